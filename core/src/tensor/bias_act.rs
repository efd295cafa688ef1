//! `bias_act`: a layer's bias and activation in one device pass (Linear and Conv2d use it when
//! an activation module follows them in a `Sequential`).

use super::Tensor;
use super::elementwise::unary_grad;
use crate::backend::{BiasGeometry, UnaryOp};
use crate::error::{Error, Result};

impl Tensor {
    /// `act(self + bias)` with `bias` (shape `[self.dims()[axis]]`) broadcast along `axis`;
    /// `act` None adds the bias alone. One pass on the device instead of two.
    pub fn bias_act(&self, bias: &Tensor, axis: usize, act: Option<UnaryOp>) -> Result<Tensor> {
        const OP: &str = "bias_act";
        // Part of a linear layer: its class under autocast is the product's.
        if let Some(low) = crate::autocast::recast(&[self, bias], crate::autocast::lower)? {
            return low[0].bias_act(&low[1], axis, act);
        }
        self.same_device(OP, bias)?;
        self.same_dtype(OP, bias)?;
        self.float_only(OP)?;
        let dims = self.dims();
        if axis >= dims.len() || bias.dims() != [dims[axis]] {
            return Err(Error::shape(
                OP,
                self.shape(),
                bias.shape(),
                format!("the bias must be one value per entry of axis {axis}"),
            ));
        }
        let geom = BiasGeometry {
            outer: dims[..axis].iter().product(),
            channels: dims[axis],
            inner: dims[axis + 1..].iter().product(),
        };
        let (x, b) = (self.contiguous()?, bias.contiguous()?);
        let buffer = self.backend().bias_act(x.buffer(), b.buffer(), geom, act)?;
        let out = Tensor::from_buffer(buffer, self.shape().clone(), self.device());
        // Keep the pre-activation inputs only for activations whose gradient needs them.
        let needs_input = matches!(act, Some(op) if op != UnaryOp::Relu);
        let saved = needs_input.then(|| (x.detach(), b.detach()));
        let y = out.detach();
        let rank = dims.len();
        Ok(out.track(OP, &[self, bias], move |g| {
            let g_pre = match act {
                None => g.clone(),
                // ReLU's gradient needs only the sign of its input, which its output shares.
                Some(UnaryOp::Relu) => unary_grad(UnaryOp::Relu, &y, &y, g)?,
                Some(op) => {
                    let (x, b) = saved.expect("kept for this activation");
                    let mut along = vec![1; rank];
                    along[axis] = geom.channels;
                    let pre = x.add(&b.reshape(along)?)?;
                    unary_grad(op, &pre, &y, g)?
                }
            };
            let others: Vec<usize> = (0..rank).filter(|&a| a != axis).collect();
            let g_bias = g_pre.sum_keepdim(&others)?.reshape([geom.channels])?;
            Ok(vec![Some(g_pre), Some(g_bias)])
        }))
    }
}
