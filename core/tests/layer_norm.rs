//! LayerNorm's weight and bias gradients are column sums over every row: on the CPU, whose rows
//! run on several threads, two runs give the same bits. And the mixed-dtype ops autocast's
//! transformer takes (a LayerNorm rounded for a product, the residual stream plus a 16-bit
//! branch) give the bits of the casts and ops they stand for.

use lockstep_core::conformance::{layer_norm_gradient_bits, mixed_dtype_mismatches};
use lockstep_core::{DType, Device};

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
