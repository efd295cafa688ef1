//! Pinned (page-locked) host memory for uploads: the host data is copied into it and the DMA
//! engine reads it asynchronously, so an upload (the data loader's batches) does not stall the
//! host on a pageable copy. A ring of `SLOTS` buffers, each grown on demand and reused once its
//! last copy completed: the copy is queued on the compute stream behind the work already there,
//! so with one buffer each upload waited for the previous step's compute (a batch is two
//! uploads: the labels waited for the images' copy), and the host could not run ahead.

use std::sync::{Arc, Mutex};

use cudarc::driver::{CudaContext, CudaEvent, CudaStream, result, sys};

use lockstep_core::Result;

use crate::error::driver_error;

/// Uploads that may be in flight before one waits: two batches of two tensors.
const SLOTS: usize = 4;

pub(crate) struct Staging {
    location: String,
    ctx: Arc<CudaContext>,
    ring: Mutex<Ring>,
}

/// The slots, used in turn: the next is the one whose copy was queued longest ago.
struct Ring {
    slots: Vec<Slot>,
    next: usize,
}

struct Slot {
    ptr: *mut u8,
    capacity: usize,
    /// Recorded after the last copy out of the buffer; waited for before it is overwritten.
    in_use_until: Option<CudaEvent>,
}

// SAFETY: the pinned pointer is only dereferenced under the ring's mutex.
unsafe impl Send for Slot {}

impl Staging {
    pub(crate) fn new(location: String, ctx: Arc<CudaContext>) -> Staging {
        Staging {
            location,
            ctx,
            ring: Mutex::new(Ring {
                slots: (0..SLOTS)
                    .map(|_| Slot {
                        ptr: std::ptr::null_mut(),
                        capacity: 0,
                        in_use_until: None,
                    })
                    .collect(),
                next: 0,
            }),
        }
    }

    /// Queues a copy of `data` to `dst` on `stream` through pinned memory; a slot still being
    /// read is waited for with `wait` (the device's wait, which a dead peer cannot hang).
    pub(crate) fn upload(
        &self,
        data: &[u8],
        dst: sys::CUdeviceptr,
        stream: &CudaStream,
        wait: impl Fn(&CudaEvent) -> Result<()>,
    ) -> Result<()> {
        let fail = |what: &str, e| driver_error(&self.location, what, e);
        let mut ring = self.ring.lock().unwrap_or_else(|p| p.into_inner());
        let index = ring.next;
        ring.next = (index + 1) % SLOTS;
        let slot = &mut ring.slots[index];
        if let Some(event) = slot.in_use_until.take() {
            wait(&event)?;
        }
        if slot.capacity < data.len() {
            let capacity = data.len().next_power_of_two().max(1 << 20);
            // SAFETY: frees the old pinned block (no copy reads it: we waited above) and takes a
            // new one of `capacity` bytes, flags 0 (not write-combined: it is also read back).
            unsafe {
                if !slot.ptr.is_null() {
                    let _ = result::free_host(slot.ptr as *mut _);
                    slot.ptr = std::ptr::null_mut();
                    slot.capacity = 0;
                }
                slot.ptr = result::malloc_host(capacity, 0).map_err(|e| fail("pinning host memory", e))? as *mut u8;
            }
            slot.capacity = capacity;
        }
        // SAFETY: `slot.ptr` holds `capacity >= data.len()` bytes that no copy is reading, and
        // the copy below reads them before `in_use_until` completes.
        unsafe {
            std::ptr::copy_nonoverlapping(data.as_ptr(), slot.ptr, data.len());
            let pinned = std::slice::from_raw_parts(slot.ptr, data.len());
            result::memcpy_htod_async(dst, pinned, stream.cu_stream()).map_err(|e| fail("upload", e))?;
        }
        slot.in_use_until = Some(stream.record_event(None).map_err(|e| fail("upload event", e))?);
        Ok(())
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        let ring = self.ring.get_mut().unwrap_or_else(|p| p.into_inner());
        for slot in &mut ring.slots {
            if let Some(event) = slot.in_use_until.take() {
                let _ = event.synchronize();
            }
            if !slot.ptr.is_null() {
                let _ = self.ctx.bind_to_thread();
                // SAFETY: allocated by malloc_host, and no copy reads it any more (waited above).
                let _ = unsafe { result::free_host(slot.ptr as *mut _) };
            }
        }
    }
}
