//! The contract between the core and a device: the `Backend` trait (tensor operations on device
//! buffers) and the `Communicator` trait (collectives). Object-safe, so a device is chosen at run
//! time and the user-facing `Tensor` never carries a backend type parameter.
//!
//! Each method is one operation with one name across the CPU kernels, the WGSL shaders, the CUDA
//! kernels and the conformance cases. Methods that take a `Layout` accept any strides (views,
//! broadcasts); the others are documented as needing contiguous inputs, which `Tensor` guarantees.

mod communicator;
pub mod cpu;
#[doc(hidden)]
pub mod gpu_plan;
mod layer_norm;
#[doc(hidden)]
pub mod mixed;
#[doc(hidden)]
pub mod multi_tensor;
mod ops;

use std::any::Any;
use std::fmt;
use std::sync::Arc;

pub use communicator::{Communicator, LocalCommunicator, ReduceOp, check_peer, read_whole, write_whole};
pub use layer_norm::{InputGradient, LayerNormAffine, LayerNormGrads, LayerNormSpec};
pub use multi_tensor::{AdamOperands, SgdOperands};
pub use ops::{
    AdamConstants, AdamStep, BatchNormSpec, BiasGeometry, BinaryOp, CausalAttention, CausalSoftmax, CmpOp,
    Conv2dGeometry, CrossEntropy, Distribution, DropoutDraw, MatmulDims, Pool2dGeometry, ReduceKind, RunningStatsSpec,
    SgdStep, UnaryOp, split_axes,
};

use crate::dtype::{DType, HostVec};
use crate::error::{Error, Result};
use crate::shape::Layout;

/// A device allocation. Backends downcast it to their own buffer type through `as_any`.
pub trait BackendBuffer: Any + Send + Sync + fmt::Debug {
    /// The buffer as `Any`, for the backend that made it to downcast to its own buffer type.
    fn as_any(&self) -> &dyn Any;
    /// Element type of the allocation.
    fn dtype(&self) -> DType;
    /// Number of elements.
    fn len(&self) -> usize;
    /// True for a zero-length allocation.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A shared handle to a device allocation; a tensor and all views of its storage hold clones of one.
pub type BufferRef = Arc<dyn BackendBuffer>;

/// An error naming `op` unless the two operands of an elementwise op were broadcast to one shape
/// (what every backend's binary kernels expect).
pub fn check_one_shape(op: &'static str, lhs: &Layout, rhs: &Layout) -> Result<()> {
    if lhs.shape != rhs.shape {
        return Err(Error::shape(
            op,
            &lhs.shape,
            &rhs.shape,
            "operands must be broadcast to one shape first",
        ));
    }
    Ok(())
}

/// An error naming `op` unless `buffers` are distinct allocations: the check of every in-place
/// op whose roles must not share a buffer (an optimizer step, a running-statistics update).
pub fn distinct_buffers(op: &'static str, buffers: &[&BufferRef]) -> Result<()> {
    if shares_a_buffer(buffers.iter().copied(), []) {
        return Err(Error::invalid(
            op,
            "the same buffer was passed in two roles; pass distinct buffers",
        ));
    }
    Ok(())
}

/// Whether an allocation stands twice among `written`, or among `written` and `read` both (a
/// buffer may be read in several roles): what an in-place op must refuse.
pub(crate) fn shares_a_buffer<'a>(
    written: impl IntoIterator<Item = &'a BufferRef>,
    read: impl IntoIterator<Item = &'a BufferRef>,
) -> bool {
    let address = |b: &BufferRef| Arc::as_ptr(b) as *const ();
    let mut seen: Vec<*const ()> = written.into_iter().map(address).collect();
    seen.sort_unstable();
    let twice = seen.windows(2).any(|w| w[0] == w[1]);
    twice || read.into_iter().any(|r| seen.binary_search(&address(r)).is_ok())
}

/// What a device reports about itself (shown by `lockstep devices`).
#[derive(Clone, Debug, Default)]
pub struct DeviceInfo {
    /// `cpu:0`, `wgpu:1`, `cuda:0`.
    pub location: String,
    /// Human name: the CPU model, the adapter or GPU name.
    pub name: String,
    /// `cpu`, `vulkan`, `metal`, `cuda`, …
    pub api: String,
    /// Device memory in bytes (system RAM for the CPU); `None` when the backend cannot tell.
    pub total_memory_bytes: Option<u64>,
    /// A software implementation of a GPU API (lavapipe, llvmpipe, WARP): never picked by default.
    pub software: bool,
    /// What a bug report needs beyond the name: vendor, driver, features, limits (label, value).
    pub details: Vec<(String, String)>,
}

/// Allocator and utilisation counters. `None` means the backend cannot know, never zero.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct MemoryStats {
    /// Bytes in live buffers now.
    pub allocated_bytes: u64,
    /// Bytes the allocator holds from the system or driver: live buffers plus cached free blocks
    /// (at least `allocated_bytes`), as `torch.cuda.memory_reserved`.
    pub reserved_bytes: u64,
    /// The highest `allocated_bytes` since the device was opened.
    pub peak_allocated_bytes: u64,
    /// Fraction of time the device was busy, 0 to 1: on the CPU since the previous call, on CUDA over
    /// NVML's last sample period.
    pub utilization: Option<f64>,
}

/// Device work queued since the backend opened, for benchmarks that count launches per step.
/// `None` means the backend does not count, never zero.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WorkCounters {
    /// Compute kernels launched (CUDA) or dispatched (wgpu).
    pub kernels: Option<u64>,
    /// Calls into a vendor library that launch their own kernels (cuBLAS GEMMs).
    pub library_calls: Option<u64>,
    /// Times the host waited for all the device's queued work (a value read back, a
    /// synchronize): each drains the queue, so the device idles while the host queues what
    /// follows.
    pub host_waits: Option<u64>,
}

/// The device time of one kernel (on wgpu: a shader entry point with its element types and
/// constants), summed over its launches while `Backend::profile_kernels` was on.
#[derive(Clone, Debug, PartialEq)]
pub struct KernelTime {
    /// What the backend calls the kernel (`bias_act/bias_act bf16 ACT=9`).
    pub name: String,
    /// Times it ran.
    pub launches: u64,
    /// Device time over all its launches.
    pub seconds: f64,
}

/// Tensor operations on one device. Work may be queued; only `to_host` and `synchronize` wait.
pub trait Backend: Send + Sync + fmt::Debug {
    /// Name, API and properties of the device.
    fn info(&self) -> DeviceInfo;
    /// The allocator's counters now, and how busy the device has been.
    fn memory_stats(&self) -> MemoryStats;
    /// Launch counters; the CPU has none to count.
    fn work_counters(&self) -> WorkCounters {
        WorkCounters::default()
    }
    /// Starts (`true`) or stops timing each kernel this device runs, one at a time: slower than
    /// running normally, for finding where a step's time goes rather than measuring the step.
    /// Starting clears the tally. Backends that cannot time kernels refuse.
    fn profile_kernels(&self, on: bool) -> Result<()> {
        let _ = on;
        Err(Error::invalid(
            "profile_kernels",
            format!(
                "{} ({}) cannot time its kernels; CUDA devices can, and wgpu adapters with timestamp queries",
                self.info().location,
                self.info().name
            ),
        ))
    }
    /// The kernels timed since profiling started, longest first (waits for queued work).
    fn kernel_times(&self) -> Result<Vec<KernelTime>> {
        Ok(Vec::new())
    }
    /// Waits for every queued operation on this device.
    fn synchronize(&self) -> Result<()>;
    /// Hands the memory kept for reuse back to the system (`torch.cuda.empty_cache`): for when
    /// a process moves on to other shapes (another model or precision), whose buffers the kept
    /// ones would not serve. Live tensors are untouched.
    fn empty_cache(&self) -> Result<()> {
        Ok(())
    }

    /// Caps the bytes this device's live tensors may hold (`None`: its own memory), as
    /// `torch.cuda.set_per_process_memory_fraction` does: a tensor past it is an
    /// [`Error::OutOfMemory`] naming the op, for sharing a device or rehearsing a smaller one.
    /// A backend without such a limit refuses.
    fn set_memory_limit(&self, _bytes: Option<u64>) -> Result<()> {
        Err(crate::error::Error::invalid(
            "set_memory_limit",
            format!("{} has no memory limit to set", self.info().location),
        ))
    }

    // --- buffers -------------------------------------------------------------------------------
    /// A new buffer of `len` zeros of `dtype`.
    fn zeros(&self, dtype: DType, len: usize) -> Result<BufferRef>;
    /// A new buffer of `len` elements of `dtype`, each `value` converted as `Element::from_f64` does.
    fn full(&self, dtype: DType, len: usize, value: f64) -> Result<BufferRef>;
    /// A new buffer on this device holding a copy of `data`, of its dtype and length.
    // Named for what it does (a buffer on this device from host data), not a constructor.
    #[allow(clippy::wrong_self_convention)]
    fn from_host(&self, data: &HostVec) -> Result<BufferRef>;
    /// Copies the elements of `layout` out of `src`, in row-major order. A sync point.
    fn to_host(&self, src: &BufferRef, layout: &Layout) -> Result<HostVec>;
    /// Counter-based random numbers: element i depends only on (seed, counter, i), so every
    /// backend draws the same values. `counter` advances by `len.div_ceil(4)` per call.
    fn rand(&self, dtype: DType, len: usize, dist: Distribution, seed: u64, counter: u64) -> Result<BufferRef>;
    /// Dropout with its mask drawn from the counter stream as `rand` draws a uniform: element `i`
    /// is kept when `uniform_at(seed, counter, i) >= p` (compared in f32), giving
    /// `src[i] / (1 - p)`, else `src[i] * 0`. The same call on the output gradient is the
    /// backward pass, so no mask is ever stored. Contiguous `src` of `len` elements, `p` in (0, 1).
    fn dropout(&self, src: &BufferRef, len: usize, p: f64, seed: u64, counter: u64) -> Result<BufferRef>;

    // --- layout --------------------------------------------------------------------------------
    /// Writes the elements of `src` (any layout) into `dst` at `dst_layout` (any layout of
    /// the same shape, e.g. a slice of a larger buffer). The only in-place write besides the
    /// optimizer steps below.
    fn copy_strided(&self, src: &BufferRef, src_layout: &Layout, dst: &BufferRef, dst_layout: &Layout) -> Result<()>;
    /// A new buffer holding the elements of `layout` in `src`, row-major. By default a zeroed
    /// buffer written by `copy_strided`; a backend that can leave it unfilled saves that pass.
    fn contiguous(&self, src: &BufferRef, layout: &Layout) -> Result<BufferRef> {
        let out = self.zeros(src.dtype(), layout.elem_count())?;
        self.copy_strided(src, layout, &out, &Layout::contiguous(layout.shape.clone()))?;
        Ok(out)
    }
    /// A contiguous copy of `src` converted to `dtype`.
    fn cast(&self, src: &BufferRef, layout: &Layout, dtype: DType) -> Result<BufferRef>;

    // --- elementwise (any layouts; binary operands are already broadcast to one shape) -------
    /// `op` on every element of `src` as seen through `layout`: a contiguous buffer of the same float dtype.
    fn unary(&self, op: UnaryOp, src: &BufferRef, layout: &Layout) -> Result<BufferRef>;
    /// `op(lhs, rhs)` elementwise on float operands of one dtype, already broadcast to one shape;
    /// contiguous output.
    fn binary(
        &self,
        op: BinaryOp,
        lhs: &BufferRef,
        lhs_layout: &Layout,
        rhs: &BufferRef,
        rhs_layout: &Layout,
    ) -> Result<BufferRef>;
    /// `op(lhs, rhs)` on float operands of two dtypes, one f32 and the other f16 or bf16 (or
    /// one dtype), already broadcast to one shape: the narrower operand's values widened
    /// (exactly) and the result in the wider dtype, contiguous: the bits of a cast, then
    /// `binary`, which is what the default does. Autocast's type promotion (the f32 residual
    /// stream plus a bf16 branch) takes it.
    fn binary_mixed(
        &self,
        op: BinaryOp,
        lhs: &BufferRef,
        lhs_layout: &Layout,
        rhs: &BufferRef,
        rhs_layout: &Layout,
    ) -> Result<BufferRef> {
        mixed::binary_mixed(self, op, lhs, lhs_layout, rhs, rhs_layout)
    }
    /// A layer's bias and activation in one pass over a contiguous `[outer, channels, inner]`
    /// tensor: `out[o, c, i] = act(src[o, c, i] + bias[c])` (`act` None: the bias alone). Linear
    /// layers use `inner = 1`, convolutions `inner = h*w`.
    fn bias_act(
        &self,
        src: &BufferRef,
        bias: &BufferRef,
        geom: BiasGeometry,
        act: Option<UnaryOp>,
    ) -> Result<BufferRef>;
    /// The gradient of `bias_act`'s input for an activation whose derivative is the unary op
    /// `derivative` of its input: `grad ∘ derivative(src + bias)` over contiguous operands of
    /// one float dtype, each step rounded as the composed ops (add, `derivative`, multiply) round
    /// it. `None` where the backend has no such kernel: the caller composes those ops.
    fn bias_act_grad(
        &self,
        _grad: &BufferRef,
        _src: &BufferRef,
        _bias: &BufferRef,
        _geom: BiasGeometry,
        _derivative: UnaryOp,
    ) -> Option<Result<BufferRef>> {
        None
    }
    /// 1 where the comparison holds, else 0, as U32.
    fn compare(
        &self,
        op: CmpOp,
        lhs: &BufferRef,
        lhs_layout: &Layout,
        rhs: &BufferRef,
        rhs_layout: &Layout,
    ) -> Result<BufferRef>;
    /// `cond != 0 ? on_true : on_false`; `cond` is U32.
    fn where_cond(
        &self,
        cond: &BufferRef,
        cond_layout: &Layout,
        on_true: &BufferRef,
        true_layout: &Layout,
        on_false: &BufferRef,
        false_layout: &Layout,
    ) -> Result<BufferRef>;

    // --- reductions ------------------------------------------------------------------------------
    /// Reduces over `axes` (sorted, unique), keeping them as size 1. ArgMax returns U32 indices
    /// (first maximum) and takes exactly one axis.
    fn reduce(&self, op: ReduceKind, src: &BufferRef, layout: &Layout, axes: &[usize]) -> Result<BufferRef>;

    // --- linear algebra --------------------------------------------------------------------------
    /// `out[b] = lhs[b] @ rhs[b]` for `dims.batch` matrices, contiguous `[batch, m, n]` output.
    /// Layouts are `[batch, m, k]` and `[batch, k, n]` with any strides (transposes and broadcast
    /// batches cost no copy).
    fn matmul(
        &self,
        lhs: &BufferRef,
        lhs_layout: &Layout,
        rhs: &BufferRef,
        rhs_layout: &Layout,
        dims: MatmulDims,
    ) -> Result<BufferRef>;

    // --- normalisation (contiguous input, over the last axis of `[rows, cols]`) ------------------
    /// Softmax of each row of `[rows, cols]`, as `torch.softmax(x, dim=-1)`; a row holding a NaN or +inf
    /// is NaN throughout.
    fn softmax_last(&self, src: &BufferRef, rows: usize, cols: usize) -> Result<BufferRef>;
    /// Log-softmax of each row of `[rows, cols]`, as `torch.log_softmax(x, dim=-1)`: shifted by the row's
    /// maximum, so large logits do not overflow.
    fn log_softmax_last(&self, src: &BufferRef, rows: usize, cols: usize) -> Result<BufferRef>;
    /// The gradient of `softmax_last` from its output `out` and the output gradient `grad`, one
    /// pass per row: `dx = out * (grad - sum(grad * out))`.
    fn softmax_last_backward(&self, grad: &BufferRef, out: &BufferRef, rows: usize, cols: usize) -> Result<BufferRef>;
    /// Attention's weights in one pass per row of scores: `dropout(softmax(scores * scale, the
    /// keys after each query's position at -inf))`, the softmax as `softmax_last` computes it (in
    /// f32 for 16-bit scores) and the dropout as `dropout` draws it, returned in the scores'
    /// dtype. `None` where the backend has no such kernel for the dtype: the caller then composes
    /// it from those ops.
    fn causal_softmax(&self, _scores: &BufferRef, _spec: &CausalSoftmax) -> Option<Result<BufferRef>> {
        None
    }
    /// The gradient of `causal_softmax` with respect to its scores, from them and the output
    /// gradient `grad` (the weights computed again, the mask drawn again); `None` as for
    /// `causal_softmax`, which a backend implements together with this.
    fn causal_softmax_backward(
        &self,
        _grad: &BufferRef,
        _scores: &BufferRef,
        _spec: &CausalSoftmax,
    ) -> Option<Result<BufferRef>> {
        None
    }
    /// Mean cross-entropy in one pass per row of contiguous `[rows, classes]` logits against
    /// U32 `targets` `[rows]`: each row's loss `logsumexp(x) - x[target]` as F32 `[rows]` (the
    /// caller takes their mean) and, with `spec.grad`, the gradient of that mean, `(softmax(x) -
    /// onehot(target)) / rows`, in the logits' dtype; the maximum, the sum of exponentials and
    /// the loss in f32 whatever the dtype. A row whose maximum is not finite (a NaN or +inf,
    /// or all -inf) has a NaN loss and gradient, as `log_softmax_last` makes it. A target out
    /// of range is an error on the CPU; GPUs, which cannot report it without a sync, give its
    /// row loss 0 and gradient 0, as their composed `gather` does. `None` where the backend has
    /// no such kernel for the dtype: the caller then composes log-softmax, gather and mean.
    fn cross_entropy(
        &self,
        _logits: &BufferRef,
        _targets: &BufferRef,
        _spec: &CrossEntropy,
    ) -> Option<Result<(BufferRef, Option<BufferRef>)>> {
        None
    }
    /// The backward pass of `cross_entropy`: its saved gradient `dlogits` times the loss'
    /// gradient `grad`, one F32 element read on the device (never on the host), in `dlogits`'
    /// dtype, rounded once; `None` as for `cross_entropy`, which a backend implements with this.
    fn cross_entropy_backward(
        &self,
        _dlogits: &BufferRef,
        _grad: &BufferRef,
        _spec: &CrossEntropy,
    ) -> Option<Result<BufferRef>> {
        None
    }
    // --- fused causal attention (flash attention) -----------------------------------------------
    /// `softmax(q·kᵀ·scale, each query's future keys masked)·v` for every head, without the
    /// `t × t` weights: returns `y` (in `qkv`'s dtype) and each row's `lse`, the natural log of
    /// the sum of `exp(score·scale)` over the keys it sees (f32), which is all the backward pass
    /// keeps. A row holding a NaN or +inf score is NaN. No dropout on the weights: callers
    /// compose when it is on. `None` where the backend has no kernel for the dtype or head
    /// size: the caller then composes it from products and `causal_softmax`.
    fn causal_attention(&self, _qkv: &BufferRef, _spec: &CausalAttention) -> Option<Result<(BufferRef, BufferRef)>> {
        None
    }
    /// The gradient of `causal_attention` with respect to `qkv`, one `[batch, t, 3, heads,
    /// head_dim]` buffer, from `qkv`, the forward pass's `y` and `lse`, and `y`'s gradient `dy`
    /// (contiguous, `qkv`'s dtype); `None` as for `causal_attention`, which a backend
    /// implements together with this.
    fn causal_attention_backward(
        &self,
        _qkv: &BufferRef,
        _y: &BufferRef,
        _lse: &BufferRef,
        _dy: &BufferRef,
        _spec: &CausalAttention,
    ) -> Option<Result<BufferRef>> {
        None
    }
    /// Batch normalisation in training with the batch's own statistics: returns `y = (x - mean)
    /// / sqrt(var + eps) * weight + bias` (the element ops in that order, in f32; plus
    /// `residual`, a contiguous `[outer, channels, inner]` of `x`'s dtype, where given, as a
    /// residual block adds its shortcut, rounded to the dtype first; then its ReLU with
    /// `spec.relu`), and the
    /// per-channel `mean` and biased `var`, each `[channels]`. `x` and `y` share a dtype; weight,
    /// bias and the statistics are f32, also for an f16/bf16 `x` (autocast's mix). `None` where
    /// the backend has no such kernel for the dtypes: the caller then composes it from
    /// reductions and element ops.
    fn batch_norm(
        &self,
        _x: &BufferRef,
        _weight: &BufferRef,
        _bias: &BufferRef,
        _residual: Option<&BufferRef>,
        _spec: &BatchNormSpec,
    ) -> Option<Result<[BufferRef; 3]>> {
        None
    }
    /// The gradients of `batch_norm` for output gradient `grad`, from its input, weight and the
    /// `mean` and `var` it returned: `[dx, dweight, dbias]`; with `spec.relu`, `out` is the
    /// forward pass's output, whose positive elements let the gradient through (`None`
    /// otherwise). `None` as for `batch_norm`, which a backend implements together with this.
    fn batch_norm_backward(
        &self,
        _grad: &BufferRef,
        _x: &BufferRef,
        _weight: &BufferRef,
        _stats: [&BufferRef; 2],
        _out: Option<&BufferRef>,
        _spec: &BatchNormSpec,
    ) -> Option<Result<[BufferRef; 3]>> {
        None
    }
    /// A training batch's bookkeeping in one pass, in place: the f32 `[channels]` running
    /// statistics `[running_mean, running_var]` become `running * (1 - momentum) + batch *
    /// momentum` from the batch's `[mean, var]` (biased; made unbiased first as `var * (count /
    /// (count - 1))`), each factor rounded to f32 and each op in f32 in that order, as the
    /// composed element ops compute it; the I64 scalar `batches`, when given, gains 1 (a layer's
    /// `num_batches_tracked`). Nothing is read back to the host. `None` where the backend has no
    /// such kernel for the operands: the caller then composes it from element ops.
    fn batch_norm_running(
        &self,
        _running: [&BufferRef; 2],
        _batch: [&BufferRef; 2],
        _batches: Option<&BufferRef>,
        _spec: &RunningStatsSpec,
    ) -> Option<Result<()>> {
        None
    }
    /// Layer normalisation of each row of a contiguous `[spec.rows, spec.cols]`, with its affine
    /// part, in one pass: `y = (x - mean) * rstd * weight + bias` with `rstd = 1 / sqrt(var +
    /// eps)` and the biased variance, the statistics accumulated in f32 or wider; an absent
    /// weight scales by 1 and an absent bias adds 0.
    fn layer_norm_last(&self, src: &BufferRef, affine: LayerNormAffine<'_>, spec: &LayerNormSpec) -> Result<BufferRef>;
    /// The gradients of `layer_norm_last` at `src` for the output gradient `grad`, `affine` as
    /// the forward pass had it (the bias's values are not read: given, its gradient is returned).
    /// The statistics are recomputed, not stored. With `n = (x - mean) * rstd` and `gw = grad *
    /// weight`: `dx = rstd * (gw - mean(gw) - n * mean(gw * n))` per row, and the column sums
    /// `dweight = sum_r grad * n`, `dbias = sum_r grad`, summed in an order fixed by the shape
    /// alone (partial sums over chunks of rows, then the chunks in order; no float atomics), so
    /// two runs on one device give the same bits.
    fn layer_norm_last_backward(
        &self,
        grad: &BufferRef,
        src: &BufferRef,
        affine: LayerNormAffine<'_>,
        spec: &LayerNormSpec,
    ) -> Result<LayerNormGrads>;
    /// `layer_norm_last` with its output rounded to `out` (f16 or bf16, from an f32 `src`; or
    /// `src`'s dtype): the bits of `layer_norm_last` then `cast`, which is what the default does.
    /// A LayerNorm whose output only feeds an autocast matrix product takes it: one pass over
    /// the activation where a backend fuses it instead of three.
    fn layer_norm_last_to(
        &self,
        src: &BufferRef,
        affine: LayerNormAffine<'_>,
        spec: &LayerNormSpec,
        out: DType,
    ) -> Result<BufferRef> {
        mixed::layer_norm_last_to(self, src, affine, spec, out)
    }
    /// The gradients of `layer_norm_last_to` for an output gradient `grad` in its output's dtype
    /// (f16 or bf16, or `src`'s), with what `input` folds into the input's: the bits of widening
    /// `grad` to `src`'s dtype, `layer_norm_last_backward`, then `binary` Add of
    /// `input.accumulated` and the input's gradient and a `cast` of the sum to `input.rounded`,
    /// which is what the default does. The gradients are in `src`'s dtype.
    fn layer_norm_last_to_backward(
        &self,
        grad: &BufferRef,
        src: &BufferRef,
        affine: LayerNormAffine<'_>,
        spec: &LayerNormSpec,
        input: InputGradient<'_>,
    ) -> Result<LayerNormGrads> {
        mixed::layer_norm_last_to_backward(self, grad, src, affine, spec, input)
    }
    /// `residual + branch` over a contiguous `[spec.rows, spec.cols]` and `layer_norm_last_to`
    /// of that sum, in one pass: `[sum, normed]`. The residual is f32 (or the branch's dtype) and
    /// the branch f32 or a half type, widened exactly: the bits of `binary_mixed` Add, then
    /// `layer_norm_last_to` of its result, which is what the default does. A pre-norm
    /// transformer's residual add and the LayerNorm that reads its result.
    fn add_layer_norm_last_to(
        &self,
        residual: &BufferRef,
        branch: &BufferRef,
        affine: LayerNormAffine<'_>,
        spec: &LayerNormSpec,
        out: DType,
    ) -> Result<[BufferRef; 2]> {
        mixed::add_layer_norm_last_to(self, residual, branch, affine, spec, out)
    }

    // --- indexing (contiguous `[outer, dim, inner]` views; indices U32) --------------------------
    /// `out[o, j, i] = src[o, ids[j], i]`, ids of length `out_dim`.
    fn index_select(
        &self,
        src: &BufferRef,
        outer: usize,
        dim: usize,
        inner: usize,
        ids: &BufferRef,
    ) -> Result<BufferRef>;
    /// `dst[o, ids[j], i] += src[o, j, i]`, in place on `dst` of shape `[outer, dst_dim, inner]`.
    #[allow(clippy::too_many_arguments)] // the [outer, dim, inner] geometry of two tensors
    fn index_add(
        &self,
        dst: &BufferRef,
        dst_dim: usize,
        src: &BufferRef,
        outer: usize,
        src_dim: usize,
        inner: usize,
        ids: &BufferRef,
    ) -> Result<()>;
    /// `out[o, j, i] = src[o, ids[o, j, i], i]`; ids shaped `[outer, out_dim, inner]`.
    fn gather(
        &self,
        src: &BufferRef,
        outer: usize,
        dim: usize,
        inner: usize,
        ids: &BufferRef,
        out_dim: usize,
    ) -> Result<BufferRef>;
    /// `dst[o, ids[o, j, i], i] += src[o, j, i]`, in place on `dst` shaped `[outer, dst_dim, inner]`.
    #[allow(clippy::too_many_arguments)] // the [outer, dim, inner] geometry of two tensors
    fn scatter_add(
        &self,
        dst: &BufferRef,
        dst_dim: usize,
        src: &BufferRef,
        outer: usize,
        src_dim: usize,
        inner: usize,
        ids: &BufferRef,
    ) -> Result<()>;

    // --- convolution and pooling (contiguous NCHW) -----------------------------------------------
    /// Unfolds `[n, c, h, w]` into columns `[c*kh*kw, n*oh*ow]` (zeros where padded): one row
    /// per (channel, tap) with the whole batch along the row, so a convolution is one GEMM.
    fn im2col(&self, src: &BufferRef, geom: &Conv2dGeometry) -> Result<BufferRef>;
    /// The adjoint of `im2col`: sums columns `[c*kh*kw, n*oh*ow]` back into `[n, c, h, w]`.
    fn col2im(&self, cols: &BufferRef, geom: &Conv2dGeometry) -> Result<BufferRef>;
    /// A convolution's product for one group, `weight [o, c*kh*kw] @ im2col(x)` as
    /// `[o, n*oh*ow]`, fused image by image where the backend has such a kernel for the dtype;
    /// `None` where it has not, and the caller composes `im2col` and `matmul`. `x` is `[n, c,
    /// h, w]` and `weight` `[o, c*kh*kw]`, both contiguous.
    fn conv2d_product(
        &self,
        _x: &BufferRef,
        _weight: &BufferRef,
        _geom: &Conv2dGeometry,
        _out_channels: usize,
    ) -> Option<Result<BufferRef>> {
        None
    }
    /// The gradients of `conv2d_product` from `grad` `[o, n*oh*ow]` (contiguous): the input's
    /// `[n, c, h, w]` and the weight's `[o, c*kh*kw]`; `None` as for `conv2d_product`.
    fn conv2d_product_backward(
        &self,
        _x: &BufferRef,
        _weight: &BufferRef,
        _grad: &BufferRef,
        _geom: &Conv2dGeometry,
        _out_channels: usize,
    ) -> Option<Result<(BufferRef, BufferRef)>> {
        None
    }
    /// A whole convolution of one group without bias, NCHW in and out: `x` `[n, c, h, w]` and
    /// `weight` `[o, c, kh, kw]` (both contiguous) to `[n, o, oh, ow]`, where the backend has a
    /// library for it (cuDNN); `None` where it has not or declines the geometry, and the caller
    /// takes `conv2d_product`.
    fn conv2d_nchw(
        &self,
        _x: &BufferRef,
        _weight: &BufferRef,
        _geom: &Conv2dGeometry,
        _out_channels: usize,
    ) -> Option<Result<BufferRef>> {
        None
    }
    /// The gradients of `conv2d_nchw` from `grad` `[n, o, oh, ow]` (contiguous): the input's
    /// `[n, c, h, w]` and the weight's `[o, c, kh, kw]`; `None` as for `conv2d_nchw`.
    fn conv2d_nchw_backward(
        &self,
        _x: &BufferRef,
        _weight: &BufferRef,
        _grad: &BufferRef,
        _geom: &Conv2dGeometry,
        _out_channels: usize,
    ) -> Option<Result<(BufferRef, BufferRef)>> {
        None
    }
    /// Max pooling: values `[n, c, oh, ow]` and U32 argmax indices into each `h*w` plane.
    fn max_pool2d(&self, src: &BufferRef, geom: &Pool2dGeometry) -> Result<(BufferRef, BufferRef)>;
    /// The gradient of `max_pool2d`: `[n, c, h, w]` where each window's gradient (`grad`,
    /// contiguous `[n, c, oh, ow]`) lands on the pixel its `indices` name, summed in window
    /// order. By default a scatter (direct on the CPU); GPUs gather over the windows covering
    /// each pixel instead, since their scatter kernels scan every window for every pixel.
    fn max_pool2d_backward(&self, grad: &BufferRef, indices: &BufferRef, geom: &Pool2dGeometry) -> Result<BufferRef> {
        let (planes, plane) = (geom.n * geom.c, geom.h * geom.w);
        let out = self.zeros(grad.dtype(), planes * plane)?;
        self.scatter_add(&out, plane, grad, planes, geom.out_h() * geom.out_w(), 1, indices)?;
        Ok(out)
    }

    // --- in-place optimizer updates (contiguous f32 parameters and state) ------------------------
    /// `dst += alpha * src`.
    fn axpy(&self, dst: &BufferRef, src: &BufferRef, alpha: f64) -> Result<()>;
    /// One SGD update of `param` in place, as [`SgdStep`] describes; `momentum_buf` (as long as
    /// `param`) is updated too when given, and `None` means no momentum. All buffers must be distinct.
    fn sgd_step(
        &self,
        param: &BufferRef,
        grad: &BufferRef,
        momentum_buf: Option<&BufferRef>,
        step: &SgdStep,
    ) -> Result<()>;
    /// One Adam/AdamW update of `param` in place, as [`AdamStep`] describes, updating the first and
    /// second moment estimates `exp_avg` and `exp_avg_sq` (each as long as `param`).
    fn adam_step(
        &self,
        param: &BufferRef,
        grad: &BufferRef,
        exp_avg: &BufferRef,
        exp_avg_sq: &BufferRef,
        step: &AdamStep,
    ) -> Result<()>;

    // --- multi-tensor updates (one launch for many parameters where the backend has a kernel) ---
    /// `adam_step` for every item, each with its own step count and weight decay, as one pass
    /// where the backend can: bit for bit what one `adam_step` per item gives. Items may differ
    /// in dtype (a backend groups them); a buffer updated by two items, or updated by one and
    /// read as another's gradient, is refused. By default one `adam_step` per item.
    fn adam_steps(&self, items: &[AdamOperands<'_>]) -> Result<()> {
        multi_tensor::adam_steps_one_by_one(self, items)
    }
    /// `sgd_step` for every item, as `adam_steps` is to `adam_step`.
    fn sgd_steps(&self, items: &[SgdOperands<'_>]) -> Result<()> {
        multi_tensor::sgd_steps_one_by_one(self, items)
    }
    /// The sum of the squares of every element of `bufs` (contiguous floats of any dtypes,
    /// empty ones allowed), as a one-element buffer: f64 when a buffer is f64, else f32 (f16
    /// and bf16 squared in f32, so large gradients do not overflow). Deterministic whatever
    /// the thread count: each buffer is cut into chunks of a fixed length, each chunk summed
    /// in a fixed order of the backend's, and the chunk sums, listed by buffer then chunk,
    /// added in a fixed order (the CPU: 8192-element chunks in 32 f64 lanes, their sums added
    /// one after another in f64; CUDA: 32768-element chunks, each thread's share in f32 then a
    /// tree in f64, the chunk sums by a fixed tree in f64). By default composed from `cast`,
    /// `binary` and `reduce`, one buffer after another, the sums added in order.
    fn sum_of_squares(&self, bufs: &[&BufferRef]) -> Result<BufferRef> {
        multi_tensor::sum_of_squares_composed(self, bufs)
    }
    /// New contiguous buffers `bufs[i] * factor`, `factor` one float element read on the device
    /// (never on the host), converted to each buffer's dtype and the product rounded once, as
    /// `binary`'s `Mul` with it broadcast. Gradient clipping's scaling: copies, not in place,
    /// since two parameters can share one gradient buffer. By default one `binary` per buffer.
    fn scaled_copies(&self, bufs: &[&BufferRef], factor: &BufferRef) -> Result<Vec<BufferRef>> {
        multi_tensor::scaled_copies_composed(self, bufs, factor)
    }
    /// How many elements of `bufs` (contiguous floats of any dtypes, empty ones allowed) are
    /// inf or NaN, judged by their bits as `UnaryOp::NonFinite` does, as one f32 element on the
    /// device: exact up to 2^24, which is all the loss scaler's "any?" needs. By default composed
    /// from `unary`, `cast`, `reduce` and `binary`, one buffer after another.
    fn non_finite_count(&self, bufs: &[&BufferRef]) -> Result<BufferRef> {
        multi_tensor::non_finite_count_composed(self, bufs)
    }
    /// New contiguous buffers, each of `bufs` (contiguous, any dtypes, empty ones allowed) cast to
    /// `dtype`, bit for bit what `cast` gives each: the low-precision copies of a model's weights
    /// that autocast takes, made in one launch where the backend can. By default one `cast` per
    /// buffer.
    fn cast_copies(&self, bufs: &[&BufferRef], dtype: DType) -> Result<Vec<BufferRef>> {
        multi_tensor::cast_copies_one_by_one(self, bufs, dtype)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_buffer_may_be_read_twice_but_not_written_twice_or_written_and_read() {
        let b = crate::Device::parse("cpu:9").unwrap().backend().clone();
        let [x, y, z] = [1.0f32, 2.0, 3.0].map(|v| b.from_host(&crate::HostVec::F32(vec![v])).unwrap());
        assert!(!shares_a_buffer([&x, &y], [&z, &z]));
        assert!(shares_a_buffer([&x, &y, &x], []));
        assert!(shares_a_buffer([&x], [&z, &x]));
        assert!(distinct_buffers("t", &[&x, &y, &z]).is_ok());
        assert!(
            distinct_buffers("t", &[&x, &y, &y])
                .unwrap_err()
                .to_string()
                .contains("two roles")
        );
    }
}
