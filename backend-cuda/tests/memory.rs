//! The stream-ordered pool: a warm loop takes nothing new from the driver, live tensors count
//! as allocated, and bf16 rests in two bytes per element.

mod support;

use std::sync::{Mutex, MutexGuard};

use lockstep_core::{DType, Generator, Tensor};

/// The tests read one device's counters: one at a time, or another test's tensors show up.
fn exclusive() -> MutexGuard<'static, ()> {
    static DEVICE: Mutex<()> = Mutex::new(());
    DEVICE.lock().unwrap_or_else(|p| p.into_inner())
}

#[test]
fn a_warm_loop_reserves_no_new_memory() {
    let _one_at_a_time = exclusive();
    let Some(device) = support::cuda_device() else { return };
    let g = Generator::new(0);
    let step = || {
        let a = Tensor::rand_normal([256, 256], 0.0, 1.0, DType::F32, &g, &device).unwrap();
        let b = a.matmul(&a).unwrap().relu().unwrap().sum_all().unwrap();
        b.item().unwrap()
    };
    step();
    device.synchronize().unwrap();
    let warm = device.backend().memory_stats();
    for _ in 0..20 {
        step();
    }
    device.synchronize().unwrap();
    let after = device.backend().memory_stats();
    assert_eq!(
        after.reserved_bytes, warm.reserved_bytes,
        "the pool grew in a steady loop"
    );
    assert!(after.peak_allocated_bytes >= 2 * 256 * 256 * 4, "{after:?}");
}

#[test]
fn live_tensors_count_as_allocated_and_bf16_takes_two_bytes() {
    let _one_at_a_time = exclusive();
    let Some(device) = support::cuda_device() else { return };
    let before = device.backend().memory_stats().allocated_bytes;
    let t = Tensor::full([1 << 20], 1.5, DType::F32, &device).unwrap();
    assert_eq!(device.backend().memory_stats().allocated_bytes, before + (4 << 20));
    let low = t.to_dtype(DType::BF16).unwrap();
    assert_eq!(device.backend().memory_stats().allocated_bytes, before + (6 << 20));
    let back = low.to_dtype(DType::F32).unwrap().to_vec::<f32>().unwrap();
    assert!(back.iter().all(|&v| v == 1.5));
    drop((t, low));
    assert_eq!(device.backend().memory_stats().allocated_bytes, before);
}
