//! LayerNorm's weight and bias gradients are column sums over every row: on the CPU, whose rows
//! run on several threads, two runs give the same bits. And the mixed-dtype ops autocast's
//! transformer takes (a LayerNorm rounded for a product, the residual stream plus a 16-bit
//! branch) give the bits of the casts and ops they stand for.

use lockstep_core::conformance::{layer_norm_gradient_bits, mixed_dtype_mismatches};
use lockstep_core::{DType, Device, Generator, Tensor};

#[test]
fn the_weight_and_bias_gradients_have_the_same_bits_every_run() {
    let device = Device::cpu();
    // 600 x 300 = 180,000 elements: above the size where the rows go to several threads.
    let first = layer_norm_gradient_bits(&device, 600, 300).unwrap();
    for _ in 0..3 {
        assert!(
            first == layer_norm_gradient_bits(&device, 600, 300).unwrap(),
            "a run gave other bits"
        );
    }
}

#[test]
fn the_mixed_dtype_ops_are_the_casts_and_ops_they_stand_for() {
    for half in [DType::F16, DType::BF16] {
        assert_eq!(
            mixed_dtype_mismatches(&Device::cpu(), half).unwrap(),
            Vec::<String>::new()
        );
    }
}

/// A pre-norm block's residual stream: `sum = x + branch` feeds a LayerNorm and the next
/// residual add, whose gradient reaches the sum first; the LayerNorm's backward adds it in its
/// own pass. The gradients of `x`, the branch, the weight and the bias have the bits of the
/// LayerNorm's gradient taken alone and added to the residual's afterwards, as the walk adds
/// the gradients of two uses; with the fused residual add and without.
#[test]
fn a_layer_norm_on_the_residual_stream_adds_its_gradient_as_the_walk_would() {
    let device = Device::cpu();
    let generator = Generator::new(3);
    let normal =
        |dims: &[usize]| Tensor::rand_normal(dims.to_vec(), 0.0, 1.0, DType::F32, &generator, &device).unwrap();
    let (x0, branch0, w0, b0) = (normal(&[64, 96]), normal(&[64, 96]), normal(&[96]), normal(&[96]));
    let (upstream, scale) = (normal(&[64, 96]), normal(&[64, 96]));
    let leaves = || [&x0, &branch0, &w0, &b0].map(|t| t.detach().requires_grad(true));
    let grads = |leaves: &[Tensor; 4]| {
        leaves
            .iter()
            .map(|t| t.grad().unwrap().to_vec::<f32>().unwrap())
            .collect::<Vec<_>>()
    };

    // The block: out = sum + normed * scale, seeded with `upstream`.
    let block = |fused: bool| {
        let [x, branch, w, b] = leaves();
        let (sum, normed) = if fused {
            x.add_layer_norm(&branch, Some(&w), Some(&b), 1e-5, None).unwrap()
        } else {
            let sum = x.add(&branch).unwrap();
            let normed = sum.layer_norm(Some(&w), Some(&b), 1e-5).unwrap();
            (sum, normed)
        };
        let out = sum.add(&normed.mul(&scale).unwrap()).unwrap();
        out.backward_with(upstream.clone()).unwrap();
        grads(&[x, branch, w, b])
    };

    // Apart: the LayerNorm's gradients from `upstream * scale` alone, then the residual's added.
    let [x, branch, w, b] = leaves();
    let sum = x.add(&branch).unwrap().detach().requires_grad(true);
    let normed = sum.layer_norm(Some(&w), Some(&b), 1e-5).unwrap();
    normed.backward_with(upstream.mul(&scale).unwrap()).unwrap();
    let through_sum = upstream.add(&sum.grad().unwrap()).unwrap().to_vec::<f32>().unwrap();
    let apart = [
        through_sum.clone(),
        through_sum,
        w.grad().unwrap().to_vec().unwrap(),
        b.grad().unwrap().to_vec().unwrap(),
    ];

    for fused in [false, true] {
        let got = block(fused);
        for (i, (g, a)) in got.iter().zip(&apart).enumerate() {
            let same = g.iter().zip(a).all(|(g, a)| g.to_bits() == a.to_bits());
            assert!(
                same,
                "fused {fused}: gradient {i} differs from the LayerNorm's added apart"
            );
        }
    }
}
