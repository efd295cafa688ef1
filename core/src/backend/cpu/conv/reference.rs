//! A convolution's inputs and its results by plain loops in f64, which every path is checked
//! against, and the geometries the paths' own tests share.

use crate::backend::Conv2dGeometry;
use crate::backend::cpu::pool::Pool;

/// A convolution's inputs and its results by plain loops in f64, for the fused paths to
/// match: strides, padding, dilation, an odd tap count (81) and a batch that does not divide
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

/// Strides 2 x 1: the input gradient folds columns back (`col2im`).
pub const STRIDED: Conv2dGeometry = Conv2dGeometry {
    n: 5,
    c: 9,
    h: 7,
    w: 6,
    kh: 3,
    kw: 3,
    stride: [2, 1],
    padding: [1, 1],
    dilation: [1, 2],
};

/// Stride 1, padding below and at `dilation·(k-1)`: the input gradient is the transposed
/// convolution (`conv::transposed`), its sum odd too (5·3·3).
pub const UNSTRIDED: Conv2dGeometry = Conv2dGeometry {
    stride: [1, 1],
    padding: [1, 1],
    dilation: [2, 1],
    ..STRIDED
};

/// Stride 1, padding 1, 8x8 images: the forward product and the transposed input gradient
/// read their vector side from the images in bf16 (`conv::direct`).
pub const SAME_SIZE: Conv2dGeometry = Conv2dGeometry {
    n: 3,
    h: 8,
    w: 8,
    stride: [1, 1],
    padding: [1, 1],
    dilation: [1, 1],
    ..STRIDED
};

pub fn reference(pool: &Pool, g: Conv2dGeometry) -> Reference {
    reference_with(pool, g, 5)
}

/// `reference` with `o` output channels.
pub fn reference_with(pool: &Pool, g: Conv2dGeometry, o: usize) -> Reference {
    let (taps, width) = (g.c * g.kh * g.kw, g.n * g.out_h() * g.out_w());
    let value = |i: usize, salt: usize| ((i * 7 + salt * 13) % 17) as f64 / 8.0 - 1.0;
    let x: Vec<f64> = (0..g.n * g.c * g.h * g.w).map(|i| value(i, 1)).collect();
    let w: Vec<f64> = (0..o * taps).map(|i| value(i, 2)).collect();
    let grad: Vec<f64> = (0..o * width).map(|i| value(i, 3)).collect();
    let cols = super::unfold::im2col(pool, &x, &g);
    let matmul = |a: &dyn Fn(usize, usize) -> f64, b: &dyn Fn(usize, usize) -> f64, m, k, n| {
        (0..m * n)
            .map(|e| (0..k).map(|t| a(e / n, t) * b(t, e % n)).sum::<f64>())
            .collect::<Vec<f64>>()
    };
    let forward = matmul(&|r, t| w[r * taps + t], &|t, p| cols[t * width + p], o, taps, width);
    let grad_w = matmul(&|r, p| grad[r * width + p], &|p, t| cols[t * width + p], o, width, taps);
    let grad_cols = matmul(&|t, r| w[r * taps + t], &|r, p| grad[r * width + p], taps, o, width);
    let grad_x = super::unfold::col2im(pool, &grad_cols, &g);
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

/// 30 images of 4x4 with 96 channels: where the CPU has the kernels, their input gradients
/// (and, in bf16, their products) take tiles of one position in 32 images
/// (`conv::positions`), the last lanes left empty.
pub const POSITIONS: Conv2dGeometry = Conv2dGeometry {
    n: 30,
    c: 96,
    h: 4,
    w: 4,
    ..SAME_SIZE
};

/// Output images of 16x16, for the column-major weight gradient (`PartialLayout`).
pub const WIDE: Conv2dGeometry = Conv2dGeometry {
    n: 2,
    h: 16,
    w: 16,
    padding: [2, 1],
    ..UNSTRIDED
};
