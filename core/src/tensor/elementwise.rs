//! Broadcasting arithmetic, unary math, comparisons and `where_cond`, each with its backward rule.

use super::Tensor;
use crate::backend::{BinaryOp, CmpOp, UnaryOp};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::shape::{Layout, Shape};

impl Tensor {
    /// Applies a binary op after broadcasting both operands to one shape (no copies).
    fn binary_forward(&self, op: BinaryOp, rhs: &Tensor) -> Result<Tensor> {
        self.same_device(op.name(), rhs)?;
        self.same_dtype(op.name(), rhs)?;
        self.float_only(op.name())?;
        let (shape, la, lb) = self.broadcast_with(op.name(), rhs)?;
        let buffer = self.backend().binary(op, self.buffer(), &la, rhs.buffer(), &lb)?;
        Ok(Tensor::from_buffer(buffer, shape, self.device()))
    }

    /// The shape `self` and `rhs` broadcast to, and each one's view of it.
    fn broadcast_with(&self, op: &'static str, rhs: &Tensor) -> Result<(Shape, Layout, Layout)> {
        let shape = Shape::broadcast(op, self.shape(), rhs.shape())?;
        let la = self.layout().broadcast_to(op, &shape)?;
        let lb = rhs.layout().broadcast_to(op, &shape)?;
        Ok((shape, la, lb))
    }

    /// `self op rhs` for an add or subtract of an f32 operand and a 16-bit one under autocast:
    /// the promotion without a widening cast (the backend reads the 16-bit operand as it is),
    /// the 16-bit operand's gradient narrowed as the cast's backward would narrow it, so the
    /// bits are the promoted op's. The residual stream (f32) plus a bf16 branch takes it.
    fn binary_mixed(&self, op: BinaryOp, rhs: &Tensor) -> Result<Tensor> {
        self.same_device(op.name(), rhs)?;
        let (shape, la, lb) = self.broadcast_with(op.name(), rhs)?;
        let buffer = self.backend().binary_mixed(op, self.buffer(), &la, rhs.buffer(), &lb)?;
        let out = Tensor::from_buffer(buffer, shape, self.device());
        let (sa, sb) = (self.shape().clone(), rhs.shape().clone());
        let (da, db) = (self.dtype(), rhs.dtype());
        Ok(out.track(op.name(), &[self, rhs], move |g| {
            let gb = if op == BinaryOp::Sub { g.neg()? } else { g.clone() };
            Ok(vec![
                Some(g.sum_to_shape(&sa)?.to_dtype(da)?),
                Some(gb.sum_to_shape(&sb)?.to_dtype(db)?),
            ])
        }))
    }

    fn binary(&self, op: BinaryOp, rhs: &Tensor) -> Result<Tensor> {
        if matches!(op, BinaryOp::Add | BinaryOp::Sub) && crate::autocast::widens_in_place(self, rhs) {
            return self.binary_mixed(op, rhs);
        }
        if let Some((a, b)) = crate::autocast::promote(self, rhs)? {
            return a.binary(op, &b);
        }
        let out = self.binary_forward(op, rhs)?;
        // Only what the rule reads stays alive until backward, as in PyTorch: nothing for an add
        // or a subtract (a residual stream's sums), the operands otherwise, and pow's output.
        let operands = (!matches!(op, BinaryOp::Add | BinaryOp::Sub)).then(|| (self.detach(), rhs.detach()));
        let power = (op == BinaryOp::Pow).then(|| out.detach());
        let (sa, sb) = (self.shape().clone(), rhs.shape().clone());
        Ok(out.track(op.name(), &[self, rhs], move |g| {
            let (ga, gb) = operand_grads(op, operands.as_ref(), power.as_ref(), g)?;
            Ok(vec![Some(ga.sum_to_shape(&sa)?), Some(gb.sum_to_shape(&sb)?)])
        }))
    }

    /// `self + rhs`, elementwise with broadcasting, as `torch.add`.
    pub fn add(&self, rhs: &Tensor) -> Result<Tensor> {
        self.binary(BinaryOp::Add, rhs)
    }
    /// `self - rhs`, elementwise with broadcasting, as `torch.sub`.
    pub fn sub(&self, rhs: &Tensor) -> Result<Tensor> {
        self.binary(BinaryOp::Sub, rhs)
    }
    /// `self * rhs`, elementwise with broadcasting, as `torch.mul`.
    pub fn mul(&self, rhs: &Tensor) -> Result<Tensor> {
        self.binary(BinaryOp::Mul, rhs)
    }
    /// `self / rhs`, elementwise with broadcasting, as `torch.div`.
    pub fn div(&self, rhs: &Tensor) -> Result<Tensor> {
        self.binary(BinaryOp::Div, rhs)
    }
    /// `self ^ exponent`, elementwise with broadcasting.
    pub fn pow(&self, exponent: &Tensor) -> Result<Tensor> {
        self.binary(BinaryOp::Pow, exponent)
    }
    /// The elementwise larger of `self` and `rhs` with broadcasting, as `torch.maximum` (ties split the gradient).
    pub fn maximum(&self, rhs: &Tensor) -> Result<Tensor> {
        self.binary(BinaryOp::Maximum, rhs)
    }
    /// The elementwise smaller of `self` and `rhs` with broadcasting, as `torch.minimum` (ties split the gradient).
    pub fn minimum(&self, rhs: &Tensor) -> Result<Tensor> {
        self.binary(BinaryOp::Minimum, rhs)
    }

    /// `self` (a gradient) where `input > 0`, else 0, with broadcasting: ReLU's backward pass
    /// in one op, as PyTorch's `threshold_backward(self, input, 0)`.
    pub fn relu_grad(&self, input: &Tensor) -> Result<Tensor> {
        self.binary(BinaryOp::ReluGrad, input)
    }

    /// Sums a broadcast gradient back down to `shape`.
    pub(crate) fn sum_to_shape(&self, shape: &Shape) -> Result<Tensor> {
        if self.shape() == shape {
            return Ok(self.clone());
        }
        let lead = self.rank() - shape.rank();
        let axes: Vec<usize> = (0..self.rank())
            .filter(|&i| i < lead || (shape.dims()[i - lead] == 1 && self.dims()[i] != 1))
            .collect();
        self.sum_keepdim(&axes)?.reshape(shape.clone())
    }

    pub(crate) fn unary(&self, op: UnaryOp) -> Result<Tensor> {
        let transcendental = matches!(op, UnaryOp::Exp | UnaryOp::Log | UnaryOp::Recip | UnaryOp::Powf(_));
        if transcendental && crate::autocast::active().is_some() && matches!(self.dtype(), DType::F16 | DType::BF16) {
            // exp/log/reciprocal/pow run in f32 under autocast.
            return crate::autocast::full(self)?.unary(op);
        }
        self.float_only(op.name())?;
        let buffer = self.backend().unary(op, self.buffer(), self.layout())?;
        let out = Tensor::from_buffer(buffer, self.shape().clone(), self.device());
        let kept = match grad_reads(op) {
            GradReads::Input => Some(self.detach()),
            GradReads::Output => Some(out.detach()),
            GradReads::Nothing => None,
        };
        Ok(out.track(op.name(), &[self], move |g| {
            Ok(vec![Some(unary_grad(op, kept.as_ref(), g)?)])
        }))
    }

    /// `-self`, elementwise.
    pub fn neg(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Neg)
    }
    /// `|self|`, elementwise (the gradient at 0 is 0).
    pub fn abs(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Abs)
    }
    /// `e^self`, elementwise.
    pub fn exp(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Exp)
    }
    /// The natural logarithm, elementwise.
    pub fn log(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Log)
    }
    /// The square root, elementwise.
    pub fn sqrt(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Sqrt)
    }
    /// `1 / self`, elementwise, as `torch.reciprocal`.
    pub fn recip(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Recip)
    }
    /// The hyperbolic tangent, elementwise.
    pub fn tanh(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Tanh)
    }
    /// The logistic function `1 / (1 + e^-self)`, elementwise.
    pub fn sigmoid(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Sigmoid)
    }
    /// `max(self, 0)`, elementwise, as `torch.relu`.
    pub fn relu(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Relu)
    }
    /// The exact (erf-based) GELU, elementwise, as `torch.nn.functional.gelu` with `approximate="none"`.
    pub fn gelu(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Gelu)
    }
    /// GELU's tanh approximation, elementwise, as `torch.nn.functional.gelu` with
    /// `approximate="tanh"` (GPT-2's "gelu_new"): `x/2 * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x^3)))`.
    /// Composed of elementwise ops (no kernel of its own), so every backend and the backward have it.
    pub fn gelu_tanh(&self) -> Result<Tensor> {
        let k = (2.0 / std::f64::consts::PI).sqrt();
        // k * (x + 0.044715 x^3) as x * (k + 0.044715 k x^2): one product fewer than the cube.
        let inner = self.mul(&self.mul(self)?.affine(0.044_715 * k, k)?)?;
        self.mul(&inner.tanh()?.affine(0.5, 0.5)?)
    }
    /// `self ^ exponent` for a scalar exponent.
    pub fn powf(&self, exponent: f64) -> Result<Tensor> {
        self.unary(UnaryOp::Powf(exponent))
    }
    /// `self * mul + add`.
    pub fn affine(&self, mul: f64, add: f64) -> Result<Tensor> {
        self.unary(UnaryOp::Affine { mul, add })
    }
    /// `self + value`, elementwise.
    pub fn add_scalar(&self, value: f64) -> Result<Tensor> {
        self.affine(1.0, value)
    }
    /// `self * value`, elementwise.
    pub fn mul_scalar(&self, value: f64) -> Result<Tensor> {
        self.affine(value, 0.0)
    }
    /// `max(self, min)`, elementwise, as `torch.clamp(min=...)`.
    pub fn clamp_min(&self, min: f64) -> Result<Tensor> {
        self.unary(UnaryOp::ClampMin(min))
    }
    /// `min(self, max)`, elementwise, as `torch.clamp(max=...)`.
    pub fn clamp_max(&self, max: f64) -> Result<Tensor> {
        self.unary(UnaryOp::ClampMax(max))
    }
    /// `self` clamped into `[min, max]`, elementwise, as `torch.clamp`.
    pub fn clamp(&self, min: f64, max: f64) -> Result<Tensor> {
        self.clamp_min(min)?.clamp_max(max)
    }

    /// Elementwise comparison with broadcasting: a U32 tensor of 0 and 1 (no gradient).
    pub fn cmp(&self, op: CmpOp, rhs: &Tensor) -> Result<Tensor> {
        self.same_device(op.name(), rhs)?;
        self.same_dtype(op.name(), rhs)?;
        let (shape, la, lb) = self.broadcast_with(op.name(), rhs)?;
        let buffer = self.backend().compare(op, self.buffer(), &la, rhs.buffer(), &lb)?;
        Ok(Tensor::from_buffer(buffer, shape, self.device()))
    }
    /// [`Tensor::cmp`] against a scalar `value`: a U32 mask of 0 and 1.
    pub fn cmp_scalar(&self, op: CmpOp, value: f64) -> Result<Tensor> {
        let scalar = Tensor::full(Shape::scalar(), value, self.dtype(), self.device())?;
        self.cmp(op, &scalar)
    }
    /// `self == rhs` with broadcasting, as a U32 mask of 0 and 1.
    pub fn eq(&self, rhs: &Tensor) -> Result<Tensor> {
        self.cmp(CmpOp::Eq, rhs)
    }
    /// `self != rhs` with broadcasting, as a U32 mask of 0 and 1.
    pub fn ne(&self, rhs: &Tensor) -> Result<Tensor> {
        self.cmp(CmpOp::Ne, rhs)
    }
    /// `self < rhs` with broadcasting, as a U32 mask of 0 and 1.
    pub fn lt(&self, rhs: &Tensor) -> Result<Tensor> {
        self.cmp(CmpOp::Lt, rhs)
    }
    /// `self <= rhs` with broadcasting, as a U32 mask of 0 and 1.
    pub fn le(&self, rhs: &Tensor) -> Result<Tensor> {
        self.cmp(CmpOp::Le, rhs)
    }
    /// `self > rhs` with broadcasting, as a U32 mask of 0 and 1.
    pub fn gt(&self, rhs: &Tensor) -> Result<Tensor> {
        self.cmp(CmpOp::Gt, rhs)
    }
    /// `self >= rhs` with broadcasting, as a U32 mask of 0 and 1.
    pub fn ge(&self, rhs: &Tensor) -> Result<Tensor> {
        self.cmp(CmpOp::Ge, rhs)
    }

    /// `self != 0 ? on_true : on_false`, broadcasting all three; `self` is a U32 mask.
    pub fn where_cond(&self, on_true: &Tensor, on_false: &Tensor) -> Result<Tensor> {
        const OP: &str = "where_cond";
        self.same_device(OP, on_true)?;
        self.same_device(OP, on_false)?;
        on_true.same_dtype(OP, on_false)?;
        if self.dtype() != DType::U32 {
            return Err(crate::error::Error::UnsupportedDType {
                op: OP,
                dtype: self.dtype(),
                hint: "; the condition is a U32 mask (from a comparison)",
            });
        }
        let shape = Shape::broadcast(
            OP,
            &Shape::broadcast(OP, self.shape(), on_true.shape())?,
            on_false.shape(),
        )?;
        let (lc, lt, lf) = (
            self.layout().broadcast_to(OP, &shape)?,
            on_true.layout().broadcast_to(OP, &shape)?,
            on_false.layout().broadcast_to(OP, &shape)?,
        );
        let buffer = self
            .backend()
            .where_cond(self.buffer(), &lc, on_true.buffer(), &lt, on_false.buffer(), &lf)?;
        let out = Tensor::from_buffer(buffer, shape, self.device());
        let cond = self.detach();
        let (st, sf) = (on_true.shape().clone(), on_false.shape().clone());
        Ok(out.track(OP, &[on_true, on_false], move |g| {
            let zero = g.zeros_like()?;
            Ok(vec![
                Some(cond.where_cond(g, &zero)?.sum_to_shape(&st)?),
                Some(cond.where_cond(&zero, g)?.sum_to_shape(&sf)?),
            ])
        }))
    }
}

/// What an op's backward kept for its rule, or an error naming the op where nothing was kept.
fn kept<'a, T>(op: &str, kept: Option<&'a T>) -> Result<&'a T> {
    kept.ok_or_else(|| Error::Autograd(format!("{op}'s backward found nothing kept for it")))
}

/// The gradients of `a op b`'s operands, not yet unbroadcast, given the gradient `g` of its
/// output; `operands` (a, b) and `out` are what `binary` kept for the rule.
fn operand_grads(
    op: BinaryOp,
    operands: Option<&(Tensor, Tensor)>,
    out: Option<&Tensor>,
    g: &Tensor,
) -> Result<(Tensor, Tensor)> {
    let operands = || kept(op.name(), operands).map(|pair| (&pair.0, &pair.1));
    Ok(match op {
        BinaryOp::Add => (g.clone(), g.clone()),
        BinaryOp::Sub => (g.clone(), g.neg()?),
        BinaryOp::Mul => {
            let (a, b) = operands()?;
            (g.mul(b)?, g.mul(a)?)
        }
        BinaryOp::Div => {
            let (a, b) = operands()?;
            (g.div(b)?, g.mul(a)?.div(&b.mul(b)?)?.neg()?)
        }
        BinaryOp::Pow => {
            // d(a^b)/da = b * a^(b-1); d(a^b)/db = a^b * ln(a)
            let (a, b) = operands()?;
            let da = b.mul(&a.binary_forward(BinaryOp::Pow, &b.affine(1.0, -1.0)?)?)?;
            (g.mul(&da)?, g.mul(&kept(op.name(), out)?.mul(&a.log()?)?)?)
        }
        BinaryOp::Maximum | BinaryOp::Minimum => {
            // Ties split the gradient evenly, as in PyTorch.
            let (a, b) = operands()?;
            let wins = if op == BinaryOp::Maximum { CmpOp::Gt } else { CmpOp::Lt };
            let share = a
                .cmp(wins, b)?
                .to_dtype(g.dtype())?
                .add(&a.cmp(CmpOp::Eq, b)?.to_dtype(g.dtype())?.affine(0.5, 0.0)?)?;
            (g.mul(&share)?, g.mul(&share.affine(-1.0, 1.0)?)?)
        }
        // Linear in the gradient, flat in the input (PyTorch's threshold_backward rule).
        BinaryOp::ReluGrad => (g.relu_grad(operands()?.1)?, g.zeros_like()?),
    })
}

/// The unary op `d` for the ops whose rule in `unary_grad` is `g * x.unary(d)` (GELU's): a
/// backend may form that product together with a layer's bias (`Backend::bias_act_grad`).
pub(crate) fn derivative_of_input(op: UnaryOp) -> Option<UnaryOp> {
    match op {
        UnaryOp::Gelu => Some(UnaryOp::GeluGrad),
        _ => None,
    }
}

/// Which of a unary op's tensors its gradient reads: the autograd graph keeps that one alone
/// until backward (as PyTorch does), so a chain of ops holds no more than it needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum GradReads {
    Nothing,
    Input,
    Output,
}

/// The tensor `unary_grad` reads for `op` (each rule uses whichever of input and output is
/// cheaper; ReLU its output, which the next layer keeps anyway).
pub(crate) fn grad_reads(op: UnaryOp) -> GradReads {
    match op {
        UnaryOp::Neg | UnaryOp::Affine { .. } | UnaryOp::NonFinite => GradReads::Nothing,
        UnaryOp::Exp | UnaryOp::Sqrt | UnaryOp::Recip | UnaryOp::Tanh | UnaryOp::Sigmoid | UnaryOp::Relu => {
            GradReads::Output
        }
        UnaryOp::Abs
        | UnaryOp::Log
        | UnaryOp::Gelu
        | UnaryOp::GeluGrad
        | UnaryOp::Powf(_)
        | UnaryOp::ClampMin(_)
        | UnaryOp::ClampMax(_) => GradReads::Input,
    }
}

/// The gradient of `y = op(x)` with respect to `x`, given the gradient `g` of `y`; `kept` is
/// the tensor `grad_reads(op)` names (`x` or `y`; None where it names neither).
pub(crate) fn unary_grad(op: UnaryOp, kept: Option<&Tensor>, g: &Tensor) -> Result<Tensor> {
    let kept = || self::kept(op.name(), kept);
    let local = match op {
        UnaryOp::Neg => return g.neg(),
        UnaryOp::Affine { mul, .. } => return g.affine(mul, 0.0),
        // A probe, flat wherever it is defined.
        UnaryOp::NonFinite => return g.zeros_like(),
        // g where x > 0 (so y > 0), else 0, in one pass (no mask written and read back).
        UnaryOp::Relu => return g.relu_grad(kept()?),
        UnaryOp::Abs => {
            let x = kept()?;
            x.cmp_scalar(CmpOp::Gt, 0.0)?
                .to_dtype(x.dtype())?
                .sub(&x.cmp_scalar(CmpOp::Lt, 0.0)?.to_dtype(x.dtype())?)?
        }
        UnaryOp::Exp => kept()?.clone(),
        UnaryOp::Log => kept()?.recip()?,
        UnaryOp::Sqrt => kept()?.recip()?.affine(0.5, 0.0)?,
        UnaryOp::Recip => {
            let y = kept()?;
            y.mul(y)?.neg()?
        }
        UnaryOp::Tanh => {
            let y = kept()?;
            y.mul(y)?.affine(-1.0, 1.0)?
        }
        UnaryOp::Sigmoid => {
            let y = kept()?;
            y.mul(&y.affine(-1.0, 1.0)?)?
        }
        UnaryOp::Gelu => kept()?.unary(UnaryOp::GeluGrad)?,
        UnaryOp::GeluGrad => {
            // d/dx [Φ(x) + x φ(x)] = φ(x) (2 - x²)
            let x = kept()?;
            let phi = x
                .mul(x)?
                .affine(-0.5, 0.0)?
                .exp()?
                .affine(0.398_942_280_401_432_7, 0.0)?;
            phi.mul(&x.mul(x)?.affine(-1.0, 2.0)?)?
        }
        UnaryOp::Powf(e) => kept()?.powf(e - 1.0)?.affine(e, 0.0)?,
        UnaryOp::ClampMin(m) => {
            let x = kept()?;
            x.cmp_scalar(CmpOp::Ge, m)?.to_dtype(x.dtype())?
        }
        UnaryOp::ClampMax(m) => {
            let x = kept()?;
            x.cmp_scalar(CmpOp::Le, m)?.to_dtype(x.dtype())?
        }
    };
    g.mul(&local)
}
