//! A convolution's product a few images at a time. Unfolding the whole batch first (`im2col`)
//! makes a ResNet layer's columns 150 MB at batch 64, written once and read back by one large
//! GEMM; here each thread unfolds one image (or, for small images, a few: see
//! `images_per_product`) into columns that stay in its cache (2.3 MB for 64 channels of 32x32)
//! and multiplies them at once, single-threaded, while the other threads do other images. The
//! results are laid out as the composed path's: `[o, n·oh·ow]`. The plan (`conv/mod.rs`) says
//! which path each pass takes: these runs of unfolded images, or in f32 the shifted copies
//! (`shifted`) or output positions (`positions`); the input gradient folded back, or as a
//! transposed convolution (`transposed`).

use rayon::prelude::*;

use super::ranges::{Columns, image_ranges, images_for_columns, per_image_range, products, staging_len};
use super::shifted::{self, Scratch, ShiftedConv, WeightGradient};
use super::transposed::Transposed;
use super::unfold::{Planes, col2im_images, im2col_images};
use super::{Forward, InputGrad, Plan, WeightGrad};
use crate::backend::Conv2dGeometry;
use crate::backend::cpu::float::CpuFloat;
use crate::backend::cpu::matmul::GemmElement;
use crate::backend::cpu::pool::Pool;
use crate::dtype::HostVec;

/// f32 products, input gradients and weight gradients by output position (`positions`), which
/// exist on x86-64 only; the planner never picks them elsewhere.
#[cfg(target_arch = "x86_64")]
mod by_position {
    pub use super::super::positions::{InputGradient, WeightGradient};
    pub fn forward(pool: &super::Pool, x: &[f32], w: &[f32], g: &super::Conv2dGeometry, o: usize, out: &mut [f32]) {
        super::super::positions::forward::<f32>(pool, x, w, g, o, out)
    }
}
#[cfg(not(target_arch = "x86_64"))]
mod by_position {
    use super::{Conv2dGeometry, Pool};
    const ABSENT: &str = "the positions path exists on x86-64 only";
    pub enum InputGradient {}
    impl InputGradient {
        pub fn new(_: &Conv2dGeometry, _: usize) -> InputGradient {
            unreachable!("{ABSENT}")
        }
        pub fn run(&self, _: &Pool, _: &[f32], _: &[f32], _: &Conv2dGeometry, _: &mut [f32]) {
            match *self {}
        }
    }
    pub fn forward(_: &Pool, _: &[f32], _: &[f32], _: &Conv2dGeometry, _: usize, _: &mut [f32]) {
        unreachable!("{ABSENT}")
    }
    pub enum WeightGradient {}
    impl WeightGradient {
        pub fn new(_: &Conv2dGeometry) -> WeightGradient {
            unreachable!("{ABSENT}")
        }
        pub fn run(&self, _: &Pool, _: &[f32], _: &[f32], _: &Conv2dGeometry, _: usize, _: &mut [f32]) {
            match *self {}
        }
    }
}

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

/// Weights above this many elements (4 MiB in f32, beyond a core's L2 cache) are read by
/// products of at least `WIDE_COLUMNS` columns; smaller ones by one product per image.
const LARGE_WEIGHT: usize = 1 << 20;
const WIDE_COLUMNS: usize = 1024;

/// Columns the shifted kernels' backward runs cover at least: the weight gradient's tiles sum
/// over a run's pixels before their partial sums are stored (an 8x8 layer's backward pass
/// took 129 ms with one image a run, 85 with four; batch 64, 256 channels).
const SHIFTED_COLUMNS: usize = 256;

/// The images one f32 product covers. Each product reads the weight (and, backward, reads and
/// writes the weight gradient's partial sum): per image, a 4x4 layer's 512x4608 weight (9 MB)
/// was streamed 64 times a batch, and its backward pass ran at 113 GFLOP/s; 32 images a product
/// ran it at 310. For smaller weights one image a product keeps its columns in the L2 cache
/// (an 8x8 layer's backward: 28 ms against 33-41 ms with 4-16 images).
fn images_per_product(g: &Conv2dGeometry, o: usize) -> usize {
    let large = o * g.c * g.kh * g.kw > LARGE_WEIGHT;
    images_for_columns(g, if large { WIDE_COLUMNS } else { 1 })
}

/// `weight [o, c·kh·kw] @ im2col(x)` as `[o, n·oh·ow]` (one group), on `plan`'s path.
pub fn forward<T: GemmElement + CpuFloat>(
    pool: &Pool,
    x: &[T],
    weight: &[T],
    g: &Conv2dGeometry,
    o: usize,
    plan: &Plan,
) -> Vec<T> {
    forward_in_runs(pool, x, weight, g, o, images_per_product(g, o), plan)
}

/// `forward` with products of `per` images.
fn forward_in_runs<T: GemmElement + CpuFloat>(
    pool: &Pool,
    x: &[T],
    weight: &[T],
    g: &Conv2dGeometry,
    o: usize,
    per: usize,
    plan: &Plan,
) -> Vec<T> {
    let (taps, pixels, plane) = (g.c * g.kh * g.kw, g.out_h() * g.out_w(), g.c * g.h * g.w);
    let width = g.n * pixels;
    let mut out = pool.take::<T>(o * width);
    if taps == 0 {
        out.fill(T::zero());
        return out;
    }
    if let (Forward::Shifted, Some(x), Some(weight), Some(out32)) =
        (plan.forward, T::as_f32(x), T::as_f32(weight), T::as_f32_mut(&mut out))
        && shifted::forward(pool, x, weight, g, o, per, out32)
    {
        return out;
    }
    if let (Forward::Positions, Some(x), Some(weight), Some(out32)) =
        (plan.forward, T::as_f32(x), T::as_f32(weight), T::as_f32_mut(&mut out))
    {
        by_position::forward(pool, x, weight, g, o, out32);
        return out;
    }
    let dst = Columns(out.as_mut_ptr());
    image_ranges(g.n).for_each(|images| {
        // The whole `Columns` (Send), not its raw pointer field (which is not).
        #[allow(clippy::redundant_locals)]
        let dst = dst;
        let mut cols = pool.take::<T>(taps * pixels * per);
        for (first, run) in products(images, per, g) {
            let columns = run.n * pixels;
            im2col_images(&x[first * plane..(first + run.n) * plane], &mut cols, &run);
            // SAFETY: `out` is o x width; the run's block starts at column first·pixels and
            // spans `columns` columns of every row (row stride `width`), written by this task
            // alone. `weight` is o x taps and `cols` taps x columns, both contiguous.
            unsafe {
                product(
                    (o, columns, taps),
                    dst.0.add(first * pixels),
                    (width, 1),
                    weight.as_ptr(),
                    (taps, 1),
                    cols.as_ptr(),
                    (columns, 1),
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
/// not depend on scheduling. Each gradient on `plan`'s path.
pub fn backward<T: GemmElement + CpuFloat>(
    pool: &Pool,
    x: &[T],
    weight: &[T],
    grad: &[T],
    g: &Conv2dGeometry,
    o: usize,
    plan: &Plan,
) -> (Vec<T>, Vec<T>) {
    let per = match T::as_f32(x).is_some() && plan.weight == WeightGrad::Shifted {
        true => images_for_columns(g, SHIFTED_COLUMNS),
        false => images_per_product(g, o),
    };
    backward_in_runs(pool, x, weight, grad, g, o, per, plan)
}

/// `backward` with products of `per` images.
#[allow(clippy::too_many_arguments)] // the operands, their geometry, the runs and the plan
fn backward_in_runs<T: GemmElement + CpuFloat>(
    pool: &Pool,
    x: &[T],
    weight: &[T],
    grad: &[T],
    g: &Conv2dGeometry,
    o: usize,
    per: usize,
    plan: &Plan,
) -> (Vec<T>, Vec<T>) {
    let (taps, pixels, plane) = (g.c * g.kh * g.kw, g.out_h() * g.out_w(), g.c * g.h * g.w);
    let width = g.n * pixels;
    let mut grad_x = pool.take::<T>(g.n * plane);
    let mut grad_w = pool.take::<T>(o * taps);
    if g.n == 0 || plane == 0 || taps == 0 {
        grad_x.fill(T::zero());
        grad_w.fill(T::zero());
        return (grad_x, grad_w);
    }
    // The weight gradient summed from shifted copies of the images (f32, AVX2).
    let by_shifts = T::as_f32(x)
        .filter(|_| plan.weight == WeightGrad::Shifted)
        .and_then(|_| WeightGradient::plan(g, o, per));
    let partial_layout = match by_shifts {
        Some(_) => PartialLayout::ColumnMajor,
        None => PartialLayout::for_product(o, taps, pixels),
    };
    // By output position (f32, AVX-512): the input gradient after the weight gradient's runs,
    // and the weight gradient tap by tap over the whole batch.
    let f32 = T::as_f32(x).is_some();
    let by_position = (f32 && plan.input == InputGrad::Positions).then(|| by_position::InputGradient::new(g, o));
    let by_tap = (f32 && plan.weight == WeightGrad::Positions).then(|| by_position::WeightGradient::new(g));
    let weight_gradient = by_tap.is_none();
    if weight_gradient {
        // The runs' partial sums are added into it; tap by tap, every element is written.
        grad_w.fill(T::zero());
    }
    let transposed = match plan.input {
        InputGrad::Transposed | InputGrad::Shifted => Transposed::plan(pool, g, o, weight),
        _ => None,
    };
    // The transposed convolution summed from shifted copies of the gradient (f32, AVX2).
    let shifted = transposed
        .as_ref()
        .filter(|_| plan.input == InputGrad::Shifted)
        .and_then(|t| {
            T::as_f32(&t.weight).and_then(|turned| ShiftedConv::plan(pool, turned, t.geometry(), t.channels(), per))
        });
    let by_runs = |first, grad_x_range: &mut [T]| {
        // Written whole by the range's first product (no accumulation), then summed into.
        let mut partial = pool.take::<T>(if weight_gradient { o * taps } else { 0 });
        let unfolds = weight_gradient && by_shifts.is_none();
        let mut cols = pool.take::<T>(if unfolds { taps * pixels * per } else { 0 });
        let mut shifted_scratch = by_shifts.as_ref().map(|w| {
            let (copies, packed) = w.scratch_lens();
            Scratch {
                copies: pool.take(copies),
                packed: pool.take(packed),
            }
        });
        // The unfolded output gradient (transposed) or the columns to fold back; and, for runs
        // of several images, their transposed product's rows before they become images.
        let (mut data_cols, mut staging) = match (&shifted, &transposed) {
            _ if by_position.is_some() => (Vec::new(), Vec::new()),
            (Some(s), _) => (pool.take::<T>(s.scratch_len()), Vec::new()),
            (None, Some(t)) => (
                pool.take::<T>(t.taps * t.inputs(per)),
                pool.take::<T>(staging_len(per, plane)),
            ),
            (None, None) => (pool.take::<T>(taps * pixels * per), Vec::new()),
        };
        let range = first..first + grad_x_range.len() / plane;
        for ((start, run), grad_x_run) in products(range, per, g).zip(grad_x_range.chunks_mut(per * plane)) {
            let x_run = &x[start * plane..(start + run.n) * plane];
            match (
                &by_shifts,
                &mut shifted_scratch,
                T::as_f32(x_run),
                T::as_f32(grad),
                T::as_f32_mut(&mut partial),
            ) {
                _ if !weight_gradient => {}
                (Some(w), Some(scratch), Some(x_run), Some(grad), Some(partial)) => w.sum_into(
                    scratch,
                    x_run,
                    run.n,
                    &grad[start * pixels..],
                    width,
                    partial,
                    start > first,
                ),
                _ => {
                    im2col_images(x_run, &mut cols, &run);
                    let grad_run = &grad[start * pixels..];
                    unfolded_weight_gradient(
                        &mut partial,
                        partial_layout,
                        grad_run,
                        width,
                        &cols,
                        &run,
                        o,
                        start > first,
                    );
                }
            }
            if by_position.is_some() {
                continue;
            }
            if let (Some(s), Some(copies), Some(grad), Some(grad_x_run)) = (
                &shifted,
                T::as_f32_mut(&mut data_cols),
                T::as_f32(grad),
                T::as_f32_mut(grad_x_run),
            ) {
                let planes = Planes {
                    image: pixels,
                    channel: width,
                };
                s.images_into(copies, &grad[start * pixels..], planes, run.n, grad_x_run);
                continue;
            }
            match &transposed {
                Some(t) => t.input_gradient(
                    &mut staging,
                    (grad, width),
                    start,
                    &run,
                    grad_x_run,
                    |unfolding, by_channel, inputs| {
                        unfolding.unfold_into(&mut data_cols);
                        turned_product(t, &data_cols, by_channel, inputs)
                    },
                ),
                None => folded_input_gradient(weight, o, grad, width, start, &mut data_cols, &run, grad_x_run),
            }
        }
        for scratch in [cols, data_cols, staging] {
            pool.recycle(T::into_host(scratch));
        }
        if let Some(Scratch { copies, packed }) = shifted_scratch {
            pool.recycle(HostVec::F32(copies));
            pool.recycle(HostVec::F32(packed));
        }
        partial
    };
    // Nothing to do image by image where both gradients go by position.
    let partials = match weight_gradient || by_position.is_none() {
        true => per_image_range(&mut grad_x, g.n, plane, by_runs),
        false => Vec::new(),
    };
    if let Some(t) = transposed {
        t.recycle(pool);
    }
    if let (Some(plan), Some(grad), Some(weight), Some(grad_x)) = (
        by_position,
        T::as_f32(grad),
        T::as_f32(weight),
        T::as_f32_mut(&mut grad_x),
    ) {
        plan.run(pool, grad, weight, g, grad_x);
    }
    if let Some(s) = shifted {
        s.recycle(pool);
    }
    if let (Some(plan), Some(x), Some(grad), Some(grad_w)) =
        (by_tap, T::as_f32(x), T::as_f32(grad), T::as_f32_mut(&mut grad_w))
    {
        plan.run(pool, x, grad, g, o, grad_w);
    }
    for partial in partials {
        // Empty where the weight gradient went tap by tap.
        if weight_gradient {
            partial_layout.add_into(&mut grad_w, &partial, o, taps);
        }
        pool.recycle(T::into_host(partial));
    }
    (grad_x, grad_w)
}

/// `partial (+)= grad_run @ colsᵀ` for a run of images: `grad_run` is o x columns with row
/// stride `width`, `cols` holds taps x columns and `partial` o x taps in `layout`.
#[allow(clippy::too_many_arguments)] // a product's operands and their geometry
fn unfolded_weight_gradient<T: GemmElement>(
    partial: &mut [T],
    layout: PartialLayout,
    grad_run: &[T],
    width: usize,
    cols: &[T],
    run: &Conv2dGeometry,
    o: usize,
    accumulate: bool,
) {
    let (taps, columns) = (run.c * run.kh * run.kw, run.n * run.out_h() * run.out_w());
    assert!(partial.len() >= o * taps && cols.len() >= taps * columns);
    assert!(o == 0 || grad_run.len() >= (o - 1) * width + columns);
    // SAFETY: the asserts above bound every element the strides reach; `partial` is this
    // task's own.
    unsafe {
        product(
            (o, taps, columns),
            partial.as_mut_ptr(),
            layout.strides(o, taps),
            grad_run.as_ptr(),
            (width, 1),
            cols.as_ptr(),
            (1, columns),
            accumulate,
        );
    }
}

/// `by_channel = t.weight @ cols` (`c x inputs`): the transposed convolution's product.
fn turned_product<T: GemmElement + CpuFloat>(t: &Transposed<T>, cols: &[T], by_channel: &mut [T], inputs: usize) {
    // SAFETY: `t.weight` is c x t.taps, `cols` t.taps x inputs and `by_channel` holds
    // c x inputs, all contiguous and this task's own.
    unsafe {
        product(
            (t.channels(), inputs, t.taps),
            by_channel.as_mut_ptr(),
            (inputs, 1),
            t.weight.as_ptr(),
            (t.taps, 1),
            cols.as_ptr(),
            (inputs, 1),
            false,
        );
    }
}

/// The input gradient of a run of images (`run.n` from `start`) into `grad_x_run`:
/// `weightᵀ @ grad_run` into columns, folded back (`col2im`).
#[allow(clippy::too_many_arguments)]
fn folded_input_gradient<T: GemmElement + CpuFloat>(
    weight: &[T],
    o: usize,
    grad: &[T],
    width: usize,
    start: usize,
    grad_cols: &mut [T],
    run: &Conv2dGeometry,
    grad_x_run: &mut [T],
) {
    let (taps, pixels) = (run.c * run.kh * run.kw, run.out_h() * run.out_w());
    let columns = run.n * pixels;
    // SAFETY: `grad` is o x width, the run's block at column start·pixels with row stride
    // `width`; `weight` is o x taps, read as taps x o; `grad_cols` holds taps x columns, this
    // task's own, contiguous.
    unsafe {
        product(
            (taps, columns, o),
            grad_cols.as_mut_ptr(),
            (columns, 1),
            weight.as_ptr(),
            (1, taps),
            grad[start * pixels..].as_ptr(),
            (width, 1),
            false,
        );
    }
    col2im_images(grad_cols, grad_x_run, run);
}

/// How a range's partial weight gradient (`o x taps`) is stored. `gemm` makes its destination
/// column-major and packs the left operand when its rows are not contiguous: with a row-major
/// partial that operand is the columns (`taps x pixels`), with a column-major one the output
/// gradient (`o x pixels`). For large images with more taps than channels out, packing the
/// smaller one halved the backward pass (a 64-channel 32x32 layer: 66 -> 36 ms at batch 64);
/// for small ones the columns fit the cache and row-major was faster (8x8: 28 against 35 ms).
#[derive(Clone, Copy, Debug, PartialEq)]
enum PartialLayout {
    RowMajor,
    ColumnMajor,
}

impl PartialLayout {
    fn for_product(o: usize, taps: usize, pixels: usize) -> PartialLayout {
        if taps > o && pixels >= 256 {
            PartialLayout::ColumnMajor
        } else {
            PartialLayout::RowMajor
        }
    }

    /// (row, column) strides of an `o x taps` partial.
    fn strides(self, o: usize, taps: usize) -> (usize, usize) {
        match self {
            PartialLayout::RowMajor => (taps, 1),
            PartialLayout::ColumnMajor => (1, o),
        }
    }

    /// `grad_w += partial`, `grad_w` row-major.
    fn add_into<T: CpuFloat>(self, grad_w: &mut [T], partial: &[T], o: usize, taps: usize) {
        match self {
            PartialLayout::RowMajor => grad_w.iter_mut().zip(partial).for_each(|(w, &p)| *w = *w + p),
            PartialLayout::ColumnMajor => {
                for (r, row) in grad_w.chunks_mut(taps).enumerate() {
                    row.iter_mut()
                        .enumerate()
                        .for_each(|(t, w)| *w = *w + partial[t * o + r]);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests;
