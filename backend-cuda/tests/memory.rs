//! The stream-ordered pool: a warm loop takes nothing new from the driver, live tensors count
//! as allocated, and bf16 rests in two bytes per element.

mod support;

use lockstep_core::{DType, Generator, Tensor};

#[test]
fn a_warm_loop_reserves_no_new_memory() {
    let _one_at_a_time = support::exclusive();
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
    let _one_at_a_time = support::exclusive();
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

/// Uploads go through a ring of pinned buffers: more uploads queued behind work than the ring
/// has slots must each arrive whole (a slot reused before its copy ran would show another's
/// data), whatever their sizes (a slot grows for a larger upload).
#[test]
fn uploads_queued_behind_compute_each_arrive_whole() {
    let _one_at_a_time = support::exclusive();
    let Some(device) = support::cuda_device() else { return };
    let g = Generator::new(1);
    let busy = Tensor::rand_normal([1024, 1024], 0.0, 1.0, DType::F32, &g, &device).unwrap();
    let mut uploads = Vec::new();
    for i in 0..12usize {
        // Queue compute first, so each copy waits behind it on the stream.
        let _ = busy.matmul(&busy).unwrap();
        let len = 1000 + (i % 3) * 300_000;
        let values: Vec<f32> = (0..len).map(|j| (i * 7 + j % 13) as f32).collect();
        uploads.push((Tensor::from_vec(values.clone(), [len], &device).unwrap(), values));
    }
    for (i, (tensor, values)) in uploads.iter().enumerate() {
        assert_eq!(&tensor.to_vec::<f32>().unwrap(), values, "upload {i}");
    }
}

#[test]
fn empty_cache_hands_back_what_the_pool_keeps_and_leaves_live_tensors() {
    let _one_at_a_time = support::exclusive();
    let Some(device) = support::cuda_device() else { return };
    let g = Generator::new(3);
    let live = Tensor::rand_normal([256, 256], 0.0, 1.0, DType::F32, &g, &device).unwrap();
    drop(live.matmul(&live).unwrap().relu().unwrap());
    device.synchronize().unwrap();
    let before = device.backend().memory_stats();
    device.empty_cache().unwrap();
    let after = device.backend().memory_stats();
    assert!(after.reserved_bytes <= before.reserved_bytes, "{before:?} -> {after:?}");
    assert_eq!(after.allocated_bytes, before.allocated_bytes);
    assert_eq!(
        live.to_vec::<f32>().unwrap().len(),
        256 * 256,
        "the live tensor still reads"
    );
}
