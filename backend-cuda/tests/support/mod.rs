//! Opening the CUDA device a test runs on, or saying loudly why there is none.

use lockstep_core::Device;

/// `cuda:0`, or None after printing why the test does not run. With `LOCKSTEP_EXPECT_CUDA=1`
/// (set it on a GPU machine) a missing GPU or library fails instead.
pub fn cuda_device() -> Option<Device> {
    lockstep_cuda::register();
    match Device::parse("cuda:0") {
        Ok(d) => Some(d),
        Err(e) => {
            assert!(
                std::env::var("LOCKSTEP_EXPECT_CUDA").as_deref() != Ok("1"),
                "LOCKSTEP_EXPECT_CUDA=1 but cuda:0 did not open: {e}"
            );
            eprintln!(
                "\n*** SKIPPED: no CUDA device ({e}) ***\n*** run on an NVIDIA GPU with LOCKSTEP_EXPECT_CUDA=1 ***\n"
            );
            None
        }
    }
}

/// Kernels `device` has launched so far, once its queued work has finished.
#[allow(dead_code)] // not every test file counts launches
pub fn launches(device: &Device) -> u64 {
    device.backend().synchronize().unwrap();
    device.backend().work_counters().kernels.unwrap()
}
