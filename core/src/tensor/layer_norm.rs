//! Layer normalisation over the last axis (PyTorch's `F.layer_norm` with one normalised axis):
//! the backend's fused `layer_norm_last` (one pass per row, and one for its gradient), then the
//! affine part as elementwise ops, whose gradients give the weight's and bias's. Statistics are
//! always taken in f32 or wider (in half precision `(var + eps)^-1.5` overflows); under autocast
//! the result stays f32, as PyTorch's autocast lists it, otherwise it returns in the input's dtype.

use super::Tensor;
use crate::dtype::DType;
use crate::error::{Error, Result};

impl Tensor {
    /// `(x - mean) / sqrt(var + eps) * weight + bias` over the last axis, with the biased
    /// variance; `weight` and `bias` are `[features]` (the last axis's length).
    pub fn layer_norm(&self, weight: Option<&Tensor>, bias: Option<&Tensor>, eps: f64) -> Result<Tensor> {
        let mut operands = vec![self];
        operands.extend(weight);
        operands.extend(bias);
        if let Some(wide) = crate::autocast::recast(&operands, crate::autocast::full)? {
            let (x, rest) = (&wide[0], &wide[1..]);
            let weight = weight.map(|_| &rest[0]);
            let bias = bias.map(|_| &rest[rest.len() - 1]);
            return x.layer_norm(weight, bias, eps);
        }
        self.float_only("layer_norm")?;
        if matches!(self.dtype(), DType::F16 | DType::BF16) {
            let wide = |t: &Tensor| t.to_dtype(DType::F32);
            let (w, b) = (weight.map(wide).transpose()?, bias.map(wide).transpose()?);
            return wide(self)?
                .layer_norm(w.as_ref(), b.as_ref(), eps)?
                .to_dtype(self.dtype());
        }
        let features = *self
            .dims()
            .last()
            .ok_or_else(|| Error::invalid("layer_norm", "needs at least one axis to normalise over"))?;
        for (what, t) in [("weight", weight), ("bias", bias)] {
            if let Some(t) = t
                && t.dims() != [features]
            {
                return Err(Error::shape(
                    "layer_norm",
                    self.shape(),
                    t.shape(),
                    format!("{what} must be [{features}], the input's last axis"),
                ));
            }
        }
        let mut y = self.normalize_rows(features, eps)?;
        if let Some(w) = weight {
            y = y.mul(w)?;
        }
        if let Some(b) = bias {
            y = y.add(b)?;
        }
        Ok(y)
    }
}

impl Tensor {
    /// `(x - mean) / sqrt(var + eps)` over rows of `features`, and its gradient, as one backend
    /// pass each.
    fn normalize_rows(&self, features: usize, eps: f64) -> Result<Tensor> {
        let x = self.contiguous()?;
        let rows = x.elem_count().checked_div(features).unwrap_or(0);
        let buffer = x.backend().layer_norm_last(x.buffer(), rows, features, eps)?;
        let out = Tensor::from_buffer(buffer, x.shape().clone(), x.device());
        let input = x.detach();
        Ok(out.track("layer_norm", &[&x], move |g| {
            let g = g.contiguous()?;
            let dx = g
                .backend()
                .layer_norm_last_backward(g.buffer(), input.buffer(), rows, features, eps)?;
            Ok(vec![Some(Tensor::from_buffer(dx, g.shape().clone(), g.device()))])
        }))
    }
}
