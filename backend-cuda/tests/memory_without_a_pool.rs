//! The fallback for devices without memory pools (some vGPUs), forced on a device that has one
//! with `LOCKSTEP_CUDA_NO_POOL=1`: plain allocations, frees that wait for queued work, and the
//! same counters. Its own test binary, because the variable is read when the device opens and a
//! device opens once per process.

mod support;

use lockstep_core::{DType, Generator, Tensor};

#[test]
fn without_a_pool_results_and_counters_stay_right() {
    // SAFETY: this binary holds this one test, so no other thread reads the environment.
    unsafe { std::env::set_var("LOCKSTEP_CUDA_NO_POOL", "1") };
    let Some(device) = support::cuda_device() else { return };
    let g = Generator::new(0);
    let before = device.backend().memory_stats();
    for _ in 0..5 {
        // Intermediates are dropped while the kernels reading them may still be queued.
        let a = Tensor::rand_normal([256, 256], 0.0, 1.0, DType::F32, &g, &device).unwrap();
        let ones = Tensor::full([256, 256], 1.0, DType::F32, &device).unwrap();
        let rows = a.mul(&ones).unwrap().matmul(&ones).unwrap();
        drop((a, ones));
        let total = rows.sum_all().unwrap().item().unwrap();
        assert!(total.is_finite(), "{total}");
    }
    let t = Tensor::full([1 << 20], 1.5, DType::F32, &device).unwrap();
    let stats = device.backend().memory_stats();
    assert_eq!(stats.allocated_bytes, before.allocated_bytes + (4 << 20));
    assert_eq!(
        stats.reserved_bytes, stats.allocated_bytes,
        "no pool: reserved is what is allocated"
    );
    assert!(t.to_vec::<f32>().unwrap().iter().all(|&v| v == 1.5));
    drop(t);
    let after = device.backend().memory_stats();
    assert_eq!(after.allocated_bytes, before.allocated_bytes);
    assert!(after.peak_allocated_bytes >= 3 * 256 * 256 * 4, "{after:?}");
}
