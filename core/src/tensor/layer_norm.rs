//! Layer normalisation over the last axis (PyTorch's `F.layer_norm` with one normalised axis):
//! the backend's fused `layer_norm_last`, affine part included, one pass over the rows; its
//! gradient is one backward call that returns the input's, the weight's and the bias's, from the
//! saved input alone (nothing else the size of the activation is kept). Statistics are always
//! taken in f32 or wider (in half precision `(var + eps)^-1.5` overflows); under autocast the
//! result stays f32, as PyTorch's autocast lists it, otherwise it returns in the input's dtype.

use super::Tensor;
use super::add_layer_norm::RoundedBranch;
use crate::backend::{InputGradient, LayerNormAffine, LayerNormSpec};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::shape::Shape;

impl Tensor {
    /// `(x - mean) / sqrt(var + eps) * weight + bias` over the last axis, with the biased
    /// variance; `weight` and `bias` are `[features]` (the last axis's length).
    pub fn layer_norm(&self, weight: Option<&Tensor>, bias: Option<&Tensor>, eps: f64) -> Result<Tensor> {
        self.layer_norm_into(weight, bias, eps, None)
    }

    /// `layer_norm`, its f32 result rounded to `dtype` (f16 or bf16; or the dtype `layer_norm`
    /// returns, which changes nothing): the bits of `layer_norm(..)?.to_dtype(dtype)`, in one pass
    /// over the rows where the backend fuses the two. The gradient comes back in `dtype` and
    /// is widened in the same pass as LayerNorm's backward. For a LayerNorm whose output only
    /// feeds an autocast matrix product (`nn::LayerNorm::forward_for_product`).
    pub fn layer_norm_to(
        &self,
        weight: Option<&Tensor>,
        bias: Option<&Tensor>,
        eps: f64,
        dtype: DType,
    ) -> Result<Tensor> {
        self.layer_norm_into(weight, bias, eps, Some(dtype))
    }

    /// `layer_norm`, its output in `out` (None: the dtype it computes in).
    pub(super) fn layer_norm_into(
        &self,
        weight: Option<&Tensor>,
        bias: Option<&Tensor>,
        eps: f64,
        out: Option<DType>,
    ) -> Result<Tensor> {
        let mut operands = vec![self];
        operands.extend(weight);
        operands.extend(bias);
        if let Some(wide) = crate::autocast::recast(&operands, crate::autocast::full)? {
            let (x, rest) = (&wide[0], &wide[1..]);
            let weight = weight.map(|_| &rest[0]);
            let bias = bias.map(|_| &rest[rest.len() - 1]);
            return x.layer_norm_into(weight, bias, eps, out);
        }
        self.float_only("layer_norm")?;
        if matches!(self.dtype(), DType::F16 | DType::BF16) {
            let wide = |t: &Tensor| t.to_dtype(DType::F32);
            let (w, b) = (weight.map(wide).transpose()?, bias.map(wide).transpose()?);
            let out = out.unwrap_or(self.dtype());
            return wide(self)?.layer_norm_into(w.as_ref(), b.as_ref(), eps, Some(out));
        }
        let out = out.unwrap_or(self.dtype());
        if out != self.dtype() && !matches!(out, DType::F16 | DType::BF16) {
            return Err(Error::invalid(
                "layer_norm",
                format!("rounds its {} result to f16 or bf16, not {out}", self.dtype()),
            ));
        }
        let features = self.layer_norm_features(weight, bias)?;
        self.normalize_rows(weight, bias, features, eps, out)
    }
}

impl Tensor {
    /// `layer_norm` over rows of `features` by the backend, its output in `out`, forward and
    /// backward one call each.
    fn normalize_rows(
        &self,
        weight: Option<&Tensor>,
        bias: Option<&Tensor>,
        features: usize,
        eps: f64,
        out: DType,
    ) -> Result<Tensor> {
        let x = self.contiguous()?;
        let (weight, bias) = (
            weight.map(Tensor::contiguous).transpose()?,
            bias.map(Tensor::contiguous).transpose()?,
        );
        let spec = LayerNormSpec {
            rows: x.elem_count().checked_div(features).unwrap_or(0),
            cols: features,
            eps,
        };
        let buffer = x
            .backend()
            .layer_norm_last_to(x.buffer(), affine(&weight, &bias), &spec, out)?;
        let out = Tensor::from_buffer(buffer, x.shape().clone(), x.device());
        Ok(track_layer_norm(out, &x, weight, bias, spec, None))
    }
}

/// Records `out`, the LayerNorm of the contiguous `x` by `spec`: its backward is one backend
/// call that also adds the gradient `x`'s other uses delivered first (the residual stream's),
/// and, given `branch`, rounds that sum for the 16-bit branch of the residual add that produced
/// `x` (`add_layer_norm`). The input and the `[features]` parameters are saved: the statistics
/// are recomputed.
pub(super) fn track_layer_norm(
    out: Tensor,
    x: &Tensor,
    weight: Option<Tensor>,
    bias: Option<Tensor>,
    spec: LayerNormSpec,
    branch: Option<RoundedBranch>,
) -> Tensor {
    let mut inputs = vec![x];
    inputs.extend(weight.as_ref());
    inputs.extend(bias.as_ref());
    let saved = (
        x.detach(),
        weight.as_ref().map(Tensor::detach),
        bias.as_ref().map(Tensor::detach),
    );
    out.track_absorbing("layer_norm", &inputs, move |g, accumulated| {
        let (x, weight, bias) = &saved;
        let g = g.contiguous()?;
        // Folded into the backward where it is the input's shape and dtype (it always is on a
        // residual stream); otherwise, or with autocast's fusions switched off to compare,
        // added after, as the walk would.
        let accumulated = accumulated.map(|a| a.contiguous()).transpose()?;
        let (folded, after) = match accumulated {
            Some(a) if a.dtype() == x.dtype() && a.shape() == x.shape() && !crate::autocast::fusions_switched_off() => {
                (Some(a), None)
            }
            other => (None, other),
        };
        let input = InputGradient {
            accumulated: folded.as_ref().map(Tensor::buffer),
            rounded: branch.as_ref().filter(|_| after.is_none()).map(|b| b.dtype),
        };
        let grads =
            g.backend()
                .layer_norm_last_to_backward(g.buffer(), x.buffer(), affine(weight, bias), &spec, input)?;
        drop(folded);
        let device = g.device();
        let mut dx = Tensor::from_buffer(grads.input, g.shape().clone(), device);
        if let Some(a) = after {
            dx = a.add(&dx)?;
        }
        if let (Some(branch), Some(rounded)) = (&branch, grads.rounded_input) {
            branch.keep(&dx, Tensor::from_buffer(rounded, g.shape().clone(), device));
        }
        let column = |b| Tensor::from_buffer(b, Shape::new(vec![spec.cols]), device);
        let mut out = vec![Some(dx)];
        if weight.is_some() {
            out.push(grads.weight.map(column));
        }
        if bias.is_some() {
            out.push(grads.bias.map(column));
        }
        Ok(out)
    })
}

impl Tensor {
    /// The last axis's length, checking that `weight` and `bias` are `[features]` on this
    /// tensor's device in its dtype.
    pub(super) fn layer_norm_features(&self, weight: Option<&Tensor>, bias: Option<&Tensor>) -> Result<usize> {
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
        for t in weight.iter().chain(bias.iter()) {
            self.same_device("layer_norm", t)?;
            self.same_dtype("layer_norm", t)?;
        }
        Ok(features)
    }
}

/// The backend's view of the affine parameters.
pub(super) fn affine<'a>(weight: &'a Option<Tensor>, bias: &'a Option<Tensor>) -> LayerNormAffine<'a> {
    LayerNormAffine {
        weight: weight.as_ref().map(Tensor::buffer),
        bias: bias.as_ref().map(Tensor::buffer),
    }
}
