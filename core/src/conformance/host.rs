//! Plain row-major f64 arrays and naive implementations of the operations, written independently
//! of the backends (index arithmetic only), so the oracles can check the CPU reference itself.

/// A row-major array of f64 values.
#[derive(Clone, Debug, PartialEq)]
pub struct HostTensor {
    /// Size of each axis, outermost first.
    pub dims: Vec<usize>,
    /// The elements in row-major order, as many as the product of `dims`.
    pub values: Vec<f64>,
}

/// Row-major strides of `dims`.
pub fn strides(dims: &[usize]) -> Vec<usize> {
    let mut s = vec![1; dims.len()];
    for i in (0..dims.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * dims[i + 1];
    }
    s
}

/// The multi-index of flat position `flat` in `dims`.
pub fn unravel(mut flat: usize, dims: &[usize]) -> Vec<usize> {
    let mut idx = vec![0; dims.len()];
    for i in (0..dims.len()).rev() {
        if dims[i] > 0 {
            idx[i] = flat % dims[i];
            flat /= dims[i];
        }
    }
    idx
}

fn ravel(idx: &[usize], dims: &[usize]) -> usize {
    idx.iter().zip(strides(dims)).map(|(i, s)| i * s).sum()
}

impl HostTensor {
    /// A tensor of `dims` over row-major `values` (their count must be the product of `dims`).
    pub fn new(dims: impl Into<Vec<usize>>, values: Vec<f64>) -> HostTensor {
        let dims = dims.into();
        debug_assert_eq!(dims.iter().product::<usize>(), values.len());
        HostTensor { dims, values }
    }
    /// The number of elements.
    pub fn len(&self) -> usize {
        self.values.len()
    }
    /// The element at multi-index `idx`.
    pub fn at(&self, idx: &[usize]) -> f64 {
        self.values[ravel(idx, &self.dims)]
    }
    /// A tensor of `dims` whose element at each multi-index is `f(index)`.
    pub fn from_fn(dims: impl Into<Vec<usize>>, f: impl Fn(&[usize]) -> f64) -> HostTensor {
        let dims = dims.into();
        let n = dims.iter().product();
        let values = (0..n).map(|i| f(&unravel(i, &dims))).collect();
        HostTensor { dims, values }
    }
    /// `f` applied to every element, same shape.
    pub fn map(&self, f: impl Fn(f64) -> f64) -> HostTensor {
        HostTensor {
            dims: self.dims.clone(),
            values: self.values.iter().map(|&x| f(x)).collect(),
        }
    }
    /// The same row-major values seen with `dims` (same element count).
    pub fn reshape(&self, dims: impl Into<Vec<usize>>) -> HostTensor {
        HostTensor::new(dims, self.values.clone())
    }
    /// Axes reordered so output axis `i` is input axis `perm[i]`, as `torch.permute`.
    pub fn permute(&self, perm: &[usize]) -> HostTensor {
        let dims: Vec<usize> = perm.iter().map(|&p| self.dims[p]).collect();
        HostTensor::from_fn(dims, |idx| {
            let mut src = vec![0; idx.len()];
            for (i, &p) in perm.iter().enumerate() {
                src[p] = idx[i];
            }
            self.at(&src)
        })
    }
    /// Indices `start..start + len` along `axis`, as `torch.narrow`.
    pub fn narrow(&self, axis: usize, start: usize, len: usize) -> HostTensor {
        let mut dims = self.dims.clone();
        dims[axis] = len;
        HostTensor::from_fn(dims, |idx| {
            let mut src = idx.to_vec();
            src[axis] += start;
            self.at(&src)
        })
    }
    /// NumPy broadcasting to `dims`.
    pub fn broadcast_to(&self, dims: &[usize]) -> HostTensor {
        let lead = dims.len() - self.dims.len();
        HostTensor::from_fn(dims.to_vec(), |idx| {
            let src: Vec<usize> = self
                .dims
                .iter()
                .enumerate()
                .map(|(i, &d)| if d == 1 { 0 } else { idx[lead + i] })
                .collect();
            self.at(&src)
        })
    }
    /// Applies `f` elementwise after broadcasting both operands.
    pub fn zip(&self, other: &HostTensor, f: impl Fn(f64, f64) -> f64) -> HostTensor {
        let dims = broadcast_dims(&self.dims, &other.dims);
        let (a, b) = (self.broadcast_to(&dims), other.broadcast_to(&dims));
        HostTensor {
            dims,
            values: a.values.iter().zip(&b.values).map(|(&x, &y)| f(x, y)).collect(),
        }
    }
    /// Folds over `axes` (kept as size 1 when `keepdim`), starting from `init`.
    pub fn reduce(&self, axes: &[usize], keepdim: bool, init: f64, f: impl Fn(f64, f64) -> f64) -> HostTensor {
        let kept: Vec<usize> = self
            .dims
            .iter()
            .enumerate()
            .map(|(i, &d)| if axes.contains(&i) { 1 } else { d })
            .collect();
        let mut out = HostTensor::from_fn(kept.clone(), |_| init);
        for (flat, &x) in self.values.iter().enumerate() {
            let mut idx = unravel(flat, &self.dims);
            axes.iter().for_each(|&a| idx[a] = 0);
            let o = ravel(&idx, &kept);
            out.values[o] = f(out.values[o], x);
        }
        if !keepdim {
            out.dims = self
                .dims
                .iter()
                .enumerate()
                .filter(|(i, _)| !axes.contains(i))
                .map(|(_, &d)| d)
                .collect();
        }
        out
    }
    /// Sum over `axes`, kept as size 1 when `keepdim`.
    pub fn sum(&self, axes: &[usize], keepdim: bool) -> HostTensor {
        self.reduce(axes, keepdim, 0.0, |a, x| a + x)
    }
    /// Index of the first maximum along `axis` (the axis is dropped); NaN counts as the
    /// maximum, the first NaN wins.
    pub fn argmax(&self, axis: usize) -> HostTensor {
        let mut dims = self.dims.clone();
        dims.remove(axis);
        HostTensor::from_fn(dims, |idx| {
            let mut src = idx.to_vec();
            src.insert(axis, 0);
            let mut best = 0;
            for j in 0..self.dims[axis] {
                src[axis] = j;
                let v = self.at(&src);
                src[axis] = best;
                let held = self.at(&src);
                if !held.is_nan() && (v.is_nan() || v > held) {
                    best = j;
                }
            }
            best as f64
        })
    }
}

/// The larger of `a` and `b`, NaN if either is (PyTorch's rule; `f64::max` drops the NaN).
pub fn max_nan(a: f64, b: f64) -> f64 {
    if a.is_nan() || b.is_nan() { f64::NAN } else { a.max(b) }
}

/// The smaller of `a` and `b`, NaN if either is.
pub fn min_nan(a: f64, b: f64) -> f64 {
    -max_nan(-a, -b)
}

/// The NumPy broadcast of shapes `a` and `b` (assumes they are compatible).
pub fn broadcast_dims(a: &[usize], b: &[usize]) -> Vec<usize> {
    let rank = a.len().max(b.len());
    let get = |d: &[usize], i: usize| if i + d.len() >= rank { d[i + d.len() - rank] } else { 1 };
    (0..rank)
        .map(|i| if get(a, i) == 1 { get(b, i) } else { get(a, i) })
        .collect()
}

/// Batched matrix product with NumPy batch broadcasting.
pub fn matmul(a: &HostTensor, b: &HostTensor) -> HostTensor {
    let (ra, rb) = (a.dims.len(), b.dims.len());
    let (m, k, n) = (a.dims[ra - 2], a.dims[ra - 1], b.dims[rb - 1]);
    let batch = broadcast_dims(&a.dims[..ra - 2], &b.dims[..rb - 2]);
    let mut dims = batch.clone();
    dims.extend([m, n]);
    HostTensor::from_fn(dims, |idx| {
        let bi = &idx[..batch.len()];
        let pick = |t: &HostTensor, r: usize, c: usize| {
            let lead = batch.len() + 2 - t.dims.len();
            let mut src: Vec<usize> = (0..t.dims.len() - 2)
                .map(|i| if t.dims[i] == 1 { 0 } else { bi[lead + i] })
                .collect();
            src.extend([r, c]);
            t.at(&src)
        };
        let (i, j) = (idx[batch.len()], idx[batch.len() + 1]);
        (0..k).map(|p| pick(a, i, p) * pick(b, p, j)).sum()
    })
}

/// Softmax (or log-softmax) along `axis`; a row whose maximum is not finite (a NaN or +inf in
/// it, or all -inf) is NaN throughout.
pub fn softmax(x: &HostTensor, axis: usize, log: bool) -> HostTensor {
    let max = x
        .reduce(&[axis], true, f64::NEG_INFINITY, max_nan)
        .map(|m| if m.is_finite() { m } else { f64::NAN });
    let shifted = x.zip(&max, |v, m| v - m);
    let total = shifted.map(f64::exp).sum(&[axis], true);
    if log {
        shifted.zip(&total, |s, t| s - t.ln())
    } else {
        shifted.zip(&total, |s, t| s.exp() / t)
    }
}

/// Direct 2-D cross-correlation: x `[n, c, h, w]`, weight `[o, c/groups, kh, kw]`.
pub fn conv2d(
    x: &HostTensor,
    weight: &HostTensor,
    stride: [usize; 2],
    padding: [usize; 2],
    dilation: [usize; 2],
    groups: usize,
) -> HostTensor {
    let [n, c, h, w] = [x.dims[0], x.dims[1], x.dims[2], x.dims[3]];
    let [o, cg, kh, kw] = [weight.dims[0], weight.dims[1], weight.dims[2], weight.dims[3]];
    let oh = (h + 2 * padding[0] - dilation[0] * (kh - 1) - 1) / stride[0] + 1;
    let ow = (w + 2 * padding[1] - dilation[1] * (kw - 1) - 1) / stride[1] + 1;
    let per_group = o / groups;
    debug_assert_eq!(c, cg * groups);
    HostTensor::from_fn([n, o, oh, ow], |idx| {
        let [b, oc, y, xx] = [idx[0], idx[1], idx[2], idx[3]];
        let g = oc / per_group;
        let mut acc = 0.0;
        for ic in 0..cg {
            for i in 0..kh {
                for j in 0..kw {
                    let iy = (y * stride[0] + i * dilation[0]) as isize - padding[0] as isize;
                    let ix = (xx * stride[1] + j * dilation[1]) as isize - padding[1] as isize;
                    if iy >= 0 && ix >= 0 && (iy as usize) < h && (ix as usize) < w {
                        acc += x.at(&[b, g * cg + ic, iy as usize, ix as usize]) * weight.at(&[oc, ic, i, j]);
                    }
                }
            }
        }
        acc
    })
}

/// Max or average pooling over `[n, c, h, w]`; average counts padding as zeros.
pub fn pool2d(x: &HostTensor, kernel: [usize; 2], stride: [usize; 2], padding: [usize; 2], max: bool) -> HostTensor {
    let [n, c, h, w] = [x.dims[0], x.dims[1], x.dims[2], x.dims[3]];
    let oh = (h + 2 * padding[0] - kernel[0]) / stride[0] + 1;
    let ow = (w + 2 * padding[1] - kernel[1]) / stride[1] + 1;
    HostTensor::from_fn([n, c, oh, ow], |idx| {
        let mut acc = if max { f64::NEG_INFINITY } else { 0.0 };
        for i in 0..kernel[0] {
            for j in 0..kernel[1] {
                let iy = (idx[2] * stride[0] + i) as isize - padding[0] as isize;
                let ix = (idx[3] * stride[1] + j) as isize - padding[1] as isize;
                if iy >= 0 && ix >= 0 && (iy as usize) < h && (ix as usize) < w {
                    let v = x.at(&[idx[0], idx[1], iy as usize, ix as usize]);
                    acc = if max { max_nan(acc, v) } else { acc + v };
                }
            }
        }
        if max { acc } else { acc / (kernel[0] * kernel[1]) as f64 }
    })
}

/// PyTorch's adaptive average pooling: output cell `i` of `out` along an axis of `len` averages
/// input positions `floor(i·len/out)` up to (excluding) `ceil((i+1)·len/out)`.
pub fn adaptive_avg_pool2d(x: &HostTensor, out: [usize; 2]) -> HostTensor {
    let [n, c, h, w] = [x.dims[0], x.dims[1], x.dims[2], x.dims[3]];
    let bounds = |i: usize, len: usize, out: usize| {
        ((i * len) as f64 / out as f64).floor() as usize..(((i + 1) * len) as f64 / out as f64).ceil() as usize
    };
    HostTensor::from_fn([n, c, out[0], out[1]], |idx| {
        let (rows, cols) = (bounds(idx[2], h, out[0]), bounds(idx[3], w, out[1]));
        let count = (rows.len() * cols.len()) as f64;
        let mut acc = 0.0;
        for y in rows {
            for x_ in cols.clone() {
                acc += x.at(&[idx[0], idx[1], y, x_]);
            }
        }
        acc / count
    })
}

/// `out[.., j, ..] = x[.., ids[j], ..]` along `axis`.
pub fn index_select(x: &HostTensor, axis: usize, ids: &HostTensor) -> HostTensor {
    let mut dims = x.dims.clone();
    dims[axis] = ids.len();
    HostTensor::from_fn(dims, |idx| {
        let mut src = idx.to_vec();
        src[axis] = ids.values[idx[axis]] as usize;
        x.at(&src)
    })
}

/// `out[idx] = x[idx with axis replaced by ids[idx]]`.
pub fn gather(x: &HostTensor, axis: usize, ids: &HostTensor) -> HostTensor {
    HostTensor::from_fn(ids.dims.clone(), |idx| {
        let mut src = idx.to_vec();
        src[axis] = ids.at(idx) as usize;
        x.at(&src)
    })
}

/// Joins along `axis`.
pub fn concat(parts: &[&HostTensor], axis: usize) -> HostTensor {
    let mut dims = parts[0].dims.clone();
    dims[axis] = parts.iter().map(|p| p.dims[axis]).sum();
    HostTensor::from_fn(dims, |idx| {
        let mut src = idx.to_vec();
        for p in parts {
            if src[axis] < p.dims[axis] {
                return p.at(&src);
            }
            src[axis] -= p.dims[axis];
        }
        f64::NAN
    })
}

/// The exact GELU, `x Φ(x)`.
pub fn gelu(x: f64) -> f64 {
    0.5 * x * (1.0 + libm::erf(x / std::f64::consts::SQRT_2))
}

/// `d gelu / dx = Φ(x) + x φ(x)`.
pub fn gelu_grad(x: f64) -> f64 {
    let pdf = (-0.5 * x * x).exp() / (2.0 * std::f64::consts::PI).sqrt();
    0.5 * (1.0 + libm::erf(x / std::f64::consts::SQRT_2)) + x * pdf
}
