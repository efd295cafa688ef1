//! lockstep-wgpu: the Lockstep `Backend` on wgpu, so training runs on any vendor's GPU (Vulkan,
//! Metal, DX12, GL) through WGSL compute shaders, and on Mesa's lavapipe in CI.
//!
//! Call [`register`] once (the `lockstep` binary does) and `Device::parse("wgpu:0")` opens the
//! first adapter. Collectives across several wgpu devices use the core's `LocalCommunicator`,
//! which stages through host memory and so works for any mix of adapters.
//!
//! How the backend stays fast: buffers come from a caching pool (`pool`), each shader variant
//! compiles once (`pipelines`), dispatches accumulate into one submission (`batch`) and only
//! read-backs wait for the GPU (`transfer`).

mod backend;
mod batch;
mod buffer;
mod contract;
mod gpu;
mod meter;
mod ops;
mod pipelines;
mod pool;
mod provider;
mod transfer;

pub use backend::WgpuBackend;
pub use provider::{WgpuProvider, adapter, details};

/// Makes `wgpu:N` devices available to `Device::parse` and `lockstep devices`.
pub fn register() {
    lockstep_core::device::register_provider(Box::new(WgpuProvider));
}
