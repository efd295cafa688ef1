//! A stride-1 f32 convolution that keeps its image size (3x3 with padding 1, 1x1), summed on
//! AVX2 and FMA straight from copies of its images instead of unfolded columns.
//!
//! With the output as wide as the input, output pixel `q` of tap (ki, kj) reads input element
//! `q + r·w + s` of the flat plane (`r`, `s` the tap's row and column shifts): a constant offset
//! per tap, so a tile's 16 pixels of one tap are two vector loads. Where `q + s` would cross into
//! the next or previous row, it must read padding instead: one copy of the images per column
//! shift, with the columns that shift wraps into zeroed, and zero rows around every plane, makes
//! every such read land on a zero. The copies are `kw` times the images (3x for 3x3) where
//! unfolding writes `kh·kw` times (9x) and the product's packing copies them once more.

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;
use std::sync::OnceLock;

use rayon::prelude::*;

use super::conv::Planes;
use super::conv_fused::{Columns, image_ranges};
use super::pool::Pool;
use crate::backend::Conv2dGeometry;
use crate::dtype::HostVec;

/// Output channels a tile sums (weight rows broadcast one by one).
const MR: usize = 6;
/// Output pixels a tile sums: two vectors of eight.
const NR: usize = 16;
/// Terms of the sum per pass: a tile's vector side (KC loads of 64 bytes) stays in L1 while the
/// block's weight strips pass over it.
const KC: usize = 1024;
/// Weight rows per block: their KC-term slice (96 KB) stays in L2 while the panels pass.
const MC: usize = 16 * MR;

/// Whether this CPU has AVX2 and FMA.
pub fn available() -> bool {
    static AVAILABLE: OnceLock<bool> = OnceLock::new();
    #[cfg(target_arch = "x86_64")]
    let detect = || is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma");
    #[cfg(not(target_arch = "x86_64"))]
    let detect = || false;
    *AVAILABLE.get_or_init(detect)
}

/// Whether `g` is a convolution this path sums: stride 1 and an output the size of its input.
pub fn applies(g: &Conv2dGeometry) -> bool {
    g.stride == [1, 1] && (g.out_h(), g.out_w()) == (g.h, g.w) && g.h * g.w > 0 && g.c > 0 && available()
}

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
    let Some(plan) = ShiftedConv::plan(pool, weight, g, o) else {
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
        let mut scratch = pool.take::<f32>(plan.scratch_len(per));
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

/// A convolution's weight in tile strips, and where each term of its sum reads in the copies.
pub struct ShiftedConv {
    /// `[strip][term][MR]`: strip s holds rows s·MR.. (zeros past the last row).
    strips: Vec<f32>,
    rows: usize,
    terms: usize,
    /// Term t (channel, ki, kj)'s read offset from an output pixel's place in its image's copies.
    offsets: Vec<usize>,
    copies: Copies,
    g: Conv2dGeometry,
}

/// How a run's images lie in the copies: image i, shift j, channel ch's plane starts at
/// `i·image + j·shift + lead[j] + ch·channel`, with at least `margin` zeros either side. Each
/// shift's lead puts the reads of a tile's first pixel on a cache line's start where the rows
/// allow (widths of 16): a tile's 16 pixels of a tap are then one line, not parts of two.
#[derive(Clone)]
struct Copies {
    lead: Vec<usize>,
    channel: usize,
    shift: usize,
    image: usize,
}

/// Floats in a cache line, and the alignment of planes and copies.
const LINE: usize = 16;

impl ShiftedConv {
    /// The product of `weight` (`[rows, c·kh·kw]`) with the columns of `g`'s images; `None`
    /// where `g` is not a convolution this path sums.
    pub fn plan(pool: &Pool, weight: &[f32], g: &Conv2dGeometry, rows: usize) -> Option<ShiftedConv> {
        if !applies(g) {
            return None;
        }
        let (kernel, plane) = (g.kh * g.kw, g.h * g.w);
        let terms = g.c * kernel;
        let mut strips = pool.take::<f32>(rows.div_ceil(MR) * terms * MR);
        for (s, strip) in strips.chunks_exact_mut(terms * MR).enumerate() {
            for (t, lanes) in strip.chunks_exact_mut(MR).enumerate() {
                for (r, lane) in lanes.iter_mut().enumerate() {
                    let row = s * MR + r;
                    *lane = if row < rows { weight[row * terms + t] } else { 0.0 };
                }
            }
        }
        let shift_of = |k: usize, axis: usize| (k * g.dilation[axis]) as isize - g.padding[axis] as isize;
        // Reads reach `padding` rows and columns past the plane either way (same-size output).
        let margin = g.padding[0] * g.w + g.padding[1];
        let channel = (margin + plane).next_multiple_of(LINE);
        let lead: Vec<usize> = (0..g.kw)
            .map(|kj| (margin as isize + shift_of(kj, 1)).rem_euclid(LINE as isize) as usize)
            .map(|misaligned| margin + (LINE - misaligned) % LINE)
            .collect();
        // The last tile of a plane may run NR lanes past it: those lanes are read, not stored.
        let shift = (margin + LINE + g.c * channel + margin + NR).next_multiple_of(LINE);
        let copies = Copies {
            lead,
            channel,
            shift,
            image: g.kw * shift,
        };
        let mut offsets = Vec::with_capacity(terms);
        for ch in 0..g.c {
            for ki in 0..g.kh {
                for kj in 0..g.kw {
                    let within = shift_of(ki, 0) * g.w as isize + shift_of(kj, 1);
                    let base = kj * copies.shift + copies.lead[kj] + ch * copies.channel;
                    offsets.push(base.checked_add_signed(within).expect("reads stay within the margin"));
                }
            }
        }
        Some(ShiftedConv {
            strips,
            rows,
            terms,
            offsets,
            copies,
            g: *g,
        })
    }

    /// Scratch for the copies of `n` images (and a line to align them).
    pub fn scratch_len(&self, n: usize) -> usize {
        n * self.copies.image + LINE
    }

    /// The product over `n` images of `src` (planes at `src_planes`) into `dst`, row r of image
    /// i's pixels at `dst + i·dst_planes.image + r·dst_planes.channel`; `scratch` holds at
    /// least `scratch_len(n)`.
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
        let start = scratch.as_ptr().align_offset(LINE * 4).min(LINE);
        let scratch = &mut scratch[start..][..n * self.copies.image];
        self.copy_images(scratch, src, src_planes, n);
        // SAFETY: `available()` held when the plan was made (`applies`); the caller's promise
        // about `dst` is `sum`'s.
        #[cfg(target_arch = "x86_64")]
        unsafe {
            self.sum(scratch, n, dst, dst_planes)
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            let _ = (dst, dst_planes);
            unreachable!("plans are made only where AVX2 is available")
        }
    }

    /// `run` into images: `dst` is `[n, rows, h, w]`.
    pub fn images_into(&self, scratch: &mut [f32], src: &[f32], src_planes: Planes, n: usize, dst: &mut [f32]) {
        let plane = self.g.h * self.g.w;
        assert_eq!(dst.len(), n * self.rows * plane, "the images' gradient");
        let planes = Planes {
            image: self.rows * plane,
            channel: plane,
        };
        // SAFETY: `dst` holds exactly the n images of `rows` planes that `planes` reaches.
        unsafe { self.run(scratch, src, src_planes, n, dst.as_mut_ptr(), planes) }
    }

    /// `n` images of `src` into `copies`, one per column shift, each with the columns its
    /// shift wraps into zeroed and zeros between the planes.
    fn copy_images(&self, copies: &mut [f32], src: &[f32], src_planes: Planes, n: usize) {
        let g = &self.g;
        let (plane, layout) = (g.h * g.w, &self.copies);
        for (i, image) in copies.chunks_exact_mut(layout.image).take(n).enumerate() {
            for (kj, shifted) in image.chunks_exact_mut(layout.shift).enumerate() {
                let s = (kj * g.dilation[1]) as isize - g.padding[1] as isize;
                // Output column x reads column x + s; where that leaves the row the flat read
                // lands in these columns of the neighbouring row, which must read zero.
                let wrapped = if s < 0 {
                    g.w.saturating_sub(s.unsigned_abs())..g.w
                } else {
                    0..(s as usize).min(g.w)
                };
                let (lead, planes) = shifted.split_at_mut(layout.lead[kj]);
                lead.fill(0.0);
                for (ch, slot) in planes.chunks_mut(layout.channel).enumerate() {
                    if ch >= g.c {
                        slot.fill(0.0);
                        continue;
                    }
                    let source = &src[i * src_planes.image + ch * src_planes.channel..][..plane];
                    let (values, gap) = slot.split_at_mut(plane);
                    values.copy_from_slice(source);
                    gap.fill(0.0);
                    for row in values.chunks_exact_mut(g.w) {
                        row[wrapped.clone()].fill(0.0);
                    }
                }
            }
        }
    }

    /// The blocked loops over the copies: for each block of terms and of weight rows, every
    /// tile of every image.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn sum(&self, copies: &[f32], n: usize, dst: *mut f32, dst_planes: Planes) {
        let plane = self.g.h * self.g.w;
        let strip_count = self.rows.div_ceil(MR);
        for k0 in (0..self.terms).step_by(KC) {
            let k1 = (k0 + KC).min(self.terms);
            for s0 in (0..strip_count).step_by(MC / MR) {
                for i in 0..n {
                    let image = &copies[i * self.copies.image..][..self.copies.image];
                    for q0 in (0..plane).step_by(NR) {
                        for s in s0..(s0 + MC / MR).min(strip_count) {
                            let rows = MR.min(self.rows - s * MR);
                            let strip = &self.strips[(s * self.terms + k0) * MR..][..(k1 - k0) * MR];
                            let out = i * dst_planes.image + s * MR * dst_planes.channel + q0;
                            // SAFETY: the offsets were built to stay within an image's copies
                            // with NR lanes past any pixel of a plane (`Copies::shift` leaves
                            // them); `out` addresses rows < self.rows and pixels < plane of
                            // image i < n, which the caller vouched for.
                            unsafe {
                                tile(
                                    image.as_ptr().add(q0),
                                    &self.offsets[k0..k1],
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
    for (r, acc) in acc.iter().enumerate().take(rows) {
        let mut values = [0f32; NR];
        // SAFETY: `values` holds NR floats.
        unsafe {
            _mm256_storeu_ps(values.as_mut_ptr(), acc[0]);
            _mm256_storeu_ps(values.as_mut_ptr().add(8), acc[1]);
        }
        // SAFETY: lanes < `lanes` of row r < `rows` are in bounds and this tile's alone.
        let out = unsafe { std::slice::from_raw_parts_mut(dst.add(r * row), lanes) };
        if accumulate {
            out.iter_mut().zip(values).for_each(|(o, v)| *o += v);
        } else {
            out.copy_from_slice(&values[..lanes]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cpu::conv_fused::tests::{SAME_SIZE, reference};

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
            let plan = ShiftedConv::plan(&pool, &w, &g, r.o).expect("a same-size stride-1 convolution");
            let pixels = g.h * g.w;
            let mut out = vec![f32::NAN; r.o * g.n * pixels];
            let mut scratch = vec![f32::NAN; plan.scratch_len(g.n)];
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
        assert!(ShiftedConv::plan(&pool, &w, &strided, 5).is_none());
        assert!(ShiftedConv::plan(&pool, &w, &shrinking, 5).is_none());
    }
}
