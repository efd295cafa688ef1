//! The implicit-GEMM convolution (conv_gemm.wgsl) against the im2col path it replaces, composed
//! from the same backend's im2col, matmul and col2im: forward and both gradients, bit for bit
//! where every sum is exact and within rounding otherwise; no im2col-sized buffer allocated;
//! one dispatch a product; two runs bit-identical, a split weight gradient included.

mod support;

use lockstep_core::backend::Conv2dGeometry;
use lockstep_core::{DType, Device, Tensor};

/// Small integers (-3..=3) in no pattern a misplaced index could keep: products of these sum
/// exactly in f32, so both paths must agree to the bit whatever order each adds in.
fn integers(len: usize, seed: usize) -> Vec<f32> {
    (0..len)
        .map(|i| ((i.wrapping_mul(2_654_435_761).wrapping_add(seed * 97) >> 7) % 7) as f32 - 3.0)
        .collect()
}

/// Values with full mantissas.
fn reals(len: usize, seed: usize) -> Vec<f32> {
    (0..len).map(|i| ((i * 31 + seed * 7) as f32 * 0.618).sin()).collect()
}

fn geometry(
    x: [usize; 4],
    k: [usize; 2],
    stride: [usize; 2],
    padding: [usize; 2],
    dilation: [usize; 2],
) -> Conv2dGeometry {
    Conv2dGeometry {
        n: x[0],
        c: x[1],
        h: x[2],
        w: x[3],
        kh: k[0],
        kw: k[1],
        stride,
        padding,
        dilation,
    }
}

/// ResNet's stem (7x7 stride 2), a padded 3x3 over odd sizes, a strided 1x1, a dilated uneven
/// kernel, and one whose products span several 64x64 blocks each way.
fn geometries() -> Vec<(&'static str, Conv2dGeometry, usize)> {
    vec![
        ("stem", geometry([2, 3, 15, 13], [7, 7], [2, 2], [3, 3], [1, 1]), 8),
        ("3x3", geometry([2, 5, 9, 7], [3, 3], [1, 1], [1, 1], [1, 1]), 6),
        ("1x1_stride2", geometry([3, 4, 6, 7], [1, 1], [2, 2], [0, 0], [1, 1]), 5),
        ("dilated", geometry([1, 2, 11, 9], [3, 2], [2, 1], [0, 1], [1, 2]), 3),
        ("blocks", geometry([2, 70, 9, 8], [3, 3], [1, 1], [1, 1], [1, 1]), 66),
    ]
}

struct Operands {
    x: Tensor,
    weight: Tensor,
    grad: Tensor,
}

fn operands(
    g: &Conv2dGeometry,
    o: usize,
    values: fn(usize, usize) -> Vec<f32>,
    dtype: DType,
    device: &Device,
) -> Operands {
    let t = |dims: Vec<usize>, seed| {
        let len = dims.iter().product();
        Tensor::from_slice(&values(len, seed), dims, device)
            .unwrap()
            .to_dtype(dtype)
            .unwrap()
    };
    let pixels = g.n * g.out_h() * g.out_w();
    Operands {
        x: t(vec![g.n, g.c, g.h, g.w], 1),
        weight: t(vec![o, g.c, g.kh, g.kw], 2),
        grad: t(vec![o, pixels], 3),
    }
}

/// [forward `[o, n*oh*ow]`, input gradient `[n, c, h, w]`, weight gradient `[o, c*kh*kw]`] by
/// the implicit kernels (the backend's `conv2d_product` and its backward).
fn implicit(ops: &Operands, g: &Conv2dGeometry, o: usize) -> [Tensor; 3] {
    let device = ops.x.device();
    let backend = device.backend();
    let taken = "the implicit kernels take one-group convolutions (with LOCKSTEP_WGPU_CONV unset)";
    let out = backend
        .conv2d_product(ops.x.buffer(), ops.weight.buffer(), g, o)
        .expect(taken)
        .unwrap();
    let (gx, gw) = backend
        .conv2d_product_backward(ops.x.buffer(), ops.weight.buffer(), ops.grad.buffer(), g, o)
        .expect(taken)
        .unwrap();
    let pixels = g.n * g.out_h() * g.out_w();
    [
        Tensor::from_buffer(out, [o, pixels], device),
        Tensor::from_buffer(gx, [g.n, g.c, g.h, g.w], device),
        Tensor::from_buffer(gw, [o, g.c * g.kh * g.kw], device),
    ]
}

/// The same three by the im2col path: im2col, matmuls and col2im.
fn composed(ops: &Operands, g: &Conv2dGeometry, o: usize) -> [Tensor; 3] {
    let cols = ops.x.im2col(*g).unwrap();
    let weight = ops.weight.reshape([o, g.c * g.kh * g.kw]).unwrap();
    [
        weight.matmul(&cols).unwrap(),
        weight
            .transpose(0, 1)
            .unwrap()
            .matmul(&ops.grad)
            .unwrap()
            .col2im(*g)
            .unwrap(),
        ops.grad.matmul(&cols.transpose(0, 1).unwrap()).unwrap(),
    ]
}

fn values(t: &Tensor) -> Vec<f32> {
    t.to_dtype(DType::F32).unwrap().to_vec::<f32>().unwrap()
}

const NAMES: [&str; 3] = ["forward", "input gradient", "weight gradient"];

#[test]
fn implicit_and_im2col_agree_to_the_bit_on_exact_sums() {
    let Some(device) = support::wgpu_device() else { return };
    for dtype in [DType::F32, DType::BF16] {
        for (label, g, o) in geometries() {
            let ops = operands(&g, o, integers, dtype, &device);
            let (mine, theirs) = (implicit(&ops, &g, o), composed(&ops, &g, o));
            for ((a, b), name) in mine.iter().zip(&theirs).zip(NAMES) {
                assert_eq!(a.dims(), b.dims(), "{label} {dtype:?} {name}");
                assert_eq!(values(a), values(b), "{label} {dtype:?} {name}");
            }
        }
    }
}

#[test]
fn implicit_and_im2col_agree_within_rounding_on_reals() {
    let Some(device) = support::wgpu_device() else { return };
    for (label, g, o) in geometries() {
        let ops = operands(&g, o, reals, DType::F32, &device);
        let (mine, theirs) = (implicit(&ops, &g, o), composed(&ops, &g, o));
        for ((a, b), name) in mine.iter().zip(&theirs).zip(NAMES) {
            for (i, (x, y)) in values(a).iter().zip(values(b)).enumerate() {
                assert!(
                    (x - y).abs() <= 1e-4 * (1.0 + y.abs()),
                    "{label} {name}[{i}]: {x} vs {y}"
                );
            }
        }
    }
}

#[test]
fn empty_images_and_batches_give_what_im2col_gives() {
    let Some(device) = support::wgpu_device() else { return };
    // Images of no rows, all padding (a 2x5 output of zeros); and a batch of no images, whose
    // weight gradient sums nothing (zeros).
    for g in [
        geometry([2, 3, 0, 4], [1, 3], [1, 1], [1, 1], [1, 1]),
        geometry([0, 3, 5, 4], [3, 3], [1, 1], [1, 1], [1, 1]),
    ] {
        let ops = operands(&g, 2, integers, DType::F32, &device);
        let (mine, theirs) = (implicit(&ops, &g, 2), composed(&ops, &g, 2));
        for ((a, b), name) in mine.iter().zip(&theirs).zip(NAMES) {
            assert_eq!((a.dims(), values(a)), (b.dims(), values(b)), "{g:?} {name}");
        }
    }
}

#[test]
fn two_runs_are_bit_identical_split_weight_gradient_included() {
    let Some(device) = support::wgpu_device() else { return };
    // 2048 pixels: the weight gradient's k splits in two, summed in split order.
    let g = geometry([2, 4, 32, 32], [3, 3], [1, 1], [1, 1], [1, 1]);
    let ops = operands(&g, 8, reals, DType::F32, &device);
    let first: Vec<Vec<f32>> = implicit(&ops, &g, 8).iter().map(values).collect();
    let second: Vec<Vec<f32>> = implicit(&ops, &g, 8).iter().map(values).collect();
    assert_eq!(first, second);
    // And the split sum is the im2col path's (the same split of the same k), to rounding.
    let theirs = values(&composed(&ops, &g, 8)[2]);
    for (x, y) in first[2].iter().zip(theirs) {
        assert!((x - y).abs() <= 1e-4 * (1.0 + y.abs()), "{x} vs {y}");
    }
}

#[test]
fn no_im2col_sized_buffer_is_allocated_and_each_product_is_one_dispatch() {
    // A device of its own: its peak and its dispatches are this test's alone.
    let Some((device, _)) = support::private_wgpu_device(wgpu::Limits::default()) else {
        return;
    };
    // A 7x7 convolution of 8 channels over 32x32: its columns are 49 times the input (1.6 MB),
    // its output 32 KB.
    let (g, o) = (geometry([1, 8, 32, 32], [7, 7], [1, 1], [3, 3], [1, 1]), 8);
    let ops = operands(&g, o, reals, DType::F32, &device);
    let cols_bytes = (g.c * g.kh * g.kw * g.n * g.out_h() * g.out_w() * 4) as u64;
    let out_bytes = (o * g.n * g.out_h() * g.out_w() * 4) as u64;
    let backend = device.backend();
    backend.synchronize().unwrap();
    let (before, dispatches) = (backend.memory_stats(), backend.work_counters().kernels.unwrap());
    let products = implicit(&ops, &g, o);
    let after = backend.memory_stats();
    // At least the growth (the peak may predate this call), which the bounds below cap.
    let grown = after.peak_allocated_bytes - before.allocated_bytes;
    // The three outputs (forward, input and weight gradients: 32 KB each, 12.5 KB), nothing more.
    assert!(
        grown <= 2 * (out_bytes + (g.n * g.c * g.h * g.w * 4) as u64 + (o * g.c * 49 * 4) as u64),
        "the peak grew by {grown} bytes (the columns are {cols_bytes})"
    );
    assert!(grown < cols_bytes / 8, "the peak grew by {grown} bytes");
    let dispatched = backend.work_counters().kernels.unwrap() - dispatches;
    assert_eq!(dispatched, 3, "one dispatch for each of the three products");
    drop(products);
}
