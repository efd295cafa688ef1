//! The CPU reference backend: simple enough to trust, fast enough to train on (rayon over all
//! cores, the `gemm` crate for matrix products, a caching buffer pool). Several independent
//! instances (`cpu:0`, `cpu:1`, …) let multi-device code run and be tested without a GPU.

mod batch_norm;
mod bias;
mod busy;
mod capacity;
mod causal_softmax;
mod conv;
mod cross_entropy;
mod details;
mod dropout;
mod elementwise;
mod fast_math;
pub mod float;
mod index;
mod layer_norm;
mod matmul;
mod max_pool;
mod optim;
mod pool;
mod reduce;
mod simd;
mod softmax;
mod stored;
mod strided;

use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};

pub use conv::{Forward, InputGrad, Plan, WeightGrad};
pub use details::conv_plans;

use rayon::prelude::*;

use self::float::ViaF32;
use self::pool::Pool;
use super::{
    AdamStep, Backend, BackendBuffer, BatchNormSpec, BiasGeometry, BinaryOp, BufferRef, CausalSoftmax, CmpOp,
    Conv2dGeometry, CrossEntropy, DeviceInfo, Distribution, MatmulDims, MemoryStats, Pool2dGeometry, ReduceKind,
    SgdStep, UnaryOp,
};
use crate::dtype::{DType, Element, HostVec};
use crate::error::{Error, Result};
use crate::shape::Layout;
use crate::{float_binary_dispatch, float_unary_dispatch, map_host_vec, stored_binary_dispatch, stored_unary_dispatch};

/// A host allocation owned by one CPU device. The lock makes the in-place operations
/// (optimizer steps, copies into slices) safe against concurrent readers.
#[derive(Debug)]
pub struct CpuBuffer {
    data: RwLock<HostVec>,
    pool: Arc<Pool>,
}

impl CpuBuffer {
    fn read(&self) -> RwLockReadGuard<'_, HostVec> {
        self.data.read().unwrap_or_else(|e| e.into_inner())
    }
    fn write(&self) -> RwLockWriteGuard<'_, HostVec> {
        self.data.write().unwrap_or_else(|e| e.into_inner())
    }
}

impl BackendBuffer for CpuBuffer {
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
    fn dtype(&self) -> DType {
        self.read().dtype()
    }
    fn len(&self) -> usize {
        self.read().len()
    }
}

impl Drop for CpuBuffer {
    fn drop(&mut self) {
        let data = std::mem::replace(
            self.data.get_mut().unwrap_or_else(|e| e.into_inner()),
            HostVec::U32(Vec::new()),
        );
        self.pool.give(data);
    }
}

/// The built-in CPU device `cpu:N`: the reference implementation of every `Backend` operation, on
/// host memory with rayon threads. Each instance has its own buffer pool and memory counters; all
/// share the process's cores.
#[derive(Debug)]
pub struct CpuBackend {
    ordinal: usize,
    pool: Arc<Pool>,
    busy: busy::BusyMeter,
    capacity: capacity::Capacity,
}

/// Matches two `HostVec`s of the same dtype, binding both inner slices, for kernels that work on
/// every element type (copies, selects, comparisons).
macro_rules! same_dtype {
    ($op:expr, $a:expr, $b:expr, |$x:ident, $y:ident| $body:expr) => {
        match ($a, $b) {
            (HostVec::F32($x), HostVec::F32($y)) => $body,
            (HostVec::F16($x), HostVec::F16($y)) => $body,
            (HostVec::BF16($x), HostVec::BF16($y)) => $body,
            (HostVec::F64($x), HostVec::F64($y)) => $body,
            (HostVec::I64($x), HostVec::I64($y)) => $body,
            (HostVec::U32($x), HostVec::U32($y)) => $body,
            (a, b) => {
                return Err(Error::DTypeMismatch {
                    op: $op,
                    lhs: a.dtype(),
                    rhs: b.dtype(),
                })
            }
        }
    };
}

fn cpu<'a>(op: &'static str, b: &'a BufferRef) -> Result<&'a CpuBuffer> {
    b.as_any()
        .downcast_ref::<CpuBuffer>()
        .ok_or_else(|| Error::invalid(op, "buffer does not belong to a CPU device"))
}

fn check_extent(op: &'static str, b: &BufferRef, layout: &Layout) -> Result<()> {
    if layout.extent() > b.len() {
        return Err(Error::invalid(
            op,
            format!("layout {:?} reaches past a buffer of {} elements", layout, b.len()),
        ));
    }
    Ok(())
}

fn u32_ids<'a>(op: &'static str, ids: &'a HostVec) -> Result<&'a [u32]> {
    match ids {
        HostVec::U32(v) => Ok(v),
        other => Err(Error::UnsupportedDType {
            op,
            dtype: other.dtype(),
            hint: "; indices are u32",
        }),
    }
}

impl CpuBackend {
    /// A fresh `cpu:ordinal` device with its own buffer pool; `Device::parse("cpu:N")` makes one per
    /// ordinal, so use that unless you need an instance outside the device registry.
    pub fn new(ordinal: usize) -> Self {
        CpuBackend {
            ordinal,
            pool: Arc::new(Pool::default()),
            busy: busy::BusyMeter::new(),
            capacity: capacity::Capacity::of_this_machine(),
        }
    }

    /// The paths this process takes for a convolution of geometry `g` into `out_channels`
    /// channels in `dtype` (see [`Plan`]); `None` for a dtype that is not convolved. The choice
    /// follows the CPU's features and `LOCKSTEP_CPU_CONV`, which forces paths: `auto`, or
    /// comma-separated `PATH` or `PASS=PATH` items (passes `forward`, `input`, `weight`; paths
    /// `unfold`, `fold`, `transposed`, `transposed-direct`, `shifted`, `positions`, `panels`,
    /// `direct`), a path that cannot run leaving its pass the automatic choice.
    pub fn conv_plan(g: &Conv2dGeometry, out_channels: usize, dtype: DType) -> Option<Plan> {
        conv::chosen(g, out_channels, dtype)
    }

    /// A new tensor of `len` elements, refused where the machine cannot hold it.
    fn check_fits(&self, op: &'static str, dtype: DType, len: usize) -> Result<()> {
        let in_use = self.pool.allocated_bytes.load(std::sync::atomic::Ordering::Relaxed);
        self.capacity.check(self.ordinal, op, dtype, len, in_use)
    }

    fn wrap(&self, data: HostVec) -> BufferRef {
        self.pool.note_alloc((data.len() * data.dtype().size_in_bytes()) as u64);
        Arc::new(CpuBuffer {
            data: RwLock::new(data),
            pool: self.pool.clone(),
        })
    }

    /// `Backend::cross_entropy` on logits of one dtype: the row losses and the gradient.
    fn cross_entropy_rows<T: ViaF32>(
        &self,
        x: &[T],
        targets: &[u32],
        spec: &CrossEntropy,
    ) -> (BufferRef, Option<BufferRef>) {
        let mut losses = self.pool.take::<f32>(spec.rows);
        let mut grad = spec.grad.then(|| self.pool.take::<T>(x.len()));
        cross_entropy::forward(x, targets, &mut losses, grad.as_deref_mut(), spec);
        let grad = grad.map(|g| self.wrap(T::into_host(g)));
        (self.wrap(HostVec::F32(losses)), grad)
    }

    /// The saved gradient `d` of `cross_entropy` times the loss' gradient `g`.
    fn cross_entropy_scaled<T: ViaF32>(&self, d: &[T], g: f32) -> Vec<T> {
        let mut out = self.pool.take::<T>(d.len());
        cross_entropy::backward(d, g, &mut out);
        out
    }

    fn typed_full<T: Element>(&self, len: usize, value: f64) -> HostVec {
        let mut v = self.pool.take::<T>(len);
        v.fill(T::from_f64(value));
        T::into_host(v)
    }
}

/// A batch norm's element-wise result as a `HostVec`, beside its per-channel f32 vectors.
fn in_host_vec<E: Element>((values, per_channel): (Vec<E>, [Vec<f32>; 2])) -> (HostVec, [Vec<f32>; 2]) {
    (E::into_host(values), per_channel)
}

impl Backend for CpuBackend {
    fn info(&self) -> DeviceInfo {
        DeviceInfo {
            location: format!("cpu:{}", self.ordinal),
            name: format!(
                "{} ({} threads)",
                details::cpu_model_name(),
                rayon::current_num_threads()
            ),
            api: "cpu".into(),
            total_memory_bytes: self.capacity.ram(),
            software: false,
            details: details::kernel_details(),
        }
    }

    fn memory_stats(&self) -> MemoryStats {
        use std::sync::atomic::Ordering::Relaxed;
        let allocated = self.pool.allocated_bytes.load(Relaxed);
        MemoryStats {
            allocated_bytes: allocated,
            reserved_bytes: allocated + self.pool.cached_bytes(),
            peak_allocated_bytes: self.pool.peak_bytes.load(Relaxed),
            utilization: self.busy.utilization(rayon::current_num_threads()),
        }
    }

    fn synchronize(&self) -> Result<()> {
        Ok(())
    }

    fn empty_cache(&self) -> Result<()> {
        self.pool.clear();
        Ok(())
    }

    fn zeros(&self, dtype: DType, len: usize) -> Result<BufferRef> {
        self.full(dtype, len, 0.0)
    }

    fn full(&self, dtype: DType, len: usize, value: f64) -> Result<BufferRef> {
        self.check_fits("full", dtype, len)?;
        let data = match dtype {
            DType::F32 => self.typed_full::<f32>(len, value),
            DType::F16 => self.typed_full::<half::f16>(len, value),
            DType::BF16 => self.typed_full::<half::bf16>(len, value),
            DType::F64 => self.typed_full::<f64>(len, value),
            DType::I64 => self.typed_full::<i64>(len, value),
            DType::U32 => self.typed_full::<u32>(len, value),
        };
        Ok(self.wrap(data))
    }

    fn from_host(&self, data: &HostVec) -> Result<BufferRef> {
        let copy = map_host_vec!(data, v => {
            let mut out = self.pool.take(v.len());
            out.copy_from_slice(v);
            Element::into_host(out)
        });
        Ok(self.wrap(copy))
    }

    fn to_host(&self, src: &BufferRef, layout: &Layout) -> Result<HostVec> {
        check_extent("to_host", src, layout)?;
        let data = cpu("to_host", src)?.read();
        Ok(map_host_vec!(&*data, v => {
            let mut out = vec![v.first().copied().unwrap_or_else(|| Element::from_f64(0.0)); layout.elem_count()];
            strided::gather(v, layout, &mut out);
            Element::into_host(out)
        }))
    }

    fn rand(&self, dtype: DType, len: usize, dist: Distribution, seed: u64, counter: u64) -> Result<BufferRef> {
        if !dtype.is_float() {
            return Err(Error::UnsupportedDType {
                op: "rand",
                dtype,
                hint: "; random tensors are floating point",
            });
        }
        self.check_fits("rand", dtype, len)?;
        let block = |b: u64| match dist {
            Distribution::Uniform { low, high } => {
                crate::rng::uniform_block(seed, counter, b).map(|u| low + (high - low) * u)
            }
            Distribution::Normal { mean, std } => crate::rng::normal_block(seed, counter, b).map(|n| mean + std * n),
        };
        Ok(self.wrap(match dtype {
            DType::F32 => HostVec::F32(random_fill(&self.pool, len, block)),
            DType::F64 => HostVec::F64(random_fill(&self.pool, len, block)),
            DType::F16 => HostVec::F16(random_fill(&self.pool, len, block)),
            DType::BF16 => HostVec::BF16(random_fill(&self.pool, len, block)),
            other => return Err(Error::dtype("rand", other)),
        }))
    }

    fn copy_strided(&self, src: &BufferRef, src_layout: &Layout, dst: &BufferRef, dst_layout: &Layout) -> Result<()> {
        check_extent("copy_strided", src, src_layout)?;
        check_extent("copy_strided", dst, dst_layout)?;
        if src_layout.shape != dst_layout.shape {
            return Err(Error::shape(
                "copy_strided",
                &src_layout.shape,
                &dst_layout.shape,
                "source and destination views differ",
            ));
        }
        let (from, to) = (cpu("copy_strided", src)?, cpu("copy_strided", dst)?);
        if std::ptr::eq(from, to) {
            // Read first into a temporary: source and destination are the same buffer.
            let values = self.to_host(src, src_layout)?;
            let mut out = to.write();
            same_dtype!("copy_strided", &values, &mut *out, |v, d| strided::scatter(
                v, dst_layout, d
            ));
            return Ok(());
        }
        // Straight from one buffer to the other: a temporary as large as the tensor, allocated
        // afresh for every copy, had the allocator fault its pages in again each step.
        let (values, mut out) = (from.read(), to.write());
        same_dtype!("copy_strided", &*values, &mut *out, |v, d| strided::copy(
            v, src_layout, d, dst_layout
        ));
        Ok(())
    }

    fn contiguous(&self, src: &BufferRef, layout: &Layout) -> Result<BufferRef> {
        check_extent("contiguous", src, layout)?;
        let data = cpu("contiguous", src)?.read();
        // From the pool and gathered into: no zeroing pass over a buffer about to be overwritten.
        Ok(self.wrap(map_host_vec!(&*data, v => {
            let mut out = self.pool.take(layout.elem_count());
            strided::gather(v, layout, &mut out);
            Element::into_host(out)
        })))
    }

    fn cast(&self, src: &BufferRef, layout: &Layout, dtype: DType) -> Result<BufferRef> {
        check_extent("cast", src, layout)?;
        let data = cpu("cast", src)?.read();
        // Between f32 and the half types (mixed precision casts weights every step): `half`'s
        // SIMD slice conversions, which round exactly as the scalar ones.
        if layout.is_contiguous() {
            let range = layout.offset..layout.offset + layout.elem_count();
            let fast = match (&*data, dtype) {
                (HostVec::F32(v), DType::F16) => Some(HostVec::F16(float::narrow_f16(&self.pool, &v[range]))),
                (HostVec::F32(v), DType::BF16) => Some(HostVec::BF16(float::narrow_bf16(&self.pool, &v[range]))),
                (HostVec::F16(v), DType::F32) => Some(HostVec::F32(float::widen_f16(&self.pool, &v[range]))),
                (HostVec::BF16(v), DType::F32) => Some(HostVec::F32(float::widen_bf16(&self.pool, &v[range]))),
                _ => None,
            };
            if let Some(out) = fast {
                return Ok(self.wrap(out));
            }
        }
        // Through f64, which holds every value of every dtype here exactly (i64 up to 2^53), so
        // each conversion rounds once, as a direct one would.
        fn convert<S: Element, D: Element>(pool: &Pool, v: &[S], layout: &Layout) -> Vec<D> {
            elementwise::map(pool, v, layout, |x| D::from_f64(x.to_f64()))
        }
        let out = map_host_vec!(&*data, v => match dtype {
            DType::F32 => HostVec::F32(convert(&self.pool, v, layout)),
            DType::F16 => HostVec::F16(convert(&self.pool, v, layout)),
            DType::BF16 => HostVec::BF16(convert(&self.pool, v, layout)),
            DType::F64 => HostVec::F64(convert(&self.pool, v, layout)),
            DType::I64 => HostVec::I64(convert(&self.pool, v, layout)),
            DType::U32 => HostVec::U32(convert(&self.pool, v, layout)),
        });
        Ok(self.wrap(out))
    }

    fn unary(&self, op: UnaryOp, src: &BufferRef, layout: &Layout) -> Result<BufferRef> {
        check_extent(op.name(), src, layout)?;
        let data = cpu(op.name(), src)?.read();
        let out = stored_unary_dispatch!(op.name(), &*data, |v| elementwise::unary(&self.pool, v, layout, op));
        Ok(self.wrap(out))
    }

    fn bias_act(
        &self,
        src: &BufferRef,
        bias: &BufferRef,
        geom: BiasGeometry,
        act: Option<UnaryOp>,
    ) -> Result<BufferRef> {
        let BiasGeometry { outer, channels, inner } = geom;
        let op = "bias_act";
        if src.len() < outer * channels * inner || bias.len() < channels {
            return Err(Error::invalid(
                op,
                format!(
                    "{geom:?} does not fit buffers of {} and {} elements",
                    src.len(),
                    bias.len()
                ),
            ));
        }
        let (x, b) = (cpu(op, src)?.read(), cpu(op, bias)?.read());
        let out = stored_binary_dispatch!(op, &*x, &*b, |x, b| bias::bias_act(
            &self.pool,
            &x[..outer * channels * inner],
            b,
            channels,
            inner,
            act
        ));
        Ok(self.wrap(out))
    }

    fn binary(
        &self,
        op: BinaryOp,
        lhs: &BufferRef,
        lhs_layout: &Layout,
        rhs: &BufferRef,
        rhs_layout: &Layout,
    ) -> Result<BufferRef> {
        check_extent(op.name(), lhs, lhs_layout)?;
        check_extent(op.name(), rhs, rhs_layout)?;
        let (a, b) = (cpu(op.name(), lhs)?.read(), cpu(op.name(), rhs)?.read());
        let out = stored_binary_dispatch!(op.name(), &*a, &*b, |x, y| elementwise::binary(
            &self.pool, x, lhs_layout, y, rhs_layout, op
        ));
        Ok(self.wrap(out))
    }

    fn compare(
        &self,
        op: CmpOp,
        lhs: &BufferRef,
        lhs_layout: &Layout,
        rhs: &BufferRef,
        rhs_layout: &Layout,
    ) -> Result<BufferRef> {
        check_extent(op.name(), lhs, lhs_layout)?;
        check_extent(op.name(), rhs, rhs_layout)?;
        let (a, b) = (cpu(op.name(), lhs)?.read(), cpu(op.name(), rhs)?.read());
        let out = same_dtype!(op.name(), &*a, &*b, |x, y| elementwise::compare(
            &self.pool, x, lhs_layout, y, rhs_layout, op
        ));
        Ok(self.wrap(HostVec::U32(out)))
    }

    fn where_cond(
        &self,
        cond: &BufferRef,
        cl: &Layout,
        on_true: &BufferRef,
        tl: &Layout,
        on_false: &BufferRef,
        fl: &Layout,
    ) -> Result<BufferRef> {
        check_extent("where_cond", cond, cl)?;
        check_extent("where_cond", on_true, tl)?;
        check_extent("where_cond", on_false, fl)?;
        let c = cpu("where_cond", cond)?.read();
        let c = u32_ids("where_cond", &c)?;
        let (t, f) = (cpu("where_cond", on_true)?.read(), cpu("where_cond", on_false)?.read());
        let out = same_dtype!("where_cond", &*t, &*f, |x, y| Element::into_host(elementwise::select(
            &self.pool, c, cl, x, tl, y, fl
        )));
        Ok(self.wrap(out))
    }

    fn reduce(&self, op: ReduceKind, src: &BufferRef, layout: &Layout, axes: &[usize]) -> Result<BufferRef> {
        check_extent(op.name(), src, layout)?;
        op.check_axes(layout.shape.rank(), axes)?;
        let data = cpu(op.name(), src)?.read();
        if op == ReduceKind::ArgMax {
            let [axis] = axes else {
                return Err(Error::invalid("argmax", "takes exactly one axis"));
            };
            let out = match &*data {
                HostVec::F32(v) => reduce::argmax(&self.pool, v, layout, *axis),
                HostVec::F64(v) => reduce::argmax(&self.pool, v, layout, *axis),
                HostVec::F16(v) => reduce::argmax(&self.pool, &float::widen_f16(&self.pool, v), layout, *axis),
                HostVec::BF16(v) => reduce::argmax(&self.pool, &float::widen_bf16(&self.pool, v), layout, *axis),
                other => return Err(Error::dtype("argmax", other.dtype())),
            };
            return Ok(self.wrap(HostVec::U32(out)));
        }
        let out = stored_unary_dispatch!(op.name(), &*data, |v| reduce::reduce(&self.pool, op, v, layout, axes));
        Ok(self.wrap(out))
    }

    fn matmul(
        &self,
        lhs: &BufferRef,
        lhs_layout: &Layout,
        rhs: &BufferRef,
        rhs_layout: &Layout,
        dims: MatmulDims,
    ) -> Result<BufferRef> {
        let expect_l = [dims.batch, dims.m, dims.k];
        let expect_r = [dims.batch, dims.k, dims.n];
        if lhs_layout.dims() != expect_l || rhs_layout.dims() != expect_r {
            return Err(Error::shape(
                "matmul",
                &lhs_layout.shape,
                &rhs_layout.shape,
                format!("expected {expect_l:?} @ {expect_r:?}"),
            ));
        }
        check_extent("matmul", lhs, lhs_layout)?;
        check_extent("matmul", rhs, rhs_layout)?;
        let (a, b) = (cpu("matmul", lhs)?.read(), cpu("matmul", rhs)?.read());
        if let (HostVec::BF16(x), HostVec::BF16(y)) = (&*a, &*b)
            && let Some(out) = matmul::matmul_bf16(&self.pool, x, lhs_layout, y, rhs_layout, dims)
        {
            return Ok(self.wrap(HostVec::BF16(out)));
        }
        let out = float_binary_dispatch!(&self.pool, "matmul", &*a, &*b, |x, y| matmul::matmul(
            &self.pool, x, lhs_layout, y, rhs_layout, dims
        ));
        Ok(self.wrap(out))
    }

    fn softmax_last(&self, src: &BufferRef, rows: usize, cols: usize) -> Result<BufferRef> {
        let data = cpu("softmax", src)?.read();
        check_len("softmax", &data, rows * cols)?;
        Ok(self.wrap(float_unary_dispatch!(&self.pool, "softmax", &*data, |v| {
            softmax::softmax(&self.pool, v, cols)
        })))
    }

    fn log_softmax_last(&self, src: &BufferRef, rows: usize, cols: usize) -> Result<BufferRef> {
        let data = cpu("log_softmax", src)?.read();
        check_len("log_softmax", &data, rows * cols)?;
        Ok(self.wrap(float_unary_dispatch!(&self.pool, "log_softmax", &*data, |v| {
            softmax::log_softmax(&self.pool, v, cols)
        })))
    }

    fn dropout(&self, src: &BufferRef, len: usize, p: f64, seed: u64, counter: u64) -> Result<BufferRef> {
        let data = cpu("dropout", src)?.read();
        check_len("dropout", &data, len)?;
        let pool = &self.pool;
        let keep = 1.0 / (1.0 - p);
        // 16-bit floats scaled in f32 and rounded once, as the f32 kernel then a cast would.
        fn via_f32<T: ViaF32>(pool: &Pool, v: &[T], p: f64, seed: u64, counter: u64, keep: f32) -> Vec<T> {
            dropout::dropout(pool, v, p, seed, counter, move |x, kept| {
                T::from_f32(x.to_f32() * if kept { keep } else { 0.0 })
            })
        }
        Ok(self.wrap(match &*data {
            HostVec::F64(v) => HostVec::F64(dropout::dropout(pool, v, p, seed, counter, move |x, kept| {
                x * if kept { keep } else { 0.0 }
            })),
            HostVec::F32(v) => HostVec::F32(via_f32(pool, v, p, seed, counter, keep as f32)),
            HostVec::BF16(v) => HostVec::BF16(via_f32(pool, v, p, seed, counter, keep as f32)),
            HostVec::F16(v) => HostVec::F16(via_f32(pool, v, p, seed, counter, keep as f32)),
            other => return Err(Error::dtype("dropout", other.dtype())),
        }))
    }

    fn batch_norm(
        &self,
        x: &BufferRef,
        weight: &BufferRef,
        bias: &BufferRef,
        spec: &BatchNormSpec,
    ) -> Option<Result<[BufferRef; 3]>> {
        const OP: &str = "batch_norm";
        let checked = || {
            let (x, w, b) = (cpu(OP, x)?.read(), cpu(OP, weight)?.read(), cpu(OP, bias)?.read());
            check_len(OP, &x, spec.outer * spec.channels * spec.inner)?;
            check_len(OP, &w, spec.channels)?;
            check_len(OP, &b, spec.channels)?;
            let (HostVec::F32(w), HostVec::F32(b)) = (&*w, &*b) else {
                return Ok(None);
            };
            let (y, stats) = match &*x {
                HostVec::F32(x) => in_host_vec(batch_norm::forward(&self.pool, x, w, b, spec)),
                HostVec::BF16(x) => in_host_vec(batch_norm::forward(&self.pool, x, w, b, spec)),
                HostVec::F16(x) => in_host_vec(batch_norm::forward(&self.pool, x, w, b, spec)),
                // f64 (the conformance reference) keeps the composed ops.
                _ => return Ok(None),
            };
            let [mean, var] = stats.map(|v| self.wrap(HostVec::F32(v)));
            Ok(Some([self.wrap(y), mean, var]))
        };
        checked().transpose()
    }

    fn batch_norm_backward(
        &self,
        grad: &BufferRef,
        x: &BufferRef,
        weight: &BufferRef,
        [mean, var]: [&BufferRef; 2],
        spec: &BatchNormSpec,
    ) -> Option<Result<[BufferRef; 3]>> {
        const OP: &str = "batch_norm_backward";
        let checked = || {
            let (g, x, w) = (cpu(OP, grad)?.read(), cpu(OP, x)?.read(), cpu(OP, weight)?.read());
            let (m, v) = (cpu(OP, mean)?.read(), cpu(OP, var)?.read());
            check_len(OP, &g, spec.outer * spec.channels * spec.inner)?;
            check_len(OP, &x, spec.outer * spec.channels * spec.inner)?;
            for per_channel in [&w, &m, &v] {
                check_len(OP, per_channel, spec.channels)?;
            }
            let (HostVec::F32(w), HostVec::F32(m), HostVec::F32(v)) = (&*w, &*m, &*v) else {
                return Ok(None);
            };
            let (dx, grads) = match (&*g, &*x) {
                (HostVec::F32(g), HostVec::F32(x)) => {
                    in_host_vec(batch_norm::backward(&self.pool, g, x, w, [m, v], spec))
                }
                (HostVec::BF16(g), HostVec::BF16(x)) => {
                    in_host_vec(batch_norm::backward(&self.pool, g, x, w, [m, v], spec))
                }
                (HostVec::F16(g), HostVec::F16(x)) => {
                    in_host_vec(batch_norm::backward(&self.pool, g, x, w, [m, v], spec))
                }
                _ => return Ok(None),
            };
            let [dweight, dbias] = grads.map(|v| self.wrap(HostVec::F32(v)));
            Ok(Some([self.wrap(dx), dweight, dbias]))
        };
        checked().transpose()
    }

    fn causal_softmax(&self, scores: &BufferRef, spec: &CausalSoftmax) -> Option<Result<BufferRef>> {
        let checked = || {
            let x = cpu("causal_softmax", scores)?.read();
            check_len("causal_softmax", &x, spec.rows * spec.t)?;
            let pool = &self.pool;
            Ok(match &*x {
                HostVec::F32(x) => Some(HostVec::F32(causal_softmax::forward(pool, x, spec))),
                HostVec::BF16(x) => Some(HostVec::BF16(causal_softmax::forward(pool, x, spec))),
                HostVec::F16(x) => Some(HostVec::F16(causal_softmax::forward(pool, x, spec))),
                // f64 (the conformance reference) keeps the composed ops.
                _ => None,
            })
        };
        checked().map(|out| out.map(|out| self.wrap(out))).transpose()
    }

    fn causal_softmax_backward(
        &self,
        grad: &BufferRef,
        scores: &BufferRef,
        spec: &CausalSoftmax,
    ) -> Option<Result<BufferRef>> {
        const OP: &str = "causal_softmax_backward";
        let checked = || {
            let (g, x) = (cpu(OP, grad)?.read(), cpu(OP, scores)?.read());
            check_len(OP, &g, spec.rows * spec.t)?;
            check_len(OP, &x, spec.rows * spec.t)?;
            let pool = &self.pool;
            Ok(match (&*g, &*x) {
                (HostVec::F32(g), HostVec::F32(x)) => Some(HostVec::F32(causal_softmax::backward(pool, g, x, spec))),
                (HostVec::BF16(g), HostVec::BF16(x)) => Some(HostVec::BF16(causal_softmax::backward(pool, g, x, spec))),
                (HostVec::F16(g), HostVec::F16(x)) => Some(HostVec::F16(causal_softmax::backward(pool, g, x, spec))),
                _ => None,
            })
        };
        checked().map(|out| out.map(|out| self.wrap(out))).transpose()
    }

    fn cross_entropy(
        &self,
        logits: &BufferRef,
        targets: &BufferRef,
        spec: &CrossEntropy,
    ) -> Option<Result<(BufferRef, Option<BufferRef>)>> {
        const OP: &str = "cross_entropy";
        let checked = || {
            let (x, t) = (cpu(OP, logits)?.read(), cpu(OP, targets)?.read());
            check_len(OP, &x, spec.rows * spec.classes)?;
            let t = u32_ids(OP, &t)?;
            if t.len() != spec.rows {
                return Err(Error::invalid(
                    OP,
                    format!("{} targets for {} rows", t.len(), spec.rows),
                ));
            }
            index::check(OP, t, spec.classes)?;
            Ok(match &*x {
                HostVec::F32(x) => Some(self.cross_entropy_rows(x, t, spec)),
                HostVec::BF16(x) => Some(self.cross_entropy_rows(x, t, spec)),
                HostVec::F16(x) => Some(self.cross_entropy_rows(x, t, spec)),
                // f64 (the conformance reference) keeps the composed ops.
                _ => None,
            })
        };
        checked().transpose()
    }

    fn cross_entropy_backward(
        &self,
        dlogits: &BufferRef,
        grad: &BufferRef,
        spec: &CrossEntropy,
    ) -> Option<Result<BufferRef>> {
        const OP: &str = "cross_entropy_backward";
        let checked = || {
            let g = cpu(OP, grad)?.read();
            CrossEntropy::check_upstream(g.dtype(), g.len())?;
            let g = g.to_f64_vec()[0] as f32;
            // The host holds the gradient already: a loss not scaled after it costs no pass.
            if g == 1.0 {
                return Ok(Some(dlogits.clone()));
            }
            let d = cpu(OP, dlogits)?.read();
            check_len(OP, &d, spec.rows * spec.classes)?;
            Ok(match &*d {
                HostVec::F32(d) => Some(self.wrap(HostVec::F32(self.cross_entropy_scaled(d, g)))),
                HostVec::BF16(d) => Some(self.wrap(HostVec::BF16(self.cross_entropy_scaled(d, g)))),
                HostVec::F16(d) => Some(self.wrap(HostVec::F16(self.cross_entropy_scaled(d, g)))),
                _ => None,
            })
        };
        checked().transpose()
    }

    fn softmax_last_backward(&self, grad: &BufferRef, out: &BufferRef, rows: usize, cols: usize) -> Result<BufferRef> {
        const OP: &str = "softmax_backward";
        let (g, y) = (cpu(OP, grad)?.read(), cpu(OP, out)?.read());
        check_len(OP, &g, rows * cols)?;
        check_len(OP, &y, rows * cols)?;
        Ok(self.wrap(float_binary_dispatch!(&self.pool, OP, &*g, &*y, |g, y| {
            softmax::softmax_backward(&self.pool, g, y, cols)
        })))
    }

    fn layer_norm_last(&self, src: &BufferRef, rows: usize, cols: usize, eps: f64) -> Result<BufferRef> {
        let data = cpu("layer_norm", src)?.read();
        check_len("layer_norm", &data, rows * cols)?;
        Ok(self.wrap(float_unary_dispatch!(&self.pool, "layer_norm", &*data, |v| {
            layer_norm::forward(&self.pool, v, cols, eps)
        })))
    }

    fn layer_norm_last_backward(
        &self,
        grad: &BufferRef,
        src: &BufferRef,
        rows: usize,
        cols: usize,
        eps: f64,
    ) -> Result<BufferRef> {
        const OP: &str = "layer_norm_backward";
        let (g, x) = (cpu(OP, grad)?.read(), cpu(OP, src)?.read());
        check_len(OP, &g, rows * cols)?;
        check_len(OP, &x, rows * cols)?;
        Ok(self.wrap(float_binary_dispatch!(&self.pool, OP, &*g, &*x, |g, x| {
            layer_norm::backward(&self.pool, g, x, cols, eps)
        })))
    }

    fn index_select(
        &self,
        src: &BufferRef,
        outer: usize,
        dim: usize,
        inner: usize,
        ids: &BufferRef,
    ) -> Result<BufferRef> {
        let (data, ids) = (cpu("index_select", src)?.read(), cpu("index_select", ids)?.read());
        check_len("index_select", &data, outer * dim * inner)?;
        let ids = u32_ids("index_select", &ids)?;
        let out =
            map_host_vec!(&*data, v => Element::into_host(index::index_select(&self.pool, v, outer, dim, inner, ids)?));
        Ok(self.wrap(out))
    }

    fn index_add(
        &self,
        dst: &BufferRef,
        dst_dim: usize,
        src: &BufferRef,
        outer: usize,
        src_dim: usize,
        inner: usize,
        ids: &BufferRef,
    ) -> Result<()> {
        distinct("index_add", &[dst, src, ids])?;
        let (s, ids) = (cpu("index_add", src)?.read(), cpu("index_add", ids)?.read());
        let ids = u32_ids("index_add", &ids)?;
        check_len("index_add", &s, outer * src_dim * inner)?;
        let mut d = cpu("index_add", dst)?.write();
        check_len("index_add", &d, outer * dst_dim * inner)?;
        float_pair_mut(
            &self.pool,
            "index_add",
            &mut d,
            &s,
            |d, s| index::index_add(d, dst_dim, s, outer, src_dim, inner, ids),
            |d, s| index::index_add(d, dst_dim, s, outer, src_dim, inner, ids),
        )
    }

    fn gather(
        &self,
        src: &BufferRef,
        outer: usize,
        dim: usize,
        inner: usize,
        ids: &BufferRef,
        out_dim: usize,
    ) -> Result<BufferRef> {
        let (data, ids) = (cpu("gather", src)?.read(), cpu("gather", ids)?.read());
        check_len("gather", &data, outer * dim * inner)?;
        let ids = u32_ids("gather", &ids)?;
        if ids.len() != outer * out_dim * inner {
            return Err(Error::invalid(
                "gather",
                format!(
                    "index holds {} elements, expected {}",
                    ids.len(),
                    outer * out_dim * inner
                ),
            ));
        }
        let out = map_host_vec!(&*data, v => Element::into_host(index::gather(&self.pool, v, outer, dim, inner, ids, out_dim)?));
        Ok(self.wrap(out))
    }

    fn scatter_add(
        &self,
        dst: &BufferRef,
        dst_dim: usize,
        src: &BufferRef,
        outer: usize,
        src_dim: usize,
        inner: usize,
        ids: &BufferRef,
    ) -> Result<()> {
        distinct("scatter_add", &[dst, src, ids])?;
        let (s, ids) = (cpu("scatter_add", src)?.read(), cpu("scatter_add", ids)?.read());
        let ids = u32_ids("scatter_add", &ids)?;
        check_len("scatter_add", &s, outer * src_dim * inner)?;
        if ids.len() != s.len() {
            return Err(Error::invalid(
                "scatter_add",
                format!("index holds {} elements, source {}", ids.len(), s.len()),
            ));
        }
        let mut d = cpu("scatter_add", dst)?.write();
        check_len("scatter_add", &d, outer * dst_dim * inner)?;
        float_pair_mut(
            &self.pool,
            "scatter_add",
            &mut d,
            &s,
            |d, s| index::scatter_add(d, dst_dim, s, outer, src_dim, inner, ids),
            |d, s| index::scatter_add(d, dst_dim, s, outer, src_dim, inner, ids),
        )
    }

    fn im2col(&self, src: &BufferRef, geom: &Conv2dGeometry) -> Result<BufferRef> {
        geom.validate("im2col")?;
        let data = cpu("im2col", src)?.read();
        check_len("im2col", &data, geom.n * geom.c * geom.h * geom.w)?;
        Ok(self.wrap(float_unary_dispatch!(&self.pool, "im2col", &*data, |v| {
            conv::unfold::im2col(&self.pool, v, geom)
        })))
    }

    fn col2im(&self, cols: &BufferRef, geom: &Conv2dGeometry) -> Result<BufferRef> {
        geom.validate("col2im")?;
        let data = cpu("col2im", cols)?.read();
        check_len(
            "col2im",
            &data,
            geom.n * geom.c * geom.kh * geom.kw * geom.out_h() * geom.out_w(),
        )?;
        Ok(self.wrap(float_unary_dispatch!(&self.pool, "col2im", &*data, |v| {
            conv::unfold::col2im(&self.pool, v, geom)
        })))
    }

    fn conv2d_product(
        &self,
        x: &BufferRef,
        weight: &BufferRef,
        geom: &Conv2dGeometry,
        out_channels: usize,
    ) -> Option<Result<BufferRef>> {
        let checked = || {
            geom.validate("conv2d")?;
            let (x, w) = (cpu("conv2d", x)?.read(), cpu("conv2d", weight)?.read());
            check_len("conv2d", &x, geom.n * geom.c * geom.h * geom.w)?;
            check_len("conv2d (weight)", &w, out_channels * geom.c * geom.kh * geom.kw)?;
            let Some(plan) = conv::chosen(geom, out_channels, x.dtype()) else {
                return Ok(None);
            };
            Ok(conv::forward(&self.pool, &x, &w, geom, out_channels, &plan))
        };
        checked().map(|out| out.map(|out| self.wrap(out))).transpose()
    }

    fn conv2d_product_backward(
        &self,
        x: &BufferRef,
        weight: &BufferRef,
        grad: &BufferRef,
        geom: &Conv2dGeometry,
        out_channels: usize,
    ) -> Option<Result<(BufferRef, BufferRef)>> {
        let checked = || {
            geom.validate("conv2d backward")?;
            let (x, w, g) = (
                cpu("conv2d backward", x)?.read(),
                cpu("conv2d backward", weight)?.read(),
                cpu("conv2d backward", grad)?.read(),
            );
            check_len("conv2d backward", &x, geom.n * geom.c * geom.h * geom.w)?;
            check_len(
                "conv2d backward (weight)",
                &w,
                out_channels * geom.c * geom.kh * geom.kw,
            )?;
            check_len(
                "conv2d backward (gradient)",
                &g,
                out_channels * geom.n * geom.out_h() * geom.out_w(),
            )?;
            let Some(plan) = conv::chosen(geom, out_channels, x.dtype()) else {
                return Ok(None);
            };
            Ok(conv::backward(&self.pool, &x, &w, &g, geom, out_channels, &plan))
        };
        checked()
            .map(|out| out.map(|(gx, gw)| (self.wrap(gx), self.wrap(gw))))
            .transpose()
    }

    fn max_pool2d(&self, src: &BufferRef, geom: &Pool2dGeometry) -> Result<(BufferRef, BufferRef)> {
        geom.validate("max_pool2d")?;
        let data = cpu("max_pool2d", src)?.read();
        check_len("max_pool2d", &data, geom.n * geom.c * geom.h * geom.w)?;
        let mut indices = Vec::new();
        let values = float_unary_dispatch!(&self.pool, "max_pool2d", &*data, |v| {
            let (vals, idx) = max_pool::max_pool2d(&self.pool, v, geom);
            indices = idx;
            vals
        });
        Ok((self.wrap(values), self.wrap(HostVec::U32(indices))))
    }

    fn axpy(&self, dst: &BufferRef, src: &BufferRef, alpha: f64) -> Result<()> {
        let s = self.to_host(src, &Layout::contiguous([src.len()]))?;
        let mut d = cpu("axpy", dst)?.write();
        check_len("axpy", &d, s.len())?;
        float_pair_mut(
            &self.pool,
            "axpy",
            &mut d,
            &s,
            |d, s| {
                let _: () = optim::axpy(d, s, alpha);
                Ok(())
            },
            |d, s| {
                let _: () = optim::axpy(d, s, alpha);
                Ok(())
            },
        )
    }

    fn sgd_step(
        &self,
        param: &BufferRef,
        grad: &BufferRef,
        momentum_buf: Option<&BufferRef>,
        step: &SgdStep,
    ) -> Result<()> {
        let mut roles = vec![param, grad];
        roles.extend(momentum_buf);
        distinct("sgd_step", &roles)?;
        let g = cpu("sgd_step", grad)?.read();
        let mut p = cpu("sgd_step", param)?.write();
        check_len("sgd_step", &g, p.len())?;
        let mut buf = momentum_buf
            .map(|b| cpu("sgd_step", b).map(|b| b.write()))
            .transpose()?;
        match (&mut *p, &*g, buf.as_deref_mut()) {
            (HostVec::F32(p), HostVec::F32(g), None) => optim::sgd(p, g, None, step),
            (HostVec::F32(p), HostVec::F32(g), Some(HostVec::F32(b))) if b.len() == p.len() => {
                optim::sgd(p, g, Some(b), step)
            }
            (HostVec::F64(p), HostVec::F64(g), None) => optim::sgd(p, g, None, step),
            (HostVec::F64(p), HostVec::F64(g), Some(HostVec::F64(b))) if b.len() == p.len() => {
                optim::sgd(p, g, Some(b), step)
            }
            (p, _, _) => {
                return Err(Error::UnsupportedDType {
                    op: "sgd_step",
                    dtype: p.dtype(),
                    hint: "; parameter, gradient and momentum must all be f32 (or f64) of one length",
                });
            }
        }
        Ok(())
    }

    fn adam_step(
        &self,
        param: &BufferRef,
        grad: &BufferRef,
        exp_avg: &BufferRef,
        exp_avg_sq: &BufferRef,
        step: &AdamStep,
    ) -> Result<()> {
        distinct("adam_step", &[param, grad, exp_avg, exp_avg_sq])?;
        if step.step == 0 {
            return Err(Error::invalid(
                "adam_step",
                "step counts from 1 (bias correction divides by 1 - beta^step)",
            ));
        }
        let g = cpu("adam_step", grad)?.read();
        let mut p = cpu("adam_step", param)?.write();
        let (mut m, mut v) = (
            cpu("adam_step", exp_avg)?.write(),
            cpu("adam_step", exp_avg_sq)?.write(),
        );
        let n = p.len();
        if g.len() != n || m.len() != n || v.len() != n {
            return Err(Error::invalid(
                "adam_step",
                "parameter, gradient and moment buffers must have one length",
            ));
        }
        match (&mut *p, &*g, &mut *m, &mut *v) {
            (HostVec::F32(p), HostVec::F32(g), HostVec::F32(m), HostVec::F32(v)) => optim::adam(p, g, m, v, step),
            (HostVec::F64(p), HostVec::F64(g), HostVec::F64(m), HostVec::F64(v)) => optim::adam(p, g, m, v, step),
            (p, ..) => {
                return Err(Error::UnsupportedDType {
                    op: "adam_step",
                    dtype: p.dtype(),
                    hint: "; parameter, gradient and moments must all be f32 (or f64)",
                });
            }
        }
        Ok(())
    }
}

/// In-place kernels lock the destination for writing and the sources for reading: the same
/// buffer in two roles would deadlock, so it is refused.
fn distinct(op: &'static str, buffers: &[&BufferRef]) -> Result<()> {
    for (i, a) in buffers.iter().enumerate() {
        if buffers[i + 1..].iter().any(|b| Arc::ptr_eq(a, b)) {
            return Err(Error::invalid(
                op,
                "the same buffer was passed in two roles; pass distinct buffers",
            ));
        }
    }
    Ok(())
}

fn check_len(op: &'static str, data: &HostVec, expected: usize) -> Result<()> {
    if data.len() != expected {
        return Err(Error::invalid(
            op,
            format!("buffer holds {} elements, the geometry needs {expected}", data.len()),
        ));
    }
    Ok(())
}

/// Runs an in-place kernel on a float destination with a source of the same dtype (f16 and bf16
/// through the f32 kernel, rounding once).
/// `len` random values, four per counter block (`block(b)` gives elements 4b … 4b + 3), filled
/// in parallel chunks into a pooled vector.
fn random_fill<T: Element>(pool: &Pool, len: usize, block: impl Fn(u64) -> [f64; 4] + Sync) -> Vec<T> {
    const CHUNK: usize = 4096; // a multiple of 4: chunks start on block boundaries
    let mut out = pool.take::<T>(len);
    out.par_chunks_mut(CHUNK).enumerate().for_each(|(c, chunk)| {
        let first = (c * CHUNK / 4) as u64;
        for (b, quad) in chunk.chunks_mut(4).enumerate() {
            let values = block(first + b as u64);
            quad.iter_mut().zip(values).for_each(|(o, v)| *o = T::from_f64(v));
        }
    });
    out
}

fn float_pair_mut(
    pool: &Pool,
    op: &'static str,
    dst: &mut HostVec,
    src: &HostVec,
    f32_kernel: impl FnOnce(&mut [f32], &[f32]) -> Result<()>,
    f64_kernel: impl FnOnce(&mut [f64], &[f64]) -> Result<()>,
) -> Result<()> {
    match (dst, src) {
        (HostVec::F32(d), HostVec::F32(s)) => f32_kernel(d, s),
        (HostVec::F64(d), HostVec::F64(s)) => f64_kernel(d, s),
        // Fix: the backward passes of index_select, gather, max_pool2d and cross_entropy
        // (index_add, scatter_add) run in every float dtype, so half precision must work too.
        (HostVec::F16(d), HostVec::F16(s)) => {
            let mut wide = float::widen_f16(pool, d);
            f32_kernel(&mut wide, &float::widen_f16(pool, s))?;
            d.iter_mut().zip(wide).for_each(|(d, w)| *d = half::f16::from_f32(w));
            Ok(())
        }
        (HostVec::BF16(d), HostVec::BF16(s)) => {
            let mut wide = float::widen_bf16(pool, d);
            f32_kernel(&mut wide, &float::widen_bf16(pool, s))?;
            d.iter_mut().zip(wide).for_each(|(d, w)| *d = half::bf16::from_f32(w));
            Ok(())
        }
        (d, s) if d.dtype() != s.dtype() => Err(Error::DTypeMismatch {
            op,
            lhs: d.dtype(),
            rhs: s.dtype(),
        }),
        (d, _) => Err(Error::UnsupportedDType {
            op,
            dtype: d.dtype(),
            hint: "; in-place accumulation needs a float dtype",
        }),
    }
}
