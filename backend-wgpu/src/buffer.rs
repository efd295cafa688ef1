//! A tensor's storage on a wgpu device.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use lockstep_core::DType;
use lockstep_core::backend::{BackendBuffer, BufferRef};
use lockstep_core::{Error, Result};

use crate::pool::Pool;

pub struct WgpuBuffer {
    /// Always `Some` until dropped, when it goes back to the pool.
    raw: Option<wgpu::Buffer>,
    dtype: DType,
    len: usize,
    pool: Arc<Pool>,
    /// The last batch of recorded commands that bound this buffer (see `Batch::touch`).
    pub(crate) last_batch: AtomicU64,
}

impl WgpuBuffer {
    pub fn new(raw: wgpu::Buffer, last_batch: u64, dtype: DType, len: usize, pool: Arc<Pool>) -> WgpuBuffer {
        WgpuBuffer {
            raw: Some(raw),
            dtype,
            len,
            pool,
            last_batch: AtomicU64::new(last_batch),
        }
    }
    pub fn dtype(&self) -> DType {
        self.dtype
    }
    /// Number of elements.
    pub fn len(&self) -> usize {
        self.len
    }
    pub fn raw(&self) -> &wgpu::Buffer {
        self.raw.as_ref().expect("a live buffer holds its allocation")
    }
    pub fn used_in(&self, batch: u64) -> bool {
        self.last_batch.load(Ordering::Relaxed) == batch
    }
}

impl Drop for WgpuBuffer {
    fn drop(&mut self) {
        if let Some(raw) = self.raw.take() {
            self.pool.give(raw, self.last_batch.load(Ordering::Relaxed));
        }
    }
}

impl fmt::Debug for WgpuBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "WgpuBuffer({} x {})", self.len, self.dtype)
    }
}

impl BackendBuffer for WgpuBuffer {
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
    fn dtype(&self) -> DType {
        WgpuBuffer::dtype(self)
    }
    fn len(&self) -> usize {
        WgpuBuffer::len(self)
    }
}

/// The wgpu buffer behind `b`, or an error naming the op when it lives on another kind of device.
pub fn wgpu_buffer<'a>(op: &'static str, b: &'a BufferRef) -> Result<&'a WgpuBuffer> {
    b.as_any().downcast_ref::<WgpuBuffer>().ok_or_else(|| {
        Error::invalid(
            op,
            "a buffer from another kind of device reached the wgpu backend; move tensors with `to_device` first",
        )
    })
}
