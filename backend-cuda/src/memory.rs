//! Device memory from the driver's stream-ordered pool (cuMemAllocAsync on the compute stream),
//! told to keep what is freed (release threshold: unlimited): after the first training step,
//! allocations are served from the pool and nothing goes back to, or comes from, the driver.
//! Our own counters give allocated and peak bytes; the pool gives reserved bytes.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use cudarc::driver::{CudaStream, result, sys};

use lockstep_core::backend::MemoryStats;

use crate::error::driver_error;

pub(crate) struct Memory {
    location: String,
    stream: Arc<CudaStream>,
    pool: Option<sys::CUmemoryPool>,
    allocated: AtomicU64,
    peak: AtomicU64,
}

// SAFETY: the pool handle is a driver object usable from any thread of the process; we only
// read and set its attributes.
unsafe impl Send for Memory {}
// SAFETY: as above; the counters are atomics.
unsafe impl Sync for Memory {}

impl Memory {
    pub(crate) fn new(location: String, stream: Arc<CudaStream>) -> Memory {
        let device = stream.context().cu_device();
        // SAFETY: `device` comes from a live context; the attribute takes a u64 by pointer.
        let pool = unsafe {
            result::device::get_default_mem_pool(device).ok().inspect(|&pool| {
                let mut keep_everything = u64::MAX;
                let _ = result::mem_pool::set_attribute(
                    pool,
                    sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
                    &mut keep_everything as *mut u64 as *mut _,
                );
            })
        };
        Memory {
            location,
            stream,
            pool,
            allocated: AtomicU64::new(0),
            peak: AtomicU64::new(0),
        }
    }

    /// `bytes` of uninitialised device memory, ordered on the compute stream.
    pub(crate) fn alloc(&self, bytes: usize) -> lockstep_core::Result<sys::CUdeviceptr> {
        // The pool hands out nothing for zero bytes; keep one word so every buffer has an address.
        let bytes = bytes.max(4);
        // SAFETY: the stream is live (we hold it); the memory is only used on this stream or on
        // streams ordered after it by events.
        let ptr = unsafe { result::malloc_async(self.stream.cu_stream(), bytes) }.map_err(|e| {
            driver_error(
                &self.location,
                &format!("could not allocate {bytes} bytes (out of GPU memory? lower the batch size)"),
                e,
            )
        })?;
        let now = self.allocated.fetch_add(bytes as u64, Ordering::Relaxed) + bytes as u64;
        self.peak.fetch_max(now, Ordering::Relaxed);
        Ok(ptr)
    }

    /// Returns `ptr` (of `bytes`, as allocated) to the pool once the compute stream is past its uses.
    pub(crate) fn free(&self, ptr: sys::CUdeviceptr, bytes: usize) {
        let bytes = bytes.max(4);
        // Buffers are dropped on whatever thread held them last (a loader, a reducer).
        let _ = self.stream.context().bind_to_thread();
        // SAFETY: `ptr` came from `alloc` on this stream and is freed once (its buffer's drop).
        let _ = unsafe { result::free_async(ptr, self.stream.cu_stream()) };
        self.allocated.fetch_sub(bytes as u64, Ordering::Relaxed);
    }

    pub(crate) fn stats(&self, utilization: Option<f64>) -> MemoryStats {
        let allocated = self.allocated.load(Ordering::Relaxed);
        MemoryStats {
            allocated_bytes: allocated,
            reserved_bytes: self.reserved().unwrap_or(allocated),
            peak_allocated_bytes: self.peak.load(Ordering::Relaxed),
            utilization,
        }
    }

    /// What the pool holds from the driver (in use or cached for reuse).
    pub(crate) fn reserved(&self) -> Option<u64> {
        let pool = self.pool?;
        let mut value = 0u64;
        // SAFETY: the attribute is a u64 written through the pointer.
        unsafe {
            result::mem_pool::get_attribute(
                pool,
                sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT,
                &mut value as *mut u64 as *mut _,
            )
        }
        .ok()?;
        Some(value)
    }
}
