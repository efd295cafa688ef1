//! im2col / col2im (convolution as GEMM) over contiguous NCHW tensors.

use rayon::prelude::*;

use crate::backend::Conv2dGeometry;
use crate::backend::cpu::float::CpuFloat;
use crate::backend::cpu::pool::Pool;
use crate::backend::cpu::simd::{Kernel, wide};
use crate::dtype::Element;

/// Input row/column read by output position `o` and kernel tap `k`, or None where it is padding.
#[inline]
fn source(o: usize, k: usize, stride: usize, dilation: usize, pad: usize, size: usize) -> Option<usize> {
    (o * stride + k * dilation).checked_sub(pad).filter(|&i| i < size)
}

/// `[n, c, h, w]` -> `[c*kh*kw, n*oh*ow]`: one row per (channel, tap), the batch in the
/// columns, so a convolution is a single GEMM.
pub fn im2col<T: CpuFloat>(pool: &Pool, src: &[T], g: &Conv2dGeometry) -> Vec<T> {
    let cols = g.n * g.out_h() * g.out_w();
    let mut out = pool.take::<T>(g.c * g.kh * g.kw * cols);
    if cols == 0 {
        return out;
    }
    out.par_chunks_mut(cols)
        .enumerate()
        .for_each(|(r, row)| im2col_tap(src, Planes::nchw(g), row, r, g));
    out
}

/// Where a source's plane (image n, channel c) starts: `n * image + c * channel` elements in.
#[derive(Clone, Copy)]
pub struct Planes {
    pub image: usize,
    pub channel: usize,
}

impl Planes {
    /// A contiguous `[n, c, h, w]` tensor's planes.
    pub fn nchw(g: &Conv2dGeometry) -> Planes {
        Planes {
            image: g.c * g.h * g.w,
            channel: g.h * g.w,
        }
    }
}

/// `im2col` of `g.n` images into the start of `out`, on this thread: the fused convolution's
/// columns for the images one product covers.
/// Only copies, so any element type (bf16 unfolds as itself, with no widening).
pub fn im2col_images<T: Element>(src: &[T], out: &mut [T], g: &Conv2dGeometry) {
    im2col_planes(src, Planes::nchw(g), out, g)
}

/// `im2col_images` of a source whose planes lie at `planes` (a `[c, n, h, w]` output gradient
/// unfolds in place).
pub fn im2col_planes<T: Element>(src: &[T], planes: Planes, out: &mut [T], g: &Conv2dGeometry) {
    let cols = g.n * g.out_h() * g.out_w();
    if cols == 0 {
        return;
    }
    out[..g.c * g.kh * g.kw * cols]
        .chunks_mut(cols)
        .enumerate()
        .for_each(|(r, row)| im2col_tap(src, planes, row, r, g));
}

/// Fills row `r` = (channel, ki, kj) of the columns for every image.
pub fn im2col_tap<T: Element>(src: &[T], planes: Planes, row: &mut [T], r: usize, g: &Conv2dGeometry) {
    let zero = T::from_f64(0.0);
    let (oh, ow) = (g.out_h(), g.out_w());
    let (c, ki, kj) = (r / (g.kh * g.kw), (r / g.kw) % g.kh, r % g.kw);
    let (x_lo, x_hi) = valid_range(ow, kj, g.stride[1], g.dilation[1], g.padding[1], g.w);
    let shifted = g.stride == [1, 1] && ow == g.w;
    for (n, block) in row.chunks_mut(oh * ow).enumerate() {
        let start = n * planes.image + c * planes.channel;
        let img = &src[start..start + g.h * g.w];
        if shifted {
            unfold_shifted(img, block, (ki, kj), (x_lo, x_hi), g);
            continue;
        }
        for y in 0..oh {
            let dst = &mut block[y * ow..(y + 1) * ow];
            let Some(iy) = source(y, ki, g.stride[0], g.dilation[0], g.padding[0], g.h) else {
                dst.fill(zero);
                continue;
            };
            dst[..x_lo].fill(zero);
            dst[x_hi..].fill(zero);
            if x_lo == x_hi {
                continue;
            }
            // Input column of output column x is x*stride + start.
            let start = iy * g.w + x_lo * g.stride[1] + kj * g.dilation[1] - g.padding[1];
            let len = x_hi - x_lo;
            if g.stride[1] == 1 {
                dst[x_lo..x_hi].copy_from_slice(&img[start..start + len]);
            } else {
                let src = &img[start..start + (len - 1) * g.stride[1] + 1];
                wide(Strided(&mut dst[x_lo..x_hi], src, g.stride[1]));
            }
        }
    }
}

/// `dst[j] = src[j * stride]`, run by `simd::wide`; stride 2 (a downsampling convolution's) as
/// a loop of its own, which the compiler vectorises (it stayed a scalar gather).
struct Strided<'a, T>(&'a mut [T], &'a [T], usize);
impl<T: Element> Kernel for Strided<'_, T> {
    type Out = ();
    #[inline(always)]
    fn run(self) {
        let Strided(dst, src, stride) = self;
        let Some((last, head)) = dst.split_last_mut() else {
            return;
        };
        *last = src[head.len() * stride];
        if stride == 2 {
            for (d, pair) in head.iter_mut().zip(src.chunks_exact(2)) {
                *d = pair[0];
            }
        } else {
            for (j, d) in head.iter_mut().enumerate() {
                *d = src[j * stride];
            }
        }
    }
}

/// One tap's row of one image where the unfolding keeps the width (stride 1, `out_w == w`):
/// output pixel j reads input pixel j + shift for one shift, so the valid rows copy as one run
/// and only the columns that wrapped into a neighbouring row are zeroed. (Row by row, a 4x4
/// image's taps were copied 4 elements at a time.)
fn unfold_shifted<T: Element>(
    img: &[T],
    block: &mut [T],
    (ki, kj): (usize, usize),
    (x_lo, x_hi): (usize, usize),
    g: &Conv2dGeometry,
) {
    let zero = T::from_f64(0.0);
    let w = g.w;
    let (y_lo, y_hi) = valid_range(g.out_h(), ki, 1, g.dilation[0], g.padding[0], g.h);
    if x_lo >= x_hi || y_lo >= y_hi {
        block.fill(zero);
        return;
    }
    let shift = (ki * g.dilation[0]) as isize - g.padding[0] as isize;
    let shift = shift * w as isize + (kj * g.dilation[1]) as isize - g.padding[1] as isize;
    // Within the valid rows, clipped to the input plane; what the clipping leaves out lies in
    // columns that wrapped, zeroed below.
    let first = ((y_lo * w) as isize).max(-shift) as usize;
    let end = ((y_hi * w) as isize)
        .min(img.len() as isize - shift)
        .max(first as isize) as usize;
    block[..first].fill(zero);
    block[end..].fill(zero);
    let from = (first as isize + shift) as usize;
    block[first..end].copy_from_slice(&img[from..from + (end - first)]);
    // Column by column, strided: a row's edge is a padding's width (one element), and a fill
    // per row edge was a call to memset each.
    for x in (0..x_lo).chain(x_hi..w) {
        block[y_lo * w + x..y_hi * w]
            .iter_mut()
            .step_by(w)
            .for_each(|v| *v = zero);
    }
}

/// The output positions `lo..hi` whose input index `o*stride + k*dilation - pad` lies in
/// `0..size`, so the inner loops need no bounds test per element.
fn valid_range(out_len: usize, k: usize, stride: usize, dilation: usize, pad: usize, size: usize) -> (usize, usize) {
    let reach = k * dilation;
    let lo = pad.saturating_sub(reach).div_ceil(stride);
    let hi = if size + pad > reach {
        ((size + pad - reach - 1) / stride + 1).min(out_len)
    } else {
        0
    };
    (lo.min(hi), hi)
}

/// The adjoint of `im2col`: `[c*kh*kw, n*oh*ow]` -> `[n, c, h, w]`, summing overlaps.
pub fn col2im<T: CpuFloat>(pool: &Pool, cols: &[T], g: &Conv2dGeometry) -> Vec<T> {
    let mut out = pool.take::<T>(g.n * g.c * g.h * g.w);
    out.fill(T::zero());
    if g.h * g.w == 0 {
        return out;
    }
    // Image planes are disjoint, so each (n, c) plane gathers its own taps in parallel.
    out.par_chunks_mut(g.h * g.w)
        .enumerate()
        .for_each(|(nc, img)| wide(Col2imPlane(cols, img, (nc / g.c, nc % g.c), g)));
    out
}

/// `col2im` of `g.n` images into `images` `[n, c, h, w]`, on this thread.
pub fn col2im_images<T: CpuFloat>(cols: &[T], images: &mut [T], g: &Conv2dGeometry) {
    images.fill(T::zero());
    if g.h * g.w == 0 {
        return;
    }
    images
        .chunks_mut(g.h * g.w)
        .enumerate()
        .for_each(|(nc, plane)| wide(Col2imPlane(cols, plane, (nc / g.c, nc % g.c), g)));
}

/// `col2im_plane` of (image, channel), run by `simd::wide`.
struct Col2imPlane<'a, T>(&'a [T], &'a mut [T], (usize, usize), &'a Conv2dGeometry);
impl<T: CpuFloat> Kernel for Col2imPlane<'_, T> {
    type Out = ();
    #[inline(always)]
    fn run(self) {
        let Col2imPlane(cols, plane, (n, c), g) = self;
        col2im_plane(cols, plane, n, c, g)
    }
}

/// Sums the taps of channel `c` of image `n` back into its `h x w` plane.
#[inline(always)]
fn col2im_plane<T: CpuFloat>(cols: &[T], img: &mut [T], n: usize, c: usize, g: &Conv2dGeometry) {
    let (oh, ow) = (g.out_h(), g.out_w());
    let width = g.n * oh * ow;
    for ki in 0..g.kh {
        for kj in 0..g.kw {
            let r = (c * g.kh + ki) * g.kw + kj;
            let block = &cols[r * width + n * oh * ow..r * width + (n + 1) * oh * ow];
            let (x_lo, x_hi) = valid_range(ow, kj, g.stride[1], g.dilation[1], g.padding[1], g.w);
            if x_lo == x_hi {
                continue;
            }
            for y in 0..oh {
                let Some(iy) = source(y, ki, g.stride[0], g.dilation[0], g.padding[0], g.h) else {
                    continue;
                };
                let start = iy * g.w + x_lo * g.stride[1] + kj * g.dilation[1] - g.padding[1];
                let src = &block[y * ow + x_lo..y * ow + x_hi];
                if g.stride[1] == 1 {
                    let dst = &mut img[start..start + src.len()];
                    for (j, d) in dst.iter_mut().enumerate() {
                        *d = *d + src[j];
                    }
                } else {
                    for (j, &s) in src.iter().enumerate() {
                        img[start + j * g.stride[1]] = img[start + j * g.stride[1]] + s;
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Column `n·oh·ow + y·ow + x` of row `(c, ki, kj)`, from the definition.
    fn unfolded(src: &[f32], planes: Planes, g: &Conv2dGeometry, r: usize, column: usize) -> f32 {
        let (oh, ow) = (g.out_h(), g.out_w());
        let (c, ki, kj) = (r / (g.kh * g.kw), (r / g.kw) % g.kh, r % g.kw);
        let (n, y, x) = (column / (oh * ow), column % (oh * ow) / ow, column % ow);
        let iy = (y * g.stride[0] + ki * g.dilation[0]) as isize - g.padding[0] as isize;
        let ix = (x * g.stride[1] + kj * g.dilation[1]) as isize - g.padding[1] as isize;
        if iy < 0 || ix < 0 || iy >= g.h as isize || ix >= g.w as isize {
            return 0.0;
        }
        src[n * planes.image + c * planes.channel + iy as usize * g.w + ix as usize]
    }

    #[test]
    fn images_unfold_as_the_definition_says() {
        let geometry = |n, c, (h, w), (kh, kw), stride, padding, dilation| Conv2dGeometry {
            n,
            c,
            h,
            w,
            kh,
            kw,
            stride,
            padding,
            dilation,
        };
        for g in [
            // ResNet's 4x4 and 8x8 (rows copied as one shifted run), strided, dilated, uneven.
            geometry(3, 2, (4, 4), (3, 3), [1, 1], [1, 1], [1, 1]),
            geometry(2, 3, (8, 8), (3, 3), [2, 2], [1, 1], [1, 1]),
            geometry(2, 2, (5, 7), (3, 2), [1, 2], [2, 1], [2, 1]),
            geometry(2, 2, (4, 4), (1, 1), [2, 2], [0, 0], [1, 1]),
            geometry(2, 2, (9, 9), (3, 3), [1, 1], [1, 1], [1, 1]),
            geometry(1, 2, (17, 12), (3, 3), [2, 1], [1, 2], [1, 2]),
        ] {
            let (rows, cols) = (g.c * g.kh * g.kw, g.n * g.out_h() * g.out_w());
            // Channels apart from images (a `[c, n, h, w]` source) as well as `[n, c, h, w]`.
            let area = g.h * g.w;
            for planes in [
                Planes::nchw(&g),
                Planes {
                    image: area,
                    channel: g.n * area,
                },
            ] {
                let src: Vec<f32> = (0..g.n * g.c * area).map(|i| i as f32 + 1.0).collect();
                let mut out = vec![f32::NAN; rows * cols + 3];
                im2col_planes(&src, planes, &mut out, &g);
                for r in 0..rows {
                    for column in 0..cols {
                        let expected = unfolded(&src, planes, &g, r, column);
                        assert_eq!(out[r * cols + column], expected, "{g:?}: row {r}, column {column}");
                    }
                }
                assert!(
                    out[rows * cols..].iter().all(|v| v.is_nan()),
                    "{g:?}: wrote past the columns"
                );
            }
        }
    }
}
