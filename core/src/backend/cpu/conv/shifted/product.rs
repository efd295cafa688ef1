//! Products of a weight with a convolution's shifted copies: the forward pass (`[o, c·kh·kw]`
//! against the images) and the transposed input gradient (the turned weight against the output
//! gradient). A tile is MR weight rows broadcast one by one against NR pixels of the copies.

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

use rayon::prelude::*;

use super::super::ranges::{Columns, image_ranges};
use super::super::unfold::Planes;
#[cfg(target_arch = "x86_64")]
use super::store_lanes;
use super::{OVERRUN, Shifts};
use crate::backend::Conv2dGeometry;
use crate::backend::cpu::pool::Pool;
use crate::dtype::HostVec;

/// Output channels a tile sums (weight rows broadcast one by one).
const MR: usize = 6;
/// Output pixels a tile sums: two vectors of eight.
const NR: usize = super::LANES;
/// Terms of the sum per pass: a tile's vector side (KC loads of 64 bytes) stays in L1 while the
/// block's weight strips pass over it.
const KC: usize = 1024;
// A tile's reads stay within the lanes the copies leave past a plane.
const _: () = assert!(NR <= OVERRUN);
/// Weight rows per block: their KC-term slice (96 KB) stays in L2 while the panels pass.
const MC: usize = 16 * MR;

/// `weight [o, c·kh·kw] @ im2col(x)` into `out` (`[o, n·oh·ow]`) in runs of `per` images, where
/// `g` is a convolution this path sums; false (and `out` untouched) where it is not.
pub fn forward(
    pool: &Pool,
    x: &[f32],
    weight: &[f32],
    g: &Conv2dGeometry,
    o: usize,
    per: usize,
    out: &mut [f32],
) -> bool {
    let Some(plan) = ShiftedConv::plan(pool, weight, g, o, per) else {
        return false;
    };
    let (pixels, plane) = (g.h * g.w, g.c * g.h * g.w);
    assert_eq!(out.len(), o * g.n * pixels, "the product's output");
    let dst = Columns(out.as_mut_ptr());
    let rows = Planes {
        image: pixels,
        channel: g.n * pixels,
    };
    image_ranges(g.n).for_each(|images| {
        // The whole `Columns` (Send), not its raw pointer field (which is not).
        #[allow(clippy::redundant_locals)]
        let dst = dst;
        let mut scratch = pool.take::<f32>(plan.scratch_len());
        for first in images.clone().step_by(per) {
            let n = per.min(images.end - first);
            // SAFETY: `out` holds o rows of n·pixels (asserted); this range writes only its
            // images' columns first·pixels.. of each row, which no other range touches.
            unsafe {
                plan.run(
                    &mut scratch,
                    &x[first * plane..],
                    Planes::nchw(g),
                    n,
                    dst.0.add(first * pixels),
                    rows,
                )
            };
        }
        pool.recycle(HostVec::F32(scratch));
    });
    plan.recycle(pool);
    true
}

/// A convolution's weight in tile strips, and its copies' layout.
pub struct ShiftedConv {
    /// `[strip][term][MR]`: strip s holds rows s·MR.. (zeros past the last row).
    strips: Vec<f32>,
    rows: usize,
    terms: usize,
    shifts: Shifts,
}

impl ShiftedConv {
    /// The product of `weight` (`[rows, c·kh·kw]`) with the columns of `g`'s images; `None`
    /// where `g` is not a convolution this path sums.
    pub fn plan(pool: &Pool, weight: &[f32], g: &Conv2dGeometry, rows: usize, per: usize) -> Option<ShiftedConv> {
        let shifts = Shifts::plan(g, per)?;
        let terms = g.c * g.kh * g.kw;
        let mut strips = pool.take::<f32>(rows.div_ceil(MR) * terms * MR);
        for (s, strip) in strips.chunks_exact_mut(terms * MR).enumerate() {
            for (t, lanes) in strip.chunks_exact_mut(MR).enumerate() {
                for (r, lane) in lanes.iter_mut().enumerate() {
                    let row = s * MR + r;
                    *lane = if row < rows { weight[row * terms + t] } else { 0.0 };
                }
            }
        }
        Some(ShiftedConv {
            strips,
            rows,
            terms,
            shifts,
        })
    }

    /// Scratch for the copies of a run (and a line to align them).
    pub fn scratch_len(&self) -> usize {
        self.shifts.scratch_len()
    }

    /// The product over `n` images of `src` (planes at `src_planes`) into `dst`, row r of image
    /// i's pixels at `dst + i·dst_planes.image + r·dst_planes.channel`; `scratch` holds at
    /// least `scratch_len()`, for `n` up to the plan's run.
    ///
    /// # Safety
    /// Every element `dst_planes` reaches for `n` images, `rows` rows and h·w pixels must be in
    /// bounds of one allocation that nothing else reads or writes meanwhile.
    pub unsafe fn run(
        &self,
        scratch: &mut [f32],
        src: &[f32],
        src_planes: Planes,
        n: usize,
        dst: *mut f32,
        dst_planes: Planes,
    ) {
        let copies = self.shifts.copy_images(scratch, src, src_planes, n);
        // SAFETY: `available()` held when the plan was made (`applies`); the caller's promise
        // about `dst` is `sum`'s.
        #[cfg(target_arch = "x86_64")]
        unsafe {
            self.sum(copies, n, dst, dst_planes)
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            let _ = (dst, dst_planes);
            unreachable!("plans are made only where AVX2 is available")
        }
    }

    /// `run` into images: `dst` is `[n, rows, h, w]`.
    pub fn images_into(&self, scratch: &mut [f32], src: &[f32], src_planes: Planes, n: usize, dst: &mut [f32]) {
        let plane = self.shifts.g.h * self.shifts.g.w;
        assert_eq!(dst.len(), n * self.rows * plane, "the images' gradient");
        let planes = Planes {
            image: self.rows * plane,
            channel: plane,
        };
        // SAFETY: `dst` holds exactly the n images of `rows` planes that `planes` reaches.
        unsafe { self.run(scratch, src, src_planes, n, dst.as_mut_ptr(), planes) }
    }

    /// The blocked loops over the copies: for each block of terms and of weight rows, every
    /// tile of every image.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn sum(&self, copies: &[f32], n: usize, dst: *mut f32, dst_planes: Planes) {
        let (plane, image_len) = (self.shifts.g.h * self.shifts.g.w, self.shifts.image);
        let strip_count = self.rows.div_ceil(MR);
        for k0 in (0..self.terms).step_by(KC) {
            let k1 = (k0 + KC).min(self.terms);
            for s0 in (0..strip_count).step_by(MC / MR) {
                for i in 0..n {
                    let image = &copies[i * image_len..];
                    for q0 in (0..plane).step_by(NR) {
                        for s in s0..(s0 + MC / MR).min(strip_count) {
                            let rows = MR.min(self.rows - s * MR);
                            let strip = &self.strips[(s * self.terms + k0) * MR..][..(k1 - k0) * MR];
                            let out = i * dst_planes.image + s * MR * dst_planes.channel + q0;
                            // SAFETY: the offsets were built to stay within an image's copies
                            // with OVERRUN >= NR lanes past any pixel of a plane; `out` addresses rows < self.rows and pixels < plane of
                            // image i < n, which the caller vouched for.
                            unsafe {
                                tile(
                                    image.as_ptr().add(q0),
                                    &self.shifts.offsets[k0..k1],
                                    strip,
                                    dst.add(out),
                                    dst_planes.channel,
                                    (rows, NR.min(plane - q0)),
                                    k0 > 0,
                                );
                            }
                        }
                    }
                }
            }
        }
    }

    pub fn recycle(self, pool: &Pool) {
        pool.recycle(HostVec::F32(self.strips));
    }
}

/// One MR x NR tile: `dst[r][l] (+)= Σ_t strip[t][r] · src[offsets[t] + l]` for the first
/// `rows` rows and `lanes` lanes.
///
/// # Safety
/// `src + offsets[t] + l` must be in bounds for every t and l < NR, and `dst + r·row + l` for
/// r < rows, l < lanes; `strip` holds MR values per offset.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn tile(
    src: *const f32,
    offsets: &[usize],
    strip: &[f32],
    dst: *mut f32,
    row: usize,
    (rows, lanes): (usize, usize),
    accumulate: bool,
) {
    debug_assert!(strip.len() >= offsets.len() * MR);
    let mut acc = [[_mm256_setzero_ps(); 2]; MR];
    for (t, &offset) in offsets.iter().enumerate() {
        // SAFETY: in bounds as the caller promised; unaligned loads.
        unsafe {
            let p = src.add(offset);
            let (lo, hi) = (_mm256_loadu_ps(p), _mm256_loadu_ps(p.add(8)));
            let w = strip.as_ptr().add(t * MR);
            for (r, acc) in acc.iter_mut().enumerate() {
                let b = _mm256_broadcast_ss(&*w.add(r));
                acc[0] = _mm256_fmadd_ps(b, lo, acc[0]);
                acc[1] = _mm256_fmadd_ps(b, hi, acc[1]);
            }
        }
    }
    for (r, &acc) in acc.iter().enumerate().take(rows) {
        // SAFETY: lanes < `lanes` of row r < `rows` are in bounds and this tile's alone.
        let out = unsafe { std::slice::from_raw_parts_mut(dst.add(r * row), lanes) };
        store_lanes(acc, out, accumulate);
    }
}

#[cfg(test)]
mod tests {
    use super::super::available;
    use super::*;
    use crate::backend::cpu::conv::reference::{SAME_SIZE, reference};

    #[test]
    fn shifted_copies_sum_what_unfolding_does() {
        assert!(available(), "this test needs a CPU with AVX2 and FMA");
        let pool = Pool::default();
        let wide = Conv2dGeometry {
            n: 2,
            c: 20,
            h: 5,
            w: 19,
            dilation: [1, 2],
            padding: [1, 2],
            ..SAME_SIZE
        };
        let pointwise = Conv2dGeometry {
            kh: 1,
            kw: 1,
            padding: [0, 0],
            ..SAME_SIZE
        };
        for g in [SAME_SIZE, wide, pointwise] {
            let r = reference(&pool, g);
            let x: Vec<f32> = r.x.iter().map(|&v| v as f32).collect();
            let w: Vec<f32> = r.w.iter().map(|&v| v as f32).collect();
            let plan = ShiftedConv::plan(&pool, &w, &g, r.o, g.n).expect("a same-size stride-1 convolution");
            let pixels = g.h * g.w;
            let mut out = vec![f32::NAN; r.o * g.n * pixels];
            let mut scratch = vec![f32::NAN; plan.scratch_len()];
            let dst = Planes {
                image: pixels,
                channel: g.n * pixels,
            };
            // SAFETY: `out` holds o rows of n·pixels.
            unsafe { plan.run(&mut scratch, &x, Planes::nchw(&g), g.n, out.as_mut_ptr(), dst) };
            for (e, (&got, &want)) in out.iter().zip(&r.forward).enumerate() {
                assert!(
                    (got as f64 - want).abs() < 1e-4,
                    "{g:?}: element {e}: {got} against {want}"
                );
            }
        }
    }

    #[test]
    fn strided_or_resizing_convolutions_are_left_to_unfolding() {
        let pool = Pool::default();
        let w = vec![0f32; 5 * 9 * 9];
        let strided = Conv2dGeometry {
            stride: [2, 1],
            ..SAME_SIZE
        };
        let shrinking = Conv2dGeometry {
            padding: [0, 1],
            ..SAME_SIZE
        };
        assert!(ShiftedConv::plan(&pool, &w, &strided, 5, 1).is_none());
        assert!(ShiftedConv::plan(&pool, &w, &shrinking, 5, 1).is_none());
    }
}
