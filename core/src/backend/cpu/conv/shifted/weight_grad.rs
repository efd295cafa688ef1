//! A convolution's weight gradient from its images' shifted copies:
//! `grad_w[r, t] = Σ_{image, q} grad[r, image, q] · copy[offsets[t] + q]`. A tile is 16 rows of
//! the output gradient (two vectors, packed pixel by pixel) against 6 terms broadcast from the
//! copies, so every element read from a copy feeds 16 multiply-adds and nothing is unfolded.

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

use super::super::unfold::Planes;
#[cfg(target_arch = "x86_64")]
use super::store_lanes;
use super::{LINE, Shifts};
use crate::backend::Conv2dGeometry;

/// Output-gradient rows a tile sums: two vectors of eight.
const OR: usize = super::LANES;
/// Terms a tile sums, each broadcast from its copy.
const TR: usize = 6;
/// Pixels per pass over an image: a tile's packed rows (16 KB for one image) stay in L1 while
/// the terms pass.
const QC: usize = 256;
/// Blocks of rows per group: their packed rows stay in L2 while every block of terms passes
/// over them, and each block of terms (6 streams from the copies) stays in L1 across the group.
const GROUP: usize = 8;

/// The weight gradient's sums for one convolution geometry, `rows` output channels.
pub struct WeightGradient {
    shifts: Shifts,
    rows: usize,
}

/// A run's scratch: the images' shifted copies and the output gradient packed in tiles' rows.
pub struct Scratch {
    pub copies: Vec<f32>,
    pub packed: Vec<f32>,
}

impl WeightGradient {
    /// `None` where `g` is not a convolution the shifted kernels sum (`super::applies`).
    pub fn plan(g: &Conv2dGeometry, rows: usize, per: usize) -> Option<WeightGradient> {
        let shifts = Shifts::plan(g, per)?;
        Some(WeightGradient { shifts, rows })
    }

    /// Scratch lengths for runs of `n` images: (copies, packed rows).
    pub fn scratch_lens(&self) -> (usize, usize) {
        let n = self.shifts.per;
        let plane = self.shifts.g.h * self.shifts.g.w;
        (
            self.shifts.scratch_len(),
            self.rows.next_multiple_of(OR) * n * plane + LINE,
        )
    }

    /// `partial (+)= grad · columnsᵀ` over the `n` images of `x` (`[n, c, h, w]`): `grad` holds
    /// their output gradient, row r's pixels of image i from `r·width + i·h·w`, and `partial` is
    /// column-major, `[c·kh·kw][rows]`, written rather than added to where `accumulate` is false.
    #[allow(clippy::too_many_arguments)] // a product's operands and their geometry
    pub fn sum_into(
        &self,
        scratch: &mut Scratch,
        x: &[f32],
        n: usize,
        grad: &[f32],
        width: usize,
        partial: &mut [f32],
        accumulate: bool,
    ) {
        let g = &self.shifts.g;
        let plane = g.h * g.w;
        let terms = self.shifts.offsets.len();
        assert_eq!(partial.len(), terms * self.rows, "the weight gradient's partial sum");
        assert!(
            n == 0 || grad.len() >= (self.rows - 1) * width + n * plane,
            "the output gradient"
        );
        let copies = self.shifts.copy_images(&mut scratch.copies, x, Planes::nchw(g), n);
        let packed = self.pack(&mut scratch.packed, grad, width, n);
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `available()` held when the plan was made; the copies hold n images and
        // `packed` n·plane pixels of every block of rows, and `partial` was checked above.
        unsafe {
            self.sum(copies, packed, n, partial, accumulate)
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            let _ = (copies, packed, accumulate);
            unreachable!("plans are made only where AVX2 is available")
        }
    }

    /// `grad`'s rows in blocks of OR, pixel by pixel: block b's pixel (i, q) holds rows
    /// b·OR.. of that pixel (zeros past the last row), starting on a cache line.
    fn pack<'a>(&self, scratch: &'a mut [f32], grad: &[f32], width: usize, n: usize) -> &'a [f32] {
        let plane = self.shifts.g.h * self.shifts.g.w;
        let start = scratch.as_ptr().align_offset(LINE * 4).min(LINE);
        let packed = &mut scratch[start..][..self.rows.next_multiple_of(OR) * n * plane];
        for (b, block) in packed.chunks_exact_mut(n * plane * OR).enumerate() {
            for (p, lanes) in block.chunks_exact_mut(OR).enumerate() {
                let (i, q) = (p / plane, p % plane);
                for (l, lane) in lanes.iter_mut().enumerate() {
                    let r = b * OR + l;
                    *lane = if r < self.rows {
                        grad[r * width + i * plane + q]
                    } else {
                        0.0
                    };
                }
            }
        }
        packed
    }

    /// The blocked loops: for each pass of QC pixels and each group of row blocks, every block of
    /// terms against every block of the group.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn sum(&self, copies: &[f32], packed: &[f32], n: usize, partial: &mut [f32], accumulate: bool) {
        let plane = self.shifts.g.h * self.shifts.g.w;
        let offsets = &self.shifts.offsets;
        let block = n * plane * OR;
        for q0 in (0..plane).step_by(QC) {
            let pixels = q0..(q0 + QC).min(plane);
            for (group, blocks) in packed.chunks(GROUP * block).enumerate() {
                for t0 in (0..offsets.len()).step_by(TR) {
                    let count = TR.min(offsets.len() - t0);
                    // A short last block repeats its first term; those sums are not stored.
                    let reads: [usize; TR] = std::array::from_fn(|j| offsets[t0 + if j < count { j } else { 0 }]);
                    for (b, rows) in blocks.chunks_exact(block).enumerate() {
                        let b = group * GROUP + b;
                        let lanes = OR.min(self.rows - b * OR);
                        let dst = &mut partial[t0 * self.rows + b * OR..];
                        // SAFETY: every offset plus a pixel < plane lies within an image's copies
                        // (`Shifts::plan`), and the images' copies lie `image` apart.
                        unsafe {
                            tile(
                                Operands {
                                    rows: rows.as_ptr(),
                                    copies: copies.as_ptr(),
                                    image: self.shifts.image,
                                    plane,
                                    n,
                                    reads,
                                },
                                pixels.clone(),
                                dst,
                                self.rows,
                                (lanes, count),
                                accumulate || q0 > 0,
                            );
                        }
                    }
                }
            }
        }
    }
}

/// One tile's operands: packed rows (pixel (i, q) at `rows + (i·plane + q)·OR`) and, for each
/// of its terms, where it reads in image 0's copies (image i's lie `i·image` further).
#[cfg(target_arch = "x86_64")]
struct Operands {
    rows: *const f32,
    copies: *const f32,
    image: usize,
    plane: usize,
    n: usize,
    reads: [usize; TR],
}

/// `dst[j·column + l] (+)= Σ_{i, q} rows[i, q, l] · copies[i·image + reads[j] + q]` for the
/// first `count` terms j and `lanes` lanes l, over `pixels` of each image.
///
/// # Safety
/// Every element the operands name for q in `pixels` and i < n must be in bounds.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn tile(
    op: Operands,
    pixels: std::ops::Range<usize>,
    dst: &mut [f32],
    column: usize,
    (lanes, count): (usize, usize),
    accumulate: bool,
) {
    let mut acc = [[_mm256_setzero_ps(); 2]; TR];
    for i in 0..op.n {
        // SAFETY: in bounds as the caller promised.
        unsafe {
            let image = op.copies.add(i * op.image);
            let streams: [*const f32; TR] = op.reads.map(|r| image.add(r));
            let rows = op.rows.add(i * op.plane * OR);
            for q in pixels.clone() {
                let a = rows.add(q * OR);
                let (lo, hi) = (_mm256_loadu_ps(a), _mm256_loadu_ps(a.add(8)));
                for (acc, stream) in acc.iter_mut().zip(streams) {
                    let b = _mm256_broadcast_ss(&*stream.add(q));
                    acc[0] = _mm256_fmadd_ps(b, lo, acc[0]);
                    acc[1] = _mm256_fmadd_ps(b, hi, acc[1]);
                }
            }
        }
    }
    for (j, &acc) in acc.iter().enumerate().take(count) {
        store_lanes(acc, &mut dst[j * column..][..lanes], accumulate);
    }
}

#[cfg(test)]
mod tests {
    use super::super::available;
    use super::*;
    use crate::backend::cpu::conv::reference::{SAME_SIZE, reference};
    use crate::backend::cpu::pool::Pool;

    #[test]
    fn the_weight_gradient_of_shifted_copies_is_what_unfolding_gives() {
        assert!(available(), "this test needs a CPU with AVX2 and FMA");
        let pool = Pool::default();
        // 17x17 planes: more pixels than a pass, and rows (5) short of a tile's 16.
        let g = Conv2dGeometry {
            n: 3,
            h: 17,
            w: 17,
            ..SAME_SIZE
        };
        let r = reference(&pool, g);
        let narrow = |v: &[f64]| v.iter().map(|&x| x as f32).collect::<Vec<f32>>();
        let (x, grad) = (narrow(&r.x), narrow(&r.grad));
        let (terms, plane) = (g.c * g.kh * g.kw, g.h * g.w);
        // Runs of two images (the last one short), summed into one column-major partial.
        let plan = WeightGradient::plan(&g, r.o, 2).expect("a same-size stride-1 convolution");
        let (copies, packed) = plan.scratch_lens();
        let mut scratch = Scratch {
            copies: vec![f32::NAN; copies],
            packed: vec![f32::NAN; packed],
        };
        let mut partial = vec![f32::NAN; terms * r.o];
        for first in (0..g.n).step_by(2) {
            let n = 2.min(g.n - first);
            let images = &x[first * g.c * plane..(first + n) * g.c * plane];
            let width = g.n * plane;
            plan.sum_into(
                &mut scratch,
                images,
                n,
                &grad[first * plane..],
                width,
                &mut partial,
                first > 0,
            );
        }
        for (e, &want) in r.grad_w.iter().enumerate() {
            let (row, term) = (e / terms, e % terms);
            assert_eq!(f64::from(partial[term * r.o + row]), want, "row {row}, term {term}");
        }
    }
}
