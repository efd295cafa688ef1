//! Max pooling over contiguous NCHW tensors: each window's maximum and the flat index it came
//! from, which the backward pass scatters the gradient to.

use rayon::prelude::*;

use super::float::CpuFloat;
use super::pool::Pool;
use crate::backend::Pool2dGeometry;

/// Max over each window; the index is the flat position `iy*w + ix` within the input plane.
pub fn max_pool2d<T: CpuFloat>(pool: &Pool, src: &[T], g: &Pool2dGeometry) -> (Vec<T>, Vec<u32>) {
    let (oh, ow) = (g.out_h(), g.out_w());
    let plane = oh * ow;
    let mut values = pool.take::<T>(g.n * g.c * plane);
    let mut indices = pool.take::<u32>(g.n * g.c * plane);
    if plane == 0 {
        return (values, indices);
    }
    values
        .par_chunks_mut(plane)
        .zip(indices.par_chunks_mut(plane))
        .enumerate()
        .for_each(|(nc, (vals, idx))| max_pool_plane(&src[nc * g.h * g.w..(nc + 1) * g.h * g.w], vals, idx, g));
    (values, indices)
}

/// Max over each window of one plane; padding never wins (it is -inf).
fn max_pool_plane<T: CpuFloat>(img: &[T], vals: &mut [T], idx: &mut [u32], g: &Pool2dGeometry) {
    let (oh, ow) = (g.out_h(), g.out_w());
    for y in 0..oh {
        // The window's rows and columns clipped to the image, computed once per output.
        let y0 = (y * g.stride[0]).saturating_sub(g.padding[0]);
        let y1 = (y * g.stride[0] + g.kernel[0]).saturating_sub(g.padding[0]).min(g.h);
        for x in 0..ow {
            let x0 = (x * g.stride[1]).saturating_sub(g.padding[1]);
            let x1 = (x * g.stride[1] + g.kernel[1]).saturating_sub(g.padding[1]).min(g.w);
            // Every window holds at least one input (padding is at most half the kernel).
            let mut best = (y0 * g.w + x0, img[y0 * g.w + x0]);
            for iy in y0..y1 {
                for ix in x0..x1 {
                    let v = img[iy * g.w + ix];
                    // NaN propagates, as in PyTorch.
                    if v > best.1 || (v.is_nan() && !best.1.is_nan()) {
                        best = (iy * g.w + ix, v);
                    }
                }
            }
            let best = (best.0 as u32, best.1);
            vals[y * ow + x] = best.1;
            idx[y * ow + x] = best.0;
        }
    }
}
