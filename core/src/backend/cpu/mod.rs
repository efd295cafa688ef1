//! The CPU reference backend: simple enough to trust, fast enough to train on (rayon over all
//! cores, the `gemm` crate for matrix products, a caching buffer pool). Several independent
//! instances (`cpu:0`, `cpu:1`, …) let multi-device code run and be tested without a GPU.

mod attention;
mod batch_norm;
mod bias;
mod buffer;
mod busy;
mod capacity;
mod causal_softmax;
mod conv;
mod cross_entropy;
mod details;
mod dropout;
mod elementwise;
mod fast_math;
pub(crate) mod float;
mod index;
mod layer_norm;
pub(crate) mod mapped_file;
mod matmul;
mod max_pool;
mod ops_attention;
mod ops_bias;
mod ops_conv;
mod ops_index;
mod ops_memory;
mod ops_multi_tensor;
mod ops_norm;
mod ops_optim;
mod ops_rows;
mod optim;
mod philox_lanes;
mod pool;
mod reduce;
mod simd;
mod softmax;
mod stored;
mod strided;
mod switch;

use std::sync::{Arc, RwLock};

pub use buffer::CpuBuffer;
use buffer::{check_extent, check_len, cpu, distinct, float_pair_mut, u32_ids};
pub use conv::{Forward, InputGrad, Plan, WeightGrad};
pub use details::conv_plans;
pub use matmul::Bf16Products;

use self::pool::Pool;
use self::switch::Switch;
use super::{
    AdamOperands, AdamStep, Backend, BatchNormSpec, BiasGeometry, BinaryOp, BufferRef, CausalAttention, CausalSoftmax,
    CmpOp, Conv2dGeometry, CrossEntropy, DeviceInfo, Distribution, LayerNormAffine, LayerNormGrads, LayerNormSpec,
    MatmulDims, MemoryStats, Pool2dGeometry, ReduceKind, RunningStatsSpec, SgdOperands, SgdStep, UnaryOp,
};
use crate::dtype::{DType, Element, HostVec};
use crate::error::{Error, Result};
use crate::shape::Layout;
use crate::{float_binary_dispatch, stored_binary_dispatch, stored_unary_dispatch};

/// The built-in CPU device `cpu:N`: the reference implementation of every `Backend` operation, on
/// host memory with rayon threads. Each instance has its own buffer pool and memory counters; all
/// share the process's cores.
#[derive(Debug)]
pub struct CpuBackend {
    ordinal: usize,
    pool: Arc<Pool>,
    busy: busy::BusyMeter,
    capacity: capacity::Capacity,
    /// Whether attention fuses (`set_attention_fused`).
    attention: Switch,
    /// Which kernel bf16 products take (`set_bf16_products`).
    bf16_products: matmul::bf16_plan::ProductsSwitch,
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

impl CpuBackend {
    /// A fresh `cpu:ordinal` device with its own buffer pool; `Device::parse("cpu:N")` makes one per
    /// ordinal, so use that unless you need an instance outside the device registry.
    pub fn new(ordinal: usize) -> Self {
        CpuBackend {
            ordinal,
            pool: Arc::new(Pool::default()),
            busy: busy::BusyMeter::new(),
            capacity: capacity::Capacity::of_this_machine(),
            attention: Switch::new(attention::fused_by_default()),
            bf16_products: matmul::bf16_plan::ProductsSwitch::new(matmul::bf16_plan::plan().products),
        }
    }

    /// Turns fused causal attention (`Backend::causal_attention`, flash-style, no `t × t`
    /// scores) on or off for this device; off, callers compose it from products and
    /// `causal_softmax`. The default is on unless `LOCKSTEP_CPU_ATTENTION=composed`.
    pub fn set_attention_fused(&self, fused: bool) {
        self.attention.set(fused);
    }

    /// Which kernel this device's bf16 products run on: AMX tiles, the AVX512-BF16 dot
    /// products, or widened to f32; the default is the process's `bf16_plan`. A kernel this CPU
    /// lacks widens. (Convolutions follow the process's plan.)
    pub fn set_bf16_products(&self, products: Bf16Products) {
        self.bf16_products.set(products);
    }

    /// The bf16 product kernels this CPU runs, widening last (it runs everywhere).
    pub fn bf16_products_available() -> Vec<Bf16Products> {
        let kernels = matmul::bf16_plan::Kernels::of_this_cpu();
        Bf16Products::ALL.into_iter().filter(|&p| kernels.run(p)).collect()
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

    /// `data`, which `op` made, as a new tensor's buffer: refused past the device's limit
    /// (`Backend::set_memory_limit`), so a run over it stops with an error naming `op`.
    fn wrap(&self, op: &'static str, data: HostVec) -> Result<BufferRef> {
        let bytes = (data.len() * data.dtype().size_in_bytes()) as u64;
        let in_use = self.pool.allocated_bytes.load(std::sync::atomic::Ordering::Relaxed);
        self.capacity.check_bytes(self.ordinal, op, bytes, in_use)?;
        self.pool.note_alloc(bytes);
        Ok(Arc::new(CpuBuffer {
            data: RwLock::new(data),
            pool: self.pool.clone(),
        }))
    }
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

    fn set_memory_limit(&self, bytes: Option<u64>) -> Result<()> {
        self.capacity.set_limit(bytes);
        Ok(())
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
        ops_memory::full(self, dtype, len, value)
    }

    fn from_host(&self, data: &HostVec) -> Result<BufferRef> {
        ops_memory::from_host(self, data)
    }

    fn to_host(&self, src: &BufferRef, layout: &Layout) -> Result<HostVec> {
        ops_memory::to_host(src, layout)
    }

    fn rand(&self, dtype: DType, len: usize, dist: Distribution, seed: u64, counter: u64) -> Result<BufferRef> {
        ops_memory::rand(self, dtype, len, dist, seed, counter)
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
        ops_memory::contiguous(self, src, layout)
    }

    fn cast(&self, src: &BufferRef, layout: &Layout, dtype: DType) -> Result<BufferRef> {
        ops_memory::cast(self, src, layout, dtype)
    }

    fn unary(&self, op: UnaryOp, src: &BufferRef, layout: &Layout) -> Result<BufferRef> {
        check_extent(op.name(), src, layout)?;
        let data = cpu(op.name(), src)?.read();
        let out = stored_unary_dispatch!(op.name(), &*data, |v| elementwise::unary(&self.pool, v, layout, op));
        self.wrap("unary", out)
    }

    fn bias_act(
        &self,
        src: &BufferRef,
        bias: &BufferRef,
        geom: BiasGeometry,
        act: Option<UnaryOp>,
    ) -> Result<BufferRef> {
        ops_bias::bias_act(self, src, bias, geom, act)
    }

    fn bias_act_grad(
        &self,
        grad: &BufferRef,
        src: &BufferRef,
        bias: &BufferRef,
        geom: BiasGeometry,
        derivative: UnaryOp,
    ) -> Option<Result<BufferRef>> {
        Some(ops_bias::bias_act_grad(self, [grad, src, bias], geom, derivative))
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
        self.wrap("binary", out)
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
        self.wrap("compare", HostVec::U32(out))
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
        self.wrap("where_cond", out)
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
            return self.wrap("reduce", HostVec::U32(out));
        }
        let out = stored_unary_dispatch!(op.name(), &*data, |v| reduce::reduce(&self.pool, op, v, layout, axes));
        self.wrap("reduce", out)
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
            && let Some(out) =
                matmul::matmul_bf16(&self.pool, self.bf16_products.get(), x, lhs_layout, y, rhs_layout, dims)
        {
            return self.wrap("matmul", HostVec::BF16(out));
        }
        let out = float_binary_dispatch!(&self.pool, "matmul", &*a, &*b, |x, y| matmul::matmul(
            &self.pool, x, lhs_layout, y, rhs_layout, dims
        ));
        self.wrap("matmul", out)
    }

    fn softmax_last(&self, src: &BufferRef, rows: usize, cols: usize) -> Result<BufferRef> {
        ops_rows::softmax_last(self, src, rows, cols)
    }

    fn log_softmax_last(&self, src: &BufferRef, rows: usize, cols: usize) -> Result<BufferRef> {
        ops_rows::log_softmax_last(self, src, rows, cols)
    }

    fn dropout(&self, src: &BufferRef, len: usize, p: f64, seed: u64, counter: u64) -> Result<BufferRef> {
        ops_rows::dropout(self, src, len, p, seed, counter)
    }

    fn batch_norm(
        &self,
        x: &BufferRef,
        weight: &BufferRef,
        bias: &BufferRef,
        residual: Option<&BufferRef>,
        spec: &BatchNormSpec,
    ) -> Option<Result<[BufferRef; 3]>> {
        // The fused residual and ReLU are declined: the caller applies them after, as their ops.
        if spec.relu || residual.is_some() {
            return None;
        }
        ops_norm::batch_norm(self, x, weight, bias, spec)
    }

    fn batch_norm_backward(
        &self,
        grad: &BufferRef,
        x: &BufferRef,
        weight: &BufferRef,
        [mean, var]: [&BufferRef; 2],
        _out: Option<&BufferRef>,
        spec: &BatchNormSpec,
    ) -> Option<Result<[BufferRef; 3]>> {
        if spec.relu {
            return None;
        }
        ops_norm::batch_norm_backward(self, grad, x, weight, [mean, var], spec)
    }

    fn batch_norm_running(
        &self,
        running: [&BufferRef; 2],
        batch: [&BufferRef; 2],
        batches: Option<&BufferRef>,
        spec: &RunningStatsSpec,
    ) -> Option<Result<()>> {
        ops_norm::batch_norm_running(running, batch, batches, spec)
    }

    fn causal_softmax(&self, scores: &BufferRef, spec: &CausalSoftmax) -> Option<Result<BufferRef>> {
        ops_norm::causal_softmax(self, scores, spec)
    }

    fn causal_softmax_backward(
        &self,
        grad: &BufferRef,
        scores: &BufferRef,
        spec: &CausalSoftmax,
    ) -> Option<Result<BufferRef>> {
        ops_norm::causal_softmax_backward(self, grad, scores, spec)
    }

    fn causal_attention(&self, qkv: &BufferRef, spec: &CausalAttention) -> Option<Result<(BufferRef, BufferRef)>> {
        ops_attention::causal_attention(self, qkv, spec)
    }

    fn causal_attention_backward(
        &self,
        qkv: &BufferRef,
        y: &BufferRef,
        lse: &BufferRef,
        dy: &BufferRef,
        spec: &CausalAttention,
    ) -> Option<Result<BufferRef>> {
        ops_attention::causal_attention_backward(self, [qkv, y, lse, dy], spec)
    }

    fn cross_entropy(
        &self,
        logits: &BufferRef,
        targets: &BufferRef,
        spec: &CrossEntropy,
    ) -> Option<Result<(BufferRef, Option<BufferRef>)>> {
        ops_norm::cross_entropy(self, logits, targets, spec)
    }

    fn cross_entropy_backward(
        &self,
        dlogits: &BufferRef,
        grad: &BufferRef,
        spec: &CrossEntropy,
    ) -> Option<Result<BufferRef>> {
        ops_norm::cross_entropy_backward(self, dlogits, grad, spec)
    }

    fn softmax_last_backward(&self, grad: &BufferRef, out: &BufferRef, rows: usize, cols: usize) -> Result<BufferRef> {
        ops_rows::softmax_last_backward(self, grad, out, rows, cols)
    }

    fn layer_norm_last(&self, src: &BufferRef, affine: LayerNormAffine<'_>, spec: &LayerNormSpec) -> Result<BufferRef> {
        ops_rows::layer_norm_last(self, src, affine, spec)
    }

    fn layer_norm_last_backward(
        &self,
        grad: &BufferRef,
        src: &BufferRef,
        affine: LayerNormAffine<'_>,
        spec: &LayerNormSpec,
    ) -> Result<LayerNormGrads> {
        ops_rows::layer_norm_last_backward(self, grad, src, affine, spec)
    }

    fn index_select(
        &self,
        src: &BufferRef,
        outer: usize,
        dim: usize,
        inner: usize,
        ids: &BufferRef,
    ) -> Result<BufferRef> {
        ops_index::index_select(self, src, outer, dim, inner, ids)
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
        ops_index::index_add(self, dst, dst_dim, src, outer, src_dim, inner, ids)
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
        ops_index::gather(self, src, outer, dim, inner, ids, out_dim)
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
        ops_index::scatter_add(self, dst, dst_dim, src, outer, src_dim, inner, ids)
    }

    fn im2col(&self, src: &BufferRef, geom: &Conv2dGeometry) -> Result<BufferRef> {
        ops_conv::im2col(self, src, geom)
    }

    fn col2im(&self, cols: &BufferRef, geom: &Conv2dGeometry) -> Result<BufferRef> {
        ops_conv::col2im(self, cols, geom)
    }

    fn conv2d_product(
        &self,
        x: &BufferRef,
        weight: &BufferRef,
        geom: &Conv2dGeometry,
        out_channels: usize,
    ) -> Option<Result<BufferRef>> {
        ops_conv::conv2d_product(self, x, weight, geom, out_channels)
    }

    fn conv2d_product_backward(
        &self,
        x: &BufferRef,
        weight: &BufferRef,
        grad: &BufferRef,
        geom: &Conv2dGeometry,
        out_channels: usize,
    ) -> Option<Result<(BufferRef, BufferRef)>> {
        ops_conv::conv2d_product_backward(self, x, weight, grad, geom, out_channels)
    }

    fn max_pool2d(&self, src: &BufferRef, geom: &Pool2dGeometry) -> Result<(BufferRef, BufferRef)> {
        ops_conv::max_pool2d(self, src, geom)
    }

    fn axpy(&self, dst: &BufferRef, src: &BufferRef, alpha: f64) -> Result<()> {
        ops_optim::axpy(self, dst, src, alpha)
    }

    fn sgd_step(
        &self,
        param: &BufferRef,
        grad: &BufferRef,
        momentum_buf: Option<&BufferRef>,
        step: &SgdStep,
    ) -> Result<()> {
        ops_optim::sgd_step(param, grad, momentum_buf, step)
    }

    fn adam_step(
        &self,
        param: &BufferRef,
        grad: &BufferRef,
        exp_avg: &BufferRef,
        exp_avg_sq: &BufferRef,
        step: &AdamStep,
    ) -> Result<()> {
        ops_optim::adam_step(param, grad, exp_avg, exp_avg_sq, step)
    }

    fn adam_steps(&self, items: &[AdamOperands<'_>]) -> Result<()> {
        ops_multi_tensor::adam_steps(items)
    }

    fn sgd_steps(&self, items: &[SgdOperands<'_>]) -> Result<()> {
        ops_multi_tensor::sgd_steps(items)
    }

    fn sum_of_squares(&self, bufs: &[&BufferRef]) -> Result<BufferRef> {
        ops_multi_tensor::sum_of_squares(self, bufs)
    }

    fn scaled_copies(&self, bufs: &[&BufferRef], factor: &BufferRef) -> Result<Vec<BufferRef>> {
        ops_multi_tensor::scaled_copies(self, bufs, factor)
    }

    fn non_finite_count(&self, bufs: &[&BufferRef]) -> Result<BufferRef> {
        ops_multi_tensor::non_finite_count(self, bufs)
    }
}
