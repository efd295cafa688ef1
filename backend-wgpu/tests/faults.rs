//! Failures a real GPU produces rarely, injected on lavapipe: a lost device ends every later call
//! in an error naming the device, never a panic (so a trainer stops with its checkpoint), and an
//! allocation that runs out of memory gets the pool's cached buffers back before it retries.
//! Each test breaks a device of its own.

mod support;

use lockstep_core::{DType, Device, Result, Tensor};
use lockstep_wgpu::Fault;

fn adapter_limits() -> wgpu::Limits {
    lockstep_wgpu::adapter(0).map(|a| a.limits()).unwrap_or_default()
}

/// Asserts that `result` is an error about `device` being lost.
fn assert_lost<T: std::fmt::Debug>(device: &Device, what: &str, result: Result<T>) {
    let msg = result.expect_err(what).to_string();
    assert!(
        msg.contains(device.location()) && msg.contains("lost") && msg.contains("restart the run"),
        "{what}: {msg}"
    );
}

/// Every kind of call a training step makes, each of which must now fail.
fn assert_every_call_fails(device: &Device, x: &Tensor) {
    assert_lost(device, "a sync", device.synchronize());
    assert_lost(device, "a read-back", x.to_vec::<f32>());
    assert_lost(device, "an upload", Tensor::from_vec(vec![1.0f32; 4], [4], device));
    assert_lost(device, "an op", x.add(x));
    assert_lost(device, "a second sync", device.synchronize());
}

#[test]
fn a_driver_reset_during_a_wait_is_an_error_naming_the_device_not_a_panic() {
    let Some((device, backend)) = support::private_wgpu_device(adapter_limits()) else {
        return;
    };
    let x = Tensor::from_vec(vec![1.0f32, 2.0, 3.0], [3], &device).unwrap();
    let y = x.mul(&x).unwrap();
    assert_eq!(y.to_vec::<f32>().unwrap(), vec![1.0, 4.0, 9.0]);
    let pending = y.add(&x).unwrap();
    backend.inject_fault(Fault::ResetDuringWait);
    assert_lost(&device, "the read-back the reset interrupts", pending.to_vec::<f32>());
    assert_every_call_fails(&device, &x);
}

#[test]
fn a_destroyed_device_fails_every_later_call_with_an_error_naming_it() {
    let Some((device, backend)) = support::private_wgpu_device(adapter_limits()) else {
        return;
    };
    let x = Tensor::from_vec(vec![1.0f32, 2.0, 3.0], [3], &device).unwrap();
    assert_eq!(x.add(&x).unwrap().to_vec::<f32>().unwrap(), vec![2.0, 4.0, 6.0]);
    backend.inject_fault(Fault::Destroyed);
    assert_every_call_fails(&device, &x);
}

#[test]
fn out_of_memory_frees_the_cached_buffers_and_waits_before_retrying() {
    let Some((device, backend)) = support::private_wgpu_device(adapter_limits()) else {
        return;
    };
    drop(Tensor::zeros([1 << 16], DType::F32, &device).unwrap()); // 256 KiB cached in the pool
    let x = Tensor::from_vec(vec![1.0f32, 2.0, 3.0], [3], &device).unwrap();
    let pending = x.add(&x).unwrap(); // recorded, not submitted
    let before = device.backend().memory_stats();
    assert!(
        before.reserved_bytes >= before.allocated_bytes + (256 << 10),
        "{before:?}"
    );

    // Memory stays held until the device is waited on, as wgpu frees dropped buffers only then.
    backend.inject_fault(Fault::MemoryHeldUntilWait);
    let fresh = Tensor::zeros([1 << 17], DType::F32, &device).expect("the retry after a wait succeeds");

    let after = device.backend().memory_stats();
    let fresh_bytes = 512 << 10;
    assert_eq!(after.allocated_bytes, before.allocated_bytes + fresh_bytes, "{after:?}");
    assert_eq!(
        after.reserved_bytes, after.allocated_bytes,
        "the cached buffers went back: {after:?}"
    );
    assert_eq!(pending.to_vec::<f32>().unwrap(), vec![2.0, 4.0, 6.0]);
    assert!(fresh.to_vec::<f32>().unwrap().iter().all(|&v| v == 0.0));
}
