//! bias_act (bias_act.wgsl): a layer's bias and activation in one pass, and its input's gradient.

use lockstep_core::backend::{BiasGeometry, BufferRef, UnaryOp};
use lockstep_core::{Error, Result};

use super::op_index;
use crate::backend::{Binding, WgpuBackend, to_u32};
use crate::buffer::WgpuBuffer;
use crate::pipelines::Variant;

/// `ACT` when there is no activation (`NO_ACT` in bias_act.wgsl).
const NO_ACT: f64 = u32::MAX as f64;

impl WgpuBackend {
    pub(crate) fn add_bias(
        &self,
        src: &BufferRef,
        bias: &BufferRef,
        geom: BiasGeometry,
        act: Option<UnaryOp>,
    ) -> Result<BufferRef> {
        const OP: &str = "bias_act";
        let (x, b) = self.bias_operands(OP, src, bias, geom)?;
        self.launch_bias(OP, act, geom, &[(1, x), (2, b)])
    }

    /// `grad * derivative(src + bias)`, rounded after each step as the composed ops round.
    pub(crate) fn bias_act_gradient(
        &self,
        grad: &BufferRef,
        src: &BufferRef,
        bias: &BufferRef,
        geom: BiasGeometry,
        derivative: UnaryOp,
    ) -> Result<BufferRef> {
        const OP: &str = "bias_act_grad";
        let (x, b) = self.bias_operands(OP, src, bias, geom)?;
        let g = self.operand(OP, grad, None)?;
        geom.check_gradient(OP, (g.len(), g.dtype()), x.dtype())?;
        self.launch_bias(OP, Some(derivative), geom, &[(1, x), (2, b), (4, g)])
    }

    /// The input and the bias of a bias op, checked against its geometry and each other's dtype.
    fn bias_operands<'a>(
        &self,
        op: &'static str,
        src: &'a BufferRef,
        bias: &'a BufferRef,
        geom: BiasGeometry,
    ) -> Result<(&'a WgpuBuffer, &'a WgpuBuffer)> {
        let (x, b) = (self.operand(op, src, None)?, self.operand(op, bias, None)?);
        geom.check(op, x.len(), b.len())?;
        if x.dtype() != b.dtype() {
            return Err(Error::DTypeMismatch {
                op,
                lhs: x.dtype(),
                rhs: b.dtype(),
            });
        }
        Ok((x, b))
    }

    /// Entry point `op` of bias_act.wgsl over `geom`, applying `act` (None: the bias alone), into
    /// a new buffer of the input's dtype (`inputs` starts with the input).
    fn launch_bias(
        &self,
        op: &'static str,
        act: Option<UnaryOp>,
        geom: BiasGeometry,
        inputs: &[Binding],
    ) -> Result<BufferRef> {
        let dtype = inputs[0].1.dtype();
        let n = geom.len();
        let (code, p0, p1) = match act {
            None => (NO_ACT, 0.0, 0.0),
            Some(a) => {
                let (p0, p1) = super::elementwise::unary_params(a);
                (op_index(&UnaryOp::ALL, UnaryOp::name, a.name()), p0, p1)
            }
        };
        let out = self.alloc(op, dtype, n)?;
        let params = [
            to_u32(op, n)?,
            to_u32(op, geom.channels)?,
            to_u32(op, geom.inner.max(1))?,
            (p0 as f32).to_bits(),
            (p1 as f32).to_bits(),
        ];
        let mut bindings = inputs.to_vec();
        bindings.push((3, &out));
        let t = self.element_type(op, dtype)?;
        self.launch(
            &Variant::new("bias_act", op, &[t]).constant("ACT", code),
            &params,
            &bindings,
            self.word_grid(op, dtype, n)?,
        )?;
        Ok(out)
    }
}
