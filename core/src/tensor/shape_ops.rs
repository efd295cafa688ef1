//! Views and rearrangements: reshape, permute, transpose, narrow, broadcast (no copies), and
//! concat, index_select and gather (copies), each with its backward rule.

use super::Tensor;
use crate::autograd::Window;
use crate::backend::CmpOp;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::shape::{Layout, Shape};

/// Splits `dims` around `axis` into (outer, dim, inner) element counts.
pub(crate) fn around(dims: &[usize], axis: usize) -> (usize, usize, usize) {
    (
        dims[..axis].iter().product(),
        dims[axis],
        dims[axis + 1..].iter().product(),
    )
}

impl Tensor {
    /// Same elements, new shape (a view when contiguous, else a copy). One dimension may be
    /// given as `usize::MAX` to be inferred.
    pub fn reshape(&self, shape: impl Into<Shape>) -> Result<Tensor> {
        let mut dims = shape.into().dims().to_vec();
        if let Some(pos) = dims.iter().position(|&d| d == usize::MAX) {
            let known: usize = dims.iter().filter(|&&d| d != usize::MAX).product();
            if known == 0 || !self.elem_count().is_multiple_of(known) {
                return Err(Error::invalid(
                    "reshape",
                    format!(
                        "cannot infer a dimension of {dims:?} for {} elements",
                        self.elem_count()
                    ),
                ));
            }
            dims[pos] = self.elem_count() / known;
        }
        let shape = Shape::new(dims);
        if shape.elem_count() != self.elem_count() {
            return Err(Error::shape("reshape", self.shape(), &shape, "element counts differ"));
        }
        if shape == *self.shape() {
            return Ok(self.clone());
        }
        let src = self.contiguous()?;
        let out = src.view(
            Layout {
                shape,
                strides: Vec::new(),
                offset: src.layout().offset,
            }
            .with_contiguous_strides(),
        );
        let original = self.shape().clone();
        Ok(out.track("reshape", &[&src], move |g| Ok(vec![Some(g.reshape(original)?)])))
    }

    /// Reorders the axes: output axis i is input axis `perm[i]` (a view).
    pub fn permute(&self, perm: &[usize]) -> Result<Tensor> {
        let mut seen = vec![false; self.rank()];
        if perm.len() != self.rank()
            || perm
                .iter()
                .any(|&p| p >= self.rank() || std::mem::replace(&mut seen[p], true))
        {
            return Err(Error::invalid(
                "permute",
                format!(
                    "{perm:?} is not a permutation of the {} axes of shape {}",
                    self.rank(),
                    self.shape()
                ),
            ));
        }
        let out = self.view(self.layout().permute(perm));
        let mut inverse = vec![0; perm.len()];
        for (i, &p) in perm.iter().enumerate() {
            inverse[p] = i;
        }
        Ok(out.track("permute", &[self], move |g| Ok(vec![Some(g.permute(&inverse)?)])))
    }

    /// Swaps two axes (a view).
    pub fn transpose(&self, a: isize, b: isize) -> Result<Tensor> {
        let (a, b) = (self.shape().axis("transpose", a)?, self.shape().axis("transpose", b)?);
        let mut perm: Vec<usize> = (0..self.rank()).collect();
        perm.swap(a, b);
        self.permute(&perm)
    }

    /// Transpose of the last two axes.
    pub fn t(&self) -> Result<Tensor> {
        if self.rank() < 2 {
            return Err(Error::invalid(
                "t",
                format!("needs at least two axes, shape is {}", self.shape()),
            ));
        }
        self.transpose(-2, -1)
    }

    /// Inserts an axis of size 1 at position `axis` (`0..=rank`), as `torch.unsqueeze`.
    pub fn unsqueeze(&self, axis: usize) -> Result<Tensor> {
        if axis > self.rank() {
            return Err(Error::invalid(
                "unsqueeze",
                format!("axis {axis} is beyond rank {}", self.rank()),
            ));
        }
        let mut dims = self.dims().to_vec();
        dims.insert(axis, 1);
        self.reshape(dims)
    }

    /// Removes `axis`, which must have size 1 (unlike PyTorch, any other size is an error).
    pub fn squeeze(&self, axis: usize) -> Result<Tensor> {
        if self.dims().get(axis) != Some(&1) {
            return Err(Error::invalid(
                "squeeze",
                format!("axis {axis} of shape {} is not of size 1", self.shape()),
            ));
        }
        let mut dims = self.dims().to_vec();
        dims.remove(axis);
        self.reshape(dims)
    }

    /// Collapses axes `from..` into one (PyTorch's `flatten(start_dim=from)`).
    pub fn flatten_from(&self, from: usize) -> Result<Tensor> {
        if from >= self.rank().max(1) {
            return Err(Error::invalid(
                "flatten",
                format!("start axis {from} is beyond rank {}", self.rank()),
            ));
        }
        let mut dims = self.dims()[..from].to_vec();
        dims.push(self.dims()[from..].iter().product());
        self.reshape(dims)
    }

    /// Repeats size-1 and missing leading axes to reach `shape` (a view, stride 0).
    pub fn broadcast_as(&self, shape: &Shape) -> Result<Tensor> {
        if shape == self.shape() {
            return Ok(self.clone());
        }
        let out = self.view(self.layout().broadcast_to("broadcast_as", shape)?);
        let original = self.shape().clone();
        Ok(out.track("broadcast_as", &[self], move |g| {
            Ok(vec![Some(g.sum_to_shape(&original)?)])
        }))
    }

    /// Elements `start..start+len` along `axis` (a view).
    pub fn narrow(&self, axis: isize, start: usize, len: usize) -> Result<Tensor> {
        let a = self.shape().axis("narrow", axis)?;
        let size = self.dims()[a];
        // Fix: checked, so a huge `start` is an error rather than an overflow panic.
        if start.checked_add(len).is_none_or(|end| end > size) {
            return Err(Error::invalid(
                "narrow",
                format!(
                    "range {start}..{start}+{len} is outside axis {a} of size {size} (shape {})",
                    self.shape()
                ),
            ));
        }
        let mut layout = self.layout().clone();
        layout.offset += start * layout.strides[a];
        let mut dims = layout.dims().to_vec();
        dims[a] = len;
        layout.shape = Shape::new(dims);
        let out = self.view(layout);
        let window = Window {
            shape: self.shape().clone(),
            axis: a,
            start,
        };
        let pad = window.clone();
        Ok(out.track_window("narrow", self, window, move |g| {
            Ok(vec![Some(g.pad_into(&pad.shape, pad.axis, pad.start)?)])
        }))
    }

    /// A zero tensor of `shape` with self written at `start` along `axis` (narrow's adjoint).
    pub(crate) fn pad_into(&self, shape: &Shape, axis: usize, start: usize) -> Result<Tensor> {
        let out = Tensor::zeros(shape.clone(), self.dtype(), self.device())?;
        let mut window = out.layout().clone();
        window.offset += start * window.strides[axis];
        window.shape = self.shape().clone();
        self.backend()
            .copy_strided(self.buffer(), self.layout(), out.buffer(), &window)?;
        Ok(out)
    }

    /// Joins tensors of equal shape but for `axis`.
    pub fn concat(tensors: &[&Tensor], axis: isize) -> Result<Tensor> {
        let first = tensors
            .first()
            .ok_or_else(|| Error::invalid("concat", "needs at least one tensor"))?;
        let a = first.shape().axis("concat", axis)?;
        for t in &tensors[1..] {
            first.same_device("concat", t)?;
            first.same_dtype("concat", t)?;
            let compatible = t.rank() == first.rank()
                && t.dims()
                    .iter()
                    .zip(first.dims())
                    .enumerate()
                    .all(|(i, (x, y))| i == a || x == y);
            if !compatible {
                return Err(Error::shape(
                    "concat",
                    first.shape(),
                    t.shape(),
                    format!("all axes but {a} must match"),
                ));
            }
        }
        let mut dims = first.dims().to_vec();
        dims[a] = tensors.iter().map(|t| t.dims()[a]).sum();
        let out = Tensor::zeros(dims, first.dtype(), first.device())?;
        let mut start = 0;
        let mut sizes = Vec::with_capacity(tensors.len());
        for t in tensors {
            let mut window = out.layout().clone();
            window.offset += start * window.strides[a];
            window.shape = t.shape().clone();
            out.backend()
                .copy_strided(t.buffer(), t.layout(), out.buffer(), &window)?;
            sizes.push((start, t.dims()[a]));
            start += t.dims()[a];
        }
        Ok(out.track("concat", tensors, move |g| {
            sizes
                .iter()
                .map(|&(s, n)| g.narrow(a as isize, s, n).map(Some))
                .collect()
        }))
    }

    /// Indices as a contiguous U32 tensor on self's device (I64 labels are converted).
    pub(crate) fn as_indices(&self, op: &'static str, ids: &Tensor) -> Result<Tensor> {
        self.same_device(op, ids)?;
        match ids.dtype() {
            DType::U32 => ids.contiguous(),
            DType::I64 => {
                // Fix: the cast saturates negative labels (e.g. -1 as an ignore index) to 0,
                // silently selecting index 0. Map them to u32::MAX so the op reports them out of
                // range, on the device (no host sync).
                let negative = ids.cmp_scalar(CmpOp::Lt, 0.0)?;
                let invalid = Tensor::full(Shape::scalar(), u32::MAX as f64, DType::I64, ids.device())?;
                negative.where_cond(&invalid, ids)?.to_dtype(DType::U32)?.contiguous()
            }
            other => Err(Error::UnsupportedDType {
                op,
                dtype: other,
                hint: "; indices must be u32 or i64",
            }),
        }
    }

    /// Picks the slices `ids` (1-D) along `axis`.
    pub fn index_select(&self, axis: isize, ids: &Tensor) -> Result<Tensor> {
        let a = self.shape().axis("index_select", axis)?;
        if ids.rank() != 1 {
            return Err(Error::invalid(
                "index_select",
                format!("indices must be 1-D, got shape {}", ids.shape()),
            ));
        }
        let ids = self.as_indices("index_select", ids)?;
        let src = self.contiguous()?;
        let (outer, dim, inner) = around(self.dims(), a);
        let buffer = self
            .backend()
            .index_select(src.buffer(), outer, dim, inner, ids.buffer())?;
        let mut dims = self.dims().to_vec();
        dims[a] = ids.elem_count();
        let out = Tensor::from_buffer(buffer, dims, self.device());
        let original = self.shape().clone();
        Ok(out.track("index_select", &[self], move |g| {
            let grad = Tensor::zeros(original, g.dtype(), g.device())?;
            let g = g.contiguous()?;
            grad.backend().index_add(
                grad.buffer(),
                dim,
                g.buffer(),
                outer,
                ids.elem_count(),
                inner,
                ids.buffer(),
            )?;
            Ok(vec![Some(grad)])
        }))
    }

    /// `out[.., j, ..] = self[.., ids[.., j, ..], ..]` along `axis`; `ids` has self's shape but
    /// for `axis` (PyTorch's gather with matching sizes).
    pub fn gather(&self, axis: isize, ids: &Tensor) -> Result<Tensor> {
        let a = self.shape().axis("gather", axis)?;
        let compatible = ids.rank() == self.rank()
            && ids
                .dims()
                .iter()
                .zip(self.dims())
                .enumerate()
                .all(|(i, (x, y))| i == a || x == y);
        if !compatible {
            return Err(Error::shape(
                "gather",
                self.shape(),
                ids.shape(),
                format!("index must match the input on every axis but {a}"),
            ));
        }
        let ids = self.as_indices("gather", ids)?;
        let src = self.contiguous()?;
        let (outer, dim, inner) = around(self.dims(), a);
        let out_dim = ids.dims()[a];
        let buffer = self
            .backend()
            .gather(src.buffer(), outer, dim, inner, ids.buffer(), out_dim)?;
        let out = Tensor::from_buffer(buffer, ids.shape().clone(), self.device());
        let original = self.shape().clone();
        Ok(out.track("gather", &[self], move |g| {
            let grad = Tensor::zeros(original, g.dtype(), g.device())?;
            let g = g.contiguous()?;
            grad.backend()
                .scatter_add(grad.buffer(), dim, g.buffer(), outer, out_dim, inner, ids.buffer())?;
            Ok(vec![Some(grad)])
        }))
    }
}

impl Layout {
    fn with_contiguous_strides(mut self) -> Layout {
        self.strides = self.shape.contiguous_strides();
        self
    }
}
