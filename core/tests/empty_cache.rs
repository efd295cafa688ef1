//! `Device::empty_cache` on the CPU: the buffers the pool keeps for reuse go back to the system,
//! live tensors stay.

use lockstep_core::{DType, Device, Generator, Tensor};

#[test]
fn empty_cache_hands_back_what_the_pool_keeps_and_leaves_live_tensors() {
    // A device of its own, so no other test's tensors count.
    let device = Device::parse("cpu:7").unwrap();
    let g = Generator::new(3);
    let live = Tensor::rand_normal([256, 256], 0.0, 1.0, DType::F32, &g, &device).unwrap();
    let expected = live.to_vec::<f32>().unwrap();
    for _ in 0..2 {
        drop(live.matmul(&live).unwrap().relu().unwrap().sum_all().unwrap());
    }
    let before = device.backend().memory_stats();
    assert!(before.reserved_bytes > before.allocated_bytes, "{before:?}");
    device.empty_cache().unwrap();
    let after = device.backend().memory_stats();
    assert_eq!(after.reserved_bytes, after.allocated_bytes, "{after:?}");
    assert_eq!(after.allocated_bytes, before.allocated_bytes);
    assert_eq!(live.to_vec::<f32>().unwrap(), expected, "the live tensor is untouched");
}
