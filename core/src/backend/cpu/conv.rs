//! im2col / col2im (convolution as GEMM) and max pooling over contiguous NCHW tensors.

use rayon::prelude::*;

use super::float::CpuFloat;
use super::pool::Pool;
use crate::backend::{Conv2dGeometry, Pool2dGeometry};

/// Input row/column read by output position `o` and kernel tap `k`, or None where it is padding.
#[inline]
fn source(o: usize, k: usize, stride: usize, dilation: usize, pad: usize, size: usize) -> Option<usize> {
    (o * stride + k * dilation).checked_sub(pad).filter(|&i| i < size)
}

/// `[n, c, h, w]` -> `[n, c*kh*kw, oh*ow]`.
pub fn im2col<T: CpuFloat>(pool: &Pool, src: &[T], g: &Conv2dGeometry) -> Vec<T> {
    let (oh, ow) = (g.out_h(), g.out_w());
    let plane = oh * ow;
    let mut out = pool.take::<T>(g.n * g.c * g.kh * g.kw * plane);
    if plane == 0 {
        return out;
    }
    // One chunk per (image, channel): kh*kw rows of oh*ow columns.
    out.par_chunks_mut(g.kh * g.kw * plane).enumerate().for_each(|(nc, chunk)| {
        let img = &src[nc * g.h * g.w..(nc + 1) * g.h * g.w];
        for ki in 0..g.kh {
            for kj in 0..g.kw {
                let row = &mut chunk[(ki * g.kw + kj) * plane..(ki * g.kw + kj + 1) * plane];
                for y in 0..oh {
                    let dst = &mut row[y * ow..(y + 1) * ow];
                    match source(y, ki, g.stride[0], g.dilation[0], g.padding[0], g.h) {
                        None => dst.fill(T::zero()),
                        Some(iy) => {
                            for (x, d) in dst.iter_mut().enumerate() {
                                *d = source(x, kj, g.stride[1], g.dilation[1], g.padding[1], g.w).map_or(T::zero(), |ix| img[iy * g.w + ix]);
                            }
                        }
                    }
                }
            }
        }
    });
    out
}

/// The adjoint of `im2col`: `[n, c*kh*kw, oh*ow]` -> `[n, c, h, w]`, summing overlaps.
pub fn col2im<T: CpuFloat>(pool: &Pool, cols: &[T], g: &Conv2dGeometry) -> Vec<T> {
    let (oh, ow) = (g.out_h(), g.out_w());
    let plane = oh * ow;
    let mut out = pool.take::<T>(g.n * g.c * g.h * g.w);
    out.fill(T::zero());
    if g.h * g.w == 0 {
        return out;
    }
    out.par_chunks_mut(g.h * g.w).enumerate().for_each(|(nc, img)| {
        let chunk = &cols[nc * g.kh * g.kw * plane..(nc + 1) * g.kh * g.kw * plane];
        for ki in 0..g.kh {
            for kj in 0..g.kw {
                let row = &chunk[(ki * g.kw + kj) * plane..(ki * g.kw + kj + 1) * plane];
                for y in 0..oh {
                    let Some(iy) = source(y, ki, g.stride[0], g.dilation[0], g.padding[0], g.h) else { continue };
                    for x in 0..ow {
                        if let Some(ix) = source(x, kj, g.stride[1], g.dilation[1], g.padding[1], g.w) {
                            img[iy * g.w + ix] = img[iy * g.w + ix] + row[y * ow + x];
                        }
                    }
                }
            }
        }
    });
    out
}

/// Max over each window; the index is the flat position `iy*w + ix` within the input plane.
pub fn max_pool2d<T: CpuFloat>(pool: &Pool, src: &[T], g: &Pool2dGeometry) -> (Vec<T>, Vec<u32>) {
    let (oh, ow) = (g.out_h(), g.out_w());
    let plane = oh * ow;
    let mut values = pool.take::<T>(g.n * g.c * plane);
    let mut indices = pool.take::<u32>(g.n * g.c * plane);
    if plane == 0 {
        return (values, indices);
    }
    values.par_chunks_mut(plane).zip(indices.par_chunks_mut(plane)).enumerate().for_each(|(nc, (vals, idx))| {
        let img = &src[nc * g.h * g.w..(nc + 1) * g.h * g.w];
        for y in 0..oh {
            for x in 0..ow {
                let mut best = (u32::MAX, T::neg_infinity());
                for ki in 0..g.kernel[0] {
                    let Some(iy) = source(y, ki, g.stride[0], 1, g.padding[0], g.h) else { continue };
                    for kj in 0..g.kernel[1] {
                        let Some(ix) = source(x, kj, g.stride[1], 1, g.padding[1], g.w) else { continue };
                        let v = img[iy * g.w + ix];
                        if best.0 == u32::MAX || v > best.1 || v.is_nan() {
                            best = ((iy * g.w + ix) as u32, v);
                        }
                    }
                }
                vals[y * ow + x] = best.1;
                idx[y * ow + x] = best.0;
            }
        }
    });
    (values, indices)
}
