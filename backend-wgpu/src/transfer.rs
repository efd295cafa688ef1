//! Moving data between host and device: uploads ordered after recorded work, read-backs through
//! reusable staging buffers (the sync points of a run).

use half::f16;
use lockstep_core::backend::BufferRef;
use lockstep_core::shape::Layout;
use lockstep_core::{DType, Error, HostVec, Result};

use crate::backend::WgpuBackend;
use crate::buffer::WgpuBuffer;
use crate::pool::allocation_size;

impl WgpuBackend {
    pub(crate) fn upload(&self, data: &HostVec) -> Result<BufferRef> {
        let bytes: &[u8] = match data {
            HostVec::F32(v) => bytemuck::cast_slice(v),
            HostVec::U32(v) => bytemuck::cast_slice(v),
            HostVec::I64(v) => bytemuck::cast_slice(v),
            HostVec::F16(v) => {
                self.float_type("from_host", DType::F16)?;
                bytemuck::cast_slice(v)
            }
            HostVec::BF16(v) => bytemuck::cast_slice(v),
            other => {
                return Err(Error::UnsupportedDType {
                    op: "from_host",
                    dtype: other.dtype(),
                    hint: " by the wgpu backend (WGSL has no f64; convert to f32 first)",
                });
            }
        };
        let buffer = self.alloc("upload", data.dtype(), data.len())?;
        self.write(&buffer, bytes);
        Ok(buffer)
    }

    /// Writes `bytes` at the start of `buffer`, after every command recorded so far.
    pub(crate) fn write(&self, buffer: &WgpuBuffer, bytes: &[u8]) {
        if bytes.is_empty() {
            return;
        }
        let mut batch = self.batch();
        // A queue write lands before the next submission's commands: when recorded commands
        // still use this (recycled) buffer, they must be submitted first.
        if buffer.used_in(batch.id()) {
            batch.flush(&self.gpu);
        }
        let padded_len = bytes.len().next_multiple_of(4);
        if padded_len == bytes.len() {
            self.gpu.queue.write_buffer(buffer.raw(), 0, bytes);
        } else {
            let mut padded = bytes.to_vec();
            padded.resize(padded_len, 0);
            self.gpu.queue.write_buffer(buffer.raw(), 0, &padded);
        }
    }

    pub(crate) fn download(&self, src: &BufferRef, layout: &Layout) -> Result<HostVec> {
        let buffer = self.operand("to_host", src, Some(layout))?;
        self.count_host_wait();
        let dtype = buffer.dtype();
        let n = layout.elem_count();
        let size = dtype.size_in_bytes();
        let start = (layout.offset * size) as u64;
        let bytes = ((n * size) as u64).next_multiple_of(4);
        let raw = if n == 0 {
            Vec::new()
        } else if layout.is_contiguous() && start.is_multiple_of(4) {
            self.read_bytes(buffer, start, bytes)?
        } else {
            // A strided view, or one that starts mid-word: contiguous into a buffer of its own.
            let packed = self.contiguous(buffer, layout)?;
            self.read_bytes(&packed, 0, bytes)?
        };
        let raw = &raw[..n * size];
        Ok(match dtype {
            DType::F32 => HostVec::F32(bytemuck::pod_collect_to_vec(raw)),
            DType::U32 => HostVec::U32(bytemuck::pod_collect_to_vec(raw)),
            DType::I64 => HostVec::I64(bytemuck::pod_collect_to_vec(raw)),
            DType::F16 => HostVec::F16(bytemuck::pod_collect_to_vec::<u8, f16>(raw)),
            DType::BF16 => HostVec::BF16(bytemuck::pod_collect_to_vec::<u8, half::bf16>(raw)),
            other => return Err(Error::dtype("to_host", other)),
        })
    }

    /// A contiguous copy of the elements of `layout`.
    pub(crate) fn contiguous(&self, src: &WgpuBuffer, layout: &Layout) -> Result<std::sync::Arc<WgpuBuffer>> {
        let out = self.alloc("contiguous", src.dtype(), layout.elem_count())?;
        self.copy_between(src, layout, &out, &Layout::contiguous(layout.shape.clone()))?;
        Ok(out)
    }

    /// Copies `bytes` from `src` at `start` to the host, waiting for the GPU.
    fn read_bytes(&self, src: &WgpuBuffer, start: u64, bytes: u64) -> Result<Vec<u8>> {
        let staging = self.staging_buffer(bytes)?;
        self.batch().copy(&self.gpu, src.raw(), start, &staging, bytes);
        self.finish()?;
        let slice = staging.slice(..bytes);
        let (tx, rx) = std::sync::mpsc::channel();
        slice.map_async(wgpu::MapMode::Read, move |r| {
            let _ = tx.send(r);
        });
        self.gpu.wait()?;
        rx.recv()
            .map_err(|_| self.gpu.error("the read-back never completed"))?
            .map_err(|e| self.gpu.error(format!("mapping a read-back buffer failed: {e}")))?;
        let data = slice
            .get_mapped_range()
            .map_err(|e| self.gpu.error(format!("reading a mapped buffer failed: {e}")))?
            .to_vec();
        staging.unmap();
        self.staging.lock().unwrap_or_else(|p| p.into_inner()).push(staging);
        Ok(data)
    }

    /// A mappable buffer of at least `bytes`, reused across read-backs.
    fn staging_buffer(&self, bytes: u64) -> Result<wgpu::Buffer> {
        let mut free = self.staging.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(i) = free.iter().position(|b| b.size() >= bytes) {
            return Ok(free.swap_remove(i));
        }
        drop(free);
        // Read-backs are at most a tensor's size, which `pool` keeps within max_buffer_size.
        let size = allocation_size(bytes, self.gpu.limits.max_buffer_size).unwrap_or(bytes);
        self.gpu
            .scoped(&format!("allocating a read-back buffer of {size} bytes"), || {
                self.gpu.device.create_buffer(&wgpu::BufferDescriptor {
                    label: Some("lockstep read-back"),
                    size,
                    usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                    mapped_at_creation: false,
                })
            })
    }
}
