//! `bias_act`: a layer's bias and activation in one device pass (Linear and Conv2d use it when
//! an activation module follows them in a `Sequential`).

use super::Tensor;
use super::elementwise::{GradReads, derivative_of_input, grad_reads, unary_grad};
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
        // Keep only what the activation's gradient reads: the pre-activation inputs, the output
        // (ReLU's, tanh's, …), or nothing (the bias alone).
        let reads = act.map_or(GradReads::Nothing, grad_reads);
        let pre_act = (reads == GradReads::Input).then(|| (x.detach(), b.detach()));
        let post_act = (reads == GradReads::Output).then(|| out.detach());
        let rank = dims.len();
        Ok(out.track(OP, &[self, bias], move |g| {
            let g_pre = match (act, pre_act) {
                (None, _) => g.clone(),
                (Some(op), None) => unary_grad(op, post_act.as_ref(), g)?,
                (Some(op), Some((x, b))) => {
                    // In one pass where the backend has the kernel: the same bits as below.
                    let fused = match derivative_of_input(op) {
                        Some(derivative) if g.dtype() == x.dtype() => {
                            let g = g.contiguous()?;
                            let backend = x.backend();
                            backend
                                .bias_act_grad(g.buffer(), x.buffer(), b.buffer(), geom, derivative)
                                .transpose()?
                        }
                        _ => None,
                    };
                    match fused {
                        Some(buffer) => Tensor::from_buffer(buffer, x.shape().clone(), x.device()),
                        None => {
                            let mut along = vec![1; rank];
                            along[axis] = geom.channels;
                            let pre = x.add(&b.reshape(along)?)?;
                            unary_grad(op, Some(&pre), g)?
                        }
                    }
                }
            };
            let others: Vec<usize> = (0..rank).filter(|&a| a != axis).collect();
            let g_bias = g_pre.sum_keepdim(&others)?.reshape([geom.channels])?;
            Ok(vec![Some(g_pre), Some(g_bias)])
        }))
    }
}

#[cfg(test)]
mod tests {
    use crate::backend::{BiasGeometry, UnaryOp};
    use crate::conformance::bias_act_grad_mismatches;
    use crate::device::Device;
    use crate::dtype::DType;
    use crate::tensor::Tensor;

    #[test]
    fn the_fused_gelu_input_gradient_is_the_composed_ops_bit_for_bit() {
        let cpu = Device::cpu();
        for dtype in [DType::F32, DType::F64, DType::BF16, DType::F16] {
            let mismatches = bias_act_grad_mismatches(&cpu, dtype).unwrap();
            assert_eq!(mismatches, Some(vec![]), "{dtype:?}");
        }
    }

    #[test]
    fn a_gradient_of_another_dtype_is_an_error_not_a_panic() {
        let cpu = Device::cpu();
        let x = Tensor::zeros([4, 3], DType::BF16, &cpu).unwrap();
        let b = Tensor::zeros([3], DType::BF16, &cpu).unwrap();
        let g = Tensor::zeros([4, 3], DType::F32, &cpu).unwrap();
        let geom = BiasGeometry {
            outer: 4,
            channels: 3,
            inner: 1,
        };
        let err = cpu
            .backend()
            .bias_act_grad(g.buffer(), x.buffer(), b.buffer(), geom, UnaryOp::GeluGrad)
            .expect("the CPU has the kernel")
            .unwrap_err()
            .to_string();
        assert!(err.contains("gradient in the input's dtype"), "{err}");
    }
}
