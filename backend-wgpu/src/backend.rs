//! `WgpuBackend`: the core `Backend` on one wgpu adapter. This file holds the device state and
//! the plumbing every op shares (allocation, launching a shader variant, element types); the
//! ops themselves live in `ops/`, one file per shader family.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use lockstep_core::backend::gpu_plan::group_len;
use lockstep_core::backend::{BufferRef, DeviceInfo, MemoryStats, WorkCounters};
use lockstep_core::shape::Layout;
use lockstep_core::{DType, Error, Result};

use crate::batch::{Batch, Recorded};
use crate::buffer::{WgpuBuffer, wgpu_buffer};
use crate::cooperative::{Cooperative, Policy};
use crate::fault::Fault;
use crate::gpu::Gpu;
use crate::meter::Meter;
use crate::pipelines::{Pipelines, Variant};
use crate::pool::Pool;

/// Invocations per workgroup of the 1-D shaders (`WG` in common.wgsl).
pub const WORKGROUP: u32 = 256;

pub struct WgpuBackend {
    pub(crate) gpu: Gpu,
    pub(crate) pool: Arc<Pool>,
    pipelines: Pipelines,
    batch: Mutex<Batch>,
    recorded: Recorded,
    pub(crate) staging: Mutex<Vec<wgpu::Buffer>>,
    pub(crate) meter: Meter,
    info: DeviceInfo,
    /// The cooperative-matrix tier once the self-test let it on (`settle_products`); unset
    /// before, so the self-test's own reference product runs on the SIMT kernel.
    cooperative: OnceLock<Option<Cooperative>>,
    /// Whether causal attention runs the fused kernels where they apply (`ops/attention.rs`).
    attention_fused: AtomicBool,
    /// Whether the optimizer and clipping run the multi-tensor shaders (`ops/multi_tensor.rs`).
    multi_tensor: AtomicBool,
}

impl std::fmt::Debug for WgpuBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "WgpuBackend({}: {})", self.gpu.location, self.gpu.info.name)
    }
}

/// One buffer bound to a shader: (binding number, buffer).
pub type Binding<'a> = (u32, &'a WgpuBuffer);

impl WgpuBackend {
    pub fn new(gpu: Gpu, info: DeviceInfo) -> WgpuBackend {
        let batch = Batch::new(&gpu);
        let meter = Meter::new(batch.timed());
        let batch = Mutex::new(batch);
        WgpuBackend {
            gpu,
            pool: Arc::default(),
            pipelines: Pipelines::default(),
            batch,
            recorded: Recorded::default(),
            staging: Mutex::default(),
            meter,
            cooperative: OnceLock::new(),
            attention_fused: AtomicBool::new(crate::ops::attention_fused_by_default()),
            multi_tensor: AtomicBool::new(crate::ops::multi_tensor_by_default(info.software)),
            info,
        }
    }

    /// Whether the optimizer steps and clipping run the multi-tensor shaders.
    pub(crate) fn multi_tensor(&self) -> bool {
        self.multi_tensor.load(Ordering::Relaxed)
    }

    /// Runs the optimizer steps and clipping's norm and scaling through the multi-tensor
    /// shaders (up to eight tensors a dispatch) or one dispatch per tensor from now on. The
    /// default is on for GPUs and off for software adapters, where a dispatch runs every
    /// tensor's branch of the shader (lavapipe's SGD step of ResNet-18 took 5x the time);
    /// `LOCKSTEP_WGPU_MULTI_TENSOR=on` or `off` sets it for every device.
    pub fn set_multi_tensor(&self, on: bool) {
        self.multi_tensor.store(on, Ordering::Relaxed);
    }

    /// Whether causal attention runs the fused kernels where they apply.
    pub(crate) fn attention_fused(&self) -> bool {
        self.attention_fused.load(Ordering::Relaxed)
    }

    /// Runs causal attention fused (the default, unless `LOCKSTEP_WGPU_ATTENTION=composed`) or
    /// composed from products and `causal_softmax` on this device from now on, so a test or
    /// benchmark can compare the two in one process.
    pub fn set_attention_fused(&self, fused: bool) {
        self.attention_fused.store(fused, Ordering::Relaxed);
    }

    /// The cooperative-matrix tier products may use, if the self-test passed.
    pub(crate) fn cooperative_tier(&self) -> Option<Cooperative> {
        self.cooperative.get().copied().flatten()
    }

    pub(crate) fn set_cooperative_tier(&self, tier: Option<Cooperative>) {
        // Settled once per device; a second call has nothing to change.
        let _ = self.cooperative.set(tier);
    }

    /// Which kernel runs matrix products, for `devices --details` and `check`.
    fn products_description(&self) -> String {
        match (self.cooperative_tier(), self.gpu.cooperative) {
            (Some(tier), _) => format!(
                "cooperative matrices {}, for {}",
                tier.describe(),
                Policy::from_env().describe()
            ),
            (None, Some(tier)) if Policy::from_env() == Policy::Off => {
                format!(
                    "SIMT tiles (cooperative matrices {} off: LOCKSTEP_WGPU_COOP=off)",
                    tier.describe()
                )
            }
            (None, Some(tier)) => format!(
                "SIMT tiles (cooperative matrices {} failed the self-test)",
                tier.describe()
            ),
            (None, None) => "SIMT tiles (no usable cooperative matrices)".into(),
        }
    }

    pub fn gpu(&self) -> &Gpu {
        &self.gpu
    }

    /// The limits the device was granted.
    pub fn limits(&self) -> &wgpu::Limits {
        &self.gpu.limits
    }

    pub(crate) fn batch(&self) -> MutexGuard<'_, Batch> {
        self.batch.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Makes the memory of buffers the pool dropped free: cached bind groups still hold them,
    /// and wgpu frees a buffer once the work using it has completed and the device was polled.
    fn reclaim(&self) -> Result<()> {
        let mut batch = self.batch();
        batch.forget_bind_groups();
        batch.flush(&self.gpu);
        self.gpu.wait()?;
        batch.all_done();
        Ok(())
    }

    /// Every cached buffer back to the driver (`Backend::empty_cache`).
    pub(crate) fn release_cached(&self) -> Result<()> {
        self.pool.trim();
        self.reclaim()
    }

    /// An uninitialised device buffer for `len` elements of `dtype`, for `op`'s output.
    pub(crate) fn alloc(&self, op: &'static str, dtype: DType, len: usize) -> Result<Arc<WgpuBuffer>> {
        self.gpu.check()?;
        let bytes = ((len * dtype.size_in_bytes()) as u64).next_multiple_of(4);
        let (raw, last_batch) = self.pool.take(&self.gpu, op, bytes, || self.reclaim())?;
        Ok(Arc::new(WgpuBuffer::new(
            raw,
            last_batch,
            dtype,
            len,
            self.pool.clone(),
        )))
    }

    /// Records one dispatch of `variant`.
    pub(crate) fn launch(
        &self,
        variant: &Variant,
        params: &[u32],
        buffers: &[Binding],
        groups: [u32; 3],
    ) -> Result<()> {
        let pipeline = self.pipelines.get(&self.gpu, variant)?;
        self.batch()
            .dispatch(&self.gpu, &self.recorded, &pipeline, params, buffers, groups)
    }

    /// Bind groups created since the device opened (a dispatch reuses a cached one where it binds
    /// the same buffers to a pipeline of the same layout as an earlier one).
    /// wgpu-only: `WorkCounters` has no field for them.
    pub fn bind_groups_created(&self) -> u64 {
        self.recorded.bind_groups.load(Ordering::Relaxed)
    }

    /// A wait for all submitted work (a read-back, a synchronize), counted for `recorded_work`.
    pub(crate) fn count_host_wait(&self) {
        self.recorded.host_waits.fetch_add(1, Ordering::Relaxed);
    }

    /// Compute dispatches recorded; wgpu has no vendor library calls to count.
    pub(crate) fn recorded_work(&self) -> WorkCounters {
        WorkCounters {
            kernels: Some(self.recorded.dispatches.load(Ordering::Relaxed)),
            library_calls: None,
            host_waits: Some(self.recorded.host_waits.load(Ordering::Relaxed)),
        }
    }

    /// The grid of a 1-D shader writing `n` elements of `dtype` a storage word per invocation:
    /// two elements a word for bf16, else one.
    pub(crate) fn word_grid(&self, op: &'static str, dtype: DType, n: usize) -> Result<[u32; 3]> {
        let per_word = if dtype == DType::BF16 { 2 } else { 1 };
        self.grid(op, n.div_ceil(per_word))
    }

    /// The workgroup grid for `n` invocations of a 1-D shader.
    pub(crate) fn grid(&self, op: &'static str, n: usize) -> Result<[u32; 3]> {
        self.groups(op, n.div_ceil(WORKGROUP as usize))
    }

    /// A grid of `count` workgroups, folded into y beyond the device's workgroups per dimension
    /// (WebGPU's default of 65535 on common adapters; tests open devices with fewer); shaders
    /// rebuild the index from their grid's size.
    pub(crate) fn groups(&self, op: &'static str, count: usize) -> Result<[u32; 3]> {
        let max = self.gpu.limits.max_compute_workgroups_per_dimension;
        fold_groups(count, max)
            .ok_or_else(|| Error::invalid(op, format!("{count} workgroups exceed a dispatch's {max}x{max}")))
    }

    /// Invocations per row for rows of `len` elements (`gpu_plan::group_len`), and the workgroups
    /// that give each of `rows` rows a group of them (the shaders' `Slot`).
    pub(crate) fn row_groups(&self, op: &'static str, rows: usize, len: usize) -> Result<(u32, [u32; 3])> {
        let group = group_len(len, WORKGROUP as usize);
        Ok((
            group as u32,
            self.groups(op, rows.div_ceil(WORKGROUP as usize / group))?,
        ))
    }

    /// Makes `fault` happen, so tests reach the code that handles it (see `Fault`).
    #[doc(hidden)]
    pub fn inject_fault(&self, fault: Fault) {
        self.gpu.inject(fault);
    }

    /// The WGSL type computing shaders use for `dtype`: f32, or f16 where the adapter has it.
    pub(crate) fn float_type(&self, op: &'static str, dtype: DType) -> Result<&'static str> {
        match dtype {
            DType::F32 => Ok("f32"),
            DType::F16 if self.gpu.has_f16() => Ok("f16"),
            DType::F16 => Err(Error::UnsupportedDType {
                op,
                dtype,
                hint: " on this adapter: it lacks SHADER_F16 (use f32)",
            }),
            _ => Err(Error::UnsupportedDType {
                op,
                dtype,
                hint: " by the wgpu backend (WGSL computes in f32 and f16; use f32)",
            }),
        }
    }

    /// The element type of shaders that read and write bf16 in its packed words themselves
    /// (those listing bf16 among their types: `lockstep_shaders::elements`), else as
    /// `float_type`.
    pub(crate) fn element_type(&self, op: &'static str, dtype: DType) -> Result<&'static str> {
        match dtype {
            DType::BF16 => Ok("bf16"),
            d => self.float_type(op, d),
        }
    }

    /// The WGSL type of shaders that read values of a float dtype or u32 (casts, comparisons,
    /// indexing).
    pub(crate) fn value_type(&self, op: &'static str, dtype: DType) -> Result<&'static str> {
        match dtype {
            DType::U32 => Ok("u32"),
            d => self.float_type(op, d),
        }
    }

    /// The storage word shaders that only move bits use for `dtype`.
    pub(crate) fn word_type(&self, op: &'static str, dtype: DType) -> Result<&'static str> {
        match dtype {
            DType::F32 | DType::U32 => Ok("u32"),
            DType::I64 => Ok("vec2<u32>"),
            DType::F16 => self.float_type(op, dtype),
            _ => Err(Error::UnsupportedDType {
                op,
                dtype,
                hint: " by the wgpu backend (WGSL has no bf16 or f64; use f32 or f16)",
            }),
        }
    }

    /// The buffers of an op, checked to be wgpu buffers of this device with `layout` inside them.
    pub(crate) fn operand<'a>(
        &self,
        op: &'static str,
        b: &'a BufferRef,
        layout: Option<&Layout>,
    ) -> Result<&'a WgpuBuffer> {
        let buffer = wgpu_buffer(op, b)?;
        if let Some(layout) = layout
            && layout.extent() > buffer.len()
        {
            return Err(Error::invalid(
                op,
                format!("layout {layout:?} reaches past a buffer of {} elements", buffer.len()),
            ));
        }
        Ok(buffer)
    }

    pub(crate) fn memory(&self) -> MemoryStats {
        let (allocated, reserved, peak) = self.pool.stats();
        MemoryStats {
            allocated_bytes: allocated,
            reserved_bytes: reserved,
            peak_allocated_bytes: peak,
            utilization: self.meter.utilization(),
        }
    }

    pub(crate) fn device_info(&self) -> DeviceInfo {
        let mut info = self.info.clone();
        // What the self-test decided, in place of what the adapter's listing promised.
        info.details.retain(|(label, _)| label != "matrix products");
        info.details
            .push(("matrix products".into(), self.products_description()));
        info.details.push((
            "attention".into(),
            crate::ops::attention_plan(self.attention_fused()).into(),
        ));
        info.details.push((
            "optimizer and clipping".into(),
            crate::ops::multi_tensor_plan(self.multi_tensor()).into(),
        ));
        info
    }

    /// Submits recorded work and waits for it.
    pub(crate) fn finish(&self) -> Result<()> {
        let mut batch = self.batch();
        let submitted = batch.flush_for_sync(&self.gpu);
        self.gpu.wait()?;
        batch.all_done();
        if submitted && let Some(ns) = batch.read_busy_ns(&self.gpu) {
            self.meter.add_busy_ns(ns);
        }
        Ok(())
    }
}

/// `count` workgroups as an x by y grid with both at most `max`, split evenly so that the
/// workgroups past `count` (which only check their index and return) are fewer than y.
fn fold_groups(count: usize, max: u32) -> Option<[u32; 3]> {
    let y = count.div_ceil(max as usize).max(1);
    let x = count.div_ceil(y);
    Some([u32::try_from(x).ok()?, u32::try_from(y).ok().filter(|&y| y <= max)?, 1])
}

pub(crate) fn to_u32(op: &'static str, x: usize) -> Result<u32> {
    u32::try_from(x).map_err(|_| Error::invalid(op, format!("{x} exceeds the 32-bit indexing of WGSL shaders")))
}

#[cfg(test)]
mod tests {
    use super::fold_groups;

    const MAX: u32 = 65535;

    #[test]
    fn large_grids_fold_into_y_with_few_idle_workgroups() {
        assert_eq!(fold_groups(0, MAX), Some([0, 1, 1]));
        assert_eq!(fold_groups(65535, MAX), Some([65535, 1, 1]));
        assert_eq!(fold_groups(65537, MAX), Some([32769, 2, 1]));
        for count in [65536usize, 70_000, 1 << 24, 65535 * 65535] {
            let [x, y, _] = fold_groups(count, MAX).expect("fits");
            let (x, y) = (x as usize, y as usize);
            assert!(
                x <= MAX as usize && x * y >= count && x * y - count < y,
                "{count}: {x}x{y}"
            );
        }
        assert_eq!(fold_groups(65535 * 65535 + 1, MAX), None);
        assert_eq!(fold_groups(17, 4), None);
    }
}
