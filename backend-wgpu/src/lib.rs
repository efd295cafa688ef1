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
mod bind_groups;
mod bind_layout;
mod buffer;
mod contract;
mod cooperative;
mod cooperative_spirv;
mod fault;
mod gpu;
mod headless;
mod in_flight;
mod kernel_timer;
mod meter;
mod ops;
mod pipelines;
mod pool;
mod provider;
mod scope;
mod spirv_memory_model;
mod transfer;

pub use backend::WgpuBackend;
/// The cooperative-matrix product's translation for Vulkan (naga, then its workgroup-memory
/// accesses made non-private), for probes that compare it with wgpu's.
#[doc(hidden)]
pub use cooperative::{TILES as COOPERATIVE_TILES, Translation};
#[doc(hidden)]
pub use cooperative_spirv::translate as translate_to_vulkan_spirv;
#[doc(hidden)]
pub use fault::Fault;
pub use headless::quiet_display_probe_without_session;
pub use ops::matmul::MatmulKernel;
pub use provider::{WgpuProvider, adapter, backend_of, open_with_limits};

/// Makes `wgpu:N` devices available to `Device::parse` and `lockstep devices`.
pub fn register() {
    lockstep_core::device::register_provider(Box::new(WgpuProvider));
}

use lockstep_core::backend::MatmulDims;
use lockstep_core::{Error, Result, Tensor};

/// `a @ b` for 2-D tensors on a wgpu device with the untiled kernel (one invocation per output,
/// no reuse): the baseline `lockstep bench gpu` measures the tiled kernel against.
pub fn matmul_naive(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    let backend = backend_of(a.device()).ok_or_else(|| Error::invalid("matmul_naive", "runs on wgpu devices only"))?;
    let (&[m, k], &[k2, n]) = (a.dims(), b.dims()) else {
        return Err(Error::invalid("matmul_naive", "takes two matrices"));
    };
    if k != k2 {
        return Err(Error::shape(
            "matmul_naive",
            a.shape(),
            b.shape(),
            "inner dimensions differ",
        ));
    }
    let batched = |t: &Tensor, rows, cols| {
        let mut l = t.layout().clone();
        l.shape = lockstep_core::Shape::new([1, rows, cols]);
        l.strides.insert(0, 0);
        l
    };
    let dims = MatmulDims { batch: 1, m, n, k };
    let out = backend.matmul_naive(a.buffer(), &batched(a, m, k), b.buffer(), &batched(b, k, n), dims)?;
    Ok(Tensor::from_buffer(out, [m, n], a.device()))
}

/// `a @ b` on a wgpu device with `kernel`'s block product, whatever `LOCKSTEP_WGPU_MATMUL` says:
/// matrices `[m, k] @ [k, n]` or batches `[batch, m, k] @ [batch, k, n]`, with any strides (a
/// transposed or broadcast operand as it is). For tests and benchmarks that compare the kernels.
pub fn matmul_with(a: &Tensor, b: &Tensor, kernel: MatmulKernel) -> Result<Tensor> {
    const OP: &str = "matmul_with";
    let backend = backend_of(a.device()).ok_or_else(|| Error::invalid(OP, "runs on wgpu devices only"))?;
    let batched = |t: &Tensor| {
        let mut l = t.layout().clone();
        if l.strides.len() == 2 {
            l.shape = lockstep_core::Shape::new([1, t.dims()[0], t.dims()[1]]);
            l.strides.insert(0, 0);
        }
        l
    };
    let (ll, rl) = (batched(a), batched(b));
    let (&[batch, m, k], &[batch2, k2, n]) = (ll.dims(), rl.dims()) else {
        return Err(Error::invalid(OP, "takes two matrices or two batches of them"));
    };
    if k != k2 || batch != batch2 || a.dims().len() != b.dims().len() {
        return Err(Error::shape(
            OP,
            a.shape(),
            b.shape(),
            "the product's dimensions differ",
        ));
    }
    let dims = MatmulDims { batch, m, n, k };
    let out = backend.gemm_by(kernel, a.buffer(), &ll, b.buffer(), &rl, dims)?;
    let shape = if a.dims().len() == 2 {
        vec![m, n]
    } else {
        vec![batch, m, n]
    };
    Ok(Tensor::from_buffer(out, shape, a.device()))
}
