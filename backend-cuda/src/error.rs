//! Driver, cuBLAS and NCCL failures as the core's errors, with the device named.

use lockstep_core::Error;

pub(crate) fn driver_error(device: &str, what: &str, e: cudarc::driver::DriverError) -> Error {
    let detail = e
        .error_string()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    Error::Device {
        device: device.into(),
        msg: format!("{what}: {:?} {detail}", e.0),
    }
}

pub(crate) fn cublas_error(device: &str, what: &str, e: cudarc::cublas::result::CublasError) -> Error {
    Error::Device {
        device: device.into(),
        msg: format!("{what}: cuBLAS {:?}", e.0),
    }
}
