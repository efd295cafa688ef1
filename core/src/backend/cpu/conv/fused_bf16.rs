//! The fused convolution (`conv::fused`) for bf16 under autocast, on the bf16 dot-product
//! kernel or on AMX tiles (as the plan says), instead of the composed path's batch-wide bf16 columns and one large product. Each
//! product's images are unfolded as bf16 (a copy) while in cache; products accumulate
//! in f32; the weight gradient sums every image in f32 and rounds once at the end (as the one
//! large product does); the input gradient is rounded once from f32, out of the transposed
//! convolution's accumulators or out of columns folded back in f32. The plan (`conv/mod.rs`)
//! says where the product and the gradients go by output position instead (`positions`), and
//! where the vector side is read from a copy of the images (`direct`) rather than unfolded
//! into panels (`panels`).

use half::bf16;
use rayon::prelude::*;

use super::panels::{LeftRows, PanelScratch, Products, Unfolded};
use super::ranges::{
    Columns, image_ranges, images_for_columns, per_image_range, products, rounded_sum_turned, staging_len,
};
use super::transposed::Transposed;
use super::unfold::{Planes, col2im_images, im2col_images};
use super::{Forward, InputGrad, Plan, WeightGrad};
use super::{grid, positions};
use crate::backend::Conv2dGeometry;
use crate::backend::cpu::float::bf16_from_f32_slice;
use crate::backend::cpu::matmul::bf16::{Dst, Product, Side};
use crate::backend::cpu::matmul::{amx, bf16_kernel};
use crate::backend::cpu::pool::Pool;
use crate::dtype::HostVec;

/// Whether this CPU has the dot-product kernel; the f32 fused path on widened copies runs where
/// it has not (and has no AMX tiles). Where it has, the fused path runs for every geometry:
/// products of several small images fill its tiles.
pub fn available() -> bool {
    bf16_kernel::available()
}

/// Whether `plan`'s kernel runs on this CPU.
fn runs(plan: &Plan) -> bool {
    if plan.tiles { amx::available() } else { available() }
}

/// How a pass's unfolded products meet their kernel: on tiles where the plan has them, else
/// the dot-product kernel reading a copy of the images where `direct`, else its panels.
fn unfolded_products(plan: &Plan, direct: bool) -> Products {
    match (plan.tiles, direct) {
        (true, _) => Products::Tiles,
        (false, true) => Products::Direct,
        (false, false) => Products::Panels,
    }
}

/// The plain products' kernel (`weightᵀ @ grad` folded back, the weight gradient).
fn product_kernel(plan: &Plan) -> Product {
    if plan.tiles {
        amx::product
    } else {
        crate::backend::cpu::matmul::bf16::product
    }
}

/// Columns (images x output pixels) each product covers at least: an 8x8 layer's backward pass
/// took 34 ms an image at a time, 22-24 ms with 4-8 images a product (batch 64, 256 channels).
const MIN_COLUMNS: usize = 512;

/// Where the input gradient is not a transposed convolution: its columns and images in f32,
/// summed there and rounded once.
struct Fold {
    grad_cols: Vec<f32>,
    images: Vec<f32>,
}

impl Fold {
    fn take(pool: &Pool, cols: usize, images: usize) -> Fold {
        Fold {
            grad_cols: pool.take(cols),
            images: pool.take(images),
        }
    }

    /// The input gradient of a run of images (`run.n` from `start`) into `grad_x_run`:
    /// `weightᵀ @ grad_run` into f32 columns, folded back and rounded once.
    #[allow(clippy::too_many_arguments)]
    fn input_gradient(
        &mut self,
        pool: &Pool,
        product: Product,
        weight: &[bf16],
        o: usize,
        grad: &[bf16],
        width: usize,
        start: usize,
        run: &Conv2dGeometry,
        grad_x_run: &mut [bf16],
    ) {
        let (taps, pixels) = (run.c * run.kh * run.kw, run.out_h() * run.out_w());
        let columns = run.n * pixels;
        let weight_by_tap = Side {
            data: weight,
            offset: 0,
            rows: taps,
            row_stride: 1,
            k_stride: taps,
        };
        let grad_by_pixel = Side {
            data: grad,
            offset: start * pixels,
            rows: columns,
            row_stride: 1,
            k_stride: width,
        };
        // SAFETY: `product`'s kernel runs here (the fused path's promise) and o > 0;
        // `grad_cols` (taps x columns) is this task's own, contiguous.
        unsafe {
            product(
                pool,
                Dst::F32(self.grad_cols.as_mut_ptr()),
                columns,
                weight_by_tap,
                grad_by_pixel,
                o,
            )
        };
        let images = &mut self.images[..grad_x_run.len()];
        col2im_images(&self.grad_cols, images, run);
        bf16_from_f32_slice(grad_x_run, images);
    }

    fn recycle(self, pool: &Pool) {
        pool.recycle(HostVec::F32(self.grad_cols));
        pool.recycle(HostVec::F32(self.images));
    }
}

/// `by_channel = turned @ columns` (`c x inputs`), rounded once from its f32 sums: the
/// transposed convolution's product, `turned` its weight arranged for `columns`.
fn turned_product(pool: &Pool, turned: &LeftRows, columns: &Unfolded, by_channel: &mut [bf16], inputs: usize) {
    // SAFETY: the plan's kernel runs here (the fused path's promise) and the sum is not empty;
    // `by_channel` holds c x inputs, this task's own, contiguous; `columns` hold `inputs`
    // columns, and `turned` was arranged for their geometry.
    unsafe { columns.product(pool, Dst::Bf16(by_channel.as_mut_ptr()), inputs, turned, inputs) };
}

/// `weight [o, c·kh·kw] @ im2col(x)` as `[o, n·oh·ow]` on `plan`'s path; call only where
/// its kernel runs.
pub fn forward(pool: &Pool, x: &[bf16], weight: &[bf16], g: &Conv2dGeometry, o: usize, plan: &Plan) -> Vec<bf16> {
    assert!(runs(plan), "the plan's bf16 kernel does not run on this CPU");
    let (taps, pixels, plane) = (g.c * g.kh * g.kw, g.out_h() * g.out_w(), g.c * g.h * g.w);
    let width = g.n * pixels;
    let mut out = pool.take::<bf16>(o * width);
    if taps == 0 || pixels == 0 {
        out.fill(bf16::ZERO);
        return out;
    }
    match plan.forward {
        Forward::Positions => {
            positions::forward(pool, x, weight, g, o, &mut out);
            return out;
        }
        Forward::Grid => {
            grid::forward(pool, x, weight, g, o, &mut out);
            return out;
        }
        _ => {}
    }
    let kernel = unfolded_products(plan, plan.forward == Forward::Direct);
    let per = images_for_columns(g, MIN_COLUMNS);
    let dst = Columns(out.as_mut_ptr());
    let weight = LeftRows::arrange(pool, g, weight, kernel);
    image_ranges(g.n).for_each(|images| {
        // The whole `Columns` (Send), not its raw pointer field (which is not).
        #[allow(clippy::redundant_locals)]
        let dst = dst;
        let mut scratch = PanelScratch::take(pool, &Conv2dGeometry { n: per, ..*g }, kernel);
        for (first, run) in products(images, per, g) {
            let columns = run.n * pixels;
            let unfolded = scratch.unfold(&x[first * plane..(first + run.n) * plane], Planes::nchw(&run), &run);
            // SAFETY: the plan's kernel runs here (asserted above) and taps > 0; the run's block
            // of `out` (o x width) is o rows of `columns` at column first·pixels, written by
            // this task alone; `unfolded` holds `columns` columns, `weight` arranged for them.
            unsafe {
                let dst = Dst::Bf16(dst.0.add(first * pixels));
                unfolded.product(pool, dst, width, &weight, columns)
            };
        }
        scratch.recycle(pool);
    });
    weight.recycle(pool);
    out
}

/// The product's gradients from `grad` `[o, n·oh·ow]`: the input's `[n, c, h, w]` and the
/// weight's `[o, c·kh·kw]`, images in one contiguous range per thread, the ranges' f32 weight
/// sums added in order (deterministic); each gradient on `plan`'s path. Call only where its
/// kernel runs.
pub fn backward(
    pool: &Pool,
    x: &[bf16],
    weight: &[bf16],
    grad: &[bf16],
    g: &Conv2dGeometry,
    o: usize,
    plan: &Plan,
) -> (Vec<bf16>, Vec<bf16>) {
    assert!(runs(plan), "the plan's bf16 kernel does not run on this CPU");
    let (taps, pixels, plane) = (g.c * g.kh * g.kw, g.out_h() * g.out_w(), g.c * g.h * g.w);
    let width = g.n * pixels;
    let product = product_kernel(plan);
    let mut grad_x = pool.take::<bf16>(g.n * plane);
    let mut grad_w = pool.take::<bf16>(o * taps);
    if g.n == 0 || plane == 0 || taps == 0 || pixels == 0 || o == 0 {
        grad_x.fill(bf16::ZERO);
        grad_w.fill(bf16::ZERO);
        return (grad_x, grad_w);
    }
    // By position, the input gradient is one product of the whole batch after the weight
    // gradient's runs.
    let by_position = (plan.input == InputGrad::Positions).then(|| positions::InputGradient::new(g, o));
    let on_grid = plan.input == InputGrad::TransposedGrid;
    let input_gradient = by_position.is_none() && !on_grid;
    let kernel = unfolded_products(plan, plan.input == InputGrad::TransposedDirect);
    let transposed = match plan.input {
        InputGrad::Transposed | InputGrad::TransposedDirect => Transposed::plan(pool, g, o, weight),
        _ => None,
    };
    // Its weight arranged for the products that read the output gradient.
    let turned = transposed
        .as_ref()
        .map(|t| LeftRows::arrange(pool, t.geometry(), &t.weight, kernel));
    let transposed_product = transposed.as_ref().zip(turned.as_ref());
    // And the weight gradient, tap by tap over the whole batch.
    let by_tap = (plan.weight == WeightGrad::Positions).then(|| positions::WeightGradient::new(g));
    let weight_on_grid = plan.weight == WeightGrad::Grid;
    let weight_gradient = by_tap.is_none() && !weight_on_grid;
    let per = images_for_columns(g, MIN_COLUMNS);
    let by_runs = |first, grad_x_range: &mut [bf16]| {
        let mut partial = pool.take::<f32>(if weight_gradient { o * taps } else { 0 });
        // The first run's product writes `partial`, the later ones add to it.
        let mut summed = false;
        let mut cols = pool.take::<bf16>(if weight_gradient { taps * pixels * per } else { 0 });
        let mut staging = pool.take::<bf16>(if transposed.is_some() {
            staging_len(per, plane)
        } else {
            0
        });
        let mut panels = match transposed_product {
            Some((t, _)) => PanelScratch::take(
                pool,
                &Conv2dGeometry {
                    n: per,
                    ..*t.geometry()
                },
                kernel,
            ),
            None => PanelScratch::default(),
        };
        let mut fold = match (&transposed, input_gradient) {
            (None, true) => Fold::take(pool, taps * pixels * per, plane * per),
            _ => Fold::take(pool, 0, 0),
        };
        let range = first..first + grad_x_range.len() / plane;
        for ((start, run), grad_x_run) in products(range, per, g).zip(grad_x_range.chunks_mut(per * plane)) {
            if weight_gradient {
                run_weight_gradient(
                    pool,
                    product,
                    (x, (grad, width)),
                    start,
                    &run,
                    o,
                    &mut cols,
                    (&mut partial, summed),
                );
                summed = true;
            }
            match transposed_product {
                _ if !input_gradient => {}
                Some((t, turned)) => t.input_gradient(
                    &mut staging,
                    (grad, width),
                    start,
                    &run,
                    grad_x_run,
                    |unfolding, by_channel, inputs| {
                        let unfolded = panels.unfold(unfolding.src, unfolding.planes, &unfolding.geometry);
                        turned_product(pool, turned, &unfolded, by_channel, inputs)
                    },
                ),
                None => fold.input_gradient(pool, product, weight, o, grad, width, start, &run, grad_x_run),
            }
        }
        if !summed {
            partial.fill(0.0);
        }
        pool.recycle(HostVec::BF16(cols));
        pool.recycle(HostVec::BF16(staging));
        panels.recycle(pool);
        fold.recycle(pool);
        partial
    };
    // Nothing to do image by image where both gradients go by position.
    let partials = match weight_gradient || input_gradient {
        true => per_image_range(&mut grad_x, g.n, plane, by_runs),
        false => Vec::new(),
    };
    if let Some(turned) = turned {
        turned.recycle(pool);
    }
    if let Some(t) = transposed {
        t.recycle(pool);
    }
    if let Some(plan) = by_position {
        plan.run(pool, grad, weight, g, &mut grad_x);
    }
    if on_grid {
        grid::input_gradient(pool, grad, weight, g, o, &mut grad_x);
    }
    match by_tap {
        Some(plan) => plan.run(pool, x, grad, g, o, &mut grad_w),
        None if weight_on_grid => grid::weight_gradient(pool, x, grad, g, o, &mut grad_w),
        // The sums are `[taps, o]` (see `run_weight_gradient`).
        None => rounded_sum_turned(pool, partials, taps, o, &mut grad_w),
    }
    (grad_x, grad_w)
}

/// `partial += cols_run @ grad_runᵀ` (`[taps, o]`; `=` where `partial` holds no sum yet) for
/// `run`, the images from `start`, unfolded into `cols`; `grad` is `[o, width]`. The
/// transposed sum (`[o, taps]`, with the output gradient packed all the same) wrote its tiles
/// a column at a time, one element per row of the sum.
#[allow(clippy::too_many_arguments)]
fn run_weight_gradient(
    pool: &Pool,
    product: Product,
    (x, (grad, width)): (&[bf16], (&[bf16], usize)),
    start: usize,
    run: &Conv2dGeometry,
    o: usize,
    cols: &mut [bf16],
    (partial, summed): (&mut [f32], bool),
) {
    let (taps, pixels, plane) = (
        run.c * run.kh * run.kw,
        run.out_h() * run.out_w(),
        run.c * run.h * run.w,
    );
    let columns = run.n * pixels;
    im2col_images(&x[start * plane..(start + run.n) * plane], cols, run);
    // grad_run: o rows of `columns` along k, at column start·pixels of `grad`.
    let grad_rows = Side {
        data: grad,
        offset: start * pixels,
        rows: o,
        row_stride: width,
        k_stride: 1,
    };
    let cols_by_tap = Side {
        data: cols,
        offset: 0,
        rows: taps,
        row_stride: columns,
        k_stride: 1,
    };
    // SAFETY: `product`'s kernel runs here (asserted by the caller) and columns > 0; `partial`
    // (taps x o) is the calling task's own, contiguous.
    unsafe {
        product(
            pool,
            if summed {
                Dst::F32Add(partial.as_mut_ptr())
            } else {
                Dst::F32(partial.as_mut_ptr())
            },
            o,
            cols_by_tap,
            grad_rows,
            columns,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cpu::conv::reference::{POSITIONS, SAME_SIZE, STRIDED, UNSTRIDED, reference_with};

    /// The bf16 product and both gradients against the f64 loops over the same values (exact in
    /// bf16), on the dot-product kernel and, where the CPU has them, on AMX tiles. Only where
    /// the CPU has the kernel (it says so otherwise).
    #[test]
    fn the_bf16_fused_product_and_its_gradients_match_plain_loops() {
        if !available() {
            eprintln!("\n*** SKIPPED: this CPU has no AVX512-BF16; the composed path runs instead ***\n");
            return;
        }
        let this = super::super::Cpu::this();
        if !this.tiles {
            eprintln!(
                "\nNOTE: no AMX tiles for this process: the bf16 convolution runs on the dot-product kernel only\n"
            );
        }
        for tiles in std::iter::once(false).chain(this.tiles.then_some(true)) {
            match_plain_loops(&super::super::Cpu { tiles, ..this });
        }
    }

    fn match_plain_loops(cpu: &super::super::Cpu) {
        let pool = Pool::default();
        let plan = |g: &Conv2dGeometry, o| {
            super::super::plan(g, o, crate::dtype::DType::BF16, cpu, Default::default()).unwrap()
        };
        if !cpu.tiles {
            assert_eq!(plan(&SAME_SIZE, 5).forward, Forward::Direct);
            assert_eq!(plan(&POSITIONS, 5).forward, Forward::Positions);
            assert_eq!(plan(&POSITIONS, 97).input, InputGrad::Positions);
        }
        // A batch of 48: the weight gradient goes tap by tap as well, beside an input gradient
        // by runs (40 output channels) or by position (97).
        let batch = Conv2dGeometry { n: 48, ..POSITIONS };
        if !cpu.tiles {
            assert_eq!(plan(&batch, 40).weight, WeightGrad::Positions);
            assert_ne!(plan(&POSITIONS, 97).weight, WeightGrad::Positions);
            assert_ne!(plan(&batch, 40).input, InputGrad::Positions);
        }
        for (g, o) in [
            (STRIDED, 5),
            (UNSTRIDED, 5),
            (SAME_SIZE, 5),
            (POSITIONS, 97),
            (batch, 40),
            (batch, 97),
        ] {
            let r = reference_with(&pool, g, o);
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
            let plan = plan(&g, o);
            assert_eq!(plan.tiles, cpu.tiles);
            assert!(
                close(&forward(&pool, &x, &w, &r.g, r.o, &plan), &r.forward),
                "{g:?} ({plan})"
            );
            let (grad_x, grad_w) = backward(&pool, &x, &w, &grad, &r.g, r.o, &plan);
            assert!(close(&grad_w, &r.grad_w), "{g:?} ({plan})");
            assert!(close(&grad_x, &r.grad_x), "{g:?} ({plan})");
        }
    }
}
