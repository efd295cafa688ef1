//! A model's weights in a file of their own: its parameters and buffers under PyTorch's names as
//! one safetensors file (`model.load_state_dict(safetensors.torch.load_file(path))` reads it),
//! and back, from such a file or from a Lockstep checkpoint (whose optimizer part is left out).

use std::collections::BTreeMap;
use std::path::Path;

use super::module::{Module, ModuleExt};
use crate::error::Result;
use crate::tensor::Tensor;
use crate::train::checkpoint::{
    FORMAT_KEY, TensorFile, host_to_device, load_tensors, save_tensors, training::OPTIMIZER_PREFIX,
};

/// What a non-strict load left out, as PyTorch's `load_state_dict(strict=False)` reports it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LoadReport {
    /// The module's names the file did not have (they keep their values).
    pub missing_keys: Vec<String>,
    /// The file's names the module does not have (ignored).
    pub unexpected_keys: Vec<String>,
}

/// Writes `module`'s state dict to `path`, atomically.
pub fn save(module: &dyn Module, path: &Path) -> Result<()> {
    save_tensors(path, &module.state_dict(), BTreeMap::new())
}

/// Reads weights from `path` into `module`, converting dtype and moving to each tensor's device.
/// Strict: every name must match both ways and nothing is written otherwise. Not strict: the
/// names both have are loaded and the rest reported. A shape that differs is an error either way.
pub fn load(module: &dyn Module, path: &Path, strict: bool) -> Result<LoadReport> {
    load_weights(module, &load_tensors(path)?, strict)
}

/// As `Module::load` (`strict`) or `Module::load_non_strict`, from a safetensors file already
/// read, e.g. by [`checkpoint::parse_tensors`](crate::train::checkpoint::parse_tensors) from
/// bytes that are not in a file.
pub fn load_weights(module: &dyn Module, file: &TensorFile, strict: bool) -> Result<LoadReport> {
    // A Lockstep checkpoint also holds the optimizer's state: not the model's to load.
    let checkpoint = file.metadata.contains_key(FORMAT_KEY);
    let own = module.state_dict();
    let given: Vec<(String, Tensor)> = file
        .tensors
        .iter()
        .filter(|(name, _)| !(checkpoint && name.starts_with(OPTIMIZER_PREFIX)))
        .map(|(name, t)| {
            // Converted to the dtype and device of the tensor it will replace, when there is one.
            let like = own.iter().find(|(n, _)| n == name).map(|(_, t)| t);
            let (dtype, device) = like.map_or((t.data.dtype(), crate::device::Device::cpu()), |l| {
                (l.dtype(), l.device().clone())
            });
            Ok((name.clone(), host_to_device(t, dtype, &device)?))
        })
        .collect::<Result<_>>()?;
    if strict {
        module.load_state_dict(&given)?;
        return Ok(LoadReport::default());
    }
    let has = |list: &[(String, Tensor)], name: &str| list.iter().any(|(n, _)| n == name);
    let report = LoadReport {
        missing_keys: own
            .iter()
            .filter(|(n, _)| !has(&given, n))
            .map(|(n, _)| n.clone())
            .collect(),
        unexpected_keys: given
            .iter()
            .filter(|(n, _)| !has(&own, n))
            .map(|(n, _)| n.clone())
            .collect(),
    };
    let shared: Vec<(String, Tensor)> = given.into_iter().filter(|(n, _)| has(&own, n)).collect();
    super::state_dict::load_subset(&own, &shared)?;
    Ok(report)
}
