//! `wgpu:N` devices: every adapter wgpu finds, best first (discrete GPUs, then integrated, then
//! software; for each GPU its native API before GL), opened once per process. One GPU appears
//! once per API it speaks (Vulkan, DX12, GL): `lockstep devices` names the duplicates.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use lockstep_core::backend::{Backend, DeviceInfo};
use lockstep_core::device::DeviceProvider;
use lockstep_core::{Error, Result};

use crate::backend::WgpuBackend;
use crate::cooperative::{Cooperative, Policy};
use crate::gpu::Gpu;

/// The process's wgpu instance and its adapters (enumerated once: a few ms to ~20 ms).
fn adapters() -> &'static Vec<wgpu::Adapter> {
    static ADAPTERS: OnceLock<Vec<wgpu::Adapter>> = OnceLock::new();
    ADAPTERS.get_or_init(|| {
        // `_from_env` honours WGPU_BACKEND (e.g. `gl`) and the other WGPU_* variables.
        let instance = wgpu::Instance::new(wgpu::InstanceDescriptor::new_without_display_handle_from_env());
        let backends = wgpu::Backends::from_env().unwrap_or(wgpu::Backends::all());
        let mut found = pollster::block_on(instance.enumerate_adapters(backends));
        // Stable: adapters alike in rank keep the order wgpu found them in.
        found.sort_by_key(|a| {
            let info = a.get_info();
            adapter_rank(info.device_type, info.backend)
        });
        found
    })
}

/// Where an adapter sorts, lowest first: a hybrid laptop's discrete GPU before its integrated
/// one (so `wgpu:0` and `auto` are the fast one), software last; for one GPU, the API with the
/// best compute path first (Vulkan, Metal, DX12, then GL).
fn adapter_rank(kind: wgpu::DeviceType, api: wgpu::Backend) -> (u8, u8) {
    let kind = match kind {
        wgpu::DeviceType::DiscreteGpu => 0,
        wgpu::DeviceType::IntegratedGpu => 1,
        wgpu::DeviceType::VirtualGpu => 2,
        wgpu::DeviceType::Other => 3,
        wgpu::DeviceType::Cpu => 4,
    };
    let api = match api {
        wgpu::Backend::Vulkan | wgpu::Backend::Metal => 0,
        wgpu::Backend::Dx12 => 1,
        _ => 2,
    };
    (kind, api)
}

/// The `wgpu:N` that is the same physical GPU as `adapters[index]` through an earlier-listed API,
/// if any: the same PCI bus where both report one, else the same vendor, device id and type
/// (ids of 0 say nothing, so those never match), the k-th such GPU of one API pairing with the
/// k-th of the other (two identical cards stay two).
fn same_gpu_as(adapters: &[wgpu::AdapterInfo], index: usize) -> Option<usize> {
    let me = &adapters[index];
    if !me.device_pci_bus_id.is_empty() {
        return adapters[..index]
            .iter()
            .position(|a| a.backend != me.backend && a.device_pci_bus_id == me.device_pci_bus_id);
    }
    if me.vendor == 0 && me.device == 0 {
        return None;
    }
    let alike = |a: &wgpu::AdapterInfo| (a.vendor, a.device, a.device_type) == (me.vendor, me.device, me.device_type);
    let earlier = &adapters[..index];
    let k = earlier.iter().filter(|a| a.backend == me.backend && alike(a)).count();
    let other_api = earlier.iter().find(|a| a.backend != me.backend && alike(a))?.backend;
    earlier
        .iter()
        .enumerate()
        .filter(|(_, a)| a.backend == other_api && alike(a))
        .nth(k)
        .map(|(i, _)| i)
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
        (
            "subgroups".into(),
            if features.contains(wgpu::Features::SUBGROUP) {
                format!("yes, {} to {} lanes", info.subgroup_min_size, info.subgroup_max_size)
            } else {
                "no".into()
            },
        ),
        ("cooperative matrices".into(), cooperative_matrices(adapter)),
        ("matrix products".into(), planned_products(adapter)),
        (
            "passthrough shaders".into(),
            has(wgpu::Features::PASSTHROUGH_SHADERS).into(),
        ),
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

/// The adapter's cooperative-matrix shapes as `MxNxK A->C` (`16x16x16 f16->f32`), or "no":
/// what a tensor-core tier could ask for on this adapter.
fn cooperative_matrices(adapter: &wgpu::Adapter) -> String {
    if !adapter
        .features()
        .contains(wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX)
    {
        return "no".into();
    }
    let shapes: Vec<String> = adapter
        .cooperative_matrix_properties()
        .iter()
        .map(|p| {
            let saturating = if p.saturating_accumulation { " saturating" } else { "" };
            format!(
                "{}x{}x{} {:?}->{:?}{saturating}",
                p.m_size, p.n_size, p.k_size, p.ab_type, p.cr_type
            )
            .to_lowercase()
        })
        .collect();
    if shapes.is_empty() {
        "feature listed, no shapes".into()
    } else {
        shapes.join(", ")
    }
}

/// Which kernel the products would run on before the device opens (the opened device's
/// `info` says what its self-test decided).
fn planned_products(adapter: &wgpu::Adapter) -> String {
    match (Cooperative::of(adapter), Policy::from_env()) {
        (Some(tier), Policy::Off) => format!(
            "SIMT tiles (cooperative matrices {} off: LOCKSTEP_WGPU_COOP=off)",
            tier.describe()
        ),
        (Some(tier), policy) => format!(
            "cooperative matrices {} for {}, if its self-test passes when the device opens",
            tier.describe(),
            policy.describe()
        ),
        (None, _) => "SIMT tiles (no usable cooperative matrices)".into(),
    }
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
    let backend = WgpuBackend::new(Gpu::open(location, adapter, limits)?, info);
    backend.settle_products();
    Ok(Arc::new(backend))
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
        let backend = WgpuBackend::new(Gpu::open(location, adapter, adapter.limits())?, info);
        backend.settle_products();
        let backend = Arc::new(backend);
        opened()
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(ordinal, backend.clone());
        Ok(backend)
    }

    fn list(&self) -> Vec<DeviceInfo> {
        let infos: Vec<wgpu::AdapterInfo> = adapters().iter().map(wgpu::Adapter::get_info).collect();
        adapters()
            .iter()
            .enumerate()
            .map(|(i, a)| {
                let mut info = describe(&format!("wgpu:{i}"), a);
                if let Some(first) = same_gpu_as(&infos, i) {
                    info.details.insert(0, ("same GPU as".into(), format!("wgpu:{first}")));
                }
                info
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use wgpu::{Backend, DeviceType};

    fn adapter(vendor: u32, device: u32, device_type: DeviceType, backend: Backend) -> wgpu::AdapterInfo {
        wgpu::AdapterInfo {
            vendor,
            device,
            ..wgpu::AdapterInfo::new(device_type, backend)
        }
    }

    #[test]
    fn a_hybrid_laptops_discrete_gpu_comes_first_and_software_last() {
        let mut found = [
            (DeviceType::Cpu, Backend::Vulkan),
            (DeviceType::IntegratedGpu, Backend::Vulkan),
            (DeviceType::DiscreteGpu, Backend::Gl),
            (DeviceType::DiscreteGpu, Backend::Dx12),
            (DeviceType::DiscreteGpu, Backend::Vulkan),
        ];
        found.sort_by_key(|&(kind, api)| adapter_rank(kind, api));
        assert_eq!(
            found,
            [
                (DeviceType::DiscreteGpu, Backend::Vulkan),
                (DeviceType::DiscreteGpu, Backend::Dx12),
                (DeviceType::DiscreteGpu, Backend::Gl),
                (DeviceType::IntegratedGpu, Backend::Vulkan),
                (DeviceType::Cpu, Backend::Vulkan),
            ]
        );
    }

    #[test]
    fn one_gpu_through_several_apis_is_named_as_the_first_listed() {
        let nvidia = 0x10de;
        let infos = [
            adapter(nvidia, 0x2684, DeviceType::DiscreteGpu, Backend::Vulkan),
            adapter(nvidia, 0x2684, DeviceType::DiscreteGpu, Backend::Dx12),
            adapter(0x8086, 0xa7a0, DeviceType::IntegratedGpu, Backend::Vulkan),
            adapter(nvidia, 0x2684, DeviceType::DiscreteGpu, Backend::Gl),
            adapter(0, 0, DeviceType::Other, Backend::Gl),
            adapter(0, 0, DeviceType::Other, Backend::Vulkan),
        ];
        let same: Vec<Option<usize>> = (0..infos.len()).map(|i| same_gpu_as(&infos, i)).collect();
        assert_eq!(same, [None, Some(0), None, Some(0), None, None]);
    }

    #[test]
    fn two_identical_cards_stay_two_gpus() {
        let card = |backend| adapter(0x1002, 0x744c, DeviceType::DiscreteGpu, backend);
        let infos = [
            card(Backend::Vulkan),
            card(Backend::Vulkan),
            card(Backend::Dx12),
            card(Backend::Dx12),
        ];
        let same: Vec<Option<usize>> = (0..infos.len()).map(|i| same_gpu_as(&infos, i)).collect();
        assert_eq!(same, [None, None, Some(0), Some(1)]);
        // Where the driver reports PCI buses, they decide.
        let on_bus = |backend, bus: &str| wgpu::AdapterInfo {
            device_pci_bus_id: bus.into(),
            ..card(backend)
        };
        let infos = [
            on_bus(Backend::Vulkan, "0000:41:00.0"),
            on_bus(Backend::Vulkan, "0000:01:00.0"),
            on_bus(Backend::Dx12, "0000:01:00.0"),
        ];
        let same: Vec<Option<usize>> = (0..infos.len()).map(|i| same_gpu_as(&infos, i)).collect();
        assert_eq!(same, [None, None, Some(1)]);
    }
}
