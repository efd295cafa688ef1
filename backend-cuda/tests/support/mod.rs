//! Opening the CUDA device a test runs on, or saying loudly why there is none.

use std::sync::{Mutex, MutexGuard};

use lockstep_core::Device;

/// `cuda:0`: the GPU where a CUDA driver is installed, else the CPU emulator
/// (lockstep-cuda-emulator: the driver and cuBLAS on the CPU, the real kernel files compiled
/// as C++). None after printing why neither opens. With `LOCKSTEP_EXPECT_CUDA=1` (a GPU
/// machine) a missing GPU fails instead; with `LOCKSTEP_EXPECT_CUDA_EMULATOR=1` (CI) an
/// emulator that does not open fails.
pub fn cuda_device() -> Option<Device> {
    let expect_gpu = std::env::var("LOCKSTEP_EXPECT_CUDA").as_deref() == Ok("1");
    let emulated = !expect_gpu && !lockstep_cuda::probe::driver_present();
    let installed = if emulated {
        lockstep_cuda_emulator::install()
    } else {
        Ok(())
    };
    lockstep_cuda::register();
    match installed.and_then(|()| Device::parse("cuda:0").map_err(|e| e.to_string())) {
        Ok(d) => {
            if emulated {
                eprintln!("note: no CUDA driver here; cuda:0 is the CPU emulator (lockstep-cuda-emulator)");
            }
            Some(d)
        }
        Err(e) => {
            assert!(!expect_gpu, "LOCKSTEP_EXPECT_CUDA=1 but cuda:0 did not open: {e}");
            assert!(
                std::env::var("LOCKSTEP_EXPECT_CUDA_EMULATOR").as_deref() != Ok("1"),
                "LOCKSTEP_EXPECT_CUDA_EMULATOR=1 but the CUDA emulator did not open cuda:0: {e}"
            );
            eprintln!(
                "\n*** SKIPPED: no CUDA device, emulated or real ({e}) ***\n*** run on an NVIDIA GPU with \
                 LOCKSTEP_EXPECT_CUDA=1, or with NVRTC and a C++ compiler for the emulator ***\n"
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

/// For tests that read the device's counters (memory, launches): one at a time, or another
/// test's work shows up in them.
#[allow(dead_code)] // not every test file reads counters
pub fn exclusive() -> MutexGuard<'static, ()> {
    static DEVICE: Mutex<()> = Mutex::new(());
    DEVICE.lock().unwrap_or_else(|p| p.into_inner())
}
