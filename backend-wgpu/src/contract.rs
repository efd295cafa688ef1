//! `impl Backend for WgpuBackend`: the core contract, each method handing off to its op file.

use lockstep_core::backend::{
    AdamOperands, AdamStep, Backend, BatchNormSpec, BiasGeometry, BinaryOp, BufferRef, CausalAttention, CausalSoftmax,
    CmpOp, Conv2dGeometry, CrossEntropy, DeviceInfo, Distribution, InputGradient, KernelTime, LayerNormAffine,
    LayerNormGrads, LayerNormSpec, MatmulDims, MemoryStats, Pool2dGeometry, ReduceKind, RunningStatsSpec, SgdOperands,
    SgdStep, UnaryOp, WorkCounters,
};
use lockstep_core::shape::Layout;
use lockstep_core::{DType, HostVec, Result};

use crate::backend::WgpuBackend;

impl Backend for WgpuBackend {
    fn info(&self) -> DeviceInfo {
        self.device_info()
    }
    fn memory_stats(&self) -> MemoryStats {
        self.memory()
    }
    fn work_counters(&self) -> WorkCounters {
        self.recorded_work()
    }
    fn set_memory_limit(&self, bytes: Option<u64>) -> Result<()> {
        self.pool.set_limit(bytes);
        Ok(())
    }
    fn empty_cache(&self) -> Result<()> {
        self.release_cached()
    }
    fn synchronize(&self) -> Result<()> {
        self.count_host_wait();
        self.finish()
    }
    fn profile_kernels(&self, on: bool) -> Result<()> {
        if self.batch().profile_kernels(&self.gpu, on)? {
            return Ok(());
        }
        Err(self
            .gpu
            .error("this adapter has no timestamp queries, so its kernels cannot be timed one by one"))
    }
    fn kernel_times(&self) -> Result<Vec<KernelTime>> {
        self.batch().kernel_times(&self.gpu)
    }

    fn zeros(&self, dtype: DType, len: usize) -> Result<BufferRef> {
        self.fill(dtype, len, 0.0)
    }
    fn full(&self, dtype: DType, len: usize, value: f64) -> Result<BufferRef> {
        self.fill(dtype, len, value)
    }
    fn from_host(&self, data: &HostVec) -> Result<BufferRef> {
        self.upload(data)
    }
    fn to_host(&self, src: &BufferRef, layout: &Layout) -> Result<HostVec> {
        self.download(src, layout)
    }
    fn rand(&self, dtype: DType, len: usize, dist: Distribution, seed: u64, counter: u64) -> Result<BufferRef> {
        self.random(dtype, len, dist, seed, counter)
    }
    fn dropout(&self, src: &BufferRef, len: usize, p: f64, seed: u64, counter: u64) -> Result<BufferRef> {
        self.in_f32("dropout", [src], |[src]| {
            self.dropout_stream(src, len, p, seed, counter)
        })
    }

    fn copy_strided(&self, src: &BufferRef, src_layout: &Layout, dst: &BufferRef, dst_layout: &Layout) -> Result<()> {
        let copy = |src: &BufferRef, dst: &BufferRef| {
            let s = self.operand("copy_strided", src, Some(src_layout))?;
            let d = self.operand("copy_strided", dst, Some(dst_layout))?;
            self.copy_between(s, src_layout, d, dst_layout)
        };
        // bf16 into a contiguous view moves its halves; into a strided one through f32 copies.
        if src.dtype() == DType::BF16 && dst.dtype() == DType::BF16 && dst_layout.is_contiguous() {
            return copy(src, dst);
        }
        self.in_f32_mut("copy_strided", [dst], [src], |[dst], [src]| copy(src, dst))
    }
    fn contiguous(&self, src: &BufferRef, layout: &Layout) -> Result<BufferRef> {
        // transfer.rs's inherent `contiguous`: no zero fill first, as every element is written.
        let buffer = self.operand("contiguous", src, Some(layout))?;
        Ok(WgpuBackend::contiguous(self, buffer, layout)?)
    }
    fn cast(&self, src: &BufferRef, layout: &Layout, dtype: DType) -> Result<BufferRef> {
        self.cast_any(src, layout, dtype)
    }

    fn unary(&self, op: UnaryOp, src: &BufferRef, layout: &Layout) -> Result<BufferRef> {
        self.map(op, src, layout)
    }
    fn binary(&self, op: BinaryOp, lhs: &BufferRef, ll: &Layout, rhs: &BufferRef, rl: &Layout) -> Result<BufferRef> {
        self.zip(op, lhs, ll, rhs, rl)
    }
    fn binary_mixed(
        &self,
        op: BinaryOp,
        lhs: &BufferRef,
        ll: &Layout,
        rhs: &BufferRef,
        rl: &Layout,
    ) -> Result<BufferRef> {
        self.zip_mixed(op, lhs, ll, rhs, rl)
    }
    fn bias_act(
        &self,
        src: &BufferRef,
        bias: &BufferRef,
        geom: BiasGeometry,
        act: Option<UnaryOp>,
    ) -> Result<BufferRef> {
        self.add_bias(src, bias, geom, act)
    }
    fn bias_act_grad(
        &self,
        grad: &BufferRef,
        src: &BufferRef,
        bias: &BufferRef,
        geom: BiasGeometry,
        derivative: UnaryOp,
    ) -> Option<Result<BufferRef>> {
        Some(self.bias_act_gradient(grad, src, bias, geom, derivative))
    }
    fn compare(&self, op: CmpOp, lhs: &BufferRef, ll: &Layout, rhs: &BufferRef, rl: &Layout) -> Result<BufferRef> {
        self.in_f32("compare", [lhs, rhs], |[lhs, rhs]| self.cmp(op, lhs, ll, rhs, rl))
    }
    fn where_cond(
        &self,
        cond: &BufferRef,
        cond_layout: &Layout,
        on_true: &BufferRef,
        true_layout: &Layout,
        on_false: &BufferRef,
        false_layout: &Layout,
    ) -> Result<BufferRef> {
        self.in_f32("where_cond", [cond, on_true, on_false], |[cond, on_true, on_false]| {
            self.select(cond, cond_layout, on_true, true_layout, on_false, false_layout)
        })
    }

    fn reduce(&self, op: ReduceKind, src: &BufferRef, layout: &Layout, axes: &[usize]) -> Result<BufferRef> {
        self.reduce_axes(op, src, layout, axes)
    }

    fn matmul(
        &self,
        lhs: &BufferRef,
        ll: &Layout,
        rhs: &BufferRef,
        rl: &Layout,
        dims: MatmulDims,
    ) -> Result<BufferRef> {
        self.gemm(lhs, ll, rhs, rl, dims)
    }

    fn softmax_last(&self, src: &BufferRef, rows: usize, cols: usize) -> Result<BufferRef> {
        self.in_f32("softmax", [src], |[src]| self.softmax_rows(src, rows, cols, false))
    }
    fn log_softmax_last(&self, src: &BufferRef, rows: usize, cols: usize) -> Result<BufferRef> {
        self.in_f32("log_softmax", [src], |[src]| self.softmax_rows(src, rows, cols, true))
    }
    fn softmax_last_backward(&self, grad: &BufferRef, out: &BufferRef, rows: usize, cols: usize) -> Result<BufferRef> {
        self.in_f32("softmax_backward", [grad, out], |[grad, out]| {
            self.softmax_backward_rows(grad, out, rows, cols)
        })
    }
    fn cross_entropy(
        &self,
        logits: &BufferRef,
        targets: &BufferRef,
        spec: &CrossEntropy,
    ) -> Option<Result<(BufferRef, Option<BufferRef>)>> {
        Some(self.cross_entropy_rows(logits, targets, spec))
    }
    fn cross_entropy_backward(
        &self,
        dlogits: &BufferRef,
        grad: &BufferRef,
        spec: &CrossEntropy,
    ) -> Option<Result<BufferRef>> {
        Some(self.cross_entropy_scaled(dlogits, grad, spec))
    }
    fn causal_attention(&self, qkv: &BufferRef, spec: &CausalAttention) -> Option<Result<(BufferRef, BufferRef)>> {
        // The kernels draw no dropout: the caller composes attention with it.
        if spec.dropout.is_some() {
            return None;
        }
        self.causal_attention_fused(qkv, spec)
    }
    fn causal_attention_backward(
        &self,
        qkv: &BufferRef,
        y: &BufferRef,
        lse: &BufferRef,
        dy: &BufferRef,
        spec: &CausalAttention,
    ) -> Option<Result<BufferRef>> {
        if spec.dropout.is_some() {
            return None;
        }
        self.causal_attention_backward_fused([qkv, y, lse, dy], spec)
    }
    fn causal_softmax(&self, scores: &BufferRef, spec: &CausalSoftmax) -> Option<Result<BufferRef>> {
        Some(self.in_f32("causal_softmax", [scores], |[scores]| {
            self.causal_softmax_rows(scores, None, spec)
        }))
    }
    fn causal_softmax_backward(
        &self,
        grad: &BufferRef,
        scores: &BufferRef,
        spec: &CausalSoftmax,
    ) -> Option<Result<BufferRef>> {
        Some(
            self.in_f32("causal_softmax_backward", [grad, scores], |[grad, scores]| {
                self.causal_softmax_rows(scores, Some(grad), spec)
            }),
        )
    }
    fn batch_norm(
        &self,
        x: &BufferRef,
        weight: &BufferRef,
        bias: &BufferRef,
        residual: Option<&BufferRef>,
        spec: &BatchNormSpec,
    ) -> Option<Result<[BufferRef; 3]>> {
        self.batch_norm_fused(x, [weight, bias], residual, spec).transpose()
    }
    fn batch_norm_backward(
        &self,
        grad: &BufferRef,
        x: &BufferRef,
        weight: &BufferRef,
        [mean, var]: [&BufferRef; 2],
        out: Option<&BufferRef>,
        spec: &BatchNormSpec,
    ) -> Option<Result<[BufferRef; 3]>> {
        self.batch_norm_backward_fused([grad, x], [weight, mean, var], out, spec)
            .transpose()
    }
    fn batch_norm_running(
        &self,
        running: [&BufferRef; 2],
        batch: [&BufferRef; 2],
        batches: Option<&BufferRef>,
        spec: &RunningStatsSpec,
    ) -> Option<Result<()>> {
        self.batch_norm_running_pass(running, batch, batches, spec).transpose()
    }
    fn layer_norm_last(&self, src: &BufferRef, affine: LayerNormAffine<'_>, spec: &LayerNormSpec) -> Result<BufferRef> {
        self.layer_norm_forward(src, affine, spec, src.dtype())
    }
    fn layer_norm_last_backward(
        &self,
        grad: &BufferRef,
        src: &BufferRef,
        affine: LayerNormAffine<'_>,
        spec: &LayerNormSpec,
    ) -> Result<LayerNormGrads> {
        affine.check_backward("layer_norm_last_backward", grad, src, spec)?;
        self.layer_norm_backward(grad, src, affine, spec, InputGradient::default())
    }
    fn layer_norm_last_to(
        &self,
        src: &BufferRef,
        affine: LayerNormAffine<'_>,
        spec: &LayerNormSpec,
        out: DType,
    ) -> Result<BufferRef> {
        self.layer_norm_forward(src, affine, spec, out)
    }
    fn layer_norm_last_to_backward(
        &self,
        grad: &BufferRef,
        src: &BufferRef,
        affine: LayerNormAffine<'_>,
        spec: &LayerNormSpec,
        input: InputGradient<'_>,
    ) -> Result<LayerNormGrads> {
        self.layer_norm_backward(grad, src, affine, spec, input)
    }
    fn add_layer_norm_last_to(
        &self,
        residual: &BufferRef,
        branch: &BufferRef,
        affine: LayerNormAffine<'_>,
        spec: &LayerNormSpec,
        out: DType,
    ) -> Result<[BufferRef; 2]> {
        self.add_layer_norm_forward(residual, branch, affine, spec, out)
    }

    fn index_select(
        &self,
        src: &BufferRef,
        outer: usize,
        dim: usize,
        inner: usize,
        ids: &BufferRef,
    ) -> Result<BufferRef> {
        self.in_f32("index_select", [src, ids], |[src, ids]| {
            self.select_rows(src, outer, dim, inner, ids)
        })
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
        self.in_f32_mut("index_add", [dst], [src, ids], |[dst], [src, ids]| {
            self.add_at("index_add", dst, dst_dim, src, outer, src_dim, inner, ids)
        })
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
        self.in_f32("gather", [src, ids], |[src, ids]| {
            self.gather_along(src, outer, dim, inner, ids, out_dim)
        })
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
        self.in_f32_mut("scatter_add", [dst], [src, ids], |[dst], [src, ids]| {
            self.add_at("scatter_add", dst, dst_dim, src, outer, src_dim, inner, ids)
        })
    }

    fn im2col(&self, src: &BufferRef, geom: &Conv2dGeometry) -> Result<BufferRef> {
        self.unfold(src, geom)
    }
    fn col2im(&self, cols: &BufferRef, geom: &Conv2dGeometry) -> Result<BufferRef> {
        self.fold(cols, geom)
    }
    fn conv2d_product(
        &self,
        x: &BufferRef,
        weight: &BufferRef,
        geom: &Conv2dGeometry,
        out_channels: usize,
    ) -> Option<Result<BufferRef>> {
        self.conv_implicit(x, weight, geom, out_channels)
    }
    fn conv2d_product_backward(
        &self,
        x: &BufferRef,
        weight: &BufferRef,
        grad: &BufferRef,
        geom: &Conv2dGeometry,
        out_channels: usize,
    ) -> Option<Result<(BufferRef, BufferRef)>> {
        self.conv_implicit_backward(x, weight, grad, geom, out_channels)
    }
    fn max_pool2d(&self, src: &BufferRef, geom: &Pool2dGeometry) -> Result<(BufferRef, BufferRef)> {
        if src.dtype() != DType::BF16 {
            return self.pool_max(src, geom);
        }
        let wide = self.widen_bf16(crate::buffer::wgpu_buffer("max_pool2d", src)?)? as BufferRef;
        let (values, indices) = self.pool_max(&wide, geom)?;
        Ok((self.rounded("max_pool2d", values)?, indices))
    }

    fn max_pool2d_backward(&self, grad: &BufferRef, indices: &BufferRef, geom: &Pool2dGeometry) -> Result<BufferRef> {
        self.in_f32("max_pool2d_backward", [grad, indices], |[grad, indices]| {
            self.pool_max_backward(grad, indices, geom)
        })
    }

    fn axpy(&self, dst: &BufferRef, src: &BufferRef, alpha: f64) -> Result<()> {
        self.in_f32_mut("axpy", [dst], [src], |[dst], [src]| self.add_scaled(dst, src, alpha))
    }
    fn sgd_step(
        &self,
        param: &BufferRef,
        grad: &BufferRef,
        momentum_buf: Option<&BufferRef>,
        step: &SgdStep,
    ) -> Result<()> {
        match momentum_buf {
            Some(m) => self.in_f32_mut("sgd_step", [param, m], [grad], |[param, m], [grad]| {
                self.sgd(param, grad, Some(m), step)
            }),
            None => self.in_f32_mut("sgd_step", [param], [grad], |[param], [grad]| {
                self.sgd(param, grad, None, step)
            }),
        }
    }
    fn adam_step(
        &self,
        param: &BufferRef,
        grad: &BufferRef,
        exp_avg: &BufferRef,
        exp_avg_sq: &BufferRef,
        step: &AdamStep,
    ) -> Result<()> {
        self.in_f32_mut(
            "adam_step",
            [param, exp_avg, exp_avg_sq],
            [grad],
            |[param, exp_avg, exp_avg_sq], [grad]| self.adam(param, grad, exp_avg, exp_avg_sq, step),
        )
    }
    fn adam_steps(&self, items: &[AdamOperands<'_>]) -> Result<()> {
        self.adam_steps_batched(items)
    }
    fn sgd_steps(&self, items: &[SgdOperands<'_>]) -> Result<()> {
        self.sgd_steps_batched(items)
    }
    fn sum_of_squares(&self, bufs: &[&BufferRef]) -> Result<BufferRef> {
        self.sum_of_squares_batched(bufs)
    }
    fn scaled_copies(&self, bufs: &[&BufferRef], factor: &BufferRef) -> Result<Vec<BufferRef>> {
        self.scaled_copies_batched(bufs, factor)
    }
    fn non_finite_count(&self, bufs: &[&BufferRef]) -> Result<BufferRef> {
        self.non_finite_count_batched(bufs)
    }
    fn cast_copies(&self, bufs: &[&BufferRef], dtype: DType) -> Result<Vec<BufferRef>> {
        self.cast_copies_batched(bufs, dtype)
    }
}
