//! How a convolution's batch is split among threads and runs of images, shared by the paths:
//! one contiguous range of images per thread (each allocates its scratch once), cut into runs
//! that one product covers.

use half::bf16;
use rayon::prelude::*;

use super::super::float::ViaF32;
use super::super::pool::Pool;
use super::super::simd::{Kernel, wide};
use crate::backend::Conv2dGeometry;
use crate::dtype::HostVec;

/// A pointer the image tasks share, each writing only its own columns of the output.
#[derive(Clone, Copy)]
pub struct Columns<T>(pub *mut T);
// SAFETY: the tasks that receive it write disjoint elements (image i's columns i·p..(i+1)·p of
// every row), and the buffer outlives them (the parallel loop ends before it is returned).
unsafe impl<T: Send> Send for Columns<T> {}
// SAFETY: as above; no element is read or written by two tasks.
unsafe impl<T: Send> Sync for Columns<T> {}

/// Images per task: one contiguous range per thread, so each allocates its scratch once.
pub fn images_per_range(n: usize) -> usize {
    n.div_ceil(rayon::current_num_threads()).max(1)
}

/// The batch's `n` images as one contiguous range per thread, in parallel.
pub fn image_ranges(n: usize) -> impl ParallelIterator<Item = std::ops::Range<usize>> {
    let per_range = images_per_range(n);
    (0..n.div_ceil(per_range))
        .into_par_iter()
        .map(move |r| r * per_range..((r + 1) * per_range).min(n))
}

/// The fewest images whose output pixels reach `columns`, within a thread's range.
pub fn images_for_columns(g: &Conv2dGeometry, columns: usize) -> usize {
    columns
        .div_ceil((g.out_h() * g.out_w()).max(1))
        .clamp(1, images_per_range(g.n))
}

/// `range` cut into runs of at most `per` images, each with its geometry.
pub fn products(
    range: std::ops::Range<usize>,
    per: usize,
    g: &Conv2dGeometry,
) -> impl Iterator<Item = (usize, Conv2dGeometry)> + '_ {
    range.clone().step_by(per).map(move |first| {
        let n = per.min(range.end - first);
        (first, Conv2dGeometry { n, ..*g })
    })
}

/// Scratch for the transposed input gradient's rows of a run of `per` images of `plane`
/// elements, laid out image by image afterwards; none where runs are single images.
pub fn staging_len(per: usize, plane: usize) -> usize {
    if per > 1 { per * plane } else { 0 }
}

/// The backward passes' split: `grad_x` (`n` images of `plane` elements) cut into one
/// contiguous range of images per thread, `range(first_image, its_grad_x)` filling its part and
/// returning its partial weight gradient; the partials in range order, so summing them in order
/// does not depend on scheduling.
pub fn per_image_range<T: Send, P: Send>(
    grad_x: &mut [T],
    n: usize,
    plane: usize,
    range: impl Fn(usize, &mut [T]) -> P + Sync,
) -> Vec<P> {
    let per_range = images_per_range(n);
    grad_x
        .par_chunks_mut(per_range * plane)
        .enumerate()
        .map(|(r, grad_x_range)| range(r * per_range, grad_x_range))
        .collect()
}

/// The threads' partial sums (each `[rows, cols]` in f32), added in order (so the result does
/// not depend on scheduling), rounded once and turned into `out` (`[cols, rows]`): a bf16
/// weight gradient from partials laid out by tap.
pub fn rounded_sum_turned(pool: &Pool, partials: Vec<Vec<f32>>, rows: usize, cols: usize, out: &mut [bf16]) {
    let mut sum = pool.take::<f32>(rows * cols);
    sum.fill(0.0);
    for partial in partials {
        sum.iter_mut().zip(&partial).for_each(|(s, p)| *s += p);
        pool.recycle(HostVec::F32(partial));
    }
    wide(RoundTurned {
        sum: &sum,
        rows,
        cols,
        out,
    });
    pool.recycle(HostVec::F32(sum));
}

/// Elements turned at a time each way, so reads and writes both move along cache lines.
const TURN: usize = 16;

/// `out[c][r] = round(sum[r][c])`, 16 by 16. Run by `simd::wide`.
struct RoundTurned<'a> {
    sum: &'a [f32],
    rows: usize,
    cols: usize,
    out: &'a mut [bf16],
}

impl Kernel for RoundTurned<'_> {
    type Out = ();
    #[inline(always)]
    fn run(self) {
        let RoundTurned { sum, rows, cols, out } = self;
        for r0 in (0..rows).step_by(TURN) {
            let rs = (rows - r0).min(TURN);
            for c0 in (0..cols).step_by(TURN) {
                let cs = (cols - c0).min(TURN);
                let mut block = [[bf16::ZERO; TURN]; TURN];
                for (r, rounded) in block.iter_mut().enumerate().take(rs) {
                    for (b, &v) in rounded.iter_mut().zip(&sum[(r0 + r) * cols + c0..][..cs]) {
                        *b = <bf16 as ViaF32>::from_f32(v);
                    }
                }
                for c in 0..cs {
                    for (r, o) in out[(c0 + c) * rows + r0..][..rs].iter_mut().enumerate() {
                        *o = block[r][c];
                    }
                }
            }
        }
    }
}
