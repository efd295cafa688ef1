//! Layer normalisation over the last axis of a contiguous `[rows, cols]` tensor with its optional
//! affine part, forward and backward, each one pass per row with the row's statistics in f64
//! (summed in `reduce::lane_sum`'s lanes: a running sum waited on every addition, and layer
//! norm was 6% of gpt-char's f32 step).
//! The weight's and bias's gradients are summed over each chunk of rows in row order, then over
//! the chunks in order: an order fixed by the shape, whatever the threads do.

use std::borrow::Cow;

use rayon::prelude::*;

use super::float::CpuFloat;
use super::pool::Pool;
use super::reduce::lane_sum;
use super::simd::{self, Kernel};

/// Row chunks of the gradients' column sums number at most this many (partials of `2 * cols`
/// f64 each)...
const ROW_CHUNKS: usize = 64;
/// ...and hold at least this many rows each.
const MIN_CHUNK_ROWS: usize = 8;

fn wide<T: CpuFloat>(v: T) -> f64 {
    crate::dtype::Element::to_f64(v)
}

/// The affine part, widened to f64: each `[cols]`, absent as a weight of 1 and a bias of 0.
#[derive(Clone, Copy, Default)]
pub struct Affine<'a> {
    pub weight: Option<&'a [f64]>,
    pub bias: Option<&'a [f64]>,
}

/// `part`, or `cols` copies of `absent`: the kernels' loops then read every column's weight and
/// bias alike, with no test in them to keep them from vectorizing. An absent weight is 1 and an
/// absent bias -0, the identities that change no value (`-0 + 0` is `+0`, `-0 + -0` is `-0`).
fn filled(part: Option<&[f64]>, cols: usize, absent: f64) -> Cow<'_, [f64]> {
    part.map_or_else(|| Cow::Owned(vec![absent; cols]), Cow::Borrowed)
}

/// The column sums of the backward pass, in f64: `g * n` (the weight's gradient) and `g` (the
/// bias's), each `[cols]`.
pub struct ColumnSums {
    pub weight: Vec<f64>,
    pub bias: Vec<f64>,
}

/// The row's mean and `1 / sqrt(var + eps)` (biased variance), in f64.
#[inline(always)]
fn statistics<T: CpuFloat>(x: &[T], eps: f64) -> (f64, f64) {
    let n = x.len() as f64;
    let mean = lane_sum(x.len(), |c| wide(x[c])) / n;
    let var = lane_sum(x.len(), |c| (wide(x[c]) - mean).powi(2)) / n;
    (mean, 1.0 / (var + eps).sqrt())
}

/// Runs the kernel `chunk(out_rows, grad_rows, src_rows)` makes over chunks of `rows_per_chunk`
/// rows, in parallel when the tensor is large, and returns the results in chunk order. The
/// kernels run through `simd::wide`: the per-column loops and the row sums' lanes on the CPU's
/// widest vectors (at the baseline's two f64 lanes the backward was a twentieth of gpt-char's
/// bf16-mixed step).
fn by_chunks<'a, T: CpuFloat, K: Kernel<Out: Send>>(
    out: &'a mut [T],
    [a, b]: [&'a [T]; 2],
    chunk_len: usize,
    chunk: impl Fn(&'a mut [T], &'a [T], &'a [T]) -> K + Sync,
) -> Vec<K::Out> {
    if out.len() >= super::elementwise::PAR_THRESHOLD {
        out.par_chunks_mut(chunk_len)
            .zip(a.par_chunks(chunk_len).zip(b.par_chunks(chunk_len)))
            .map(|(o, (a, b))| simd::wide(chunk(o, a, b)))
            .collect()
    } else {
        out.chunks_mut(chunk_len)
            .zip(a.chunks(chunk_len).zip(b.chunks(chunk_len)))
            .map(|(o, (a, b))| simd::wide(chunk(o, a, b)))
            .collect()
    }
}

/// Rows per chunk: from the row count alone.
fn rows_per_chunk(rows: usize) -> usize {
    rows.div_ceil(ROW_CHUNKS).max(MIN_CHUNK_ROWS)
}

pub fn forward<T: CpuFloat>(pool: &Pool, src: &[T], affine: Affine<'_>, cols: usize, eps: f64) -> Vec<T> {
    let mut out = pool.take::<T>(src.len());
    if cols == 0 {
        return out;
    }
    let chunk_len = rows_per_chunk(src.len() / cols) * cols;
    let (weight, bias) = (filled(affine.weight, cols, 1.0), filled(affine.bias, cols, -0.0));
    by_chunks(&mut out, [src, src], chunk_len, |out, x, _| ForwardRows {
        out,
        x,
        weight: &weight,
        bias: &bias,
        eps,
    });
    out
}

/// One chunk of `forward`'s rows, run by `simd::wide`.
struct ForwardRows<'a, T> {
    out: &'a mut [T],
    x: &'a [T],
    weight: &'a [f64],
    bias: &'a [f64],
    eps: f64,
}

impl<T: CpuFloat> Kernel for ForwardRows<'_, T> {
    type Out = ();
    #[inline(always)]
    fn run(self) {
        let ForwardRows {
            out,
            x,
            weight,
            bias,
            eps,
        } = self;
        let cols = weight.len();
        for (o, x) in out.chunks_mut(cols).zip(x.chunks(cols)) {
            let (mean, r) = statistics(x, eps);
            for (((o, v), w), b) in o.iter_mut().zip(x).zip(weight).zip(bias) {
                *o = T::of((wide(*v) - mean) * r * w + b);
            }
        }
    }
}

/// The input's gradient and, with `sums`, the column sums for the weight's and bias's.
pub fn backward<T: CpuFloat>(
    pool: &Pool,
    grad: &[T],
    src: &[T],
    weight: Option<&[f64]>,
    sums: bool,
    cols: usize,
    eps: f64,
) -> (Vec<T>, Option<ColumnSums>) {
    let mut out = pool.take::<T>(src.len());
    if cols == 0 {
        return (
            out,
            sums.then(|| ColumnSums {
                weight: Vec::new(),
                bias: Vec::new(),
            }),
        );
    }
    let chunk_len = rows_per_chunk(src.len() / cols) * cols;
    let weight = filled(weight, cols, 1.0);
    let partials = by_chunks(&mut out, [grad, src], chunk_len, |out, g, x| BackwardRows {
        out,
        g,
        x,
        weight: &weight,
        eps,
        // [g * n, g] summed over this chunk's rows, in order.
        partial: vec![0.0f64; if sums { 2 * cols } else { 0 }],
    });
    let sums = sums.then(|| {
        let mut total = vec![0.0f64; 2 * cols];
        for partial in &partials {
            total.iter_mut().zip(partial).for_each(|(t, p)| *t += p);
        }
        let bias = total.split_off(cols);
        ColumnSums { weight: total, bias }
    });
    (out, sums)
}

/// One chunk of `backward`'s rows, run by `simd::wide`; gives back its column sums.
struct BackwardRows<'a, T> {
    out: &'a mut [T],
    g: &'a [T],
    x: &'a [T],
    weight: &'a [f64],
    eps: f64,
    partial: Vec<f64>,
}

impl<T: CpuFloat> Kernel for BackwardRows<'_, T> {
    type Out = Vec<f64>;
    #[inline(always)]
    fn run(self) -> Vec<f64> {
        let BackwardRows {
            out,
            g,
            x,
            weight,
            eps,
            mut partial,
        } = self;
        let cols = weight.len();
        for (o, (g, x)) in out.chunks_mut(cols).zip(g.chunks(cols).zip(x.chunks(cols))) {
            backward_row(o, g, x, weight, eps, &mut partial);
        }
        partial
    }
}

/// One row of the input's gradient, `r * (gw - mean(gw) - n * mean(gw * n))` with `gw = g * w`,
/// adding `g * n` and `g` to `partial`'s halves when it has them.
#[inline(always)]
fn backward_row<T: CpuFloat>(o: &mut [T], g: &[T], x: &[T], weight: &[f64], eps: f64, partial: &mut [f64]) {
    let cols = weight.len();
    let (o, g, x) = (&mut o[..cols], &g[..cols], &x[..cols]);
    let (mean, r) = statistics(x, eps);
    let normed = |c: usize| (wide(x[c]) - mean) * r;
    let scaled = |c: usize| wide(g[c]) * weight[c];
    let gw_mean = lane_sum(cols, scaled) / cols as f64;
    let gwn_mean = lane_sum(cols, |c| scaled(c) * normed(c)) / cols as f64;
    for (c, o) in o.iter_mut().enumerate() {
        *o = T::of(r * (scaled(c) - gw_mean - normed(c) * gwn_mean));
    }
    if !partial.is_empty() {
        let (gn, gs) = partial.split_at_mut(cols);
        for (c, (gn, gs)) in gn.iter_mut().zip(gs).enumerate() {
            *gn += wide(g[c]) * normed(c);
            *gs += wide(g[c]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A row of zeros normalizes to the zeros it had, signs and all, with or without a weight:
    /// what `(x - mean) * r` gives, and PyTorch.
    #[test]
    fn zeros_keep_their_signs_without_a_bias() {
        let pool = Pool::default();
        let x = [-0.0f32, 0.0, -0.0, 0.0];
        let weight = [1.0f64, 2.0, 3.0, 4.0];
        for affine in [
            Affine::default(),
            Affine {
                weight: Some(&weight),
                bias: None,
            },
        ] {
            let out = forward(&pool, &x, affine, 4, 1e-5);
            let signs: Vec<bool> = out.iter().map(|v| v.is_sign_negative()).collect();
            assert_eq!(signs, [true, false, true, false], "{out:?}");
        }
    }
}
