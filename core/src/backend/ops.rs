//! The operation vocabularies shared by every backend.

use super::{BufferRef, distinct_buffers};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::shape::{Layout, MergedDims, Shape};

/// Elementwise functions of one tensor. Parameters ride in the variant.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum UnaryOp {
    /// `-x`.
    Neg,
    /// `|x|`.
    Abs,
    /// `e^x`.
    Exp,
    /// Natural logarithm; NaN below 0, -inf at 0.
    Log,
    /// Square root; NaN below 0.
    Sqrt,
    /// `1 / x` (±inf at ±0).
    Recip,
    /// Hyperbolic tangent, as `torch.tanh`.
    Tanh,
    /// Logistic function `1 / (1 + e^-x)`, as `torch.sigmoid`.
    Sigmoid,
    /// `max(x, 0)`, NaN staying NaN as in `torch.relu`.
    Relu,
    /// GELU with the exact erf form (PyTorch's default).
    Gelu,
    /// d gelu(x) / dx, for the backward pass.
    GeluGrad,
    /// `x ^ exponent`.
    Powf(f64),
    /// `x * mul + add`.
    Affine {
        /// Scale applied first.
        mul: f64,
        /// Offset added after scaling.
        add: f64,
    },
    /// `max(x, min)`.
    ClampMin(f64),
    /// `min(x, max)`.
    ClampMax(f64),
    /// 1 where `x` is ±inf or NaN, else 0: the overflow probe of loss scaling. Backends test the
    /// bits, so fast-math compilers (Metal, WGSL's finite-math licence) cannot fold it away.
    NonFinite,
}

impl UnaryOp {
    /// One of each variant: the conformance suite checks that it covers all of them.
    pub const ALL: [UnaryOp; 16] = [
        UnaryOp::Neg,
        UnaryOp::Abs,
        UnaryOp::Exp,
        UnaryOp::Log,
        UnaryOp::Sqrt,
        UnaryOp::Recip,
        UnaryOp::Tanh,
        UnaryOp::Sigmoid,
        UnaryOp::Relu,
        UnaryOp::Gelu,
        UnaryOp::GeluGrad,
        UnaryOp::Powf(2.5),
        UnaryOp::Affine { mul: -1.5, add: 0.25 },
        UnaryOp::ClampMin(0.1),
        UnaryOp::ClampMax(0.1),
        UnaryOp::NonFinite,
    ];
    /// The op's lowercase name (`neg`, `gelu_grad`, `clamp_min`, …): kernel names and error messages use it.
    pub fn name(&self) -> &'static str {
        match self {
            UnaryOp::Neg => "neg",
            UnaryOp::Abs => "abs",
            UnaryOp::Exp => "exp",
            UnaryOp::Log => "log",
            UnaryOp::Sqrt => "sqrt",
            UnaryOp::Recip => "recip",
            UnaryOp::Tanh => "tanh",
            UnaryOp::Sigmoid => "sigmoid",
            UnaryOp::Relu => "relu",
            UnaryOp::Gelu => "gelu",
            UnaryOp::GeluGrad => "gelu_grad",
            UnaryOp::Powf(_) => "powf",
            UnaryOp::Affine { .. } => "affine",
            UnaryOp::ClampMin(_) => "clamp_min",
            UnaryOp::ClampMax(_) => "clamp_max",
            UnaryOp::NonFinite => "non_finite",
        }
    }
}

/// Elementwise functions of two float operands of one dtype and shape (broadcast beforehand).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BinaryOp {
    /// `lhs + rhs`.
    Add,
    /// `lhs - rhs`.
    Sub,
    /// `lhs * rhs`.
    Mul,
    /// `lhs / rhs` (IEEE: ±inf or NaN on division by zero).
    Div,
    /// `lhs ^ rhs`.
    Pow,
    /// The larger operand, NaN if either is (as `torch.maximum`).
    Maximum,
    /// The smaller operand, NaN if either is (as `torch.minimum`).
    Minimum,
    /// `lhs` where `rhs > 0`, else 0: ReLU's backward pass, the gradient `lhs` masked by the
    /// input `rhs` (as PyTorch's `threshold_backward` at 0), in one pass instead of a comparison
    /// writing a mask and a select reading it.
    ReluGrad,
}

impl BinaryOp {
    /// One of each variant, for conformance sweeps.
    pub const ALL: [BinaryOp; 8] = [
        BinaryOp::Add,
        BinaryOp::Sub,
        BinaryOp::Mul,
        BinaryOp::Div,
        BinaryOp::Pow,
        BinaryOp::Maximum,
        BinaryOp::Minimum,
        BinaryOp::ReluGrad,
    ];
    /// The op's lowercase name (`add`, `maximum`, …), as kernels and error messages call it.
    pub fn name(&self) -> &'static str {
        match self {
            BinaryOp::Add => "add",
            BinaryOp::Sub => "sub",
            BinaryOp::Mul => "mul",
            BinaryOp::Div => "div",
            BinaryOp::Pow => "pow",
            BinaryOp::Maximum => "maximum",
            BinaryOp::Minimum => "minimum",
            BinaryOp::ReluGrad => "relu_grad",
        }
    }
}

/// Elementwise comparisons for `Backend::compare`, giving 1 where true and 0 where false (as U32).
/// Any comparison with NaN is false except `Ne`, as in IEEE and PyTorch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CmpOp {
    /// `lhs == rhs`.
    Eq,
    /// `lhs != rhs`.
    Ne,
    /// `lhs < rhs`.
    Lt,
    /// `lhs <= rhs`.
    Le,
    /// `lhs > rhs`.
    Gt,
    /// `lhs >= rhs`.
    Ge,
}

impl CmpOp {
    /// Every comparison, for conformance sweeps.
    pub const ALL: [CmpOp; 6] = [CmpOp::Eq, CmpOp::Ne, CmpOp::Lt, CmpOp::Le, CmpOp::Gt, CmpOp::Ge];
    /// The comparison's short name (`eq`, `lt`, …), as kernels and error messages call it.
    pub fn name(&self) -> &'static str {
        match self {
            CmpOp::Eq => "eq",
            CmpOp::Ne => "ne",
            CmpOp::Lt => "lt",
            CmpOp::Le => "le",
            CmpOp::Gt => "gt",
            CmpOp::Ge => "ge",
        }
    }
}

/// What `Backend::reduce` computes over the reduced axes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReduceKind {
    /// Sum (the CPU reference accumulates floats in f64).
    Sum,
    /// Maximum; a NaN anywhere in the group wins, as in PyTorch.
    Max,
    /// Minimum; a NaN anywhere in the group wins, as in PyTorch.
    Min,
    /// U32 index of the first maximum along exactly one axis (NaN counts as the maximum), as `torch.argmax`.
    ArgMax,
}

impl ReduceKind {
    /// Every reduction, for conformance sweeps.
    pub const ALL: [ReduceKind; 4] = [ReduceKind::Sum, ReduceKind::Max, ReduceKind::Min, ReduceKind::ArgMax];
    /// The reduction's lowercase name (`sum`, `argmax`, …), as kernels and error messages call it.
    pub fn name(&self) -> &'static str {
        match self {
            ReduceKind::Sum => "sum",
            ReduceKind::Max => "max",
            ReduceKind::Min => "min",
            ReduceKind::ArgMax => "argmax",
        }
    }

    /// Checks the axes of a reduction over `rank` dimensions: sorted, unique and in range, and
    /// exactly one for ArgMax.
    pub fn check_axes(self, rank: usize, axes: &[usize]) -> Result<()> {
        if axes.iter().any(|&a| a >= rank) || axes.windows(2).any(|w| w[0] >= w[1]) {
            return Err(Error::invalid(
                self.name(),
                format!("axes {axes:?} must be sorted, unique and below rank {rank}"),
            ));
        }
        if self == ReduceKind::ArgMax && axes.len() != 1 {
            return Err(Error::invalid(self.name(), "argmax reduces exactly one axis"));
        }
        Ok(())
    }
}

/// A layout split for a reduction: the (sizes, strides) of the kept axes and of the reduced
/// ones, each in axis order and merged as `MergedDims` merges (the same offsets in the same
/// order through fewer axes, which a GPU kernel divides by for every element).
pub fn split_axes(layout: &Layout, axes: &[usize]) -> [(Vec<usize>, Vec<usize>); 2] {
    let (mut kept, mut reduced) = ((vec![], vec![]), (vec![], vec![]));
    for (axis, (&d, &s)) in layout.dims().iter().zip(&layout.strides).enumerate() {
        let part = if axes.contains(&axis) { &mut reduced } else { &mut kept };
        part.0.push(d);
        part.1.push(s);
    }
    [kept, reduced].map(|(dims, strides)| {
        let part = Layout {
            shape: Shape::new(dims),
            strides,
            offset: 0,
        };
        let merged = MergedDims::new(&[&part]);
        let strides = merged.strides.into_iter().next().unwrap_or_default();
        (merged.dims, strides)
    })
}

/// The distribution `Backend::rand` draws from.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Distribution {
    /// Uniform on `[low, high)`.
    Uniform {
        /// Smallest value drawn (inclusive).
        low: f64,
        /// Upper bound, exclusive before rounding to the target dtype.
        high: f64,
    },
    /// Normal with this mean and standard deviation (Box–Muller).
    Normal {
        /// Centre (μ): each value is `mean + std * z` for a standard normal `z`.
        mean: f64,
        /// Standard deviation σ, not the variance; 0 gives `mean` everywhere.
        std: f64,
    },
}

/// Mean cross-entropy over contiguous `[rows, classes]` logits, for `Backend::cross_entropy`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CrossEntropy {
    /// Samples: one row of logits and one target each.
    pub rows: usize,
    /// Classes: the length of a row.
    pub classes: usize,
    /// Whether the forward pass also writes the gradient (false when nothing will need it:
    /// evaluation, `no_grad`), saving a write the size of the logits.
    pub grad: bool,
}

impl CrossEntropy {
    /// The op's name, for errors and kernel entry points.
    pub fn name(backward: bool) -> &'static str {
        if backward {
            "cross_entropy_backward"
        } else {
            "cross_entropy"
        }
    }

    /// Checks the loss' gradient `cross_entropy_backward` reads: one f32 element.
    pub fn check_upstream(dtype: DType, len: usize) -> Result<()> {
        if dtype == DType::F32 && len == 1 {
            return Ok(());
        }
        Err(Error::invalid(
            Self::name(true),
            format!("expects one f32 gradient, got {len} of {dtype}"),
        ))
    }

    /// `1 / rows`, the mean's factor, as every backend's kernels take it (one rounding, here).
    pub fn inv_rows(&self) -> f32 {
        1.0 / self.rows as f32
    }
}

/// Attention's weights from its raw scores, for `Backend::causal_softmax`: `rows` rows of `t`
/// scores, row `r` holding the query at position `r % t`, which sees the keys `0 ..= r % t`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CausalSoftmax {
    /// Every query of every sequence (`batch · heads · t`).
    pub rows: usize,
    /// Tokens per sequence: the length of a row.
    pub t: usize,
    /// Multiplies every score before the softmax (`1 / sqrt(head_dim)`).
    pub scale: f64,
    /// Dropout on the weights, drawn as `Backend::dropout` draws it over the whole `[rows, t]`
    /// tensor: probability `p` in (0, 1), the stream's seed and first counter.
    pub dropout: Option<DropoutDraw>,
}

impl CausalSoftmax {
    /// The op's name, for errors and kernel entry points.
    pub fn name(backward: bool) -> &'static str {
        if backward {
            "causal_softmax_backward"
        } else {
            "causal_softmax"
        }
    }

    /// Dropout as the kernels take it (the CPU's and the GPUs'): (1 if on, seed, counter, p,
    /// the kept elements' factor `1 / (1 - p)`); off: zeros and a factor of 1.
    pub fn kernel_dropout(&self) -> (u32, u64, u64, f32, f32) {
        match self.dropout {
            Some(d) => (1, d.seed, d.counter, d.p as f32, d.keep_factor()),
            None => (0, 0, 0, 0.0, 1.0),
        }
    }
}

/// Causal self-attention of every head, for `Backend::causal_attention`: queries, keys and
/// values are slots 0, 1, 2 of one contiguous `qkv` `[batch, t, 3, heads, head_dim]` (the fused
/// projection's output as it is, so no copies), the output `y` is `[batch, t, heads, head_dim]`
/// (what the output projection reads) and the row statistics `lse` are f32 `[batch, heads, t]`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CausalAttention {
    /// Sequences.
    pub batch: usize,
    /// Heads per token.
    pub heads: usize,
    /// Tokens per sequence.
    pub t: usize,
    /// Channels per head.
    pub head_dim: usize,
    /// Multiplies every score before the softmax (`1 / sqrt(head_dim)`).
    pub scale: f64,
    /// Dropout on the weights, drawn over the whole `[batch, heads, t, t]` weights as
    /// `CausalSoftmax::dropout` draws it, so the same elements drop as on the composed path. A
    /// backend whose kernels draw no dropout declines (`None`) when it is set.
    pub dropout: Option<DropoutDraw>,
}

impl CausalAttention {
    /// The op's name, for errors and kernel entry points.
    pub fn name(backward: bool) -> &'static str {
        if backward {
            "causal_attention_backward"
        } else {
            "causal_attention"
        }
    }
    /// Elements of `qkv` (and of its gradient).
    pub fn qkv_len(&self) -> usize {
        self.batch * self.t * 3 * self.heads * self.head_dim
    }
    /// Elements of `y` (and of its gradient).
    pub fn out_len(&self) -> usize {
        self.batch * self.t * self.heads * self.head_dim
    }
    /// Rows of scores: one per query of every head (`lse`'s length).
    pub fn rows(&self) -> usize {
        self.batch * self.heads * self.t
    }
}

/// One dropout's draw from the counter stream: element `i` is kept when `uniform_at(seed,
/// counter, i) >= p`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DropoutDraw {
    /// The probability of dropping an element.
    pub p: f64,
    /// The stream's key.
    pub seed: u64,
    /// The stream's first counter for this draw (it takes `len.div_ceil(4)` of them).
    pub counter: u64,
}

impl DropoutDraw {
    /// What a kept element is multiplied by, `1 / (1 - p)`, as the kernels take it.
    pub fn keep_factor(&self) -> f32 {
        (1.0 / (1.0 - self.p)) as f32
    }
}

/// A contiguous `[outer, channels, inner]` view for `Backend::bias_act`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BiasGeometry {
    /// Product of the dimensions before the channel axis (the batch, for NCHW).
    pub outer: usize,
    /// Length of the channel axis, and of the bias.
    pub channels: usize,
    /// Product of the dimensions after the channel axis: 1 for a linear layer, `h*w` for a convolution.
    pub inner: usize,
}

impl BiasGeometry {
    /// Elements of the `[outer, channels, inner]` tensor.
    pub fn len(&self) -> usize {
        self.outer * self.channels * self.inner
    }

    /// Whether the tensor has no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// An error naming `op` unless buffers of `src_len` and `bias_len` elements hold this view.
    pub fn check(&self, op: &'static str, src_len: usize, bias_len: usize) -> crate::error::Result<()> {
        if src_len < self.len() || bias_len < self.channels {
            return Err(crate::error::Error::invalid(
                op,
                format!("{self:?} does not fit buffers of {src_len} and {bias_len} elements"),
            ));
        }
        Ok(())
    }

    /// An error naming `op` unless `grad` (its element count and dtype) is a gradient for this
    /// view of an input of `src_dtype` (`Backend::bias_act_grad`).
    pub fn check_gradient(
        &self,
        op: &'static str,
        (grad_len, grad_dtype): (usize, crate::dtype::DType),
        src_dtype: crate::dtype::DType,
    ) -> crate::error::Result<()> {
        let wrong = if grad_dtype != src_dtype {
            format!("expects the gradient in the input's dtype {src_dtype:?}, got {grad_dtype:?}")
        } else if grad_len < self.len() {
            format!("{self:?} does not fit a gradient of {grad_len} elements")
        } else {
            return Ok(());
        };
        Err(crate::error::Error::invalid(op, wrong))
    }
}

/// Sizes of a batched matrix product `[batch, m, k] @ [batch, k, n] -> [batch, m, n]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MatmulDims {
    /// Number of independent products.
    pub batch: usize,
    /// Rows of the left operand and of the output.
    pub m: usize,
    /// Columns of the right operand and of the output.
    pub n: usize,
    /// The contracted length: columns of the left operand, rows of the right.
    pub k: usize,
}

/// Geometry of a 2-D convolution's unfolding: input `[n, c, h, w]`, kernel `kh x kw`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Conv2dGeometry {
    /// Batch size.
    pub n: usize,
    /// Input channels.
    pub c: usize,
    /// Input height, before padding.
    pub h: usize,
    /// Input width, before padding.
    pub w: usize,
    /// Kernel height, in taps.
    pub kh: usize,
    /// Kernel width, in taps.
    pub kw: usize,
    /// Step between output positions, `[vertical, horizontal]`.
    pub stride: [usize; 2],
    /// Implicit zeros added on each side, `[top and bottom, left and right]`.
    pub padding: [usize; 2],
    /// Spacing between kernel taps, `[vertical, horizontal]` (1: adjacent taps).
    pub dilation: [usize; 2],
}

impl Conv2dGeometry {
    /// Checks that strides and dilations are at least 1 and the dilated kernel fits the padded input;
    /// `InvalidArgument` naming `op` otherwise. Call it before `out_h`/`out_w`, which assume so.
    pub fn validate(&self, op: &'static str) -> Result<()> {
        if self.stride.contains(&0) || self.dilation.contains(&0) {
            return Err(Error::invalid(op, "stride and dilation must be at least 1"));
        }
        let eff_h = self.dilation[0] * (self.kh.max(1) - 1) + 1;
        let eff_w = self.dilation[1] * (self.kw.max(1) - 1) + 1;
        if self.kh == 0 || self.kw == 0 || self.h + 2 * self.padding[0] < eff_h || self.w + 2 * self.padding[1] < eff_w
        {
            return Err(Error::invalid(
                op,
                format!(
                    "kernel {}x{} (dilation {:?}) does not fit input {}x{} with padding {:?}",
                    self.kh, self.kw, self.dilation, self.h, self.w, self.padding
                ),
            ));
        }
        Ok(())
    }
    /// Output height: `(h + 2*pad - dilation*(kh-1) - 1) / stride + 1`, as `torch.nn.Conv2d` computes it.
    pub fn out_h(&self) -> usize {
        (self.h + 2 * self.padding[0] - self.dilation[0] * (self.kh - 1) - 1) / self.stride[0] + 1
    }
    /// Output width, by the same formula as `out_h` along the horizontal axis.
    pub fn out_w(&self) -> usize {
        (self.w + 2 * self.padding[1] - self.dilation[1] * (self.kw - 1) - 1) / self.stride[1] + 1
    }
}

/// Geometry of a 2-D max pooling window over `[n, c, h, w]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pool2dGeometry {
    /// Batch size.
    pub n: usize,
    /// Channels (pooled independently).
    pub c: usize,
    /// Input height, before padding.
    pub h: usize,
    /// Input width, before padding.
    pub w: usize,
    /// Window size, `[height, width]`.
    pub kernel: [usize; 2],
    /// Step between windows, `[vertical, horizontal]` (PyTorch's default is the kernel size).
    pub stride: [usize; 2],
    /// Implicit padding on each side, `[top and bottom, left and right]`; it never wins the max. At
    /// most half the kernel.
    pub padding: [usize; 2],
}

impl Pool2dGeometry {
    /// Checks kernel and stride are at least 1, padding at most half the kernel, and the window fits the
    /// padded input (PyTorch's rules); `InvalidArgument` naming `op` otherwise.
    pub fn validate(&self, op: &'static str) -> Result<()> {
        if self.kernel.contains(&0) || self.stride.contains(&0) {
            return Err(Error::invalid(op, "kernel and stride must be at least 1"));
        }
        if self.padding[0] * 2 > self.kernel[0] || self.padding[1] * 2 > self.kernel[1] {
            return Err(Error::invalid(
                op,
                "padding must be at most half the kernel size (as in PyTorch)",
            ));
        }
        if self.h + 2 * self.padding[0] < self.kernel[0] || self.w + 2 * self.padding[1] < self.kernel[1] {
            return Err(Error::invalid(
                op,
                format!(
                    "kernel {:?} is larger than the padded input {}x{}",
                    self.kernel, self.h, self.w
                ),
            ));
        }
        Ok(())
    }
    /// The same window as a convolution geometry (dilation 1), to reuse its output-size arithmetic.
    pub fn as_conv(&self) -> Conv2dGeometry {
        Conv2dGeometry {
            n: self.n,
            c: self.c,
            h: self.h,
            w: self.w,
            kh: self.kernel[0],
            kw: self.kernel[1],
            stride: self.stride,
            padding: self.padding,
            dilation: [1, 1],
        }
    }
    /// Output height, `(h + 2*padding - kernel) / stride + 1` (floor mode, as PyTorch's default).
    pub fn out_h(&self) -> usize {
        self.as_conv().out_h()
    }
    /// Output width, by the same formula as `out_h` along the horizontal axis.
    pub fn out_w(&self) -> usize {
        self.as_conv().out_w()
    }
}

/// One SGD update, PyTorch semantics: `g = grad + wd*p`; with momentum, `buf = g` on the first
/// step, else `buf = momentum*buf + (1-dampening)*g`; `g = nesterov ? g + momentum*buf : buf`;
/// `p -= lr*g`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SgdStep {
    /// Learning rate: the parameter moves by `-lr * g`.
    pub lr: f64,
    /// Momentum factor (0: plain SGD, no buffer).
    pub momentum: f64,
    /// Fraction of the new gradient left out of the momentum buffer (PyTorch's `dampening`, usually 0).
    pub dampening: f64,
    /// L2 penalty added to the gradient as `wd * p`.
    pub weight_decay: f64,
    /// Use Nesterov momentum: step along `g + momentum*buf` instead of `buf`.
    pub nesterov: bool,
    /// True on the first step with momentum: the buffer is set to `g` rather than updated.
    pub first_step: bool,
}

/// One Adam/AdamW update, PyTorch semantics (step counts from 1; `decoupled` is AdamW).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdamStep {
    /// Step size: `p -= lr * m_hat / (sqrt(v_hat) + eps)` with bias-corrected moments.
    pub lr: f64,
    /// Decay rate of the first moment (mean of gradients), PyTorch's `betas[0]`, usually 0.9.
    pub beta1: f64,
    /// Decay rate of the second moment (mean of squared gradients), `betas[1]`, usually 0.999.
    pub beta2: f64,
    /// Added to `sqrt(v_hat)` in the denominator so near-zero second moments do not blow up the step.
    pub eps: f64,
    /// Weight decay: folded into the gradient (Adam, L2) or applied as `p *= 1 - lr*wd` (AdamW).
    pub weight_decay: f64,
    /// True for AdamW's decoupled weight decay, false for Adam's L2 penalty.
    pub decoupled: bool,
    /// This update's number, from 1, for the bias corrections `1 - beta^step`.
    pub step: u64,
}

/// An [`AdamStep`]'s constants folded in f64 on the host, once, so every backend updates with
/// the same numbers (each rounds them to its element type).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdamConstants {
    /// Multiplies the weight first: `1 - lr * weight_decay` for AdamW, 1 for Adam.
    pub decay: f64,
    /// Added to the gradient times the weight: Adam's L2 `weight_decay`, 0 for AdamW.
    pub l2: f64,
    /// The first moment's decay rate.
    pub beta1: f64,
    /// `1 - beta1`.
    pub one_minus_beta1: f64,
    /// The second moment's decay rate.
    pub beta2: f64,
    /// `1 - beta2`.
    pub one_minus_beta2: f64,
    /// `lr / (1 - beta1^step)`: the step size with the first moment's bias correction.
    pub step_size: f64,
    /// `sqrt(1 - beta2^step)`: the second moment's bias correction under the root.
    pub bias2_sqrt: f64,
    /// Added to the corrected root.
    pub eps: f64,
}

impl AdamConstants {
    /// The constants in the order the CUDA and WGSL kernels take them.
    pub fn in_kernel_order(&self) -> [f64; 9] {
        [
            self.decay,
            self.l2,
            self.beta1,
            self.one_minus_beta1,
            self.beta2,
            self.one_minus_beta2,
            self.step_size,
            self.bias2_sqrt,
            self.eps,
        ]
    }
}

impl AdamStep {
    /// This update's constants: AdamW decays the weight itself, Adam adds the decay to the
    /// gradient (L2).
    pub fn constants(&self) -> AdamConstants {
        let t = self.step as i32;
        let (decay, l2) = if self.decoupled {
            (1.0 - self.lr * self.weight_decay, 0.0)
        } else {
            (1.0, self.weight_decay)
        };
        AdamConstants {
            decay,
            l2,
            beta1: self.beta1,
            one_minus_beta1: 1.0 - self.beta1,
            beta2: self.beta2,
            one_minus_beta2: 1.0 - self.beta2,
            step_size: self.lr / (1.0 - self.beta1.powi(t)),
            bias2_sqrt: (1.0 - self.beta2.powi(t)).sqrt(),
            eps: self.eps,
        }
    }
}

/// Batch normalisation in training of `[outer, channels, inner]` f32 data with its own batch
/// statistics, for `Backend::batch_norm`: per channel, over `outer · inner` values.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BatchNormSpec {
    /// The batch size.
    pub outer: usize,
    /// Normalised separately; axis 1 of the input.
    pub channels: usize,
    /// Values per channel in one batch item (the pixels of an image).
    pub inner: usize,
    /// Added to the variance before its square root.
    pub eps: f64,
    /// The input (and its gradient) laid out `[channels, outer, inner]`, as a convolution's
    /// product leaves it; the output and its gradient stay `[outer, channels, inner]`. A backend
    /// without this layout answers `None` and is asked again with the input made contiguous.
    pub channel_major: bool,
    /// ReLU applied to the output (`relu(y)`, as `max` with NaN kept), and its gradient masked
    /// by the saved output (`g · [y > 0]`), as a layer followed by a ReLU wants it. A backend
    /// without the fused activation answers `None` and is asked again without it.
    pub relu: bool,
}

/// How `Backend::batch_norm_running` blends one training batch's statistics into the running
/// ones, as PyTorch keeps them.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RunningStatsSpec {
    /// Per-channel statistics: the length of each buffer.
    pub channels: usize,
    /// Values per channel the batch's statistics cover (at least 2): its biased variance is
    /// made unbiased by `count / (count - 1)`.
    pub count: usize,
    /// Weight of the batch's statistics, in [0, 1].
    pub momentum: f64,
}

impl RunningStatsSpec {
    /// The f32 factors every backend multiplies by, `[1 - momentum, momentum, count / (count -
    /// 1)]`, each rounded once from f64 as the composed element ops round theirs; an error for
    /// a count below 2 (no unbiased variance) or a momentum outside [0, 1].
    pub fn factors(&self, op: &'static str) -> Result<[f32; 3]> {
        if self.count < 2 || !(0.0..=1.0).contains(&self.momentum) {
            return Err(Error::invalid(
                op,
                format!(
                    "running statistics need a count of at least 2 and a momentum in [0, 1], got {} and {}",
                    self.count, self.momentum
                ),
            ));
        }
        let unbias = self.count as f64 / (self.count - 1) as f64;
        Ok([(1.0 - self.momentum) as f32, self.momentum as f32, unbias as f32])
    }

    /// What a backend's own `batch_norm_running` checks before its kernel: the `factors`, the
    /// operands distinct buffers (the running pair written, the rest read), each statistic
    /// holding `channels` values and the count one. Then the factors, or `None` unless the
    /// statistics are f32 and the count I64, the dtypes the kernels take (the caller composes
    /// the others).
    pub fn fused_factors(
        &self,
        op: &'static str,
        running: [&BufferRef; 2],
        batch: [&BufferRef; 2],
        batches: Option<&BufferRef>,
    ) -> Result<Option<[f32; 3]>> {
        let factors = self.factors(op)?;
        let stats = [running[0], running[1], batch[0], batch[1]];
        let mut roles = stats.to_vec();
        roles.extend(batches);
        distinct_buffers(op, &roles)?;
        let needed = stats.iter().map(|b| (*b, self.channels)).chain(batches.map(|b| (b, 1)));
        for (b, len) in needed {
            if b.len() < len {
                let msg = format!("a statistic holds {} values where {len} are needed", b.len());
                return Err(Error::invalid(op, msg));
            }
        }
        let kernel_dtypes =
            stats.iter().all(|b| b.dtype() == DType::F32) && batches.is_none_or(|b| b.dtype() == DType::I64);
        Ok(kernel_dtypes.then_some(factors))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reduction_sees_merged_kept_and_reduced_axes() {
        let nchw = Layout::contiguous([4, 3, 5, 6]);
        // Batch norm's per-channel sums: keep C, reduce N and the merged H·W.
        assert_eq!(
            split_axes(&nchw, &[0, 2, 3]),
            [(vec![3], vec![30]), (vec![4, 30], vec![90, 1])]
        );
        // A last-axis softmax-style reduction: everything before it is one kept axis.
        assert_eq!(split_axes(&nchw, &[3]), [(vec![60], vec![6]), (vec![6], vec![1])]);
        // Size-1 axes vanish; a permuted layout keeps the axes it cannot merge.
        let permuted = Layout::contiguous([2, 1, 3, 4]).permute(&[3, 1, 2, 0]);
        assert_eq!(
            split_axes(&permuted, &[0]),
            [(vec![3, 2], vec![4, 12]), (vec![4], vec![1])]
        );
    }

    #[test]
    fn fused_running_stats_check_their_operands_and_leave_other_dtypes_to_the_caller() {
        use crate::HostVec;
        let b = crate::Device::parse("cpu:9").unwrap().backend().clone();
        let buf = |v: HostVec| b.from_host(&v).unwrap();
        let f32s = |n: usize| buf(HostVec::F32(vec![0.0; n]));
        let spec = RunningStatsSpec {
            channels: 3,
            count: 4,
            momentum: 0.25,
        };
        let (rm, rv, m, v) = (f32s(3), f32s(3), f32s(3), f32s(3));
        let count = buf(HostVec::I64(vec![0]));
        let fused =
            |mean: &BufferRef, batches: Option<&BufferRef>| spec.fused_factors("t", [&rm, &rv], [mean, &v], batches);
        assert_eq!(fused(&m, Some(&count)).unwrap(), Some(spec.factors("t").unwrap()));
        assert_eq!(
            fused(&buf(HostVec::F64(vec![0.0; 3])), None).unwrap(),
            None,
            "f64 statistics"
        );
        assert_eq!(fused(&m, Some(&f32s(1))).unwrap(), None, "an f32 count");
        let error = |r: Result<Option<[f32; 3]>>| r.unwrap_err().to_string();
        assert!(error(fused(&m, Some(&m))).contains("distinct buffers"));
        assert!(error(fused(&f32s(2), None)).contains("holds 2 values where 3 are needed"));
        assert!(error(fused(&m, Some(&buf(HostVec::I64(vec![]))))).contains("holds 0 values where 1"));
    }
}
