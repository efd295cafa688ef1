//! A device allocation: a raw pointer into the stream-ordered pool, its dtype and length, and
//! the event of a collective still writing it on the communication stream (if any), which the
//! compute stream waits for before its next use of the buffer.

use std::any::Any;
use std::fmt;
use std::sync::{Arc, Mutex};

use cudarc::driver::{CudaEvent, CudaStream, sys};

use lockstep_core::backend::{BackendBuffer, BufferRef};
use lockstep_core::{DType, Error, Result};

use crate::memory::Memory;

pub struct CudaBuffer {
    dtype: DType,
    len: usize,
    pub(crate) ptr: sys::CUdeviceptr,
    memory: Arc<Memory>,
    /// The compute stream, which must wait for `pending` before freeing or touching the buffer.
    stream: Arc<CudaStream>,
    pending: Mutex<Option<Arc<CudaEvent>>>,
}

impl CudaBuffer {
    pub(crate) fn new(dtype: DType, len: usize, memory: Arc<Memory>, stream: Arc<CudaStream>) -> Result<CudaBuffer> {
        let ptr = memory.alloc(len * dtype.size_in_bytes())?;
        Ok(CudaBuffer {
            dtype,
            len,
            ptr,
            memory,
            stream,
            pending: Mutex::new(None),
        })
    }

    pub(crate) fn on_memory(&self, memory: &Arc<Memory>) -> bool {
        Arc::ptr_eq(&self.memory, memory)
    }

    pub(crate) fn bytes(&self) -> usize {
        self.len * self.dtype.size_in_bytes()
    }

    /// Marks the buffer as written by work on another stream that `event` follows.
    pub(crate) fn set_pending(&self, event: Arc<CudaEvent>) {
        *self.pending.lock().unwrap_or_else(|p| p.into_inner()) = Some(event);
    }

    /// Orders the compute stream after any pending write from another stream.
    pub(crate) fn ready(&self) -> Result<()> {
        if let Some(event) = self.pending.lock().unwrap_or_else(|p| p.into_inner()).take() {
            // `wait` binds the stream's context to this thread first.
            self.stream.wait(&event).map_err(|e| Error::Device {
                device: format!("cuda:{}", self.stream.context().ordinal()),
                msg: format!("waiting for a collective: {e:?}"),
            })?;
        }
        Ok(())
    }
}

impl Drop for CudaBuffer {
    fn drop(&mut self) {
        // A collective may still be writing it: the free is ordered after that write.
        let _ = self.ready();
        self.memory.free(self.ptr, self.bytes());
    }
}

impl fmt::Debug for CudaBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CudaBuffer({} x {}, {:#x})", self.len, self.dtype, self.ptr)
    }
}

impl BackendBuffer for CudaBuffer {
    fn as_any(&self) -> &dyn Any {
        self
    }
    fn dtype(&self) -> DType {
        self.dtype
    }
    fn len(&self) -> usize {
        self.len
    }
}

/// The CUDA buffer behind a `BufferRef`, or an error naming the op and the buffer's real home.
pub(crate) fn cuda_buffer<'a>(op: &'static str, buf: &'a BufferRef) -> Result<&'a CudaBuffer> {
    buf.as_any().downcast_ref::<CudaBuffer>().ok_or_else(|| {
        Error::invalid(
            op,
            format!("{buf:?} is not a CUDA buffer; move it with `to_device` first"),
        )
    })
}
