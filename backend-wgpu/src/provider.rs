//! `wgpu:N` devices: every adapter wgpu finds, in a stable order (hardware before software, then
//! by backend), opened once per process.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use lockstep_core::backend::{Backend, DeviceInfo};
use lockstep_core::device::DeviceProvider;
use lockstep_core::{Error, Result};

use crate::backend::WgpuBackend;
use crate::gpu::Gpu;

/// The process's wgpu instance and its adapters (enumerated once: a few ms to ~20 ms).
fn adapters() -> &'static Vec<wgpu::Adapter> {
    static ADAPTERS: OnceLock<Vec<wgpu::Adapter>> = OnceLock::new();
    ADAPTERS.get_or_init(|| {
        // `_from_env` honours WGPU_BACKEND (e.g. `gl`) and the other WGPU_* variables.
        let instance = wgpu::Instance::new(wgpu::InstanceDescriptor::new_without_display_handle_from_env());
        let backends = wgpu::Backends::from_env().unwrap_or(wgpu::Backends::all());
        let mut found = pollster::block_on(instance.enumerate_adapters(backends));
        found.sort_by_key(|a| {
            let info = a.get_info();
            (is_software(&info), backend_rank(info.backend))
        });
        found
    })
}

fn backend_rank(b: wgpu::Backend) -> u8 {
    match b {
        wgpu::Backend::Vulkan | wgpu::Backend::Metal | wgpu::Backend::Dx12 => 0,
        _ => 1,
    }
}

fn is_software(info: &wgpu::AdapterInfo) -> bool {
    info.device_type == wgpu::DeviceType::Cpu
}

/// What `lockstep devices` shows for an adapter.
pub fn describe(location: &str, adapter: &wgpu::Adapter) -> DeviceInfo {
    let info = adapter.get_info();
    DeviceInfo {
        location: location.to_string(),
        name: info.name.clone(),
        api: format!("{:?}", info.backend).to_lowercase(),
        // WebGPU does not say how much memory an adapter has.
        total_memory_bytes: None,
        software: is_software(&info),
        details: details(adapter),
    }
}

/// Adapter details for bug reports: vendor, driver, type and the limits that matter here.
fn details(adapter: &wgpu::Adapter) -> Vec<(String, String)> {
    let info = adapter.get_info();
    let limits = adapter.limits();
    let features = adapter.features();
    let has = |f: wgpu::Features| if features.contains(f) { "yes" } else { "no" };
    vec![
        ("vendor".into(), format!("{:#06x}", info.vendor)),
        ("device id".into(), format!("{:#06x}", info.device)),
        ("type".into(), format!("{:?}", info.device_type)),
        (
            "driver".into(),
            format!("{} {}", info.driver, info.driver_info).trim().to_string(),
        ),
        ("shader f16".into(), has(wgpu::Features::SHADER_F16).into()),
        ("timestamps".into(), has(wgpu::Features::TIMESTAMP_QUERY).into()),
        ("max buffer".into(), format!("{} bytes", limits.max_buffer_size)),
        (
            "max storage binding".into(),
            format!("{} bytes", limits.max_storage_buffer_binding_size),
        ),
        (
            "max workgroup storage".into(),
            format!("{} bytes", limits.max_compute_workgroup_storage_size),
        ),
        (
            "max invocations/workgroup".into(),
            limits.max_compute_invocations_per_workgroup.to_string(),
        ),
    ]
}

/// The backends opened so far, by ordinal (the core caches the `Device`; this keeps the concrete
/// type for ops beyond the `Backend` trait, such as the benchmark's naive GEMM).
fn opened() -> &'static Mutex<HashMap<usize, Arc<WgpuBackend>>> {
    static OPENED: OnceLock<Mutex<HashMap<usize, Arc<WgpuBackend>>>> = OnceLock::new();
    OPENED.get_or_init(Mutex::default)
}

/// The backend of an opened `wgpu:N` device.
pub fn backend_of(device: &lockstep_core::Device) -> Option<Arc<WgpuBackend>> {
    let ordinal = device.location().strip_prefix("wgpu:")?.parse().ok()?;
    opened()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get(&ordinal)
        .cloned()
}

/// The adapter behind `wgpu:N`.
pub fn adapter(ordinal: usize) -> Option<&'static wgpu::Adapter> {
    adapters().get(ordinal)
}

/// The adapter behind `wgpu:N`, or an error saying which adapters exist.
fn existing_adapter(ordinal: usize) -> Result<&'static wgpu::Adapter> {
    let all = adapters();
    all.get(ordinal).ok_or_else(|| Error::UnknownDevice {
        name: format!("wgpu:{ordinal}"),
        hint: if all.is_empty() {
            "wgpu found no adapter: install a Vulkan, Metal or DX12 driver (on Linux without a GPU, \
             Mesa's lavapipe: `apt install mesa-vulkan-drivers`)"
                .into()
        } else {
            format!(
                "wgpu found {} adapter(s), wgpu:0 to wgpu:{}; `lockstep devices` lists them",
                all.len(),
                all.len() - 1
            )
        },
    })
}

/// Opens a device of its own on the adapter behind `wgpu:N`, with `limits` instead of the
/// adapter's: `wgpu::Limits::default()` gives what every WebGPU adapter offers, so tests prove the
/// backend needs no more. Wrap it with `Device::from_backend`. Its location, `wgpu:N (private K)`,
/// keeps its tensors apart from those of `wgpu:N` and of other private devices.
pub fn open_with_limits(ordinal: usize, limits: wgpu::Limits) -> Result<Arc<WgpuBackend>> {
    static OPENED: AtomicUsize = AtomicUsize::new(0);
    let adapter = existing_adapter(ordinal)?;
    let location = format!(
        "wgpu:{ordinal} (private {})",
        OPENED.fetch_add(1, Ordering::Relaxed) + 1
    );
    let info = describe(&location, adapter);
    Ok(Arc::new(WgpuBackend::new(Gpu::open(location, adapter, limits)?, info)))
}

pub struct WgpuProvider;

impl DeviceProvider for WgpuProvider {
    fn prefix(&self) -> &'static str {
        "wgpu"
    }

    fn open(&self, ordinal: usize) -> Result<Arc<dyn Backend>> {
        let adapter = existing_adapter(ordinal)?;
        let location = format!("wgpu:{ordinal}");
        let info = describe(&location, adapter);
        // The adapter's own limits, not WebGPU's defaults: those cap buffers at 256 MiB.
        let backend = Arc::new(WgpuBackend::new(Gpu::open(location, adapter, adapter.limits())?, info));
        opened()
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(ordinal, backend.clone());
        Ok(backend)
    }

    fn list(&self) -> Vec<DeviceInfo> {
        adapters()
            .iter()
            .enumerate()
            .map(|(i, a)| describe(&format!("wgpu:{i}"), a))
            .collect()
    }
}
