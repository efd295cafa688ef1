//! bias_act (bias_act.wgsl): a layer's bias and activation in one pass.

use lockstep_core::backend::{BiasGeometry, BufferRef, UnaryOp};
use lockstep_core::{Error, Result};

use super::op_index;
use crate::backend::{WgpuBackend, to_u32};
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
        let BiasGeometry { channels, inner, .. } = geom;
        let n = geom.len();
        let (x, b) = (self.operand(OP, src, None)?, self.operand(OP, bias, None)?);
        geom.check(OP, x.len(), b.len())?;
        if x.dtype() != b.dtype() {
            return Err(Error::DTypeMismatch {
                op: OP,
                lhs: x.dtype(),
                rhs: b.dtype(),
            });
        }
        let t = self.element_type(OP, x.dtype())?;
        let (code, p0, p1) = match act {
            None => (NO_ACT, 0.0, 0.0),
            Some(op) => {
                let (p0, p1) = super::elementwise::unary_params(op);
                (op_index(&UnaryOp::ALL, UnaryOp::name, op.name()), p0, p1)
            }
        };
        let out = self.alloc("add_bias", x.dtype(), n)?;
        let params = [
            to_u32(OP, n)?,
            to_u32(OP, channels)?,
            to_u32(OP, inner.max(1))?,
            (p0 as f32).to_bits(),
            (p1 as f32).to_bits(),
        ];
        self.launch(
            &Variant::new(OP, OP, &[t]).constant("ACT", code),
            &params,
            &[(1, x), (2, b), (3, &out)],
            self.word_grid(OP, x.dtype(), n)?,
        )?;
        Ok(out)
    }
}
