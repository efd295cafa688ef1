//! The caching allocator: device buffers come in size classes and go back to a free list when
//! their tensor is dropped, so a training step allocates nothing from the driver once warm.
//! Reuse is safe without waiting: wgpu orders every later use of a buffer after the submitted
//! work that used it before.

use std::collections::HashMap;
use std::sync::Mutex;

use lockstep_core::Result;

use crate::gpu::Gpu;

/// Storage buffers hold tensors, and are copied to and from for uploads and read-backs.
pub const STORAGE_USAGE: wgpu::BufferUsages = wgpu::BufferUsages::STORAGE
    .union(wgpu::BufferUsages::COPY_SRC)
    .union(wgpu::BufferUsages::COPY_DST);

#[derive(Default)]
struct State {
    /// Free buffers by size class, each with the last batch that used it (an upload into a
    /// recycled buffer must still be ordered after that batch).
    free: HashMap<u64, Vec<(wgpu::Buffer, u64)>>,
    allocated: u64,
    reserved: u64,
    peak: u64,
}

#[derive(Default)]
pub struct Pool {
    state: Mutex<State>,
}

/// The byte size a request is rounded up to: at least 256, then four classes per power of two
/// (at most 25% slack, and few distinct sizes so buffers find reuse).
pub fn size_class(bytes: u64) -> u64 {
    let bytes = bytes.max(256);
    let step = (1u64 << (63 - bytes.leading_zeros())) / 4;
    bytes.div_ceil(step) * step
}

impl Pool {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A buffer of at least `bytes` (its size is `size_class(bytes)`), and the last batch that
    /// used it (0 for a new one).
    pub fn take(&self, gpu: &Gpu, bytes: u64) -> Result<(wgpu::Buffer, u64)> {
        let class = size_class(bytes);
        let limit = gpu.limits.max_storage_buffer_binding_size;
        if class > limit {
            return Err(gpu.error(format!(
                "a tensor of {bytes} bytes exceeds the adapter's max_storage_buffer_binding_size of {limit} bytes \
                 ({}); use smaller batches or layers",
                gpu.info.name
            )));
        }
        let reused = self.state().free.get_mut(&class).and_then(Vec::pop);
        let (buffer, last_batch) = match reused {
            Some(b) => b,
            None => {
                let created = self.create(gpu, class);
                match created {
                    Ok(b) => (b, 0),
                    Err(_) => {
                        // Out of memory: give the cached buffers back to the driver and retry once.
                        self.trim();
                        (self.create(gpu, class)?, 0)
                    }
                }
            }
        };
        let mut s = self.state();
        s.allocated += class;
        s.peak = s.peak.max(s.allocated);
        Ok((buffer, last_batch))
    }

    fn create(&self, gpu: &Gpu, class: u64) -> Result<wgpu::Buffer> {
        let buffer = gpu.scoped(
            wgpu::ErrorFilter::OutOfMemory,
            &format!("allocating {class} bytes"),
            || {
                gpu.device.create_buffer(&wgpu::BufferDescriptor {
                    label: None,
                    size: class,
                    usage: STORAGE_USAGE,
                    mapped_at_creation: false,
                })
            },
        )?;
        self.state().reserved += class;
        Ok(buffer)
    }

    /// Returns a buffer taken with `take`, last used by batch `last_batch`.
    pub fn give(&self, buffer: wgpu::Buffer, last_batch: u64) {
        let class = buffer.size();
        let mut s = self.state();
        s.allocated -= class;
        s.free.entry(class).or_default().push((buffer, last_batch));
    }

    /// Frees every cached buffer.
    pub fn trim(&self) {
        let mut s = self.state();
        let freed: u64 = s.free.values().flatten().map(|(b, _)| b.size()).sum();
        s.free.clear();
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
    use super::size_class;

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
}
