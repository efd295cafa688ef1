//! Dynamic loss scaling for f16 training, PyTorch's `GradScaler` (spec AMP-7..10): the loss is
//! multiplied by a scale S so small gradients survive f16's range; before the optimizer step the
//! gradients are unscaled once (x 1/S), and if any is inf or NaN the step is skipped and S
//! halves; after `growth_interval` clean steps S doubles. The check runs on the device over all
//! gradients together and reads one value back per optimizer step.

use serde::{Deserialize, Serialize};

use super::by_device::by_device;
use super::scaled_grads::scale_grads;
use crate::autograd::no_grad;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::shape::Shape;
use crate::tensor::Tensor;

/// Dynamic loss scaling for `16-mixed` training (`torch.amp.GradScaler`), kept in checkpoints with
/// the trainer's state.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct GradScaler {
    /// The loss scale S now (PyTorch's `init_scale` to start, 65536 by default).
    pub scale: f64,
    /// What S is multiplied by after `growth_interval` clean steps (default 2).
    pub growth_factor: f64,
    /// What S is multiplied by after a step with an inf or NaN gradient (default 0.5).
    pub backoff_factor: f64,
    /// Clean optimizer steps in a row before S grows (default 2000).
    pub growth_interval: u64,
    /// Clean steps since the scale last changed.
    pub growth_tracker: u64,
}

impl Default for GradScaler {
    /// PyTorch's defaults: 65536, x2 every 2000 clean steps, x0.5 on inf/NaN.
    fn default() -> Self {
        GradScaler {
            scale: 65536.0,
            growth_factor: 2.0,
            backoff_factor: 0.5,
            growth_interval: 2000,
            growth_tracker: 0,
        }
    }
}

impl GradScaler {
    /// A scaler starting at `scale`, with a zero growth tracker; an error unless `scale` is
    /// positive and finite, `growth_factor > 1` and `0 <= backoff_factor < 1` (a `growth_interval`
    /// of 0 counts as 1).
    pub fn new(scale: f64, growth_factor: f64, backoff_factor: f64, growth_interval: u64) -> Result<GradScaler> {
        if !(scale.is_finite() && scale > 0.0) || growth_factor <= 1.0 || !(0.0..1.0).contains(&backoff_factor) {
            return Err(Error::invalid(
                "GradScaler",
                "needs a positive finite scale, growth_factor > 1 and 0 <= backoff_factor < 1",
            ));
        }
        Ok(GradScaler {
            scale,
            growth_factor,
            backoff_factor,
            growth_interval: growth_interval.max(1),
            growth_tracker: 0,
        })
    }

    /// `loss * scale`, for `backward`.
    pub fn scale_loss(&self, loss: &Tensor) -> Result<Tensor> {
        loss.affine(self.scale, 0.0)
    }

    /// Divides every gradient of `params` by the scale and returns whether all of them are
    /// finite. Once per optimizer step, before clipping: a `scaled_copies` per device and 16 MiB
    /// of gradients, then a `non_finite_count` per device.
    pub fn unscale(&self, params: &[Tensor]) -> Result<bool> {
        let Some(first) = params.iter().find_map(Tensor::grad) else {
            return Ok(true);
        };
        // The reciprocal in f64, then f32, as PyTorch (exact for powers of two anyway).
        let inv = (1.0 / self.scale) as f32 as f64;
        // `scaled_copies` rounds the factor to each gradient's dtype first: exact in f32 and
        // f64, but 1/S underflows f16 past S = 2^24, so 16-bit gradients (never those of
        // 16-mixed, whose parameters stay f32) keep one product in f32 each, as before.
        let (narrow, wide): (Vec<Tensor>, Vec<Tensor>) = params
            .iter()
            .filter(|p| p.grad().is_some())
            .cloned()
            .partition(|p| p.grad().is_some_and(|g| matches!(g.dtype(), DType::F16 | DType::BF16)));
        let factor = Tensor::full(Shape::scalar(), inv, DType::F32, first.device())?;
        scale_grads(&wide, &factor)?;
        no_grad(|| -> Result<()> {
            for (p, g) in narrow.iter().filter_map(|p| p.grad().map(|g| (p, g))) {
                p.set_grad(Some(g.affine(inv, 0.0)?));
            }
            Ok(())
        })?;
        grads_finite(params)
    }

    /// Adjusts the scale after an optimizer step (taken when `finite`, skipped otherwise).
    pub fn update(&mut self, finite: bool) {
        if finite {
            self.growth_tracker += 1;
            if self.growth_tracker >= self.growth_interval {
                self.scale *= self.growth_factor;
                self.growth_tracker = 0;
            }
        } else {
            self.scale *= self.backoff_factor;
            self.growth_tracker = 0;
        }
    }
}

/// Whether every gradient of `params` is finite. Counts the elements that are inf or NaN (by
/// their bits: `x * 0` would do it too, but a fast-math GPU compiler may fold that to 0) with
/// one `non_finite_count` per device and one read-back.
pub fn grads_finite(params: &[Tensor]) -> Result<bool> {
    let grads: Vec<Tensor> = params.iter().filter_map(|p| p.grad()).collect();
    Ok(non_finite_elements(&grads)? == 0)
}

/// How many elements of `tensors` are inf or NaN (exact up to 2^24), read back once: each
/// device's count added on the first tensor's device.
pub fn non_finite_elements(tensors: &[Tensor]) -> Result<u64> {
    let Some(first) = tensors.first() else {
        return Ok(0);
    };
    no_grad(|| {
        let dense = tensors.iter().map(Tensor::contiguous).collect::<Result<Vec<_>>>()?;
        let mut total: Option<Tensor> = None;
        for (device, bufs) in by_device(dense.iter().map(|t| (t.device().clone(), t.buffer()))) {
            let count = device.backend().non_finite_count(&bufs)?;
            let part = Tensor::from_buffer(count, Shape::scalar(), &device).to_device(first.device())?;
            total = Some(match total {
                None => part,
                Some(sum) => sum.add(&part)?,
            });
        }
        Ok(match total {
            None => 0,
            Some(t) => t.item()? as u64,
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::Device;
    use crate::dtype::DType;

    fn param_with_grad(values: &[f32]) -> Tensor {
        let p = Tensor::zeros([values.len()], DType::F32, &Device::cpu())
            .unwrap()
            .requires_grad(true);
        p.set_grad(Some(
            Tensor::from_slice(values, [values.len()], &Device::cpu()).unwrap(),
        ));
        p
    }

    #[test]
    fn unscaling_divides_and_finds_infinities() {
        let s = GradScaler::new(4.0, 2.0, 0.5, 3).unwrap();
        let a = param_with_grad(&[4.0, 8.0]);
        assert!(s.unscale(std::slice::from_ref(&a)).unwrap());
        assert_eq!(a.grad().unwrap().to_vec::<f32>().unwrap(), vec![1.0, 2.0]);
        let b = param_with_grad(&[1.0, f32::INFINITY]);
        let c = param_with_grad(&[f32::NAN]);
        assert!(!s.unscale(&[a.clone(), b]).unwrap());
        assert!(!s.unscale(&[c]).unwrap());
    }

    #[test]
    fn f16_gradients_survive_a_scale_whose_reciprocal_f16_cannot_hold() {
        // 1/2^25 is below f16's smallest subnormal: rounding the factor to f16 would zero it.
        let s = GradScaler::new(2f64.powi(25), 2.0, 0.5, 3).unwrap();
        let p = Tensor::zeros([1], DType::F16, &Device::cpu())
            .unwrap()
            .requires_grad(true);
        p.set_grad(Some(Tensor::full([1], 32768.0, DType::F16, &Device::cpu()).unwrap()));
        let q = param_with_grad(&[2f32.powi(20)]);
        assert!(s.unscale(&[p.clone(), q.clone()]).unwrap());
        let unscaled = p.grad().unwrap().to_dtype(DType::F32).unwrap().to_vec::<f32>().unwrap();
        assert_eq!(unscaled, vec![2f32.powi(-10)]);
        assert_eq!(q.grad().unwrap().to_vec::<f32>().unwrap(), vec![2f32.powi(-5)]);
    }

    #[test]
    fn the_scale_halves_on_overflow_and_grows_after_clean_steps() {
        let mut s = GradScaler::new(8.0, 2.0, 0.5, 3).unwrap();
        s.update(false);
        assert_eq!((s.scale, s.growth_tracker), (4.0, 0));
        s.update(true);
        s.update(true);
        assert_eq!(s.scale, 4.0);
        s.update(true);
        assert_eq!((s.scale, s.growth_tracker), (8.0, 0));
    }

    #[test]
    fn bad_settings_are_refused() {
        assert!(GradScaler::new(0.0, 2.0, 0.5, 1).is_err());
        assert!(GradScaler::new(1.0, 1.0, 0.5, 1).is_err());
        assert!(GradScaler::new(1.0, 2.0, 1.5, 1).is_err());
    }
}
