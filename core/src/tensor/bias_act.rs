//! `bias_act`: a layer's bias and activation in one device pass (Linear and Conv2d use it when
//! an activation module follows them in a `Sequential`).

use super::Tensor;
use super::elementwise::{derivative_of_input, unary_grad};
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
                            unary_grad(op, &pre, &y, g)?
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
    use super::*;
    use crate::device::Device;
    use crate::dtype::{DType, HostVec};
    use crate::rng::Generator;

    /// Normal values of spread 3 in `dtype`, with a NaN, infinities and signed zeros among them.
    fn values(dims: &[usize], seed: u64, dtype: DType, device: &Device) -> Tensor {
        let x = Tensor::rand_normal(dims.to_vec(), 0.0, 3.0, DType::F64, &Generator::new(seed), device).unwrap();
        let mut v = x.to_vec::<f64>().unwrap();
        let specials = [f64::NAN, f64::INFINITY, f64::NEG_INFINITY, 0.0, -0.0, 40.0, -40.0];
        for (i, s) in specials.into_iter().enumerate() {
            let at = (i * 7919 + seed as usize) % v.len();
            v[at] = s;
        }
        Tensor::from_host(HostVec::from_f64(dtype, &v), dims.to_vec(), device).unwrap()
    }

    fn bits(t: &Tensor) -> Vec<u64> {
        t.to_host().unwrap().to_f64_vec().iter().map(|v| v.to_bits()).collect()
    }

    #[test]
    fn the_fused_gelu_input_gradient_is_the_composed_ops_bit_for_bit() {
        let cpu = Device::cpu();
        // A linear layer's rows, a convolution's channels, and rows past the parallel threshold.
        let cases: [(&[usize], usize); 3] = [(&[5, 7], 1), (&[2, 3, 4, 5], 1), (&[600, 300], 1)];
        for dtype in [DType::F32, DType::F64, DType::BF16, DType::F16] {
            for (dims, axis) in cases {
                let x = values(dims, 1, dtype, &cpu);
                let b = values(&[dims[axis]], 2, dtype, &cpu);
                let g = values(dims, 3, dtype, &cpu);
                let geom = BiasGeometry {
                    outer: dims[..axis].iter().product(),
                    channels: dims[axis],
                    inner: dims[axis + 1..].iter().product(),
                };
                let fused = cpu
                    .backend()
                    .bias_act_grad(g.buffer(), x.buffer(), b.buffer(), geom, UnaryOp::GeluGrad)
                    .expect("the CPU has the kernel")
                    .unwrap();
                let fused = Tensor::from_buffer(fused, x.shape().clone(), &cpu);
                let mut along = vec![1; dims.len()];
                along[axis] = dims[axis];
                let pre = x.add(&b.reshape(along).unwrap()).unwrap();
                let composed = unary_grad(UnaryOp::Gelu, &pre, &pre.gelu().unwrap(), &g).unwrap();
                assert_eq!(bits(&fused), bits(&composed), "{dtype:?} {dims:?}");
            }
        }
    }

    #[test]
    fn a_gradient_of_another_dtype_is_an_error_not_a_panic() {
        let cpu = Device::cpu();
        let x = values(&[4, 3], 1, DType::BF16, &cpu);
        let b = values(&[3], 2, DType::BF16, &cpu);
        let g = values(&[4, 3], 3, DType::F32, &cpu);
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
