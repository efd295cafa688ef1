//! lockstep-kernels: the CUDA C kernels of the CUDA backend, as source text compiled by NVRTC at
//! run time for the device's architecture (never nvcc at build time), and cached on disk keyed
//! by the source's hash, the architecture and the NVRTC version.
//!
//! Each file in `cuda/` is one module; NVRTC compiles `prelude.cuh` followed by the file, so
//! kernels need no `#include`. Kernel names are `<op>_<dtype>`, matching the Backend method.

mod cache;
mod compile;
mod cubin;
mod entry_points;

pub use cache::{cache_dir, compile_cached};
pub use compile::{CompileError, compile, nvrtc_present, nvrtc_version};

/// One kernel file: a module with the entry points its name says.
#[derive(Clone, Copy, Debug)]
pub struct KernelSource {
    pub name: &'static str,
    pub code: &'static str,
}

/// Definitions every kernel file relies on (storage types, strided views, unary ops).
pub const PRELUDE: &str = include_str!("../cuda/prelude.cuh");

macro_rules! kernel {
    ($name:literal) => {
        KernelSource {
            name: $name,
            code: include_str!(concat!("../cuda/", $name, ".cu")),
        }
    };
}

pub const FILL: KernelSource = kernel!("fill");
pub const RAND: KernelSource = kernel!("rand");
pub const LAYOUT: KernelSource = kernel!("layout");
pub const ELEMENTWISE: KernelSource = kernel!("elementwise");
pub const REDUCE: KernelSource = kernel!("reduce");
pub const SOFTMAX: KernelSource = kernel!("softmax");
pub const CROSS_ENTROPY: KernelSource = kernel!("cross_entropy");
pub const LAYER_NORM: KernelSource = kernel!("layer_norm");
pub const BATCH_NORM: KernelSource = kernel!("batch_norm");
pub const INDEX: KernelSource = kernel!("index");
pub const CONV: KernelSource = kernel!("conv");
pub const OPTIM: KernelSource = kernel!("optim");
pub const ATTENTION: KernelSource = kernel!("attention");

/// Every kernel file; the compile test builds each for sm_80 and sm_90.
pub const ALL: [KernelSource; 13] = [
    FILL,
    RAND,
    LAYOUT,
    ELEMENTWISE,
    REDUCE,
    SOFTMAX,
    CROSS_ENTROPY,
    LAYER_NORM,
    BATCH_NORM,
    INDEX,
    CONV,
    OPTIM,
    ATTENTION,
];

impl KernelSource {
    /// What NVRTC compiles: the prelude, then this file.
    pub fn program(&self) -> String {
        format!("{PRELUDE}\n// ---- {}.cu\n{}", self.name, self.code)
    }

    /// The names of the entry points (`extern "C" __global__` functions) this file defines, read
    /// from its source with its macros expanded, no compiler needed; an error says which macro
    /// call the reader could not expand.
    pub fn entry_points(&self) -> Result<Vec<String>, String> {
        entry_points::entry_points(&self.program())
    }
}

#[cfg(test)]
mod attention_layout;
#[cfg(test)]
mod tests;
