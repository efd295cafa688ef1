//! lockstep-cuda: the Lockstep `Backend` on NVIDIA GPUs through cudarc: GEMMs on cuBLAS, every
//! other op a CUDA C kernel from lockstep-kernels compiled by NVRTC for the device's
//! architecture, memory from the driver's stream-ordered pool (plain allocations on devices
//! without one), collectives on NCCL.
//!
//! Every CUDA library is loaded at run time: the crate builds, and `lockstep` runs, on machines
//! without CUDA; opening `cuda:0` there is an error naming what is missing (`probe`).
//!
//! Call [`register`] once (the `lockstep` binary does) and `Device::parse("cuda:0")` opens the
//! first GPU.

mod backend;
mod blas;
mod buffer;
mod contract;
mod dnn;
mod entry_points;
mod error;
mod gpu;
mod in_flight;
mod memory;
mod nccl;
mod nccl_handle;
mod nccl_init;
mod nvml;
mod ops;
pub mod probe;
mod profiler;
mod provider;
mod staging;
mod views;
mod wait;

pub use backend::CudaBackend;
pub use blas::{allow_tf32, set_allow_tf32};
pub use nccl::{NcclCommunicator, NcclId};
pub use provider::{CudaProvider, backend_of};

/// Makes `cuda:N` devices available to `Device::parse` and `lockstep devices`.
pub fn register() {
    lockstep_core::device::register_provider(Box::new(CudaProvider));
}
