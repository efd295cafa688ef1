//! Opening the wgpu device a test runs on, or saying loudly why there is none.

use lockstep_core::Device;

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
