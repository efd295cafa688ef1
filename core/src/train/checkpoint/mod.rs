//! Checkpoints: one safetensors file holding the model's tensors under their PyTorch names,
//! the optimizer's under `optimizer.…`, and the trainer's state as JSON in the file's metadata.
//! Written to a temporary file, synced, then renamed over the target, so a crash while saving
//! leaves the previous checkpoint intact.

use std::collections::{BTreeMap, HashMap};
use std::io::{Read, Write};
use std::path::Path;

use safetensors::tensor::{Dtype, SafeTensors, TensorView};

use crate::data::HostTensor;
use crate::dtype::{DType, HostVec};
use crate::error::{Error, Result};
use crate::shape::Shape;
use crate::tensor::Tensor;

pub(crate) mod training;

pub use training::hparams;

/// Marks files written by this module (a plain weights file has no such key).
#[doc(hidden)]
pub const FORMAT_KEY: &str = "lockstep.format";
/// The `FORMAT_KEY` value of this layout; resuming refuses files without it.
#[doc(hidden)]
pub const FORMAT: &str = "lockstep-checkpoint/1";

/// The contents of a safetensors file in host memory.
pub struct TensorFile {
    /// (name, tensor) pairs, sorted by name.
    pub tensors: Vec<(String, HostTensor)>,
    /// The header's `__metadata__` map (empty when the file has none).
    pub metadata: BTreeMap<String, String>,
}

impl TensorFile {
    /// The tensor named `name`, if the file has one.
    pub fn get(&self, name: &str) -> Option<&HostTensor> {
        self.tensors.iter().find(|(n, _)| n == name).map(|(_, t)| t)
    }
}

fn to_bytes(data: &HostVec) -> (Dtype, Vec<u8>) {
    match data {
        HostVec::F32(v) => (Dtype::F32, bytemuck::cast_slice(v).to_vec()),
        HostVec::F16(v) => (Dtype::F16, bytemuck::cast_slice(v).to_vec()),
        HostVec::BF16(v) => (Dtype::BF16, bytemuck::cast_slice(v).to_vec()),
        HostVec::F64(v) => (Dtype::F64, bytemuck::cast_slice(v).to_vec()),
        HostVec::I64(v) => (Dtype::I64, bytemuck::cast_slice(v).to_vec()),
        HostVec::U32(v) => (Dtype::U32, bytemuck::cast_slice(v).to_vec()),
    }
}

/// Decodes little-endian bytes (unaligned in the file) of a supported dtype.
fn from_bytes(what: &str, dtype: Dtype, bytes: &[u8]) -> Result<HostVec> {
    fn read<T: bytemuck::Pod>(bytes: &[u8]) -> Vec<T> {
        bytes
            .chunks_exact(std::mem::size_of::<T>())
            .map(bytemuck::pod_read_unaligned)
            .collect()
    }
    Ok(match dtype {
        Dtype::F32 => HostVec::F32(read(bytes)),
        Dtype::F16 => HostVec::F16(read(bytes)),
        Dtype::BF16 => HostVec::BF16(read(bytes)),
        Dtype::F64 => HostVec::F64(read(bytes)),
        Dtype::I64 => HostVec::I64(read(bytes)),
        Dtype::U32 => HostVec::U32(read(bytes)),
        // Masks (transformers' causal-mask buffers) come as bytes: widened, they stay exact.
        Dtype::U8 | Dtype::BOOL => HostVec::U32(bytes.iter().map(|&b| u32::from(b)).collect()),
        other => {
            return Err(Error::data(
                what.to_string(),
                format!("dtype {other:?} is not supported (use f32, f16, bf16, f64, i64, u32, u8 or bool)"),
            ));
        }
    })
}

/// Writes `bytes` to `path` atomically: temporary file in the same directory, fsync, rename.
/// Temporary files left in that directory by writers that were killed go first.
pub(crate) fn write_atomically(path: &Path, bytes: &[u8]) -> Result<()> {
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    remove_stale_temporaries(dir);
    let tmp = dir.join(format!(".{name}.tmp-{}", std::process::id()));
    let result = (|| {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)?;
        // Make the rename itself durable.
        if let Ok(d) = std::fs::File::open(dir) {
            let _ = d.sync_all();
        }
        Ok(())
    })();
    result.map_err(|e: std::io::Error| {
        let _ = std::fs::remove_file(&tmp);
        Error::io(path, e)
    })
}

/// Removes the `.NAME.tmp-PID` files of `write_atomically` in `dir` whose writer process no
/// longer runs: a killed writer leaves one, up to a checkpoint's size, that nothing else would
/// remove. Another live process's (a second run writing into the same directory) is left
/// alone, and so is everything where liveness cannot be told (no `/proc`).
pub(crate) fn remove_stale_temporaries(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for entry in entries.flatten() {
        let file = entry.file_name();
        let writer = file
            .to_str()
            .filter(|f| f.starts_with('.'))
            .and_then(|f| f.rsplit_once(".tmp-"))
            .and_then(|(_, pid)| pid.parse::<u32>().ok());
        if writer.is_some_and(|pid| pid != std::process::id() && process_is_gone(pid)) {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

/// Whether process `pid` has certainly exited (Linux's `/proc`; elsewhere never certain).
fn process_is_gone(pid: u32) -> bool {
    Path::new("/proc/self").exists() && !Path::new(&format!("/proc/{pid}")).exists()
}

/// Saves named tensors (read back from their devices) and metadata as one safetensors file.
pub fn save_tensors(path: &Path, tensors: &[(String, Tensor)], metadata: BTreeMap<String, String>) -> Result<()> {
    let mut encoded = Vec::with_capacity(tensors.len());
    for (name, t) in tensors {
        let (dtype, bytes) = to_bytes(&t.to_host()?);
        encoded.push((name.clone(), dtype, t.dims().to_vec(), bytes));
    }
    let views = encoded
        .iter()
        .map(|(name, dtype, shape, bytes)| TensorView::new(*dtype, shape.clone(), bytes).map(|v| (name.clone(), v)))
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|e| Error::data(path.display().to_string(), e.to_string()))?;
    let info: HashMap<String, String> = metadata.into_iter().collect();
    let bytes = safetensors::tensor::serialize(views, Some(info))
        .map_err(|e| Error::data(path.display().to_string(), e.to_string()))?;
    write_atomically(path, &bytes)
}

/// Reads a whole safetensors file, saying what is wrong when it is not one.
pub fn load_tensors(path: &Path) -> Result<TensorFile> {
    let bytes = std::fs::read(path).map_err(|e| Error::io(path, e))?;
    parse_tensors(&bytes, &path.display().to_string())
}

/// The tensors and metadata of the safetensors file whose contents are `bytes` (named `what` in
/// errors), as [`load_tensors`] reads them.
pub fn parse_tensors(bytes: &[u8], what: &str) -> Result<TensorFile> {
    let corrupt = |e: safetensors::SafeTensorError| {
        Error::data(
            what,
            format!("not a valid safetensors file ({e}); it may be truncated or corrupt"),
        )
    };
    let (_, header) = SafeTensors::read_metadata(bytes).map_err(corrupt)?;
    let file = SafeTensors::deserialize(bytes).map_err(corrupt)?;
    let mut tensors = Vec::new();
    for (name, view) in file.tensors() {
        let tensor = format!("{what}: tensor {name}");
        // safetensors checks that the data fills the shape, which a 0 anywhere in it does: the
        // other dimensions must still multiply within a usize, as the tensor's strides do.
        let dims = view.shape();
        if dims
            .iter()
            .filter(|&&d| d != 0)
            .try_fold(1usize, |n, &d| n.checked_mul(d))
            .is_none()
        {
            return Err(Error::data(
                tensor,
                format!("shape {dims:?} is too large to address (its dimensions overflow a usize)"),
            ));
        }
        let data = from_bytes(&tensor, view.dtype(), view.data())?;
        tensors.push((
            name,
            HostTensor {
                data,
                shape: Shape::new(view.shape().to_vec()),
            },
        ));
    }
    tensors.sort_by(|a, b| a.0.cmp(&b.0));
    let metadata = header.metadata().clone().unwrap_or_default().into_iter().collect();
    Ok(TensorFile { tensors, metadata })
}

/// A safetensors file's metadata, from its header alone: what a checkpoint says about itself
/// without reading its tensors.
pub fn load_metadata(path: &Path) -> Result<BTreeMap<String, String>> {
    let file = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
    read_metadata(file, &path.display().to_string())
}

/// The metadata in the header of the safetensors file read from `file` (named `what` in errors),
/// as [`load_metadata`] reads it; nothing past the header is read.
pub fn read_metadata(mut file: impl Read, what: &str) -> Result<BTreeMap<String, String>> {
    /// safetensors' own bound on a header.
    const MAX_HEADER: u64 = 100_000_000;
    #[derive(serde::Deserialize)]
    struct Header {
        #[serde(rename = "__metadata__", default)]
        metadata: BTreeMap<String, String>,
    }
    let corrupt = |why: String| {
        Error::data(
            what,
            format!("not a valid safetensors file ({why}); it may be truncated or corrupt"),
        )
    };
    let mut len = [0u8; 8];
    file.read_exact(&mut len).map_err(|e| corrupt(e.to_string()))?;
    let len = u64::from_le_bytes(len);
    if len > MAX_HEADER {
        return Err(corrupt(format!("a header of {len} bytes")));
    }
    // The length is outside input: the buffer grows with the bytes that are really there.
    let mut header = Vec::new();
    file.take(len)
        .read_to_end(&mut header)
        .map_err(|e| corrupt(e.to_string()))?;
    if header.len() as u64 != len {
        return Err(corrupt(format!(
            "a header of {len} bytes, but the file ends after {}",
            header.len()
        )));
    }
    let header: Header = serde_json::from_slice(&header).map_err(|e| corrupt(e.to_string()))?;
    Ok(header.metadata)
}

/// Converts a loaded tensor to `dtype` on `device`.
pub(crate) fn host_to_device(t: &HostTensor, dtype: DType, device: &crate::device::Device) -> Result<Tensor> {
    if t.data.dtype() == dtype {
        return Tensor::from_host(t.data.clone(), t.shape.clone(), device);
    }
    let values = t.data.to_f64_vec();
    Tensor::from_host(HostVec::from_f64(dtype, &values), t.shape.clone(), device)
}
