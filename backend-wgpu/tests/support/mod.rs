//! Opening the wgpu device a test runs on, or saying loudly why there is none.

use std::sync::Arc;

use lockstep_core::Device;
use lockstep_wgpu::WgpuBackend;

/// The first wgpu adapter, or None after printing why the test does not run. When
/// `LOCKSTEP_EXPECT_WGPU=1` (CI sets it, having installed lavapipe) a missing adapter fails.
pub fn wgpu_device() -> Option<Device> {
    lockstep_wgpu::register();
    match Device::parse("wgpu:0") {
        Ok(d) => Some(d),
        Err(e) => {
            assert!(
                std::env::var("LOCKSTEP_EXPECT_WGPU").as_deref() != Ok("1"),
                "LOCKSTEP_EXPECT_WGPU=1 but no wgpu adapter opened: {e}"
            );
            eprintln!(
                "\n*** SKIPPED: no wgpu adapter ({e}) ***\n*** install mesa-vulkan-drivers to run the wgpu tests ***\n"
            );
            None
        }
    }
}

/// A device of its own on the first adapter, with `limits` (see `lockstep_wgpu::open_with_limits`),
/// and its backend for what only the wgpu backend offers; None as for `wgpu_device`.
#[allow(dead_code, reason = "not every test file opens one")]
pub fn private_wgpu_device(limits: wgpu::Limits) -> Option<(Device, Arc<WgpuBackend>)> {
    wgpu_device()?;
    let backend = lockstep_wgpu::open_with_limits(0, limits).expect("the first adapter opens with these limits");
    Some((Device::from_backend(backend.clone()), backend))
}

/// Median seconds of `runs` calls of `f` on `device`, each waited for, after one warm-up call
/// (pipelines compile there): what the cost-bound tests compare.
#[allow(dead_code, reason = "not every test file times work")]
pub fn median_seconds(device: &Device, runs: usize, f: &dyn Fn()) -> f64 {
    f();
    device.synchronize().unwrap();
    let mut times: Vec<f64> = (0..runs)
        .map(|_| {
            let start = std::time::Instant::now();
            f();
            device.synchronize().unwrap();
            start.elapsed().as_secs_f64()
        })
        .collect();
    times.sort_by(f64::total_cmp);
    times[runs / 2]
}
