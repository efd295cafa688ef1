//! The caching allocator: device buffers come in size classes and go back to a free list when
//! their tensor is dropped, so a training step allocates nothing from the driver once warm.
//! Reuse is safe without waiting: wgpu orders every later use of a buffer after the submitted
//! work that used it before.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use lockstep_core::{Error, Result};

use crate::gpu::Gpu;
use crate::scope;

/// Storage buffers hold tensors, and are copied to and from for uploads and read-backs.
pub const STORAGE_USAGE: wgpu::BufferUsages = wgpu::BufferUsages::STORAGE
    .union(wgpu::BufferUsages::COPY_SRC)
    .union(wgpu::BufferUsages::COPY_DST);

#[derive(Default)]
struct State {
    /// Free buffers by size and creation number, each with the last batch that used it (an
    /// upload into a recycled buffer must still be ordered after that batch). `take` picks the
    /// oldest: which buffers are free then decides which one a request gets, not the order they
    /// were freed in, so each training step gets the same buffers as the last and its dispatches
    /// find their bind groups cached.
    free: HashMap<u64, BTreeMap<u64, (wgpu::Buffer, u64)>>,
    /// The creation number of every buffer the pool made and still holds or lent.
    numbers: HashMap<wgpu::Buffer, u64>,
    created: u64,
    allocated: u64,
    reserved: u64,
    peak: u64,
}

impl State {
    /// The creation number of `buffer`, given on first sight.
    fn number(&mut self, buffer: &wgpu::Buffer) -> u64 {
        if let Some(&n) = self.numbers.get(buffer) {
            return n;
        }
        self.created += 1;
        self.numbers.insert(buffer.clone(), self.created);
        self.created
    }
}

#[derive(Default)]
pub struct Pool {
    state: Mutex<State>,
    /// `Backend::set_memory_limit`'s bytes for the buffers lent out; 0 for none.
    limit: AtomicU64,
}

/// The byte size a request is rounded up to: at least 256, then four classes per power of two
/// (at most 25% slack, and few distinct sizes so buffers find reuse).
pub fn size_class(bytes: u64) -> u64 {
    let bytes = bytes.max(256);
    let step = (1u64 << (63 - bytes.leading_zeros())) / 4;
    bytes.div_ceil(step) * step
}

/// The byte size to allocate for a request of `bytes` (a multiple of 4) under a `limit` on one
/// buffer: its size class, or exactly `bytes` where the class would pass a limit the request
/// stays within (a 1.8 GiB tensor under a limit of 2 GiB - 1). None when the request passes it.
pub fn allocation_size(bytes: u64, limit: u64) -> Option<u64> {
    if bytes > limit {
        return None;
    }
    let class = size_class(bytes);
    Some(if class <= limit { class } else { bytes })
}

/// The tightest of the device's limits on a tensor's buffer, which is bound whole as storage:
/// (its name, bytes).
pub fn tensor_limit(limits: &wgpu::Limits) -> (&'static str, u64) {
    if limits.max_storage_buffer_binding_size <= limits.max_buffer_size {
        (
            "max_storage_buffer_binding_size",
            limits.max_storage_buffer_binding_size,
        )
    } else {
        ("max_buffer_size", limits.max_buffer_size)
    }
}

/// How a buffer creation went.
enum Created {
    Buffer(wgpu::Buffer),
    OutOfMemory(Error),
    Failed(Error),
}

impl Pool {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Caps the bytes lent out at once (None: the device's memory alone).
    pub fn set_limit(&self, limit: Option<u64>) {
        self.limit.store(limit.unwrap_or(0), Ordering::Relaxed);
    }

    /// A buffer of at least `bytes` (see `allocation_size`) for `op`'s output, and the last
    /// batch that used it (0 for a new one). Past the limit it is an out-of-memory error naming
    /// `op`; out of the device's memory, it calls `reclaim` (submit recorded work and wait for
    /// it) to get cached buffers freed before it tries again.
    pub fn take(
        &self,
        gpu: &Gpu,
        op: &'static str,
        bytes: u64,
        reclaim: impl FnOnce() -> Result<()>,
    ) -> Result<(wgpu::Buffer, u64)> {
        let (limit_name, limit) = tensor_limit(&gpu.limits);
        let size = allocation_size(bytes, limit).ok_or_else(|| {
            gpu.error(format!(
                "a tensor of {bytes} bytes exceeds the adapter's {limit_name} of {limit} bytes ({}); \
                 use smaller batches or layers",
                gpu.info.name
            ))
        })?;
        let (limit, in_use) = (self.limit.load(Ordering::Relaxed), self.state().allocated);
        if limit > 0 && in_use + size > limit {
            return Err(Error::OutOfMemory {
                device: gpu.location.clone(),
                op,
                requested: size,
                in_use,
                capacity: limit,
            });
        }
        let reused = self
            .state()
            .free
            .get_mut(&size)
            .and_then(BTreeMap::pop_first)
            .map(|(_, free)| free);
        let (buffer, last_batch) = match reused {
            Some(b) => b,
            None => (self.create_or_reclaim(gpu, size, reclaim)?, 0),
        };
        let mut s = self.state();
        s.allocated += size;
        s.peak = s.peak.max(s.allocated);
        Ok((buffer, last_batch))
    }

    /// A new buffer of `size` bytes, retried once out of memory with the cached buffers given
    /// back: wgpu frees a dropped buffer only once the work that used it has completed and the
    /// device was polled, which is what `reclaim` brings about.
    fn create_or_reclaim(&self, gpu: &Gpu, size: u64, reclaim: impl FnOnce() -> Result<()>) -> Result<wgpu::Buffer> {
        match self.create(gpu, size) {
            Created::Buffer(b) => return Ok(b),
            Created::Failed(e) => return Err(e),
            Created::OutOfMemory(_) => {}
        }
        self.trim();
        reclaim()?;
        match self.create(gpu, size) {
            Created::Buffer(b) => Ok(b),
            Created::OutOfMemory(e) | Created::Failed(e) => Err(e),
        }
    }

    fn create(&self, gpu: &Gpu, size: u64) -> Created {
        let what = format!("allocating {size} bytes");
        if gpu.memory_held() {
            return Created::OutOfMemory(gpu.error(format!("{what}: out of memory (an injected fault)")));
        }
        let created = scope::catching(&gpu.device, || {
            gpu.device.create_buffer(&wgpu::BufferDescriptor {
                label: None,
                size,
                usage: STORAGE_USAGE,
                mapped_at_creation: false,
            })
        });
        match created {
            (buffer, None) => {
                let mut s = self.state();
                s.reserved += size;
                s.number(&buffer);
                Created::Buffer(buffer)
            }
            (_, Some(e @ wgpu::Error::OutOfMemory { .. })) => Created::OutOfMemory(gpu.error(format!(
                "{what}: {e}, with the memory pool's cached buffers freed; use smaller batches or layers"
            ))),
            (_, Some(e)) => Created::Failed(gpu.error(format!("{what}: {e}"))),
        }
    }

    /// Returns a buffer taken with `take`, last used by batch `last_batch`.
    pub fn give(&self, buffer: wgpu::Buffer, last_batch: u64) {
        let size = buffer.size();
        let mut s = self.state();
        s.allocated -= size;
        let number = s.number(&buffer);
        s.free.entry(size).or_default().insert(number, (buffer, last_batch));
    }

    /// Drops every cached buffer (wgpu frees their memory once their work is done and the device
    /// was polled).
    pub fn trim(&self) {
        let mut s = self.state();
        let free = std::mem::take(&mut s.free);
        let mut freed = 0;
        for (buffer, _) in free.into_values().flat_map(BTreeMap::into_values) {
            freed += buffer.size();
            s.numbers.remove(&buffer);
        }
        s.reserved -= freed;
    }

    /// (allocated, reserved, peak allocated) in bytes.
    pub fn stats(&self) -> (u64, u64, u64) {
        let s = self.state();
        (s.allocated, s.reserved, s.peak)
    }
}

#[cfg(test)]
mod tests {
    use super::{allocation_size, size_class, tensor_limit};

    const GIB: u64 = 1 << 30;

    #[test]
    fn size_classes_round_up_by_at_most_a_quarter() {
        assert_eq!(size_class(1), 256);
        assert_eq!(size_class(256), 256);
        assert_eq!(size_class(257), 320);
        assert_eq!(size_class(1000), 1024);
        assert_eq!(size_class(1025), 1280);
        for bytes in [300u64, 5000, 123_457, 10_000_000] {
            let c = size_class(bytes);
            assert!(c >= bytes && (c - bytes) * 4 <= bytes, "{bytes} -> {c}");
        }
    }

    #[test]
    fn a_request_within_the_limit_is_granted_even_where_its_class_is_not() {
        let limit = 2 * GIB - 1;
        let request = 2 * GIB - 256 * (1 << 20) + 4;
        assert!(size_class(request) > limit, "the case this guards");
        assert_eq!(allocation_size(request, limit), Some(request));
        assert_eq!(allocation_size(GIB + 4, limit), Some(size_class(GIB + 4)));
        assert_eq!(allocation_size(2 * GIB - 4, limit), Some(2 * GIB - 4));
    }

    #[test]
    fn a_request_beyond_the_limit_is_refused() {
        assert_eq!(allocation_size(2 * GIB, 2 * GIB - 1), None);
        assert_eq!(allocation_size(128 << 20, 128 << 20), Some(128 << 20));
        assert_eq!(allocation_size((128 << 20) + 4, 128 << 20), None);
    }

    #[test]
    fn the_tighter_of_binding_and_buffer_limits_applies() {
        let mut limits = wgpu::Limits {
            max_storage_buffer_binding_size: 128 << 20,
            max_buffer_size: 256 << 20,
            ..wgpu::Limits::default()
        };
        assert_eq!(tensor_limit(&limits), ("max_storage_buffer_binding_size", 128 << 20));
        limits.max_buffer_size = 64 << 20;
        assert_eq!(tensor_limit(&limits), ("max_buffer_size", 64 << 20));
    }
}
