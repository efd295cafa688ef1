//! Sum, max, min and argmax over any set of axes, keeping them as size 1.

use rayon::prelude::*;

use super::float::CpuFloat;
use super::pool::Pool;
use super::simd::{Kernel, wide};
use super::stored::Stored;
use crate::backend::ReduceKind;
use crate::dtype::Element;
use crate::shape::{Layout, Shape};

/// Splits `layout` into the kept axes (outer) and the reduced axes (inner).
fn split(layout: &Layout, axes: &[usize]) -> (Layout, Layout) {
    let pick = |keep: bool| {
        let idx: Vec<usize> = (0..layout.shape.rank()).filter(|a| axes.contains(a) != keep).collect();
        Layout {
            shape: Shape::new(idx.iter().map(|&a| layout.dims()[a]).collect::<Vec<_>>()),
            strides: idx.iter().map(|&a| layout.strides[a]).collect(),
            offset: layout.offset,
        }
    };
    (pick(true), pick(false))
}

/// Reduces floats. Sums accumulate in f64: a plain f32 running sum over the 4,096 values per
/// channel of a batch-norm's statistics loses about 1e-5 relative, which PyTorch's cascaded f32
/// sums do not, and a ResNet's training magnifies that difference step by step. Max and min are
/// exact in `T`. The kind is matched once, so each reduction's loops are compiled on their own.
/// Elements are stored as `S` and compared or summed as `T` (bf16 read directly, its sums
/// rounded to f32 and then to bf16, as an f32 reduction followed by a cast).
pub fn reduce<S: Stored<T>, T: CpuFloat>(
    pool: &Pool,
    kind: ReduceKind,
    src: &[S],
    layout: &Layout,
    axes: &[usize],
) -> Vec<S> {
    match kind {
        ReduceKind::Sum => {
            let wide = |x: S| x.load().to_f64();
            let sums = reduce_with(
                src,
                layout,
                axes,
                0.0,
                |a: f64, x| a + wide(x),
                |a, run| a + sum_f64(run),
            );
            let mut out = pool.take::<S>(sums.len());
            out.iter_mut()
                .zip(sums)
                .for_each(|(o, s)| *o = S::store(T::from(s).unwrap_or(T::nan())));
            out
        }
        // NaN wins, as in PyTorch.
        ReduceKind::Max => stored(
            pool,
            reduce_with_folds(src, layout, axes, T::neg_infinity(), |a: T, x: S| {
                let x = x.load();
                if x > a || x.is_nan() { x } else { a }
            }),
        ),
        ReduceKind::Min => stored(
            pool,
            reduce_with_folds(src, layout, axes, T::infinity(), |a: T, x: S| {
                let x = x.load();
                if x < a || x.is_nan() { x } else { a }
            }),
        ),
        ReduceKind::ArgMax => unreachable!("argmax has its own kernel"),
    }
}

/// `values` stored as `S` in a buffer of the pool.
fn stored<S: Stored<T>, T>(pool: &Pool, values: Vec<T>) -> Vec<S> {
    let mut out = pool.take::<S>(values.len());
    for (o, v) in out.iter_mut().zip(values) {
        *o = S::store(v);
    }
    out
}

/// The sum of `run` in f64 (see `lane_sum`).
#[inline(always)]
fn sum_f64<S: Stored<T>, T: CpuFloat>(run: &[S]) -> f64 {
    lane_sum(run.len(), |i| run[i].load().to_f64())
}

/// `Σ term(i)` over `0..len` (see `LaneSums`).
#[inline(always)]
pub(super) fn lane_sum(len: usize, term: impl Fn(usize) -> f64) -> f64 {
    let mut sums = LaneSums::default();
    sums.add_run(len, term);
    sums.total()
}

/// f64 partial sums in 32 lanes, element `i` of each run added to lane `i % 32`, combined
/// pairwise at the end: the additions vectorise as four independent vectors of eight, where
/// one vector (or one running sum) waits on each addition (batch norm's sums ran at the
/// adder's latency: 2.3x slower with eight lanes).
pub(super) struct LaneSums([f64; LaneSums::LANES]);

impl Default for LaneSums {
    fn default() -> Self {
        LaneSums([0.0; LaneSums::LANES])
    }
}

impl LaneSums {
    const LANES: usize = 32;

    /// Adds `term(i)` for `i` in `0..len`.
    #[inline(always)]
    pub(super) fn add_run(&mut self, len: usize, term: impl Fn(usize) -> f64) {
        let whole = len / Self::LANES * Self::LANES;
        for i in (0..whole).step_by(Self::LANES) {
            for (l, lane) in self.0.iter_mut().enumerate() {
                *lane += term(i + l);
            }
        }
        for (l, lane) in self.0.iter_mut().enumerate().take(len - whole) {
            *lane += term(whole + l);
        }
    }

    /// The sum: the lanes added pairwise.
    #[inline(always)]
    pub(super) fn total(mut self) -> f64 {
        pairwise_total(&mut self.0)
    }
}

/// The sum of `lanes` (a power of two of them), added pairwise, halves onto halves.
#[inline(always)]
pub(super) fn pairwise_total(lanes: &mut [f64]) -> f64 {
    let mut width = lanes.len();
    while width > 1 {
        width /= 2;
        for l in 0..width {
            lanes[l] += lanes[l + width];
        }
    }
    lanes[0]
}

/// `reduce_with` folding each contiguous run element by element with `combine`.
fn reduce_with_folds<T: Element, A: Copy + Send + Sync>(
    src: &[T],
    layout: &Layout,
    axes: &[usize],
    init: A,
    combine: impl Fn(A, T) -> A + Send + Sync + Copy,
) -> Vec<A> {
    let fold_run = move |acc: A, run: &[T]| {
        let mut acc = acc;
        for &x in run {
            acc = combine(acc, x);
        }
        acc
    };
    reduce_with(src, layout, axes, init, combine, fold_run)
}

/// Folds the reduced axes of `src` into accumulators of type `A`, one per kept element:
/// `combine` adds one element, `fold_run` a contiguous run of them.
fn reduce_with<T: Element, A: Copy + Send + Sync>(
    src: &[T],
    layout: &Layout,
    axes: &[usize],
    init: A,
    combine: impl Fn(A, T) -> A + Send + Sync + Copy,
    fold_run: impl Fn(A, &[T]) -> A + Send + Sync + Copy,
) -> Vec<A> {
    let (kept, reduced) = split(layout, axes);
    let n_out = kept.elem_count();
    let mut out = vec![init; n_out];
    // Fast path: contiguous input whose kept axes form one block, seen as [outer, mid, inner]
    // and reduced over outer and inner (trailing, leading and conv-bias reductions alike).
    let rank = layout.shape.rank();
    let kept_axes: Vec<usize> = (0..rank).filter(|a| !axes.contains(a)).collect();
    let block = kept_axes.windows(2).all(|w| w[1] == w[0] + 1);
    if let (Some(range), true) = (layout.contiguous_range(), block) {
        let dims = layout.dims();
        // With nothing kept, the block is empty at axis 0: one row of every element.
        let (first, last) = (
            kept_axes.first().copied().unwrap_or(0),
            kept_axes.last().map_or(0, |&l| l + 1),
        );
        let outer: usize = dims[..first].iter().product();
        let inner: usize = dims[last..].iter().product();
        let src = &src[range];
        // Fix: with no kept elements (e.g. [0, 3] over axis 1) `mid_slab` is 0 and `chunks(0)` panics.
        if inner == 0 || outer == 0 || n_out == 0 {
            return out;
        }
        if inner == 1 && outer > 1 {
            // Leading-axis reductions (bias gradients): whole rows combine elementwise. Threads
            // take ranges of columns, each column still folded in row order.
            let columns = |(c, o): (usize, &mut [A])| {
                wide(Columns {
                    out: o,
                    src,
                    first: c * COLUMNS,
                    row_len: n_out,
                    combine,
                })
            };
            if src.len() >= super::elementwise::PAR_THRESHOLD {
                out.par_chunks_mut(COLUMNS).enumerate().for_each(columns);
            } else {
                out.chunks_mut(COLUMNS).enumerate().for_each(columns);
            }
        } else {
            // Trailing and middle-axis reductions (batch-norm statistics over N, H and W):
            // threads take ranges of the kept elements, each folding its runs slab by slab.
            let per_task = (n_out / (4 * rayon::current_num_threads())).max(1);
            let runs = |(c, o): (usize, &mut [A])| {
                wide(Runs {
                    out: o,
                    src,
                    first: c * per_task,
                    n_out,
                    inner,
                    fold_run,
                })
            };
            if src.len() >= super::elementwise::PAR_THRESHOLD {
                out.par_chunks_mut(per_task).enumerate().for_each(runs);
            } else {
                out.chunks_mut(n_out).enumerate().for_each(runs);
            }
        }
        return out;
    }
    for (o, base) in out.iter_mut().zip(kept.offsets()) {
        let inner = Layout {
            offset: base,
            ..reduced.clone()
        };
        *o = inner.offsets().fold(init, |a, i| combine(a, src[i]));
    }
    out
}

/// Kept elements `first..first + out.len()` of `src` seen as `[outer, n_out, inner]`, each
/// folding its `inner` run of every slab in turn; run by `simd::wide`.
struct Runs<'a, T, A, F> {
    out: &'a mut [A],
    src: &'a [T],
    first: usize,
    n_out: usize,
    inner: usize,
    fold_run: F,
}

impl<T, A: Copy, F: Fn(A, &[T]) -> A> Kernel for Runs<'_, T, A, F> {
    type Out = ();
    #[inline(always)]
    fn run(self) {
        let Runs {
            out,
            src,
            first,
            n_out,
            inner,
            fold_run,
        } = self;
        for slab in src.chunks_exact(n_out * inner) {
            let runs = slab[first * inner..].chunks_exact(inner);
            for (o, run) in out.iter_mut().zip(runs) {
                *o = fold_run(*o, run);
            }
        }
    }
}

/// Columns per task of a leading-axis reduction: a few cache lines of every row.
const COLUMNS: usize = 256;

/// Columns `first..first + out.len()` of `src`'s rows of `row_len`, folded into `out` row by
/// row; run by `simd::wide`. `combine` by value, so what it captures stays in registers.
struct Columns<'a, T, A, F> {
    out: &'a mut [A],
    src: &'a [T],
    first: usize,
    row_len: usize,
    combine: F,
}

impl<T: Copy, A: Copy, F: Fn(A, T) -> A> Kernel for Columns<'_, T, A, F> {
    type Out = ();
    #[inline(always)]
    fn run(self) {
        let Columns {
            out,
            src,
            first,
            row_len,
            combine,
        } = self;
        for row in src.chunks_exact(row_len) {
            let row = &row[first..first + out.len()];
            for (o, &x) in out.iter_mut().zip(row) {
                *o = combine(*o, x);
            }
        }
    }
}

/// Index of the first maximum along one axis (NaN counts as the maximum, as in PyTorch).
pub fn argmax<T: Element + num_traits::Float>(pool: &Pool, src: &[T], layout: &Layout, axis: usize) -> Vec<u32> {
    let (kept, reduced) = split(layout, &[axis]);
    let mut out = pool.take::<u32>(kept.elem_count());
    for (o, base) in out.iter_mut().zip(kept.offsets()) {
        let inner = Layout {
            offset: base,
            ..reduced.clone()
        };
        let mut best = (0u32, T::neg_infinity());
        for (j, i) in inner.offsets().enumerate() {
            let x = src[i];
            if j == 0 || x > best.1 || (x.is_nan() && !best.1.is_nan()) {
                best = (j as u32, x);
            }
        }
        *o = best.0;
    }
    out
}
