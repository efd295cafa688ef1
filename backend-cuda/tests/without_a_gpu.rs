//! What a machine without CUDA sees: clear errors, never a panic (cudarc's loaders panic when
//! a library is missing, so the backend probes with dlopen first).

use lockstep_core::Device;

#[test]
fn opening_cuda_without_a_driver_says_what_is_missing() {
    lockstep_cuda::register();
    let libraries = lockstep_cuda::probe::libraries();
    assert_eq!(libraries.len(), 6, "driver, NVRTC, cuBLAS, cuBLASLt, NCCL, cuDNN");
    let driver = libraries.iter().find(|l| l.name == "CUDA driver").unwrap();
    let opened = std::panic::catch_unwind(|| Device::parse("cuda:0"));
    let opened = opened.expect("opening cuda:0 must not panic");
    if driver.present {
        eprintln!(
            "a CUDA driver is present here: cuda:0 -> {:?}",
            opened.as_ref().map(|d| d.location().to_string())
        );
        return;
    }
    let message = opened.expect_err("no driver, no device").to_string();
    assert!(message.contains("no CUDA driver found"), "{message}");
    // The kind is known; the driver is what is missing.
    assert!(
        message.starts_with("device cuda:0: ") && !message.contains("unknown"),
        "{message}"
    );
    assert!(message.contains("cpu"), "the message offers another device: {message}");
}

#[test]
fn listing_devices_without_a_driver_is_empty_not_an_error() {
    lockstep_cuda::register();
    let cuda: Vec<_> = lockstep_core::device::list_devices()
        .into_iter()
        .filter(|d| d.location.starts_with("cuda:"))
        .collect();
    if !lockstep_cuda::probe::driver_present() {
        assert!(cuda.is_empty(), "{cuda:?}");
    }
    // With or without a GPU, the CPU is always there and `best_available` never fails.
    assert!(lockstep_core::device::best_available().is_ok());
}

#[test]
fn a_missing_library_names_its_remedy() {
    for lib in lockstep_cuda::probe::libraries() {
        assert!(!lib.remedy.is_empty(), "{} has no remedy", lib.name);
        assert!(lib.file.starts_with("lib"), "{}", lib.file);
    }
    if !lockstep_cuda::probe::nccl_present() {
        let err = lockstep_cuda::NcclId::new().err().expect("no NCCL, no id").to_string();
        assert!(
            err.contains("NCCL library not found") && err.contains("libnccl.so"),
            "{err}"
        );
    }
}
