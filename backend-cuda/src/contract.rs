//! `impl Backend for CudaBackend`: the core contract, each method handing off to its op file.

use lockstep_core::backend::{
    AdamOperands, AdamStep, Backend, BatchNormSpec, BiasGeometry, BinaryOp, BufferRef, CausalAttention, CausalSoftmax,
    CmpOp, Conv2dGeometry, CrossEntropy, DeviceInfo, Distribution, InputGradient, KernelTime, LayerNormAffine,
    LayerNormGrads, LayerNormSpec, MatmulDims, MemoryStats, Pool2dGeometry, ReduceKind, RunningStatsSpec, SgdOperands,
    SgdStep, UnaryOp, WorkCounters,
};
use lockstep_core::shape::Layout;
use lockstep_core::{DType, HostVec, Result};

use crate::backend::CudaBackend;

impl Backend for CudaBackend {
    fn info(&self) -> DeviceInfo {
        self.device_info()
    }
    fn memory_stats(&self) -> MemoryStats {
        self.memory()
    }
    fn work_counters(&self) -> WorkCounters {
        self.gpu.work_counters()
    }
    fn profile_kernels(&self, on: bool) -> Result<()> {
        self.gpu.synchronize()?;
        self.gpu.profiler.set(on);
        Ok(())
    }
    fn kernel_times(&self) -> Result<Vec<KernelTime>> {
        self.gpu.synchronize()?;
        Ok(self.gpu.profiler.times())
    }
    fn synchronize(&self) -> Result<()> {
        self.gpu.synchronize()
    }
    /// Frees wait for queued work in stream order, so everything queued must finish first.
    fn empty_cache(&self) -> Result<()> {
        self.gpu.synchronize()?;
        self.gpu.memory.release_cached();
        Ok(())
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
        self.dropout_stream(src, len, p, seed, counter)
    }

    fn copy_strided(&self, src: &BufferRef, src_layout: &Layout, dst: &BufferRef, dst_layout: &Layout) -> Result<()> {
        self.copy_between(src, src_layout, dst, dst_layout)
    }
    fn cast(&self, src: &BufferRef, layout: &Layout, dtype: DType) -> Result<BufferRef> {
        self.convert(src, layout, dtype)
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
        self.cmp(op, lhs, ll, rhs, rl)
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
        self.select(cond, cond_layout, on_true, true_layout, on_false, false_layout)
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
        self.softmax_rows(src, rows, cols, false)
    }
    fn log_softmax_last(&self, src: &BufferRef, rows: usize, cols: usize) -> Result<BufferRef> {
        self.softmax_rows(src, rows, cols, true)
    }
    fn softmax_last_backward(&self, grad: &BufferRef, out: &BufferRef, rows: usize, cols: usize) -> Result<BufferRef> {
        self.softmax_backward_rows(grad, out, rows, cols)
    }
    fn causal_softmax(&self, scores: &BufferRef, spec: &CausalSoftmax) -> Option<Result<BufferRef>> {
        Some(self.causal_softmax_rows(scores, None, spec))
    }
    fn causal_softmax_backward(
        &self,
        grad: &BufferRef,
        scores: &BufferRef,
        spec: &CausalSoftmax,
    ) -> Option<Result<BufferRef>> {
        Some(self.causal_softmax_rows(scores, Some(grad), spec))
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
    fn batch_norm(
        &self,
        x: &BufferRef,
        weight: &BufferRef,
        bias: &BufferRef,
        residual: Option<&BufferRef>,
        spec: &BatchNormSpec,
    ) -> Option<Result<[BufferRef; 3]>> {
        // Neither the channel-major layout nor the fused residual and ReLU: the caller gathers,
        // or applies them after.
        if spec.channel_major || spec.relu || residual.is_some() {
            return None;
        }
        self.batch_norm_fused(x, [weight, bias], spec).transpose()
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
        if spec.channel_major || spec.relu {
            return None;
        }
        self.batch_norm_backward_fused([grad, x], [weight, mean, var], spec)
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
        affine.check_backward("layer_norm_backward", grad, src, spec)?;
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
        self.pick("index_select", src, outer, dim, inner, ids, ids.len(), false)
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
        self.add_at("index_add", dst, dst_dim, src, outer, src_dim, inner, ids, false)
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
        self.pick("gather", src, outer, dim, inner, ids, out_dim, true)
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
        self.add_at("scatter_add", dst, dst_dim, src, outer, src_dim, inner, ids, true)
    }

    fn im2col(&self, src: &BufferRef, geom: &Conv2dGeometry) -> Result<BufferRef> {
        self.unfold_or_fold(src, geom, true)
    }
    fn col2im(&self, cols: &BufferRef, geom: &Conv2dGeometry) -> Result<BufferRef> {
        self.unfold_or_fold(cols, geom, false)
    }
    fn conv2d_nchw(
        &self,
        x: &BufferRef,
        weight: &BufferRef,
        geom: &Conv2dGeometry,
        out_channels: usize,
    ) -> Option<Result<BufferRef>> {
        self.conv2d_dnn(x, weight, geom, out_channels).transpose()
    }
    fn conv2d_nchw_backward(
        &self,
        x: &BufferRef,
        weight: &BufferRef,
        grad: &BufferRef,
        geom: &Conv2dGeometry,
        out_channels: usize,
    ) -> Option<Result<(BufferRef, BufferRef)>> {
        self.conv2d_dnn_backward([x, weight, grad], geom, out_channels)
            .transpose()
    }
    fn max_pool2d(&self, src: &BufferRef, geom: &Pool2dGeometry) -> Result<(BufferRef, BufferRef)> {
        self.pool_max(src, geom)
    }
    fn max_pool2d_backward(&self, grad: &BufferRef, indices: &BufferRef, geom: &Pool2dGeometry) -> Result<BufferRef> {
        self.pool_max_backward(grad, indices, geom)
    }

    fn axpy(&self, dst: &BufferRef, src: &BufferRef, alpha: f64) -> Result<()> {
        self.add_scaled(dst, src, alpha)
    }
    fn sgd_step(
        &self,
        param: &BufferRef,
        grad: &BufferRef,
        momentum_buf: Option<&BufferRef>,
        step: &SgdStep,
    ) -> Result<()> {
        self.sgd(param, grad, momentum_buf, step)
    }
    fn adam_step(
        &self,
        param: &BufferRef,
        grad: &BufferRef,
        exp_avg: &BufferRef,
        exp_avg_sq: &BufferRef,
        step: &AdamStep,
    ) -> Result<()> {
        self.adam(param, grad, exp_avg, exp_avg_sq, step)
    }
    fn adam_steps(&self, items: &[AdamOperands<'_>]) -> Result<()> {
        self.adam_steps_grouped(items)
    }
    fn sgd_steps(&self, items: &[SgdOperands<'_>]) -> Result<()> {
        self.sgd_steps_grouped(items)
    }
    fn sum_of_squares(&self, bufs: &[&BufferRef]) -> Result<BufferRef> {
        self.sum_of_squares_grouped(bufs)
    }
    fn scaled_copies(&self, bufs: &[&BufferRef], factor: &BufferRef) -> Result<Vec<BufferRef>> {
        self.scaled_copies_grouped(bufs, factor)
    }
    fn non_finite_count(&self, bufs: &[&BufferRef]) -> Result<BufferRef> {
        self.non_finite_count_grouped(bufs)
    }
    fn cast_copies(&self, bufs: &[&BufferRef], dtype: DType) -> Result<Vec<BufferRef>> {
        self.cast_copies_grouped(bufs, dtype)
    }
}
