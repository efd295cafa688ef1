//! Training-mode batch normalisation with the batch's own statistics as one backend op each way
//! (`Backend::batch_norm`), where the backend has it: two passes over the input forward and two
//! backward, where the composed ops (`batch_norm_with`) make about twenty.

use super::Tensor;
use super::nn_ops::{BatchStatsFn, Running, local_batch_stats, update_running_stats};
use crate::backend::BatchNormSpec;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::shape::Shape;

/// What a block does with a batch norm's output next, fused into the normalising pass where the
/// backend can (wgpu), else applied after as its own ops: `relu(y + residual)`.
#[derive(Clone, Copy, Default)]
pub(crate) struct Epilogue<'a> {
    /// Added to the output (a residual block's shortcut), of its shape.
    pub residual: Option<&'a Tensor>,
    /// ReLU last.
    pub relu: bool,
}

impl Epilogue<'_> {
    /// The epilogue as its own ops.
    pub(crate) fn apply(&self, y: Tensor) -> Result<Tensor> {
        let y = match self.residual {
            Some(r) => y.add(r)?,
            None => y,
        };
        if self.relu { y.relu() } else { Ok(y) }
    }
    fn is_empty(&self) -> bool {
        self.residual.is_none() && !self.relu
    }
}

impl Tensor {
    /// Training-mode `batch_norm` with this batch's statistics (the running statistics updated):
    /// fused where the backend can, otherwise composed by `batch_norm_with`; then `then`, in
    /// the same pass where the backend fuses it.
    pub(crate) fn batch_norm_local(
        &self,
        running: &Running<'_>,
        weight: Option<&Tensor>,
        bias: Option<&Tensor>,
        eps: f64,
        then: Epilogue<'_>,
    ) -> Result<Tensor> {
        let channels = self.dims().get(1).copied().unwrap_or(0);
        let count = self.elem_count() / channels.max(1);
        if let (Some(w), Some(b), true) = (weight, bias, self.rank() >= 2 && count > 1)
            && let Some((y, mean, var)) = self.batch_norm_fused(w, b, eps, then)?
        {
            update_running_stats(running, &mean, &var, count)?;
            return Ok(y);
        }
        // Also where the composed path has the clear error for a bad input, and where autocast's
        // half-precision input is normalised in f32 and returned in its own dtype.
        let stats: &BatchStatsFn<'_> = &local_batch_stats;
        then.apply(self.batch_norm_with(running, weight, bias, Some(stats), eps)?)
    }

    /// `(y, mean, var)` of training-mode batch norm over axis 1 of this `[N, C, …]` tensor (biased
    /// variance, each statistic `[C]`, f32) by the backend's fused op, `y` in this tensor's dtype:
    /// f32, or f16/bf16 with f32 parameters (autocast's mix), then `then` (fused where the
    /// backend can, else applied after); `None` where the backend has no kernel for this input
    /// (the caller composes it).
    fn batch_norm_fused(
        &self,
        weight: &Tensor,
        bias: &Tensor,
        eps: f64,
        then: Epilogue<'_>,
    ) -> Result<Option<(Tensor, Tensor, Tensor)>> {
        let c = self.dims()[1];
        let per_channel = |t: &Tensor| t.dtype() == DType::F32 && t.dims() == [c] && t.device() == self.device();
        if !matches!(self.dtype(), DType::F32 | DType::F16 | DType::BF16) || !per_channel(weight) || !per_channel(bias)
        {
            return Ok(None);
        }
        let (weight, bias) = (weight.contiguous()?, bias.contiguous()?);
        let spec = BatchNormSpec {
            outer: self.dims()[0],
            channels: c,
            inner: self.dims()[2..].iter().product(),
            eps,
            channel_major: false,
            relu: false,
        };
        // The whole epilogue fused where the backend can (a residual read as the output is laid
        // out), else none of it: the ops after the kernel.
        let residual_fits = |r: &Tensor| {
            r.shape() == self.shape()
                && r.dtype() == self.dtype()
                && r.device() == self.device()
                && r.is_contiguous()
                && r.layout().offset == 0
        };
        let mut epilogues = vec![Epilogue::default()];
        if !then.is_empty() && then.residual.is_none_or(residual_fits) {
            epilogues.insert(0, then);
        }
        let attempt = |x: &Tensor, channel_major: bool| -> Result<Option<(Tensor, Tensor, Tensor)>> {
            for fused in &epilogues {
                let spec = BatchNormSpec {
                    channel_major,
                    relu: fused.relu,
                    ..spec
                };
                if let Some((y, mean, var)) = x.batch_norm_kernel(&weight, &bias, fused.residual, spec)? {
                    let y = if fused.is_empty() { then.apply(y)? } else { y };
                    return Ok(Some((y, mean, var)));
                }
            }
            Ok(None)
        };
        // A convolution's product comes channel-major: normalised where it lies, no gather,
        // where the backend reads that layout.
        if is_channel_major(self)
            && let Some(out) = attempt(self, true)?
        {
            return Ok(Some(out));
        }
        attempt(&self.contiguous()?, false)
    }

    /// `batch_norm_fused` by the backend's kernel on this tensor's buffer, laid out as `spec`
    /// says, with `residual` added (before the ReLU of `spec.relu`); `None` where the backend has
    /// no kernel for it.
    fn batch_norm_kernel(
        &self,
        weight: &Tensor,
        bias: &Tensor,
        residual: Option<&Tensor>,
        spec: BatchNormSpec,
    ) -> Result<Option<(Tensor, Tensor, Tensor)>> {
        let (x, c) = (self, spec.channels);
        let Some(outputs) = x.backend().batch_norm(
            x.buffer(),
            weight.buffer(),
            bias.buffer(),
            residual.map(Tensor::buffer),
            &spec,
        ) else {
            return Ok(None);
        };
        let [y, mean, var] = outputs?;
        let device = x.device();
        let (mean, var) = (
            Tensor::from_buffer(mean, Shape::new(vec![c]), device),
            Tensor::from_buffer(var, Shape::new(vec![c]), device),
        );
        let y = Tensor::from_buffer(y, x.shape().clone(), device);
        // A fused ReLU's gradient is masked by the output (the next layer keeps it anyway).
        let out = spec.relu.then(|| y.detach());
        let saved = (x.detach(), weight.detach(), mean.clone(), var.clone());
        let with_residual = residual.is_some();
        let mut inputs = vec![x, weight, bias];
        inputs.extend(residual);
        let y = y.track("batch_norm", &inputs, move |g| {
            let (x, weight, mean, var) = &saved;
            // The output's gradient in the output's (the input's) dtype.
            let mut g = g.to_dtype(x.dtype())?.contiguous()?;
            let mut spec = spec;
            let mut out = out.clone();
            if with_residual {
                // The residual's gradient is the ReLU's masked one, which the batch norm's
                // backward pass then takes as it is.
                if let Some(y) = out.take() {
                    g = g.relu_grad(&y)?;
                }
                spec.relu = false;
            }
            let grads = x
                .backend()
                .batch_norm_backward(
                    g.buffer(),
                    x.buffer(),
                    weight.buffer(),
                    [mean.buffer(), var.buffer()],
                    out.as_ref().map(Tensor::buffer),
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
            // The input's gradient laid out as the input.
            let dx = match spec.channel_major {
                true => {
                    let mut dims = x.dims().to_vec();
                    dims.swap(0, 1);
                    let mut order: Vec<usize> = (0..dims.len()).collect();
                    order.swap(0, 1);
                    Tensor::from_buffer(dx, dims, device).permute(&order)?
                }
                false => Tensor::from_buffer(dx, x.shape().clone(), device),
            };
            let mut grads = vec![
                Some(dx),
                Some(Tensor::from_buffer(dweight, Shape::new(vec![c]), device)),
                Some(Tensor::from_buffer(dbias, Shape::new(vec![c]), device)),
            ];
            if with_residual {
                grads.push(Some(g));
            }
            Ok(grads)
        });
        Ok(Some((y, mean, var)))
    }
}

/// Whether `x` `[N, C, …]` is the whole of its buffer laid out `[C, N, …]`, as a convolution's
/// product comes.
fn is_channel_major(x: &Tensor) -> bool {
    let dims = x.dims();
    if dims.len() < 3 {
        return false;
    }
    let inner: usize = dims[2..].iter().product();
    let mut strides = x.shape().contiguous_strides();
    (strides[0], strides[1]) = (inner, dims[0] * inner);
    let layout = x.layout();
    layout.offset == 0 && layout.strides == strides && x.buffer().len() == x.elem_count()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::Device;
    use crate::rng::Generator;
    use crate::tensor::Conv2dOptions;

    /// `[output, grad_x, grad_weight, grad_gamma]` of conv → training batch norm → a weighted sum,
    /// batch norm fed the convolution's output as it comes or gathered to NCHW first.
    fn conv_then_batch_norm(dtype: DType, gathered: bool) -> [Vec<f32>; 4] {
        let cpu = Device::cpu();
        let normal = |dims: &[usize], seed| {
            Tensor::rand_normal(dims.to_vec(), 0.0, 1.0, DType::F32, &Generator::new(seed), &cpu)
                .unwrap()
                .requires_grad(true)
        };
        let (x, w, gamma) = (normal(&[3, 4, 5, 5], 1), normal(&[6, 4, 3, 3], 2), normal(&[6], 3));
        let constant = |value| Tensor::full([6], value, DType::F32, &cpu).unwrap();
        // The running statistics are updated in place: each its own tensor.
        let (beta, mean, var) = (constant(0.5), constant(0.0), constant(1.0));
        let opts = Conv2dOptions {
            padding: [1, 1],
            ..Default::default()
        };
        let product = x
            .to_dtype(dtype)
            .unwrap()
            .conv2d(&w.to_dtype(dtype).unwrap(), None, opts)
            .unwrap();
        assert!(is_channel_major(&product), "the product comes channel-major");
        let product = if gathered {
            product.contiguous().unwrap()
        } else {
            product
        };
        let y = product
            .batch_norm(&mean, &var, Some(&gamma), Some(&beta), true, 0.1, 1e-5)
            .unwrap();
        let y = y.to_dtype(DType::F32).unwrap();
        let weights = normal(y.dims(), 4).detach();
        y.mul(&weights).unwrap().sum_all().unwrap().backward().unwrap();
        let values = |t: &Tensor| t.to_dtype(DType::F32).unwrap().to_vec::<f32>().unwrap();
        [
            values(&y),
            values(&x.grad().unwrap()),
            values(&w.grad().unwrap()),
            values(&gamma.grad().unwrap()),
        ]
    }

    #[test]
    fn a_convolutions_product_is_normalised_where_it_lies() {
        for (dtype, tolerance) in [(DType::F32, 1e-5), (DType::BF16, 2e-2)] {
            let (in_place, gathered) = (conv_then_batch_norm(dtype, false), conv_then_batch_norm(dtype, true));
            for (name, (a, b)) in ["output", "grad x", "grad weight", "grad gamma"]
                .iter()
                .zip(in_place.iter().zip(&gathered))
            {
                assert_eq!(a.len(), b.len());
                for (i, (a, b)) in a.iter().zip(b).enumerate() {
                    assert!(
                        (a - b).abs() <= tolerance * (1.0 + b.abs()),
                        "{dtype:?} {name}[{i}]: {a} vs {b}"
                    );
                }
            }
        }
    }
}
