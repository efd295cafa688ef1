//! Attention's weights from its raw scores in one pass per row, and their gradient in one more:
//! `dropout(softmax(scores * scale, the future masked))`. Composed, the scale, the masked fill,
//! the softmax, the dropout and the casts between them are five or more passes each way over a
//! `[batch·heads, t, t]` tensor; here a row is read once, computed in f32 in cache, and written
//! once, and dropout's stream is drawn only for the keys the query sees (half of them).
//!
//! In f32 every value is bit for bit what the composed ops give (the same sums in the same
//! order), so the fused and composed paths train identically.

use rayon::prelude::*;

use super::dropout::KeepMask;
use super::elementwise::max_nan;
use super::fast_math::exp_nonpositive;
use super::float::ViaF32;
use super::pool::Pool;
use super::reduce::lane_sum;
use super::simd::{Kernel, wide};
use crate::backend::CausalSoftmax;

/// Elements per parallel task (whole rows).
const TASK: usize = 1 << 15;

/// `dropout(softmax(scores * scale))` with the keys after each query masked, in `T`.
pub fn forward<T: ViaF32>(pool: &Pool, scores: &[T], spec: &CausalSoftmax) -> Vec<T> {
    let mut out = pool.take::<T>(scores.len());
    for_rows::<T, 1, Forward>(&mut out, &[scores], spec);
    out
}

/// The gradient with respect to the scores for the output gradient `grad`: the weights `y`
/// computed again, `dy` the gradient through the dropout, `scale * y * (dy - sum(y * dy))` on
/// the keys seen (the sum in f64, as `softmax_last_backward` takes it) and 0 on the rest.
pub fn backward<T: ViaF32>(pool: &Pool, grad: &[T], scores: &[T], spec: &CausalSoftmax) -> Vec<T> {
    let mut out = pool.take::<T>(scores.len());
    for_rows::<T, 2, Backward>(&mut out, &[grad, scores], spec);
    out
}

/// A row kernel over `N` inputs (`Forward`, `Backward`): a trait, not a closure, so its
/// always-inlined `row` is compiled into `simd::wide`'s vector copy.
trait RowKernel<T, const N: usize> {
    fn row(rows: &Row, o: &mut [T], inputs: [&[T]; N], scratch: (&mut [f32], &mut [u32]));
}

/// One row of `forward`.
struct Forward;
impl<T: ViaF32> RowKernel<T, 1> for Forward {
    #[inline(always)]
    fn row(rows: &Row, o: &mut [T], [x]: [&[T]; 1], scratch: (&mut [f32], &mut [u32])) {
        let (y, words) = scratch;
        let seen = rows.seen;
        if !softmax_row(x, rows.scale, seen, y) {
            for o in o.iter_mut() {
                *o = T::from_f32(f32::NAN);
            }
            return;
        }
        let (o_seen, o_future) = o.split_at_mut(seen);
        match rows.draw(words) {
            Some((words, mask)) => {
                for ((o, &y), &w) in o_seen.iter_mut().zip(y.iter()).zip(words.iter()) {
                    *o = T::from_f32(y * mask.factor(w));
                }
            }
            None => {
                for (o, &y) in o_seen.iter_mut().zip(y.iter()) {
                    *o = T::from_f32(y);
                }
            }
        }
        for o in o_future.iter_mut() {
            *o = T::from_f32(0.0);
        }
    }
}

/// One row of `backward`.
struct Backward;
impl<T: ViaF32> RowKernel<T, 2> for Backward {
    #[inline(always)]
    fn row(rows: &Row, o: &mut [T], [g, x]: [&[T]; 2], scratch: (&mut [f32], &mut [u32])) {
        let (y, words) = scratch;
        let seen = rows.seen;
        let (o_seen, o_future) = o.split_at_mut(seen);
        for o in o_future.iter_mut() {
            *o = T::from_f32(0.0);
        }
        if !softmax_row(x, rows.scale, seen, y) {
            for o in o_seen.iter_mut() {
                *o = T::from_f32(f32::NAN);
            }
            return;
        }
        // dy overwrites the words' slot as f32 bits: one scratch row less.
        let dy = match rows.draw(words) {
            Some((words, mask)) => {
                for (w, &g) in words.iter_mut().zip(g.iter()) {
                    *w = (g.to_f32() * mask.factor(*w)).to_bits();
                }
                &words[..seen]
            }
            None => {
                let words = &mut words[..seen];
                for (w, &g) in words.iter_mut().zip(g.iter()) {
                    *w = g.to_f32().to_bits();
                }
                words
            }
        };
        // Lane by lane as `softmax_last_backward`'s: the masked keys it adds are zeros.
        let dot = lane_sum(dy.len(), |i| f32::from_bits(dy[i]) as f64 * y[i] as f64) as f32;
        for ((o, &d), &y) in o_seen.iter_mut().zip(dy).zip(y.iter()) {
            // `+ 0.0` as the composed scale (an affine map) adds it: -0 becomes +0.
            *o = T::from_f32(y * (f32::from_bits(d) - dot) * rows.scale + 0.0);
        }
    }
}

/// What a row's kernel needs besides its data.
struct Row {
    /// The keys this row's query sees: `0 .. seen`.
    seen: usize,
    /// The flat index of the row's first element, where its part of dropout's stream starts.
    first: usize,
    scale: f32,
    mask: Option<KeepMask>,
}

impl Row {
    /// The words of dropout's stream for the keys the row sees, in `words`, with the mask that
    /// reads them; `None` without dropout.
    #[inline(always)]
    fn draw<'w>(&self, words: &'w mut [u32]) -> Option<(&'w mut [u32], KeepMask)> {
        let mask = self.mask?;
        let words = &mut words[..self.seen];
        mask.words(self.first, words);
        Some((words, mask))
    }
}

/// Runs the row kernel `K` on every row of `out` and the same rows of `inputs`, in parallel tasks of whole
/// rows, each task with its own f32 and u32 scratch rows.
fn for_rows<T: ViaF32, const N: usize, K: RowKernel<T, N>>(out: &mut [T], inputs: &[&[T]; N], spec: &CausalSoftmax) {
    let t = spec.t;
    if t == 0 {
        return;
    }
    let rows_per_task = (TASK / t).max(1);
    let mask = KeepMask::of(spec.dropout);
    out.par_chunks_mut(rows_per_task * t).enumerate().for_each(|(task, o)| {
        let (mut y, mut words) = (vec![0f32; t], vec![0u32; t]);
        let first_row = task * rows_per_task;
        let (scale, scratch) = (spec.scale as f32, (&mut y[..], &mut words[..]));
        wide(RowsOfTask {
            o,
            inputs,
            t,
            first_row,
            scale,
            mask,
            scratch,
            row: std::marker::PhantomData::<K>,
        });
    });
}

/// The rows of one task, from row `first_row`, each through `row` (an always-inlined row
/// kernel); run by `simd::wide`.
struct RowsOfTask<'a, T, const N: usize, K> {
    o: &'a mut [T],
    inputs: &'a [&'a [T]; N],
    t: usize,
    first_row: usize,
    scale: f32,
    mask: Option<KeepMask>,
    scratch: (&'a mut [f32], &'a mut [u32]),
    row: std::marker::PhantomData<K>,
}

impl<T: ViaF32, const N: usize, K: RowKernel<T, N>> Kernel for RowsOfTask<'_, T, N, K> {
    type Out = ();
    #[inline(always)]
    fn run(self) {
        let (t, (y, words)) = (self.t, self.scratch);
        for (r, o) in self.o.chunks_mut(t).enumerate() {
            let index = self.first_row + r;
            let at = index * t;
            let ctx = Row {
                seen: index % t + 1,
                first: at,
                scale: self.scale,
                mask: self.mask,
            };
            let data = self.inputs.map(|x| &x[at..at + t]);
            K::row(&ctx, o, data, (&mut *y, &mut *words));
        }
    }
}

/// The softmax of `x[..seen] * scale` into `y[..seen]`, as `softmax_last` computes a row whose
/// masked entries are -inf (which add nothing to its maximum or sum); false when the row's
/// maximum is not finite (a NaN or +inf seen), whose weights are all NaN.
#[inline(always)]
fn softmax_row<T: ViaF32>(x: &[T], scale: f32, seen: usize, y: &mut [f32]) -> bool {
    let y = &mut y[..seen];
    for (y, &x) in y.iter_mut().zip(x) {
        // `+ 0.0` as the composed scale (an affine map) adds it.
        *y = x.to_f32() * scale + 0.0;
    }
    // In independent lanes, so it vectorizes: a NaN anywhere still wins, and otherwise the
    // maximum is the maximum in any order.
    let mut lanes = [f32::NEG_INFINITY; 16];
    let chunks = y.chunks_exact(16);
    let rest = chunks.remainder();
    for chunk in chunks {
        for (m, &v) in lanes.iter_mut().zip(chunk) {
            *m = max_nan(v, *m);
        }
    }
    let max = rest.iter().chain(&lanes).fold(f32::NEG_INFINITY, |m, &v| max_nan(v, m));
    if !max.is_finite() {
        return false;
    }
    // The exponentials first, in a loop that vectorizes, then their sum in order.
    for y in y.iter_mut() {
        *y = exp_nonpositive(*y - max);
    }
    let mut sum = 0.0f32;
    for &y in y.iter() {
        sum += y;
    }
    for y in y.iter_mut() {
        *y /= sum;
    }
    true
}
