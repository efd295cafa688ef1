//! The fused convolution (`conv_fused.rs`) for bf16 under autocast, on the bf16 dot-product
//! kernel, instead of the composed path's batch-wide bf16 columns and one large product. Each
//! image's columns are unfolded as bf16 (a copy) while in cache; products accumulate
//! in f32; the weight gradient sums every image in f32 and rounds once at the end (as the one
//! large product does); the input gradient's columns fold back in f32 and round once.

use half::bf16;
use rayon::prelude::*;

use super::conv::{col2im_image, im2col_image};
use super::conv_fused::{Columns, image_ranges, one_image, per_image_range};
use super::float::bf16_from_f32_slice;
use super::matmul::bf16::{Dst, Side, product};
use super::matmul::bf16_kernel;
use super::pool::Pool;
use crate::backend::Conv2dGeometry;
use crate::dtype::HostVec;

/// Whether this CPU has the kernel; the composed path runs where it has not.
pub fn available() -> bool {
    bf16_kernel::available()
}

/// Output pixels per image below which one batch-wide product beats per-image ones.
const MIN_PIXELS: usize = 256;

/// Whether the fused path runs for `g`: on the kernel, for images of many output pixels (where
/// the batch-wide columns are largest; small images' products are too small to fill the tiles).
pub fn pays(g: &Conv2dGeometry) -> bool {
    available() && g.out_h() * g.out_w() >= MIN_PIXELS
}

/// One task's scratch: an image's input gradient in f32, an image's columns in bf16.
struct Scratch {
    image: Vec<f32>,
    cols: Vec<bf16>,
}

impl Scratch {
    fn take(pool: &Pool, plane: usize, cols: usize) -> Scratch {
        Scratch {
            image: pool.take(plane),
            cols: pool.take(cols),
        }
    }

    /// Unfolds `x` (one image) into `self.cols` (taps x pixels, bf16).
    fn unfold(&mut self, x: &[bf16], image: &Conv2dGeometry) {
        im2col_image(x, &mut self.cols, image);
    }

    fn recycle(self, pool: &Pool) {
        pool.recycle(HostVec::F32(self.image));
        pool.recycle(HostVec::BF16(self.cols));
    }
}

/// `weight [o, c·kh·kw] @ im2col(x)` as `[o, n·oh·ow]`; call only where `available()`.
pub fn forward(pool: &Pool, x: &[bf16], weight: &[bf16], g: &Conv2dGeometry, o: usize) -> Vec<bf16> {
    let (taps, pixels, plane) = (g.c * g.kh * g.kw, g.out_h() * g.out_w(), g.c * g.h * g.w);
    let width = g.n * pixels;
    let mut out = pool.take::<bf16>(o * width);
    if taps == 0 || pixels == 0 {
        out.fill(bf16::ZERO);
        return out;
    }
    let image = one_image(g);
    let dst = Columns(out.as_mut_ptr());
    image_ranges(g.n).for_each(|images| {
        // The whole `Columns` (Send), not its raw pointer field (which is not).
        #[allow(clippy::redundant_locals)]
        let dst = dst;
        let mut scratch = Scratch::take(pool, plane, taps * pixels);
        for i in images {
            scratch.unfold(&x[i * plane..(i + 1) * plane], &image);
            let w = Side {
                data: weight,
                offset: 0,
                rows: o,
                row_stride: taps,
                k_stride: 1,
            };
            let cols = Side {
                data: &scratch.cols,
                offset: 0,
                rows: pixels,
                row_stride: 1,
                k_stride: pixels,
            };
            // SAFETY: `available()` holds (the caller's promise) and taps > 0; image i's block
            // of `out` (o x width) is o rows of `pixels` at column i·pixels, written by this
            // task alone.
            unsafe { product(pool, Dst::Bf16(dst.0.add(i * pixels)), width, w, cols, taps) };
        }
        scratch.recycle(pool);
    });
    out
}

/// The product's gradients from `grad` `[o, n·oh·ow]`: the input's `[n, c, h, w]` and the
/// weight's `[o, c·kh·kw]`, images in one contiguous range per thread, the ranges' f32 weight
/// sums added in order (deterministic); call only where `available()`.
pub fn backward(
    pool: &Pool,
    x: &[bf16],
    weight: &[bf16],
    grad: &[bf16],
    g: &Conv2dGeometry,
    o: usize,
) -> (Vec<bf16>, Vec<bf16>) {
    let (taps, pixels, plane) = (g.c * g.kh * g.kw, g.out_h() * g.out_w(), g.c * g.h * g.w);
    let width = g.n * pixels;
    let mut grad_x = pool.take::<bf16>(g.n * plane);
    let mut grad_w = pool.take::<bf16>(o * taps);
    if g.n == 0 || plane == 0 || taps == 0 || pixels == 0 || o == 0 {
        grad_x.fill(bf16::ZERO);
        grad_w.fill(bf16::ZERO);
        return (grad_x, grad_w);
    }
    let image = one_image(g);
    let partials = per_image_range(&mut grad_x, g.n, plane, |first, grad_x_range| {
        let mut partial = pool.take::<f32>(o * taps);
        partial.fill(0.0);
        let mut scratch = Scratch::take(pool, plane, taps * pixels);
        let mut grad_cols = pool.take::<f32>(taps * pixels);
        for (j, grad_x_image) in grad_x_range.chunks_mut(plane).enumerate() {
            let i = first + j;
            scratch.unfold(&x[i * plane..(i + 1) * plane], &image);
            // grad_i: o rows of `pixels` along k, at column i·pixels of `grad`.
            let grad_rows = Side {
                data: grad,
                offset: i * pixels,
                rows: o,
                row_stride: width,
                k_stride: 1,
            };
            let cols_by_tap = Side {
                data: &scratch.cols,
                offset: 0,
                rows: taps,
                row_stride: pixels,
                k_stride: 1,
            };
            let weight_by_tap = Side {
                data: weight,
                offset: 0,
                rows: taps,
                row_stride: 1,
                k_stride: taps,
            };
            let grad_by_pixel = Side {
                data: grad,
                offset: i * pixels,
                rows: pixels,
                row_stride: 1,
                k_stride: width,
            };
            // SAFETY: `available()` holds and pixels, o > 0; `partial` (o x taps) and
            // `grad_cols` (taps x pixels) are this task's own, contiguous.
            unsafe {
                // partial += grad_i @ cols_iᵀ
                product(
                    pool,
                    Dst::F32Add(partial.as_mut_ptr()),
                    taps,
                    grad_rows,
                    cols_by_tap,
                    pixels,
                );
                // grad_cols = weightᵀ @ grad_i
                product(
                    pool,
                    Dst::F32(grad_cols.as_mut_ptr()),
                    pixels,
                    weight_by_tap,
                    grad_by_pixel,
                    o,
                );
            }
            col2im_image(&grad_cols, &mut scratch.image, &image);
            bf16_from_f32_slice(grad_x_image, &scratch.image);
        }
        scratch.recycle(pool);
        pool.recycle(HostVec::F32(grad_cols));
        partial
    });
    let mut sum = pool.take::<f32>(o * taps);
    sum.fill(0.0);
    for partial in partials {
        sum.iter_mut().zip(&partial).for_each(|(s, p)| *s += p);
        pool.recycle(HostVec::F32(partial));
    }
    bf16_from_f32_slice(&mut grad_w, &sum);
    pool.recycle(HostVec::F32(sum));
    (grad_x, grad_w)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cpu::conv_fused::tests::reference;

    /// The bf16 product and both gradients against the f64 loops over the same values (exact in
    /// bf16). Only where the CPU has the kernel (it says so otherwise).
    #[test]
    fn the_bf16_fused_product_and_its_gradients_match_plain_loops() {
        if !available() {
            eprintln!("\n*** SKIPPED: this CPU has no AVX512-BF16; the composed path runs instead ***\n");
            return;
        }
        let pool = Pool::default();
        let r = reference(&pool);
        let narrow = |v: &[f64]| v.iter().map(|&x| bf16::from_f64(x)).collect::<Vec<bf16>>();
        let (x, w, grad) = (narrow(&r.x), narrow(&r.w), narrow(&r.grad));
        // Each result is rounded to bf16 once: within half a bf16 ulp of the exact value.
        let close = |got: &[bf16], want: &[f64]| {
            got.len() == want.len()
                && got
                    .iter()
                    .zip(want)
                    .all(|(g, w)| (g.to_f64() - w).abs() <= w.abs() * 2f64.powi(-8) + 1e-6)
        };
        assert!(close(&forward(&pool, &x, &w, &r.g, r.o), &r.forward));
        let (grad_x, grad_w) = backward(&pool, &x, &w, &grad, &r.g, r.o);
        assert!(close(&grad_w, &r.grad_w));
        assert!(close(&grad_x, &r.grad_x));
    }
}
