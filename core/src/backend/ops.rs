//! The operation vocabularies shared by every backend.

use crate::error::{Error, Result};

/// Elementwise functions of one tensor. Parameters ride in the variant.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum UnaryOp {
    Neg,
    Abs,
    Exp,
    Log,
    Sqrt,
    Recip,
    Tanh,
    Sigmoid,
    Relu,
    /// GELU with the exact erf form (PyTorch's default).
    Gelu,
    /// d gelu(x) / dx, for the backward pass.
    GeluGrad,
    /// `x ^ exponent`.
    Powf(f64),
    /// `x * mul + add`.
    Affine {
        mul: f64,
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

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BinaryOp {
    Add,
    Sub,
    Mul,
    Div,
    /// `lhs ^ rhs`.
    Pow,
    Maximum,
    Minimum,
}

impl BinaryOp {
    pub const ALL: [BinaryOp; 7] = [
        BinaryOp::Add,
        BinaryOp::Sub,
        BinaryOp::Mul,
        BinaryOp::Div,
        BinaryOp::Pow,
        BinaryOp::Maximum,
        BinaryOp::Minimum,
    ];
    pub fn name(&self) -> &'static str {
        match self {
            BinaryOp::Add => "add",
            BinaryOp::Sub => "sub",
            BinaryOp::Mul => "mul",
            BinaryOp::Div => "div",
            BinaryOp::Pow => "pow",
            BinaryOp::Maximum => "maximum",
            BinaryOp::Minimum => "minimum",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CmpOp {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
}

impl CmpOp {
    pub const ALL: [CmpOp; 6] = [CmpOp::Eq, CmpOp::Ne, CmpOp::Lt, CmpOp::Le, CmpOp::Gt, CmpOp::Ge];
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

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReduceKind {
    Sum,
    Max,
    Min,
    ArgMax,
}

impl ReduceKind {
    pub const ALL: [ReduceKind; 4] = [ReduceKind::Sum, ReduceKind::Max, ReduceKind::Min, ReduceKind::ArgMax];
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
/// ones, each in axis order.
pub fn split_axes(layout: &crate::shape::Layout, axes: &[usize]) -> [(Vec<usize>, Vec<usize>); 2] {
    let (mut kept, mut reduced) = ((vec![], vec![]), (vec![], vec![]));
    for (axis, (&d, &s)) in layout.dims().iter().zip(&layout.strides).enumerate() {
        let part = if axes.contains(&axis) { &mut reduced } else { &mut kept };
        part.0.push(d);
        part.1.push(s);
    }
    [kept, reduced]
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Distribution {
    /// Uniform on `[low, high)`.
    Uniform { low: f64, high: f64 },
    /// Normal with this mean and standard deviation (Box–Muller).
    Normal { mean: f64, std: f64 },
}

/// A contiguous `[outer, channels, inner]` view for `Backend::bias_act`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BiasGeometry {
    pub outer: usize,
    pub channels: usize,
    pub inner: usize,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MatmulDims {
    pub batch: usize,
    pub m: usize,
    pub n: usize,
    pub k: usize,
}

/// Geometry of a 2-D convolution's unfolding: input `[n, c, h, w]`, kernel `kh x kw`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Conv2dGeometry {
    pub n: usize,
    pub c: usize,
    pub h: usize,
    pub w: usize,
    pub kh: usize,
    pub kw: usize,
    pub stride: [usize; 2],
    pub padding: [usize; 2],
    pub dilation: [usize; 2],
}

impl Conv2dGeometry {
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
    pub fn out_h(&self) -> usize {
        (self.h + 2 * self.padding[0] - self.dilation[0] * (self.kh - 1) - 1) / self.stride[0] + 1
    }
    pub fn out_w(&self) -> usize {
        (self.w + 2 * self.padding[1] - self.dilation[1] * (self.kw - 1) - 1) / self.stride[1] + 1
    }
}

/// Geometry of a 2-D max pooling window over `[n, c, h, w]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pool2dGeometry {
    pub n: usize,
    pub c: usize,
    pub h: usize,
    pub w: usize,
    pub kernel: [usize; 2],
    pub stride: [usize; 2],
    pub padding: [usize; 2],
}

impl Pool2dGeometry {
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
    pub fn out_h(&self) -> usize {
        self.as_conv().out_h()
    }
    pub fn out_w(&self) -> usize {
        self.as_conv().out_w()
    }
}

/// One SGD update, PyTorch semantics: `g = grad + wd*p`; with momentum, `buf = g` on the first
/// step, else `buf = momentum*buf + (1-dampening)*g`; `g = nesterov ? g + momentum*buf : buf`;
/// `p -= lr*g`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SgdStep {
    pub lr: f64,
    pub momentum: f64,
    pub dampening: f64,
    pub weight_decay: f64,
    pub nesterov: bool,
    pub first_step: bool,
}

/// One Adam/AdamW update, PyTorch semantics (step counts from 1; `decoupled` is AdamW).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdamStep {
    pub lr: f64,
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
    pub weight_decay: f64,
    pub decoupled: bool,
    pub step: u64,
}
