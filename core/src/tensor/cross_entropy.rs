//! Mean cross-entropy of logits against class labels: one pass over the logits each way where
//! the backend fuses it (`Backend::cross_entropy`), else composed from log-softmax, gather and
//! mean. Fused, the forward pass writes the gradient of the mean loss beside the loss and
//! backward only scales it, so nothing else the size of the logits is kept or allocated (no
//! f32 copy of 16-bit logits under autocast, no log-softmax).

use super::Tensor;
use crate::autograd;
use crate::backend::CrossEntropy;
use crate::dtype::DType;
use crate::error::{Error, Result};

impl Tensor {
    /// Mean cross-entropy of `[n, classes]` logits against integer labels `[n]` (u32 or i64),
    /// as `torch.nn.functional.cross_entropy` with its defaults; in f32 under autocast.
    pub fn cross_entropy(&self, labels: &Tensor) -> Result<Tensor> {
        if self.rank() != 2 || labels.rank() != 1 || labels.dims()[0] != self.dims()[0] {
            return Err(Error::shape(
                "cross_entropy",
                self.shape(),
                labels.shape(),
                "expects logits [N, C] and labels [N]",
            ));
        }
        if labels.dtype() != DType::U32 && labels.dtype() != DType::I64 {
            return Err(Error::UnsupportedDType {
                op: "cross_entropy",
                dtype: labels.dtype(),
                hint: "; labels are class indices (u32 or i64)",
            });
        }
        self.float_only("cross_entropy")?;
        let targets = self.as_indices("cross_entropy", labels)?;
        match self.cross_entropy_fused(&targets)? {
            Some(loss) => Ok(loss),
            None => self.cross_entropy_composed(&targets),
        }
    }

    /// `-mean(log_softmax(self)[i, targets[i]])` from the backend's general ops; `targets` U32.
    pub(crate) fn cross_entropy_composed(&self, targets: &Tensor) -> Result<Tensor> {
        let picked = self
            .log_softmax(-1)?
            .gather(1, &targets.reshape([targets.elem_count(), 1])?)?;
        picked.mean_all()?.neg()
    }

    /// The loss through `Backend::cross_entropy`, in the dtype the composed path gives; `None`
    /// where the backend does not fuse it.
    fn cross_entropy_fused(&self, targets: &Tensor) -> Result<Option<Tensor>> {
        let [rows, classes] = [self.dims()[0], self.dims()[1]];
        if rows == 0 || classes == 0 {
            // The mean of nothing, or rows without classes: the composed ops say what they are.
            return Ok(None);
        }
        let x = self.contiguous()?;
        let spec = CrossEntropy {
            rows,
            classes,
            grad: autograd::is_grad_enabled() && x.tracks_grad(),
        };
        let Some(fused) = x.backend().cross_entropy(x.buffer(), targets.buffer(), &spec) else {
            return Ok(None);
        };
        let (losses, dlogits) = fused?;
        let device = x.device();
        let loss = Tensor::from_buffer(losses, [rows], device)
            .mean_all()?
            .to_dtype(crate::autocast::full_dtype(x.dtype()))?;
        let Some(dlogits) = dlogits else {
            return Ok(Some(loss));
        };
        let dlogits = Tensor::from_buffer(dlogits, x.shape().clone(), device);
        Ok(Some(loss.track("cross_entropy", &[&x], move |g| {
            let g = g.to_dtype(DType::F32)?.contiguous()?;
            let dx = dlogits
                .backend()
                .cross_entropy_backward(dlogits.buffer(), g.buffer(), &spec)
                .ok_or_else(|| {
                    Error::invalid(
                        "cross_entropy",
                        "the backend fused the forward pass but has no backward pass for it",
                    )
                })??;
            Ok(vec![Some(Tensor::from_buffer(
                dx,
                dlogits.shape().clone(),
                dlogits.device(),
            ))])
        })))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::Device;
    use crate::rng::Generator;

    fn logits(rows: usize, classes: usize, device: &Device) -> Tensor {
        Tensor::rand_normal([rows, classes], 0.0, 3.0, DType::F32, &Generator::new(11), device).unwrap()
    }

    fn targets(rows: usize, classes: usize, device: &Device) -> Tensor {
        let t: Vec<u32> = (0..rows).map(|i| ((i * 7919) % classes) as u32).collect();
        Tensor::from_vec(t, [rows], device).unwrap()
    }

    /// The loss and the logits' gradient for a loss scaled by `scale` after it.
    fn loss_and_grad(x: &Tensor, t: &Tensor, composed: bool, scale: f64) -> (f64, Vec<f32>) {
        let x = x.detach().requires_grad(true);
        let loss = if composed {
            x.cross_entropy_composed(t)
        } else {
            x.cross_entropy(t)
        }
        .unwrap();
        loss.mul_scalar(scale).unwrap().backward().unwrap();
        let grad = x.grad().unwrap().to_dtype(DType::F32).unwrap();
        (loss.item().unwrap(), grad.to_vec::<f32>().unwrap())
    }

    #[test]
    fn fused_matches_composed_in_f32() {
        let cpu = Device::cpu();
        let (x, t) = (logits(37, 517, &cpu), targets(37, 517, &cpu));
        for scale in [1.0, 3.0] {
            let (fused, fused_grad) = loss_and_grad(&x, &t, false, scale);
            let (composed, composed_grad) = loss_and_grad(&x, &t, true, scale);
            assert!(
                (fused - composed).abs() <= 1e-6 * composed.abs(),
                "{fused} vs {composed}"
            );
            for (a, b) in fused_grad.iter().zip(&composed_grad) {
                assert!((a - b).abs() <= 1e-7 + 1e-5 * b.abs(), "scale {scale}: {a} vs {b}");
            }
        }
    }

    #[test]
    fn runs_give_the_same_bits() {
        let cpu = Device::cpu();
        let (x, t) = (logits(300, 1000, &cpu), targets(300, 1000, &cpu));
        let (a, a_grad) = loss_and_grad(&x, &t, false, 0.5);
        let (b, b_grad) = loss_and_grad(&x, &t, false, 0.5);
        assert_eq!(a.to_bits(), b.to_bits());
        assert!(a_grad.iter().zip(&b_grad).all(|(a, b)| a.to_bits() == b.to_bits()));
    }

    #[test]
    fn a_target_out_of_range_is_an_error() {
        let cpu = Device::cpu();
        let x = logits(2, 5, &cpu);
        let t = Tensor::from_vec(vec![1u32, 5], [2], &cpu).unwrap();
        let err = x.cross_entropy(&t).unwrap_err().to_string();
        assert!(err.contains("index 5 is out of range"), "{err}");
    }

    #[test]
    fn bf16_logits_under_autocast_get_no_f32_copy() {
        // A device of its own, so other tests' buffers do not move its counters.
        let device = Device::parse("cpu:7").unwrap();
        let (rows, classes) = (64, 4096);
        let x = logits(rows, classes, &device)
            .to_dtype(DType::BF16)
            .unwrap()
            .requires_grad(true);
        let t = targets(rows, classes, &device);
        let before = device.backend().memory_stats().allocated_bytes;
        let loss = crate::autocast::autocast(DType::BF16, || x.cross_entropy(&t)).unwrap();
        let grown = device.backend().memory_stats().allocated_bytes - before;
        assert_eq!(loss.dtype(), DType::F32);
        // The bf16 gradient, kept for backward, and small change; an f32 copy would double it.
        let dlogits = (rows * classes * 2) as u64;
        assert!(grown < dlogits + 4096, "{grown} bytes for {dlogits} of gradient");
        loss.backward().unwrap();
        assert_eq!(x.grad().unwrap().dtype(), DType::BF16);
    }
}
