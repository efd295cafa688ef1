//! LayerNorm's weight and bias gradients are column sums over every row: on the CPU, whose rows
//! run on several threads, two runs give the same bits.

use lockstep_core::Device;
use lockstep_core::conformance::layer_norm_gradient_bits;

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
