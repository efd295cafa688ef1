//! Utilization from NVML, matched to the CUDA device by PCI address (NVML and CUDA number GPUs
//! differently). No NVML, or a GPU it does not know, is "unknown" (None), never an error.

use std::sync::{Arc, OnceLock};

use cudarc::driver::{CudaContext, sys};
use nvml_wrapper::Nvml;

fn nvml() -> Option<&'static Nvml> {
    static NVML: OnceLock<Option<Nvml>> = OnceLock::new();
    NVML.get_or_init(|| Nvml::init().ok()).as_ref()
}

pub(crate) struct Utilization {
    pci_bus_id: Option<String>,
}

impl Utilization {
    pub(crate) fn for_device(ctx: &Arc<CudaContext>) -> Utilization {
        let attr = |a| ctx.attribute(a).ok();
        let pci_bus_id = (|| {
            let domain = attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID)?;
            let bus = attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_PCI_BUS_ID)?;
            let device = attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID)?;
            Some(format!("{domain:08x}:{bus:02x}:{device:02x}.0"))
        })();
        Utilization { pci_bus_id }
    }

    /// The GPU's busy fraction over NVML's last sample period, 0 to 1.
    pub(crate) fn percent(&self) -> Option<f64> {
        let device = nvml()?.device_by_pci_bus_id(self.pci_bus_id.as_deref()?).ok()?;
        Some(device.utilization_rates().ok()?.gpu as f64 / 100.0)
    }
}

/// The driver version NVML reports, for `lockstep devices`.
pub(crate) fn driver_version() -> Option<String> {
    nvml()?.sys_driver_version().ok()
}
