//! Device memory. Where the device has memory pools: the driver's stream-ordered pool
//! (cuMemAllocAsync on the compute stream), told to keep what is freed (release threshold:
//! unlimited), so after the first training step allocations are served from the pool and
//! nothing goes back to, or comes from, the driver. Where it has none (some vGPUs), or with
//! `LOCKSTEP_CUDA_NO_POOL=1`: plain cuMemAlloc/cuMemFree, each free waiting for the compute
//! stream first (slower; correct).
//! Our own counters give allocated and peak bytes either way; the pool, if any, gives reserved
//! bytes (without one, what is reserved is what is allocated).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use cudarc::driver::{CudaStream, result, sys};

use lockstep_core::backend::MemoryStats;

use crate::error::driver_error;

/// How device memory is taken from and given back to the driver.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Allocator {
    /// cuMemAllocAsync / cuMemFreeAsync on the compute stream, from the device's default pool.
    StreamOrdered,
    /// cuMemAlloc / cuMemFree: a free first waits for the compute stream, which may still be
    /// using the memory.
    Synchronous,
}

impl Allocator {
    /// The stream-ordered pool wherever the device supports memory pools and it is not turned
    /// off; plain allocations otherwise (every cuMemAllocAsync would fail there).
    pub(crate) fn choose(pools_supported: bool, pool_turned_off: bool) -> Allocator {
        if pools_supported && !pool_turned_off {
            Allocator::StreamOrdered
        } else {
            Allocator::Synchronous
        }
    }
}

fn is_out_of_memory(e: &cudarc::driver::DriverError) -> bool {
    e.0 == sys::cudaError_enum::CUDA_ERROR_OUT_OF_MEMORY
}

/// `LOCKSTEP_CUDA_NO_POOL=1`: the synchronous fallback on a device that has pools (to test it).
fn pool_turned_off() -> bool {
    std::env::var("LOCKSTEP_CUDA_NO_POOL").as_deref() == Ok("1")
}

/// Allocated bytes and their high-water mark, as the allocator is asked (not as the driver
/// rounds them).
#[derive(Debug, Default)]
struct Usage {
    allocated: AtomicU64,
    peak: AtomicU64,
}

impl Usage {
    fn add(&self, bytes: u64) {
        let now = self.allocated.fetch_add(bytes, Ordering::Relaxed) + bytes;
        self.peak.fetch_max(now, Ordering::Relaxed);
    }

    fn remove(&self, bytes: u64) {
        self.allocated.fetch_sub(bytes, Ordering::Relaxed);
    }

    fn allocated(&self) -> u64 {
        self.allocated.load(Ordering::Relaxed)
    }

    fn peak(&self) -> u64 {
        self.peak.load(Ordering::Relaxed)
    }
}

pub(crate) struct Memory {
    location: String,
    stream: Arc<CudaStream>,
    allocator: Allocator,
    /// The default pool, with `Allocator::StreamOrdered` only.
    pool: Option<sys::CUmemoryPool>,
    usage: Usage,
}

// SAFETY: the pool handle is a driver object usable from any thread of the process; we only
// read and set its attributes.
unsafe impl Send for Memory {}
// SAFETY: as above; the counters are atomics.
unsafe impl Sync for Memory {}

impl Memory {
    pub(crate) fn new(location: String, stream: Arc<CudaStream>) -> Memory {
        let ctx = stream.context();
        let allocator = Allocator::choose(ctx.has_async_alloc(), pool_turned_off());
        let pool = match allocator {
            Allocator::StreamOrdered => pool_keeping_everything(ctx.cu_device()),
            Allocator::Synchronous => None,
        };
        Memory {
            location,
            stream,
            allocator,
            pool,
            usage: Usage::default(),
        }
    }

    /// `bytes` of uninitialised device memory, usable on the compute stream. When the driver
    /// has none left, the pool's cached memory goes back to it (after the queued work) and the
    /// allocation is tried once more, as PyTorch's caching allocator does; then the error is
    /// `Error::OutOfMemory`, which says what to try.
    pub(crate) fn alloc(&self, bytes: usize) -> lockstep_core::Result<sys::CUdeviceptr> {
        // The pool hands out nothing for zero bytes; keep one word so every buffer has an address.
        let bytes = bytes.max(4);
        let mut attempt = self.driver_alloc(bytes);
        if attempt.as_ref().err().is_some_and(is_out_of_memory) && self.stream.synchronize().is_ok() {
            self.release_cached();
            attempt = self.driver_alloc(bytes);
        }
        let ptr = attempt.map_err(|e| {
            if is_out_of_memory(&e) {
                self.out_of_memory(bytes as u64)
            } else {
                driver_error(&self.location, &format!("could not allocate {bytes} bytes"), e)
            }
        })?;
        self.usage.add(bytes as u64);
        Ok(ptr)
    }

    fn driver_alloc(&self, bytes: usize) -> Result<sys::CUdeviceptr, cudarc::driver::DriverError> {
        match self.allocator {
            // SAFETY: the stream is live (we hold it); the memory is only used on this stream or
            // on streams ordered after it by events.
            Allocator::StreamOrdered => unsafe { result::malloc_async(self.stream.cu_stream(), bytes) },
            // SAFETY: the caller bound this device's context (`Gpu::alloc` enters it first).
            Allocator::Synchronous => unsafe { result::malloc_sync(bytes) },
        }
    }

    /// The error for `requested` bytes the driver could not give: what is in use in our
    /// tensors, and the device's whole memory.
    fn out_of_memory(&self, requested: u64) -> lockstep_core::Error {
        lockstep_core::Error::OutOfMemory {
            device: self.location.clone(),
            op: "a new tensor",
            requested,
            in_use: self.usage.allocated(),
            capacity: result::mem_get_info().map_or(0, |(_, total)| total as u64),
        }
    }

    /// Gives `ptr` (of `bytes`, as allocated) back once the compute stream is past its uses.
    pub(crate) fn free(&self, ptr: sys::CUdeviceptr, bytes: usize) {
        let bytes = bytes.max(4);
        // Buffers are dropped on whatever thread held them last (a loader, a reducer).
        let _ = self.stream.context().bind_to_thread();
        match self.allocator {
            Allocator::StreamOrdered => {
                // SAFETY: `ptr` came from `alloc` on this stream and is freed once (its buffer's
                // drop); the free is ordered after the stream's queued uses.
                let _ = unsafe { result::free_async(ptr, self.stream.cu_stream()) };
            }
            Allocator::Synchronous => self.free_after_the_stream(ptr),
        }
        self.usage.remove(bytes as u64);
    }

    /// cuMemFree does not wait for queued kernels: wait for the compute stream (which already
    /// waits for any collective on the buffer, see `CudaBuffer::ready`) first.
    fn free_after_the_stream(&self, ptr: sys::CUdeviceptr) {
        if self.stream.synchronize().is_err() {
            // The stream may still be using it; the context's teardown reclaims it instead.
            return;
        }
        // SAFETY: `ptr` came from `alloc` (cuMemAlloc) and is freed once; every queued use of it
        // has finished.
        let _ = unsafe { result::free_sync(ptr) };
    }

    pub(crate) fn stats(&self, utilization: Option<f64>) -> MemoryStats {
        let allocated = self.usage.allocated();
        MemoryStats {
            allocated_bytes: allocated,
            reserved_bytes: self.reserved().unwrap_or(allocated),
            peak_allocated_bytes: self.usage.peak(),
            utilization,
        }
    }

    /// Hands the pool's unused memory back to the driver (`cuMemPoolTrimTo(pool, 0)`); the
    /// caller has waited for the queued work. Nothing to do without a pool.
    pub(crate) fn release_cached(&self) {
        if let Some(pool) = self.pool {
            // SAFETY: `pool` is the device's default pool, valid while its context lives (as
            // long as `self`); trimming keeps every allocation still in use.
            let _ = unsafe { result::mem_pool::trim_to(pool, 0) };
        }
    }

    /// What the pool holds from the driver (in use or cached for reuse); None without a pool.
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

/// The device's default pool, told never to give freed memory back to the driver.
fn pool_keeping_everything(device: sys::CUdevice) -> Option<sys::CUmemoryPool> {
    // SAFETY: `device` comes from a live context; the attribute takes a u64 by pointer.
    unsafe {
        result::device::get_default_mem_pool(device).ok().inspect(|&pool| {
            let mut keep_everything = u64::MAX;
            let _ = result::mem_pool::set_attribute(
                pool,
                sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
                &mut keep_everything as *mut u64 as *mut _,
            );
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pool_is_used_only_where_the_device_has_one() {
        assert_eq!(Allocator::choose(true, false), Allocator::StreamOrdered);
        assert_eq!(Allocator::choose(false, false), Allocator::Synchronous);
        assert_eq!(Allocator::choose(true, true), Allocator::Synchronous);
        assert_eq!(Allocator::choose(false, true), Allocator::Synchronous);
    }

    #[test]
    fn usage_counts_live_bytes_and_keeps_the_peak() {
        let usage = Usage::default();
        usage.add(100);
        usage.add(50);
        usage.remove(100);
        usage.add(20);
        assert_eq!((usage.allocated(), usage.peak()), (70, 150));
        usage.remove(70);
        assert_eq!((usage.allocated(), usage.peak()), (0, 150));
    }
}
