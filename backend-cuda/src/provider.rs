//! `cuda:N` devices: probed with dlopen first (no panic without a driver), each opened once per
//! process.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use cudarc::driver::CudaContext;

use lockstep_core::backend::{Backend, Communicator, DeviceInfo};
use lockstep_core::device::DeviceProvider;
use lockstep_core::{Device, Error, Result};

use crate::backend::CudaBackend;
use crate::gpu::Gpu;
use crate::probe;

fn opened() -> &'static Mutex<HashMap<usize, Arc<CudaBackend>>> {
    static OPENED: OnceLock<Mutex<HashMap<usize, Arc<CudaBackend>>>> = OnceLock::new();
    OPENED.get_or_init(Mutex::default)
}

/// The backend of an opened `cuda:N` device (for what lies beyond the Backend trait: NCCL).
pub fn backend_of(device: &lockstep_core::Device) -> Option<Arc<CudaBackend>> {
    let ordinal = device.location().strip_prefix("cuda:")?.parse().ok()?;
    opened()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get(&ordinal)
        .cloned()
}

/// What `lockstep devices` shows for GPU `ordinal` (the driver must be present).
fn describe(ordinal: usize) -> Option<DeviceInfo> {
    let ctx = CudaContext::new(ordinal).ok()?;
    let (major, minor) = ctx.compute_capability().ok()?;
    let mut details = vec![
        ("compute capability".into(), format!("{major}.{minor}")),
        (
            "libraries".into(),
            probe::libraries()
                .iter()
                .map(|l| format!("{} {}", l.name, if l.present { "ok" } else { "MISSING" }))
                .collect::<Vec<_>>()
                .join(", "),
        ),
        (
            "tf32 matmul".into(),
            if crate::blas::allow_tf32() {
                "on"
            } else {
                "off (LOCKSTEP_TF32=1)"
            }
            .into(),
        ),
        (
            "cudnn algorithms".into(),
            if crate::dnn::deterministic_only() {
                "deterministic (LOCKSTEP_CUDNN_DETERMINISTIC=0 admits the others)"
            } else {
                "any, not bit-exact (LOCKSTEP_CUDNN_DETERMINISTIC=0)"
            }
            .into(),
        ),
    ];
    details.push(("attention".into(), crate::ops::attention_plan()));
    if let Some(v) = crate::nvml::driver_version() {
        details.push(("driver".into(), v));
    }
    let name = ctx.name().unwrap_or_else(|_| "NVIDIA GPU".into());
    Some(DeviceInfo {
        location: format!("cuda:{ordinal}"),
        // The CPU emulator (backend-cuda/emulator) names its device so: software, as lavapipe
        // is, and never what `--device auto` picks.
        software: name.starts_with("Lockstep CUDA emulator"),
        name,
        api: "cuda".into(),
        total_memory_bytes: ctx.total_mem().ok().map(|b| b as u64),
        details,
    })
}

pub struct CudaProvider;

impl DeviceProvider for CudaProvider {
    fn prefix(&self) -> &'static str {
        "cuda"
    }

    fn open(&self, ordinal: usize) -> Result<Arc<dyn Backend>> {
        let count = probe::device_count().map_err(|e| match e {
            Error::Device { msg, .. } => Error::Device {
                device: format!("cuda:{ordinal}"),
                msg,
            },
            other => other,
        })?;
        if ordinal >= count {
            return Err(Error::UnknownDevice {
                name: format!("cuda:{ordinal}"),
                hint: if count == 0 {
                    "the CUDA driver sees no GPU; use `wgpu:0` or `cpu`".into()
                } else {
                    format!("this machine has {count} CUDA device(s), cuda:0 to cuda:{}", count - 1)
                },
            });
        }
        let gpu = Gpu::open(ordinal)?;
        let info = describe(ordinal).unwrap_or_default();
        let backend = Arc::new(CudaBackend::new(gpu, info));
        opened()
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(ordinal, backend.clone());
        Ok(backend)
    }

    fn list(&self) -> Vec<DeviceInfo> {
        let Ok(count) = probe::device_count() else {
            return vec![];
        };
        (0..count).filter_map(describe).collect()
    }

    /// NCCL's group where libnccl loads (else the core's host-staged one).
    fn communicators(&self, devices: &[Device], timeout: Duration) -> Option<Result<Vec<Box<dyn Communicator>>>> {
        if !probe::nccl_present() {
            return None;
        }
        Some(crate::NcclCommunicator::group(devices).map(|group| {
            group
                .into_iter()
                .map(|c| Box::new(c.with_timeout(timeout)) as Box<dyn Communicator>)
                .collect()
        }))
    }
}
