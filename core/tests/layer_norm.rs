//! LayerNorm's weight and bias gradients are column sums over every row: on the CPU, whose rows
//! run on several threads, two runs give the same bits.

use lockstep_core::{Device, Tensor};

/// The input's, the weight's and the bias's gradients of `sum(layer_norm(x) * r)` for a
/// `[rows, cols]` input large enough to run on several threads.
fn gradients(device: &Device, rows: usize, cols: usize) -> Vec<Vec<u32>> {
    let values = |n: usize, k: usize| (0..n).map(|i| ((i * k) % 97) as f32 / 24.0 - 2.0).collect::<Vec<_>>();
    let x = Tensor::from_vec(values(rows * cols, 37), [rows, cols], device)
        .unwrap()
        .requires_grad(true);
    let w = Tensor::from_vec(values(cols, 11), [cols], device)
        .unwrap()
        .requires_grad(true);
    let b = Tensor::from_vec(values(cols, 5), [cols], device)
        .unwrap()
        .requires_grad(true);
    let r = Tensor::from_vec(values(rows * cols, 13), [rows, cols], device).unwrap();
    let y = x.layer_norm(Some(&w), Some(&b), 1e-5).unwrap();
    y.mul(&r).unwrap().sum_all().unwrap().backward().unwrap();
    [x, w, b]
        .iter()
        .map(|t| {
            t.grad()
                .unwrap()
                .to_vec::<f32>()
                .unwrap()
                .iter()
                .map(|v| v.to_bits())
                .collect()
        })
        .collect()
}

#[test]
fn the_weight_and_bias_gradients_have_the_same_bits_every_run() {
    let device = Device::cpu();
    // 600 x 300 = 180,000 elements: above the size where the rows go to several threads.
    let first = gradients(&device, 600, 300);
    for _ in 0..3 {
        assert!(first == gradients(&device, 600, 300), "a run gave other bits");
    }
}
