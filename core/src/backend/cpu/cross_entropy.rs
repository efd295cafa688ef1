//! Mean cross-entropy and its gradient in one pass per row of `[rows, classes]` logits: the
//! row's maximum, its log-sum-exp and loss in f32, and `(softmax - onehot) / rows` written in
//! the logits' dtype while the row is in cache. Composed, log-softmax, gather, mean and their
//! backward (a zero fill, a scatter, a sum, exp, mul, sub) are nine passes over the logits; a
//! GPT's logits are its largest tensor.
//!
//! Sums run in 16 independent lanes combined in a fixed order, so every run gives the same
//! bits and the loops vectorize.

use rayon::prelude::*;

use super::elementwise::max_nan;
use super::fast_math::exp_nonpositive;
use super::float::ViaF32;
use super::simd::{Kernel, wide};
use crate::backend::CrossEntropy;

/// Elements per parallel task (whole rows).
const TASK: usize = 1 << 15;
/// Independent accumulators per row: wide enough for AVX-512's sixteen f32 lanes.
const LANES: usize = 16;

/// Each row's loss, and with `spec.grad` the mean loss' gradient in `T` (`grad` as long as the
/// logits). Every target must be below `spec.classes`.
pub fn forward<T: ViaF32>(
    logits: &[T],
    targets: &[u32],
    losses: &mut [f32],
    grad: Option<&mut [T]>,
    spec: &CrossEntropy,
) {
    let classes = spec.classes;
    if classes == 0 {
        return;
    }
    let rows_per_task = (TASK / classes).max(1);
    let inv_rows = spec.inv_rows();
    let tasks = losses.len().div_ceil(rows_per_task);
    let mut grads: Vec<Option<&mut [T]>> = match grad {
        Some(g) => g.chunks_mut(rows_per_task * classes).map(Some).collect(),
        None => (0..tasks).map(|_| None).collect(),
    };
    losses
        .par_chunks_mut(rows_per_task)
        .zip(grads.par_iter_mut())
        .enumerate()
        .for_each(|(task, (losses, grad))| {
            let first = task * rows_per_task;
            let rows = first..first + losses.len();
            wide(Rows {
                logits: &logits[rows.start * classes..rows.end * classes],
                targets: &targets[rows],
                losses,
                grad: grad.as_deref_mut(),
                classes,
                inv_rows,
            });
        });
}

/// `dlogits * grad` rounded once to `T`.
pub fn backward<T: ViaF32>(dlogits: &[T], grad: f32, out: &mut [T]) {
    out.par_chunks_mut(TASK)
        .zip(dlogits.par_chunks(TASK))
        .for_each(|(o, d)| {
            for (o, &d) in o.iter_mut().zip(d) {
                *o = T::from_f32(d.to_f32() * grad);
            }
        });
}

/// The rows of one task; run by `simd::wide`.
struct Rows<'a, T> {
    logits: &'a [T],
    targets: &'a [u32],
    losses: &'a mut [f32],
    grad: Option<&'a mut [T]>,
    classes: usize,
    inv_rows: f32,
}

impl<T: ViaF32> Kernel for Rows<'_, T> {
    type Out = ();
    #[inline(always)]
    fn run(self) {
        let classes = self.classes;
        let mut grad_rows = self.grad.map(|g| g.chunks_mut(classes));
        for ((x, &target), loss) in self
            .logits
            .chunks(classes)
            .zip(self.targets)
            .zip(self.losses.iter_mut())
        {
            let target = target as usize;
            let lse = log_sum_exp(x);
            // A NaN lse (a poisoned row) makes the loss NaN.
            *loss = lse - x[target].to_f32();
            let Some(g) = grad_rows.as_mut().and_then(|rows| rows.next()) else {
                continue;
            };
            if lse.is_nan() {
                g.iter_mut().for_each(|g| *g = T::from_f32(f32::NAN));
                continue;
            }
            for (g, &x) in g.iter_mut().zip(x) {
                *g = T::from_f32(exp_nonpositive(x.to_f32() - lse) * self.inv_rows);
            }
            let p = exp_nonpositive(x[target].to_f32() - lse);
            g[target] = T::from_f32((p - 1.0) * self.inv_rows);
        }
    }
}

/// `max + ln(sum(exp(x - max)))` of a row, NaN when its maximum is not finite (a NaN or +inf
/// in it, or every entry -inf), as `log_softmax_last` poisons such a row.
#[inline(always)]
fn log_sum_exp<T: ViaF32>(x: &[T]) -> f32 {
    let mut lanes = [f32::NEG_INFINITY; LANES];
    let chunks = x.chunks_exact(LANES);
    let rest = chunks.remainder();
    for chunk in chunks {
        for (m, &v) in lanes.iter_mut().zip(chunk) {
            *m = max_nan(v.to_f32(), *m);
        }
    }
    let max = rest
        .iter()
        .map(|v| v.to_f32())
        .chain(lanes)
        .fold(f32::NEG_INFINITY, |m, v| max_nan(v, m));
    if !max.is_finite() {
        return f32::NAN;
    }
    let mut sums = [0.0f32; LANES];
    let chunks = x.chunks_exact(LANES);
    let rest = chunks.remainder();
    for chunk in chunks {
        for (s, &v) in sums.iter_mut().zip(chunk) {
            *s += exp_nonpositive(v.to_f32() - max);
        }
    }
    let sum = rest
        .iter()
        .fold(sums.iter().sum::<f32>(), |s, &v| s + exp_nonpositive(v.to_f32() - max));
    max + sum.ln()
}
