//! A convolution's product one image at a time. Unfolding the whole batch first (`im2col`)
//! makes a ResNet layer's columns 150 MB at batch 64, written once and read back by one large
//! GEMM; here each thread unfolds one image into columns that stay in its cache (2.3 MB for
//! 64 channels of 32x32) and multiplies them at once, single-threaded, while the other threads
//! do other images. The results are laid out as the composed path's: `[o, n·oh·ow]`.

use rayon::prelude::*;

use super::conv::{col2im_image, im2col_image};
use super::float::CpuFloat;
use super::matmul::GemmElement;
use super::pool::Pool;
use crate::backend::Conv2dGeometry;

/// A pointer the image tasks share, each writing only its own columns of the output.
#[derive(Clone, Copy)]
pub(super) struct Columns<T>(pub(super) *mut T);
// SAFETY: the tasks that receive it write disjoint elements (image i's columns i·p..(i+1)·p of
// every row), and the buffer outlives them (the parallel loop ends before it is returned).
unsafe impl<T: Send> Send for Columns<T> {}
// SAFETY: as above; no element is read or written by two tasks.
unsafe impl<T: Send> Sync for Columns<T> {}

/// `dst = (accumulate ? dst : 0) + a @ b` on one thread, for an `m x k` by `k x n` product; each
/// matrix given by its first element and its (row, column) strides in elements.
///
/// # Safety
/// Every element the strides reach must be in bounds of its allocation, and `dst`'s must not
/// overlap `a`'s or `b`'s nor be touched by another thread meanwhile.
#[allow(clippy::too_many_arguments)]
unsafe fn product<T: GemmElement>(
    (m, n, k): (usize, usize, usize),
    dst: *mut T,
    dst_strides: (usize, usize),
    a: *const T,
    a_strides: (usize, usize),
    b: *const T,
    b_strides: (usize, usize),
    accumulate: bool,
) {
    // SAFETY: the caller's promises are gemm's.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst,
            dst_strides.1 as isize,
            dst_strides.0 as isize,
            accumulate,
            a,
            a_strides.1 as isize,
            a_strides.0 as isize,
            b,
            b_strides.1 as isize,
            b_strides.0 as isize,
            T::one(),
            T::one(),
            false,
            false,
            false,
            gemm::Parallelism::None,
        );
    }
}

/// Images per task: one contiguous range per thread, so each allocates its scratch once.
pub(super) fn images_per_range(n: usize) -> usize {
    n.div_ceil(rayon::current_num_threads()).max(1)
}

/// The batch's `n` images as one contiguous range per thread, in parallel.
pub(super) fn image_ranges(n: usize) -> impl ParallelIterator<Item = std::ops::Range<usize>> {
    let per_range = images_per_range(n);
    (0..n.div_ceil(per_range))
        .into_par_iter()
        .map(move |r| r * per_range..((r + 1) * per_range).min(n))
}

/// The backward passes' split: `grad_x` (`n` images of `plane` elements) cut into one
/// contiguous range of images per thread, `range(first_image, its_grad_x)` filling its part and
/// returning its partial weight gradient; the partials in range order, so summing them in order
/// does not depend on scheduling.
pub(super) fn per_image_range<T: Send, P: Send>(
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

/// The geometry of one image of `g`'s batch.
pub(super) fn one_image(g: &Conv2dGeometry) -> Conv2dGeometry {
    Conv2dGeometry { n: 1, ..*g }
}

/// `weight [o, c·kh·kw] @ im2col(x)` as `[o, n·oh·ow]` (one group).
pub fn forward<T: GemmElement + CpuFloat>(pool: &Pool, x: &[T], weight: &[T], g: &Conv2dGeometry, o: usize) -> Vec<T> {
    let (taps, pixels) = (g.c * g.kh * g.kw, g.out_h() * g.out_w());
    let width = g.n * pixels;
    let mut out = pool.take::<T>(o * width);
    if taps == 0 {
        out.fill(T::zero());
        return out;
    }
    let image = one_image(g);
    let dst = Columns(out.as_mut_ptr());
    image_ranges(g.n).for_each(|images| {
        // The whole `Columns` (Send), not its raw pointer field (which is not).
        #[allow(clippy::redundant_locals)]
        let dst = dst;
        let mut cols = pool.take::<T>(taps * pixels);
        for i in images {
            im2col_image(&x[i * g.c * g.h * g.w..(i + 1) * g.c * g.h * g.w], &mut cols, &image);
            // SAFETY: `out` is o x width; image i's block starts at column i·pixels and spans
            // `pixels` columns of every row (row stride `width`), written by this task alone.
            // `weight` is o x taps and `cols` taps x pixels, both contiguous.
            unsafe {
                product(
                    (o, pixels, taps),
                    dst.0.add(i * pixels),
                    (width, 1),
                    weight.as_ptr(),
                    (taps, 1),
                    cols.as_ptr(),
                    (pixels, 1),
                    false,
                );
            }
        }
        pool.recycle(T::into_host(cols));
    });
    out
}

/// The product's gradients from `grad` `[o, n·oh·ow]`: the input's `[n, c, h, w]` and the
/// weight's `[o, c·kh·kw]`. Images are split into one contiguous range per thread; each range
/// sums its own weight gradient, and the ranges' sums are added in order, so the result does
/// not depend on scheduling.
pub fn backward<T: GemmElement + CpuFloat>(
    pool: &Pool,
    x: &[T],
    weight: &[T],
    grad: &[T],
    g: &Conv2dGeometry,
    o: usize,
) -> (Vec<T>, Vec<T>) {
    let (taps, pixels, plane) = (g.c * g.kh * g.kw, g.out_h() * g.out_w(), g.c * g.h * g.w);
    let width = g.n * pixels;
    let mut grad_x = pool.take::<T>(g.n * plane);
    let mut grad_w = pool.take::<T>(o * taps);
    grad_w.fill(T::zero());
    if g.n == 0 || plane == 0 || taps == 0 {
        grad_x.fill(T::zero());
        return (grad_x, grad_w);
    }
    let image = one_image(g);
    let partials = per_image_range(&mut grad_x, g.n, plane, |first, grad_x_range| {
        // Written whole by the range's first image (no accumulation), then summed into.
        let mut partial = pool.take::<T>(o * taps);
        let (mut cols, mut grad_cols) = (pool.take::<T>(taps * pixels), pool.take::<T>(taps * pixels));
        for (j, grad_x_image) in grad_x_range.chunks_mut(plane).enumerate() {
            let i = first + j;
            im2col_image(&x[i * plane..(i + 1) * plane], &mut cols, &image);
            let grad_image = grad[i * pixels..].as_ptr();
            // SAFETY: `grad` is o x width, image i's block at column i·pixels with row stride
            // `width`; `cols` and `grad_cols` are taps x pixels, `partial` o x taps and
            // `weight` o x taps, all contiguous and owned or borrowed by this task alone.
            unsafe {
                // partial += grad_i @ cols_iᵀ: cols read as pixels x taps.
                product(
                    (o, taps, pixels),
                    partial.as_mut_ptr(),
                    (taps, 1),
                    grad_image,
                    (width, 1),
                    cols.as_ptr(),
                    (1, pixels),
                    j > 0,
                );
                // grad_cols = weightᵀ @ grad_i: weight read as taps x o.
                product(
                    (taps, pixels, o),
                    grad_cols.as_mut_ptr(),
                    (pixels, 1),
                    weight.as_ptr(),
                    (1, taps),
                    grad_image,
                    (width, 1),
                    false,
                );
            }
            col2im_image(&grad_cols, grad_x_image, &image);
        }
        pool.recycle(T::into_host(cols));
        pool.recycle(T::into_host(grad_cols));
        partial
    });
    for partial in partials {
        grad_w.iter_mut().zip(&partial).for_each(|(w, &p)| *w = *w + p);
        pool.recycle(T::into_host(partial));
    }
    (grad_x, grad_w)
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// A convolution's inputs and its results by plain loops in f64, for the fused paths to
    /// match: strides, padding, dilation, an odd tap count (27) and a batch that does not divide
    /// among the threads. The values are multiples of 1/8 in [-1, 1], exact in bf16 too.
    pub struct Reference {
        pub g: Conv2dGeometry,
        pub o: usize,
        pub x: Vec<f64>,
        pub w: Vec<f64>,
        pub grad: Vec<f64>,
        pub forward: Vec<f64>,
        pub grad_x: Vec<f64>,
        pub grad_w: Vec<f64>,
    }

    pub fn reference(pool: &Pool) -> Reference {
        let g = Conv2dGeometry {
            n: 5,
            c: 3,
            h: 7,
            w: 6,
            kh: 3,
            kw: 3,
            stride: [2, 1],
            padding: [1, 1],
            dilation: [1, 2],
        };
        let o = 4;
        let (taps, width) = (g.c * g.kh * g.kw, g.n * g.out_h() * g.out_w());
        let value = |i: usize, salt: usize| ((i * 7 + salt * 13) % 17) as f64 / 8.0 - 1.0;
        let x: Vec<f64> = (0..g.n * g.c * g.h * g.w).map(|i| value(i, 1)).collect();
        let w: Vec<f64> = (0..o * taps).map(|i| value(i, 2)).collect();
        let grad: Vec<f64> = (0..o * width).map(|i| value(i, 3)).collect();
        let cols = super::super::conv::im2col(pool, &x, &g);
        let matmul = |a: &dyn Fn(usize, usize) -> f64, b: &dyn Fn(usize, usize) -> f64, m, k, n| {
            (0..m * n)
                .map(|e| (0..k).map(|t| a(e / n, t) * b(t, e % n)).sum::<f64>())
                .collect::<Vec<f64>>()
        };
        let forward = matmul(&|r, t| w[r * taps + t], &|t, p| cols[t * width + p], o, taps, width);
        let grad_w = matmul(&|r, p| grad[r * width + p], &|p, t| cols[t * width + p], o, width, taps);
        let grad_cols = matmul(&|t, r| w[r * taps + t], &|r, p| grad[r * width + p], taps, o, width);
        let grad_x = super::super::conv::col2im(pool, &grad_cols, &g);
        Reference {
            g,
            o,
            x,
            w,
            grad,
            forward,
            grad_x,
            grad_w,
        }
    }

    #[test]
    fn the_fused_product_and_its_gradients_match_plain_loops() {
        let pool = Pool::default();
        let r = reference(&pool);
        let close = |a: &[f64], b: &[f64]| a.iter().zip(b).all(|(x, y)| (x - y).abs() < 1e-9) && a.len() == b.len();
        assert!(close(&forward(&pool, &r.x, &r.w, &r.g, r.o), &r.forward));
        let (grad_x, grad_w) = backward(&pool, &r.x, &r.w, &r.grad, &r.g, r.o);
        assert!(close(&grad_w, &r.grad_w));
        assert!(close(&grad_x, &r.grad_x));
    }
}
