//! Training-mode batch normalisation with the batch's own statistics as one backend op each way
//! (`Backend::batch_norm`), where the backend has it: two passes over the input forward and two
//! backward, where the composed ops (`batch_norm_with`) make about twenty.

use super::Tensor;
use super::nn_ops::{BatchStatsFn, local_batch_stats, update_running_stats};
use crate::backend::BatchNormSpec;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::shape::Shape;

impl Tensor {
    /// Training-mode `batch_norm` with this batch's statistics (the running statistics updated):
    /// fused where the backend can, otherwise composed by `batch_norm_with`.
    pub(crate) fn batch_norm_local(
        &self,
        running_mean: &Tensor,
        running_var: &Tensor,
        weight: Option<&Tensor>,
        bias: Option<&Tensor>,
        momentum: f64,
        eps: f64,
    ) -> Result<Tensor> {
        let channels = self.dims().get(1).copied().unwrap_or(0);
        let count = self.elem_count() / channels.max(1);
        if let (Some(w), Some(b), true) = (weight, bias, self.rank() >= 2 && count > 1)
            && let Some((y, mean, var)) = self.batch_norm_fused(w, b, eps)?
        {
            update_running_stats(running_mean, running_var, &mean, &var, count, momentum)?;
            return Ok(y);
        }
        // Also where the composed path has the clear error for a bad input, and where autocast's
        // half-precision input is normalised in f32 and returned in its own dtype.
        let stats: &BatchStatsFn<'_> = &local_batch_stats;
        self.batch_norm_with(running_mean, running_var, weight, bias, Some(stats), momentum, eps)
    }

    /// `(y, mean, var)` of training-mode batch norm over axis 1 of this `[N, C, …]` tensor (biased
    /// variance, each statistic `[C]`, f32) by the backend's fused op, `y` in this tensor's dtype:
    /// f32, or f16/bf16 with f32 parameters (autocast's mix); `None` where the backend has no
    /// kernel for this input (the caller composes it).
    fn batch_norm_fused(&self, weight: &Tensor, bias: &Tensor, eps: f64) -> Result<Option<(Tensor, Tensor, Tensor)>> {
        let c = self.dims()[1];
        let per_channel = |t: &Tensor| t.dtype() == DType::F32 && t.dims() == [c] && t.device() == self.device();
        if !matches!(self.dtype(), DType::F32 | DType::F16 | DType::BF16) || !per_channel(weight) || !per_channel(bias)
        {
            return Ok(None);
        }
        let x = self.contiguous()?;
        let (weight, bias) = (weight.contiguous()?, bias.contiguous()?);
        let spec = BatchNormSpec {
            outer: x.dims()[0],
            channels: c,
            inner: x.dims()[2..].iter().product(),
            eps,
        };
        let Some(outputs) = x
            .backend()
            .batch_norm(x.buffer(), weight.buffer(), bias.buffer(), &spec)
        else {
            return Ok(None);
        };
        let [y, mean, var] = outputs?;
        let device = x.device();
        let (mean, var) = (
            Tensor::from_buffer(mean, Shape::new(vec![c]), device),
            Tensor::from_buffer(var, Shape::new(vec![c]), device),
        );
        let y = Tensor::from_buffer(y, x.shape().clone(), device);
        let saved = (x.detach(), weight.detach(), mean.clone(), var.clone());
        let y = y.track("batch_norm", &[&x, &weight, &bias], move |g| {
            let (x, weight, mean, var) = &saved;
            // The output's gradient in the output's (the input's) dtype.
            let g = g.to_dtype(x.dtype())?.contiguous()?;
            let grads = x
                .backend()
                .batch_norm_backward(
                    g.buffer(),
                    x.buffer(),
                    weight.buffer(),
                    [mean.buffer(), var.buffer()],
                    &spec,
                )
                .ok_or_else(|| {
                    Error::invalid(
                        "batch_norm",
                        "the backend fused the forward pass but has no backward pass for it",
                    )
                })??;
            let [dx, dweight, dbias] = grads;
            let device = x.device();
            Ok(vec![
                Some(Tensor::from_buffer(dx, x.shape().clone(), device)),
                Some(Tensor::from_buffer(dweight, Shape::new(vec![c]), device)),
                Some(Tensor::from_buffer(dbias, Shape::new(vec![c]), device)),
            ])
        });
        Ok(Some((y, mean, var)))
    }
}
