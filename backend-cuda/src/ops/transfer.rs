//! Buffers from and to the host (uploads through pinned staging memory), fills and random
//! numbers (fill.cu, rand.cu).

use lockstep_core::backend::{BackendBuffer, BufferRef, Distribution};
use lockstep_core::shape::Layout;
use lockstep_core::{DType, Error, HostVec, Result, map_host_vec};

use cudarc::driver::result;

use crate::backend::CudaBackend;
use crate::entry_points;
use crate::error::driver_error;
use crate::gpu::launch;
use crate::views::to_u32;

impl CudaBackend {
    pub(crate) fn upload(&self, data: &HostVec) -> Result<BufferRef> {
        // A dtype the copy kernels can move (all but f64).
        entry_points::width_index("from_host", data.dtype())?;
        let out = self.output(data.dtype(), data.len())?;
        let bytes: &[u8] = map_host_vec!(data, v => bytemuck::cast_slice(v.as_slice()));
        if !bytes.is_empty() {
            let gpu = &self.gpu;
            gpu.staging.upload(bytes, out.ptr, &gpu.compute, |event| {
                gpu.wait_event(event, "waiting for an upload")
            })?;
        }
        Ok(out)
    }

    /// The elements of `layout` in row-major order; waits for the device.
    pub(crate) fn download(&self, src: &BufferRef, layout: &Layout) -> Result<HostVec> {
        let buffer = self.operand("to_host", src, Some(layout))?;
        let dtype = buffer.dtype();
        let n = layout.elem_count();
        let contiguous;
        let (ptr, offset) = if layout.is_contiguous() {
            (buffer.ptr, layout.offset)
        } else {
            let packed = self.output(dtype, n)?;
            self.copy_into(buffer, layout, &packed, &Layout::contiguous(layout.shape.clone()))?;
            contiguous = packed;
            (contiguous.ptr, 0)
        };
        // A copy into pageable memory blocks inside the driver until the stream reaches it, and
        // the stream may wait for a collective: wait for it by polling first (see `wait_for`).
        const WHAT: &str = "download (an earlier kernel may have failed)";
        self.gpu.host_waits.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.gpu.wait_for(&self.gpu.compute, WHAT)?;
        let mut bytes = vec![0u8; n * dtype.size_in_bytes()];
        if n > 0 {
            let at = ptr + (offset * dtype.size_in_bytes()) as u64;
            // SAFETY: `at` starts `n` elements inside a live buffer (checked by `operand`); the
            // host slice holds exactly their bytes; we wait for the copy before reading them.
            unsafe { result::memcpy_dtoh_async(&mut bytes[..], at, self.gpu.compute.cu_stream()) }
                .map_err(|e| driver_error(&self.gpu.location, "download", e))?;
        }
        self.gpu.wait_for(&self.gpu.compute, WHAT)?;
        Ok(host_from_bytes(dtype, &bytes))
    }

    /// zeros and full: `value` converted to `dtype` on the host, then one word per element.
    pub(crate) fn fill(&self, dtype: DType, len: usize, value: f64) -> Result<BufferRef> {
        let word = HostVec::from_f64(dtype, &[value]);
        let fill = entry_points::FILL.of("full", dtype)?;
        let out = self.output(dtype, len)?;
        let n = to_u32("full", len)?;
        let cfg = self.gpu.grid(len);
        match word {
            HostVec::F16(v) => {
                launch!(&self.gpu, fill, cfg; &out.ptr, &n, &v[0].to_bits())
            }
            HostVec::BF16(v) => {
                launch!(&self.gpu, fill, cfg; &out.ptr, &n, &v[0].to_bits())
            }
            HostVec::F32(v) => {
                launch!(&self.gpu, fill, cfg; &out.ptr, &n, &v[0].to_bits())
            }
            HostVec::U32(v) => launch!(&self.gpu, fill, cfg; &out.ptr, &n, &v[0]),
            HostVec::I64(v) => {
                launch!(&self.gpu, fill, cfg; &out.ptr, &n, &(v[0] as u64))
            }
            HostVec::F64(_) => return Err(Error::dtype("full", DType::F64)),
        }
        Ok(out)
    }

    pub(crate) fn random(
        &self,
        dtype: DType,
        len: usize,
        dist: Distribution,
        seed: u64,
        counter: u64,
    ) -> Result<BufferRef> {
        let rand = entry_points::RAND.of("rand", dtype)?;
        let out = self.output(dtype, len)?;
        let (normal, a, b) = match dist {
            Distribution::Uniform { low, high } => (0u32, low, high - low),
            Distribution::Normal { mean, std } => (1u32, mean, std),
        };
        let n = to_u32("rand", len)?;
        launch!(&self.gpu, rand, self.gpu.grid(len);
            &out.ptr, &n, &seed, &counter, &normal, &a, &b);
        Ok(out)
    }

    /// Dropout with the stream's mask (rand.cu's `dropout`).
    pub(crate) fn dropout_stream(
        &self,
        src: &BufferRef,
        len: usize,
        p: f64,
        seed: u64,
        counter: u64,
    ) -> Result<BufferRef> {
        const OP: &str = "dropout";
        let s = self.operand(OP, src, Some(&Layout::contiguous([len])))?;
        let entry = entry_points::DROPOUT.of(OP, s.dtype())?;
        let out = self.output(s.dtype(), len)?;
        if len == 0 {
            return Ok(out);
        }
        let (n, p32, scale) = (to_u32(OP, len)?, p as f32, (1.0 / (1.0 - p)) as f32);
        launch!(&self.gpu, entry, self.gpu.grid(len);
            &out.ptr, &s.ptr, &n, &seed, &counter, &p32, &scale);
        Ok(out)
    }
}

fn host_from_bytes(dtype: DType, bytes: &[u8]) -> HostVec {
    // pod_collect_to_vec copies, so the byte vector's alignment does not matter.
    match dtype {
        DType::F32 => HostVec::F32(bytemuck::pod_collect_to_vec(bytes)),
        DType::F16 => HostVec::F16(bytemuck::pod_collect_to_vec(bytes)),
        DType::BF16 => HostVec::BF16(bytemuck::pod_collect_to_vec(bytes)),
        DType::F64 => HostVec::F64(bytemuck::pod_collect_to_vec(bytes)),
        DType::I64 => HostVec::I64(bytemuck::pod_collect_to_vec(bytes)),
        DType::U32 => HostVec::U32(bytemuck::pod_collect_to_vec(bytes)),
    }
}
