//! Devices chosen at run time by name (`cpu`, `cpu:1`, `wgpu:0`, `cuda:0`). The CPU backend is
//! built in; other backend crates register a `DeviceProvider` for their prefix.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use crate::backend::cpu::CpuBackend;
use crate::backend::{Backend, Communicator, DeviceInfo, LocalCommunicator};
use crate::error::{Error, Result};

/// A handle to one device. Cheap to clone; two handles are equal when they name the same device.
#[derive(Clone)]
pub struct Device {
    backend: Arc<dyn Backend>,
    location: Arc<str>,
}

impl Device {
    /// Wraps a backend instance (backend crates and tests; users go through `Device::parse`).
    pub fn from_backend(backend: Arc<dyn Backend>) -> Device {
        let location = backend.info().location.into();
        Device { backend, location }
    }
    /// The first CPU device, `cpu:0`.
    pub fn cpu() -> Device {
        Device::parse("cpu:0").expect("cpu:0 always exists")
    }
    /// Opens (once per process) the device named `name`: `cpu`, `cpu:N`, or `PREFIX:N` for a
    /// registered backend.
    pub fn parse(name: &str) -> Result<Device> {
        let name = name.trim();
        let (prefix, ordinal) = match name.split_once(':') {
            Some((p, n)) => {
                let ordinal = n.parse::<usize>().map_err(|_| Error::UnknownDevice {
                    name: name.into(),
                    hint: format!("the part after ':' must be a device number, as in `{p}:0`"),
                })?;
                (p, ordinal)
            }
            None => (name, 0),
        };
        let key = format!("{prefix}:{ordinal}");
        let mut reg = registry().lock().unwrap_or_else(|e| e.into_inner());
        if let Some(d) = reg.open.get(&key) {
            return Ok(d.clone());
        }
        let backend: Arc<dyn Backend> = if prefix == "cpu" {
            if ordinal >= MAX_CPU_DEVICES {
                return Err(Error::UnknownDevice {
                    name: name.into(),
                    hint: format!(
                        "at most {MAX_CPU_DEVICES} virtual CPU devices (cpu:0 … cpu:{})",
                        MAX_CPU_DEVICES - 1
                    ),
                });
            }
            Arc::new(CpuBackend::new(ordinal))
        } else if let Some(provider) = reg.providers.iter().find(|p| p.prefix() == prefix) {
            provider.open(ordinal)?
        } else {
            let mut known: Vec<&str> = vec!["cpu"];
            known.extend(reg.providers.iter().map(|p| p.prefix()));
            return Err(Error::UnknownDevice {
                name: name.into(),
                hint: format!(
                    "known kinds in this build: {} (e.g. `cpu:0`); `lockstep devices` lists what is present",
                    known.join(", ")
                ),
            });
        };
        let device = Device {
            backend,
            location: key.clone().into(),
        };
        reg.open.insert(key, device.clone());
        Ok(device)
    }
    /// The backend that runs this device's operations (for backend crates and custom kernels).
    pub fn backend(&self) -> &Arc<dyn Backend> {
        &self.backend
    }
    /// `cpu:0`, `wgpu:1`, …
    pub fn location(&self) -> &str {
        &self.location
    }
    /// What the device reports about itself: name, API, memory size (as shown by `lockstep devices`).
    pub fn info(&self) -> DeviceInfo {
        self.backend.info()
    }
    /// Blocks until every operation queued on this device has finished (as `torch.cuda.synchronize`);
    /// use it before reading wall-clock timings.
    pub fn synchronize(&self) -> Result<()> {
        self.backend.synchronize()
    }

    /// Hands the memory this device keeps for reuse back to the system, as
    /// `torch.cuda.empty_cache()`: after one workload, before another of other shapes.
    pub fn empty_cache(&self) -> Result<()> {
        self.backend.empty_cache()
    }
}

impl PartialEq for Device {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.backend, &other.backend) || self.location == other.location
    }
}
impl Eq for Device {}

impl fmt::Debug for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.location)
    }
}
impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.location)
    }
}

const MAX_CPU_DEVICES: usize = 64;

/// A family of devices provided by a backend crate.
pub trait DeviceProvider: Send + Sync {
    /// The name before the colon: `wgpu`, `cuda`.
    fn prefix(&self) -> &'static str;
    /// Opens device number `ordinal` of this kind, an error when the machine has no such device;
    /// `Device::parse` calls it once per device and caches the result.
    fn open(&self, ordinal: usize) -> Result<Arc<dyn Backend>>;
    /// Every device of this kind present on the machine (empty, not an error, when none).
    fn list(&self) -> Vec<DeviceInfo>;
    /// A native communicator group over `devices` (all of this kind), one per device by rank,
    /// e.g. NCCL's for `cuda:*`; None (the default) to use the core's host-staged group.
    fn communicators(&self, _devices: &[Device], _timeout: Duration) -> Option<Result<Vec<Box<dyn Communicator>>>> {
        None
    }
}

/// One communicator per device of `devices`, by rank, for the replicas of a data-parallel run:
/// the devices' own kind (NCCL for `cuda:*` where its library loads) when they are all of one
/// kind that has one, else `LocalCommunicator`, which stages through host memory and so joins
/// any mix of devices. A collective waits `timeout` for a rank before failing.
pub fn communicator_group(devices: &[Device], timeout: Duration) -> Result<Vec<Box<dyn Communicator>>> {
    let kind = |d: &Device| d.location().split(':').next().unwrap_or_default().to_string();
    if let Some(first) = devices.first()
        && devices.iter().all(|d| kind(d) == kind(first))
    {
        // Out of the registry's lock: the provider may open devices.
        let native = {
            let reg = registry().lock().unwrap_or_else(|e| e.into_inner());
            reg.providers.iter().find(|p| p.prefix() == kind(first)).cloned()
        };
        if let Some(group) = native.and_then(|p| p.communicators(devices, timeout)) {
            return group;
        }
    }
    let backends = devices.iter().map(|d| d.backend().clone()).collect();
    Ok(LocalCommunicator::group_with_timeout(backends, timeout)
        .into_iter()
        .map(|c| Box::new(c) as Box<dyn Communicator>)
        .collect())
}

#[derive(Default)]
struct Registry {
    providers: Vec<Arc<dyn DeviceProvider>>,
    open: HashMap<String, Device>,
}

fn registry() -> &'static Mutex<Registry> {
    static REGISTRY: OnceLock<Mutex<Registry>> = OnceLock::new();
    REGISTRY.get_or_init(Default::default)
}

/// Makes `PREFIX:N` devices available to `Device::parse` (a second provider for a prefix replaces the first).
pub fn register_provider(provider: Box<dyn DeviceProvider>) {
    let mut reg = registry().lock().unwrap_or_else(|e| e.into_inner());
    reg.providers.retain(|p| p.prefix() != provider.prefix());
    reg.providers.push(Arc::from(provider));
}

/// The device a run uses when none is named: a CUDA GPU, else a hardware GPU through wgpu
/// (never a software one), else `cpu:0`.
pub fn best_available() -> Result<Device> {
    let all = list_devices();
    let pick = ["cuda", "wgpu"].iter().find_map(|kind| {
        all.iter()
            .find(|d| d.location.starts_with(&format!("{kind}:")) && !d.software)
    });
    match pick {
        Some(info) => Device::parse(&info.location),
        None => Ok(Device::cpu()),
    }
}

/// `cpu:0` and every device the registered providers find.
pub fn list_devices() -> Vec<DeviceInfo> {
    let mut all = vec![Device::cpu().info()];
    let reg = registry().lock().unwrap_or_else(|e| e.into_inner());
    for p in &reg.providers {
        all.extend(p.list());
    }
    all
}
