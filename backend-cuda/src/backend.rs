//! `CudaBackend`: the core `Backend` on one CUDA device. This file holds the plumbing every op
//! shares (operand checks, dtype suffixes of kernel names, outputs); the ops live in `ops/`, one
//! file per kernel file, and `contract.rs` maps the trait onto them.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use lockstep_core::backend::{BackendBuffer, BufferRef, DeviceInfo, MemoryStats};
use lockstep_core::shape::Layout;
use lockstep_core::{DType, Error, Result};

use crate::buffer::{CudaBuffer, cuda_buffer};
use crate::gpu::Gpu;
use crate::nvml::Utilization;

pub struct CudaBackend {
    pub(crate) gpu: Gpu,
    info: DeviceInfo,
    utilization: Utilization,
    /// The fused attention's start-up verdicts by (dtype, head dim) (ops/attention_check.rs).
    pub(crate) attention_checks: Mutex<HashMap<(DType, usize), bool>>,
    /// The multi-tensor kernels' start-up verdicts by dtype (ops/multi_tensor_check.rs).
    pub(crate) multi_tensor_checks: Mutex<HashMap<DType, bool>>,
    /// The column reduction's start-up verdicts by dtype (ops/reduce_check.rs).
    pub(crate) column_reduce_checks: Mutex<HashMap<DType, bool>>,
}

impl std::fmt::Debug for CudaBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CudaBackend({}: {})", self.gpu.location, self.info.name)
    }
}

impl CudaBackend {
    pub(crate) fn new(gpu: Gpu, info: DeviceInfo) -> CudaBackend {
        let utilization = Utilization::for_device(&gpu.ctx);
        CudaBackend {
            gpu,
            info,
            utilization,
            attention_checks: Mutex::default(),
            multi_tensor_checks: Mutex::default(),
            column_reduce_checks: Mutex::default(),
        }
    }

    pub(crate) fn device_info(&self) -> DeviceInfo {
        self.info.clone()
    }

    pub(crate) fn memory(&self) -> MemoryStats {
        self.gpu.memory.stats(self.utilization.percent())
    }

    /// A new output buffer.
    pub(crate) fn output(&self, dtype: DType, len: usize) -> Result<Arc<CudaBuffer>> {
        Ok(Arc::new(self.gpu.alloc(dtype, len)?))
    }

    /// An operand: a CUDA buffer of this device, `layout` (if any) inside it, its pending
    /// collective (if any) waited for on the compute stream.
    pub(crate) fn operand<'a>(
        &self,
        op: &'static str,
        b: &'a BufferRef,
        layout: Option<&Layout>,
    ) -> Result<&'a CudaBuffer> {
        let buffer = cuda_buffer(op, b)?;
        if !buffer.on_memory(&self.gpu.memory) {
            return Err(Error::DeviceMismatch {
                op,
                a: self.gpu.location.clone(),
                b: "another CUDA device".into(),
            });
        }
        if let Some(layout) = layout
            && layout.elem_count() > 0
            && layout.extent() > buffer.len()
        {
            return Err(Error::invalid(
                op,
                format!("layout {layout:?} reaches past a buffer of {} elements", buffer.len()),
            ));
        }
        self.gpu.enter()?;
        buffer.ready()?;
        Ok(buffer)
    }

    /// Operands that must share one dtype.
    pub(crate) fn same_dtype(&self, op: &'static str, a: &CudaBuffer, b: &CudaBuffer) -> Result<DType> {
        if a.dtype() != b.dtype() {
            return Err(Error::DTypeMismatch {
                op,
                lhs: a.dtype(),
                rhs: b.dtype(),
            });
        }
        Ok(a.dtype())
    }
}
