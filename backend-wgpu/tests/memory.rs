//! The pool and the busy meter: a warm loop allocates nothing new from the driver, the counters
//! add up, and utilization comes from GPU timestamps (a fraction in [0, 1]) where the adapter
//! has them.

mod support;

use std::sync::{Mutex, MutexGuard};

use lockstep_core::{DType, Generator, Tensor};

/// The tests read one device's counters: one at a time, or another test's tensors show up.
fn exclusive() -> MutexGuard<'static, ()> {
    static DEVICE: Mutex<()> = Mutex::new(());
    DEVICE.lock().unwrap_or_else(|p| p.into_inner())
}

#[test]
fn a_warm_loop_reuses_pooled_buffers() {
    let _one_at_a_time = exclusive();
    let Some(device) = support::wgpu_device() else { return };
    let g = Generator::new(0);
    let step = || {
        let a = Tensor::rand_normal([64, 64], 0.0, 1.0, DType::F32, &g, &device).unwrap();
        let b = a.matmul(&a).unwrap().relu().unwrap().sum_all().unwrap();
        b.item().unwrap()
    };
    step();
    let warm = device.backend().memory_stats();
    for _ in 0..20 {
        step();
    }
    let after = device.backend().memory_stats();
    assert_eq!(
        after.reserved_bytes, warm.reserved_bytes,
        "the pool grew in a steady loop"
    );
    assert!(after.peak_allocated_bytes >= 2 * 64 * 64 * 4, "{after:?}");
    assert!(after.allocated_bytes <= after.reserved_bytes, "{after:?}");
}

#[test]
fn live_tensors_count_as_allocated() {
    let _one_at_a_time = exclusive();
    let Some(device) = support::wgpu_device() else { return };
    let before = device.backend().memory_stats().allocated_bytes;
    let t = Tensor::zeros([1 << 20], DType::F32, &device).unwrap();
    let during = device.backend().memory_stats().allocated_bytes;
    assert!(during >= before + (4 << 20), "{before} -> {during}");
    drop(t);
    assert_eq!(device.backend().memory_stats().allocated_bytes, before);
}

#[test]
fn bf16_tensors_rest_in_two_bytes_per_element() {
    let _one_at_a_time = exclusive();
    let Some(device) = support::wgpu_device() else { return };
    let x = Tensor::full([1 << 20], 1.5, DType::F32, &device).unwrap();
    device.synchronize().unwrap();
    let before = device.backend().memory_stats().allocated_bytes;
    let low = x.to_dtype(DType::BF16).unwrap();
    device.synchronize().unwrap();
    let during = device.backend().memory_stats().allocated_bytes;
    assert_eq!(during - before, 2 << 20, "a bf16 tensor of 1M elements holds 2 MiB");
    let back = low.to_dtype(DType::F32).unwrap().to_vec::<f32>().unwrap();
    assert!(back.iter().all(|&v| v == 1.5));
}

#[test]
fn utilization_is_measured_where_the_adapter_has_timestamps() {
    let _one_at_a_time = exclusive();
    let Some(device) = support::wgpu_device() else { return };
    let timestamps = lockstep_wgpu::adapter(0)
        .unwrap()
        .features()
        .contains(wgpu::Features::TIMESTAMP_QUERY | wgpu::Features::TIMESTAMP_QUERY_INSIDE_ENCODERS);
    let g = Generator::new(1);
    let _ = device.backend().memory_stats(); // starts a fresh window
    let a = Tensor::rand_normal([256, 256], 0.0, 1.0, DType::F32, &g, &device).unwrap();
    for _ in 0..3 {
        a.matmul(&a).unwrap().sum_all().unwrap().item().unwrap();
    }
    let busy = device.backend().memory_stats().utilization;
    if timestamps {
        let busy = busy.expect("timestamps give a busy fraction");
        assert!(busy > 0.0 && busy <= 1.0, "busy fraction {busy}");
    } else {
        assert_eq!(busy, None, "without timestamps the fraction is unknown, not made up");
    }
}

#[test]
fn empty_cache_hands_back_what_the_pool_keeps_and_leaves_live_tensors() {
    let _one_at_a_time = exclusive();
    let Some(device) = support::wgpu_device() else { return };
    let g = Generator::new(3);
    let live = Tensor::rand_normal([64, 64], 0.0, 1.0, DType::F32, &g, &device).unwrap();
    drop(live.matmul(&live).unwrap().relu().unwrap());
    device.synchronize().unwrap();
    let before = device.backend().memory_stats();
    assert!(before.reserved_bytes > before.allocated_bytes, "{before:?}");
    device.empty_cache().unwrap();
    let after = device.backend().memory_stats();
    assert_eq!(after.reserved_bytes, after.allocated_bytes, "{after:?}");
    assert_eq!(after.allocated_bytes, before.allocated_bytes);
    assert_eq!(
        live.to_vec::<f32>().unwrap().len(),
        64 * 64,
        "the live tensor still reads"
    );
}

/// A device capped below what a product needs refuses the product's output with an
/// out-of-memory error naming the op, the sizes and what to try; lifting the cap lets it run.
#[test]
fn a_memory_limit_refuses_the_op_past_it_naming_it() {
    let Some((device, _)) = support::private_wgpu_device(wgpu::Limits::downlevel_defaults()) else {
        return;
    };
    let g = Generator::new(0);
    let a = Tensor::rand_normal([256, 256], 0.0, 1.0, DType::F32, &g, &device).unwrap();
    // The operand holds 256 KiB; its 256 KiB product does not fit beside it under 384 KiB.
    device.backend().set_memory_limit(Some(384 << 10)).unwrap();
    let err = a.matmul(&a).unwrap_err().to_string();
    for part in [
        " matmul asks for 256 KiB, with 256 KiB in use, more than the 384 KiB",
        "--accumulate",
    ] {
        assert!(err.contains(part), "{err} lacks `{part}`");
    }
    device.backend().set_memory_limit(None).unwrap();
    a.matmul(&a).unwrap();
}
