//! Neural-network operations: softmax, convolution, pooling, normalisation, dropout and losses.
//! Convolution and average pooling are built on the backend's im2col/col2im and matmul.

use super::{Epilogue, Tensor};
use crate::backend::{Conv2dGeometry, Pool2dGeometry, RunningStatsSpec, UnaryOp};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::rng::{Generator, StreamPlace};
use crate::shape::Shape;

/// Stride, zero padding, dilation and groups of a 2-D convolution (per axis `[h, w]`), as `torch.nn.functional.conv2d`.
/// The default is stride 1, no padding, dilation 1, one group.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Conv2dOptions {
    /// Step between windows, `[h, w]`.
    pub stride: [usize; 2],
    /// Zeros added on each side, `[h, w]`.
    pub padding: [usize; 2],
    /// Spacing between kernel taps, `[h, w]` (1 is a dense kernel).
    pub dilation: [usize; 2],
    /// Number of channel groups; input and output channels must both divide by it.
    pub groups: usize,
}

impl Default for Conv2dOptions {
    fn default() -> Self {
        Conv2dOptions {
            stride: [1, 1],
            padding: [0, 0],
            dilation: [1, 1],
            groups: 1,
        }
    }
}

/// Window geometry of a 2-D pooling, per axis `[h, w]`; [`Pool2dOptions::new`] gives PyTorch's defaults.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pool2dOptions {
    /// Window size, `[h, w]`.
    pub kernel: [usize; 2],
    /// Step between windows, `[h, w]`.
    pub stride: [usize; 2],
    /// Padding on each side, `[h, w]`: `-inf` for max pooling, zeros counted in the mean for average pooling.
    pub padding: [usize; 2],
}

impl Pool2dOptions {
    /// PyTorch's default: stride equal to the kernel, no padding.
    pub fn new(kernel: usize) -> Self {
        Pool2dOptions {
            kernel: [kernel; 2],
            stride: [kernel; 2],
            padding: [0, 0],
        }
    }
}

impl Tensor {
    /// Moves `axis` last and returns (contiguous tensor, rows, cols, permutation used).
    fn last_axis_rows(&self, op: &'static str, axis: isize) -> Result<(Tensor, usize, usize, Option<Vec<usize>>)> {
        self.float_only(op)?;
        let a = self.shape().axis(op, axis)?;
        let last = self.rank().saturating_sub(1);
        let (moved, perm) = if a == last {
            (self.contiguous()?, None)
        } else {
            let mut perm: Vec<usize> = (0..self.rank()).collect();
            perm.swap(a, last);
            (self.permute(&perm)?.contiguous()?, Some(perm))
        };
        let cols = self.dims().get(a).copied().unwrap_or(1);
        Ok((moved, self.elem_count() / cols.max(1), cols, perm))
    }

    fn rowwise(&self, axis: isize, log: bool) -> Result<Tensor> {
        let op = if log { "log_softmax" } else { "softmax" };
        let (x, rows, cols, perm) = self.last_axis_rows(op, axis)?;
        let backend = x.backend();
        let buffer = if log {
            backend.log_softmax_last(x.buffer(), rows, cols)?
        } else {
            backend.softmax_last(x.buffer(), rows, cols)?
        };
        let out = Tensor::from_buffer(buffer, x.shape().clone(), x.device());
        let y = out.detach();
        let out = out.track(op, &[&x], move |g| {
            let last = -1;
            if log {
                // d log_softmax: g - softmax * sum(g)
                return Ok(vec![Some(g.sub(&y.exp()?.mul(&g.sum(&[last], true)?)?)?)]);
            }
            // d softmax: y * (g - sum(g * y)), one backend pass (attention's largest tensor).
            let g = g.contiguous()?;
            let dx = g.backend().softmax_last_backward(g.buffer(), y.buffer(), rows, cols)?;
            Ok(vec![Some(Tensor::from_buffer(dx, g.shape().clone(), g.device()))])
        });
        match perm {
            Some(p) => out.permute(&p),
            None => Ok(out),
        }
    }

    /// Softmax along `axis` (negative counts from the end), as `torch.softmax`; f16/bf16 run in f32 under autocast.
    pub fn softmax(&self, axis: isize) -> Result<Tensor> {
        crate::autocast::full(self)?.rowwise(axis, false)
    }
    /// Log-softmax along `axis` (negative counts from the end), as `torch.log_softmax`; computed in f32 under autocast.
    pub fn log_softmax(&self, axis: isize) -> Result<Tensor> {
        crate::autocast::full(self)?.rowwise(axis, true)
    }

    pub(super) fn nchw(&self, op: &'static str) -> Result<[usize; 4]> {
        match *self.dims() {
            [n, c, h, w] => Ok([n, c, h, w]),
            _ => Err(Error::invalid(
                op,
                format!("expects an [N, C, H, W] input, got shape {}", self.shape()),
            )),
        }
    }

    /// Unfolds image patches into columns `[c*kh*kw, n*oh*ow]` (differentiable; col2im is its adjoint).
    pub fn im2col(&self, geom: Conv2dGeometry) -> Result<Tensor> {
        self.float_only("im2col")?;
        geom.validate("im2col")?;
        // Fix: the geometry must describe this tensor, not just its element count.
        let expected = [geom.n, geom.c, geom.h, geom.w];
        if self.dims() != expected {
            return Err(Error::shape(
                "im2col",
                self.shape(),
                &Shape::new(expected),
                "the input does not match the geometry's [n, c, h, w]",
            ));
        }
        let x = self.contiguous()?;
        let buffer = x.backend().im2col(x.buffer(), &geom)?;
        let out = Tensor::from_buffer(
            buffer,
            [geom.c * geom.kh * geom.kw, geom.n * geom.out_h() * geom.out_w()],
            x.device(),
        );
        Ok(out.track("im2col", &[&x], move |g| Ok(vec![Some(g.col2im(geom)?)])))
    }

    /// Folds columns back into images, summing overlaps (differentiable; im2col is its adjoint).
    pub fn col2im(&self, geom: Conv2dGeometry) -> Result<Tensor> {
        self.float_only("col2im")?;
        geom.validate("col2im")?;
        let expected = [geom.c * geom.kh * geom.kw, geom.n * geom.out_h() * geom.out_w()];
        if self.dims() != expected {
            return Err(Error::shape(
                "col2im",
                self.shape(),
                &Shape::new(expected),
                "columns do not match the geometry",
            ));
        }
        let cols = self.contiguous()?;
        let buffer = cols.backend().col2im(cols.buffer(), &geom)?;
        let out = Tensor::from_buffer(buffer, [geom.n, geom.c, geom.h, geom.w], cols.device());
        Ok(out.track("col2im", &[&cols], move |g| Ok(vec![Some(g.im2col(geom)?)])))
    }

    /// 2-D convolution (cross-correlation, as PyTorch): input `[n, c, h, w]`, weight
    /// `[out, c/groups, kh, kw]`, optional bias `[out]`.
    pub fn conv2d(&self, weight: &Tensor, bias: Option<&Tensor>, opts: Conv2dOptions) -> Result<Tensor> {
        self.conv2d_act(weight, bias, opts, None)
    }

    /// `conv2d` followed by the activation `act`, with bias and activation applied in one pass
    /// over the GEMM's output (`bias_act`).
    pub fn conv2d_act(
        &self,
        weight: &Tensor,
        bias: Option<&Tensor>,
        opts: Conv2dOptions,
        act: Option<UnaryOp>,
    ) -> Result<Tensor> {
        // A convolution is a product: its input, weight and bias go low under autocast.
        let operands: Vec<&Tensor> = [self, weight].into_iter().chain(bias).collect();
        if let Some(low) = crate::autocast::recast(&operands, crate::autocast::lower)? {
            return low[0].conv2d_act(&low[1], low.get(2), opts, act);
        }
        // Fix: check devices and dtypes here, so errors name conv2d rather than an inner op.
        self.float_only("conv2d")?;
        self.same_device("conv2d", weight)?;
        self.same_dtype("conv2d", weight)?;
        if let Some(b) = bias {
            self.same_device("conv2d", b)?;
        }
        let [n, c, h, w] = self.nchw("conv2d")?;
        let [o, cg, kh, kw] = weight.nchw("conv2d (weight)")?;
        let g = opts.groups;
        if g == 0 || c % g != 0 || o % g != 0 || cg != c / g {
            return Err(Error::shape(
                "conv2d",
                self.shape(),
                weight.shape(),
                format!(
                    "with groups={g}, input channels ({c}) and output channels ({o}) must divide by groups and the weight must have {} input channels",
                    c / g.max(1)
                ),
            ));
        }
        let geom = Conv2dGeometry {
            n,
            c,
            h,
            w,
            kh,
            kw,
            stride: opts.stride,
            padding: opts.padding,
            dilation: opts.dilation,
        };
        geom.validate("conv2d")?;
        if let Some(b) = bias
            && b.dims() != [o]
        {
            return Err(Error::shape(
                "conv2d",
                b.shape(),
                weight.shape(),
                format!("bias must have shape [{o}]"),
            ));
        }
        // Bias and activation along the channel axis of whichever layout the product has.
        let finish = |out: Tensor, channel_axis: usize| match (bias, act) {
            (Some(b), _) => out.bias_act(b, channel_axis, act),
            (None, Some(op)) => out.unary(op),
            (None, None) => Ok(out),
        };
        // A backend's convolution library (cuDNN) takes NCHW straight to NCHW.
        if g == 1
            && let Some(out) = super::conv_product::conv_nchw(self, weight, geom)?
        {
            return finish(out, 1);
        }
        // Else one GEMM per group over the whole batch: [o/g, cg*kh*kw] @ [cg*kh*kw, n*oh*ow],
        // bias and activation on its [o, n*oh*ow] output. The batch moves first in a view: an op
        // that needs NCHW gathers it, batch norm reads it where it lies.
        let (oh, ow) = (geom.out_h(), geom.out_w());
        let flat = finish(super::conv_product::conv_product(self, weight, geom, g)?, 0)?;
        flat.reshape([o, n, oh, ow])?.permute(&[1, 0, 2, 3])
    }

    /// Max pooling over `[n, c, h, w]` windows.
    pub fn max_pool2d(&self, opts: Pool2dOptions) -> Result<Tensor> {
        self.float_only("max_pool2d")?;
        let [n, c, h, w] = self.nchw("max_pool2d")?;
        let geom = Pool2dGeometry {
            n,
            c,
            h,
            w,
            kernel: opts.kernel,
            stride: opts.stride,
            padding: opts.padding,
        };
        geom.validate("max_pool2d")?;
        let x = self.contiguous()?;
        let (values, indices) = x.backend().max_pool2d(x.buffer(), &geom)?;
        let (oh, ow) = (geom.out_h(), geom.out_w());
        let out = Tensor::from_buffer(values, [n, c, oh, ow], x.device());
        let indices = Tensor::from_buffer(indices, [n * c, oh * ow], x.device());
        Ok(out.track("max_pool2d", &[&x], move |g| {
            let g = g.contiguous()?;
            let grad = g.backend().max_pool2d_backward(g.buffer(), indices.buffer(), &geom)?;
            Ok(vec![Some(Tensor::from_buffer(grad, [n, c, h, w], g.device()))])
        }))
    }

    /// Average pooling (padding counts as zeros in the average, PyTorch's default).
    pub fn avg_pool2d(&self, opts: Pool2dOptions) -> Result<Tensor> {
        let [n, c, h, w] = self.nchw("avg_pool2d")?;
        let geom = Pool2dGeometry {
            n,
            c,
            h,
            w,
            kernel: opts.kernel,
            stride: opts.stride,
            padding: opts.padding,
        };
        geom.validate("avg_pool2d")?;
        let planes = Conv2dGeometry {
            n: n * c,
            c: 1,
            ..geom.as_conv()
        };
        // Columns are [kh*kw, n*c*oh*ow]: averaging over the taps leaves the outputs in NCHW order.
        self.reshape([n * c, 1, h, w])?
            .im2col(planes)?
            .mean(&[0], false)?
            .reshape([n, c, geom.out_h(), geom.out_w()])
    }

    /// Batch normalisation over axis 1 of `[n, c]` or `[n, c, h, w]`. In training, normalises with
    /// the batch statistics (biased variance) and updates the running statistics in place with
    /// the unbiased variance and `momentum`; in evaluation, uses the running statistics.
    #[allow(clippy::too_many_arguments)]
    pub fn batch_norm(
        &self,
        running_mean: &Tensor,
        running_var: &Tensor,
        weight: Option<&Tensor>,
        bias: Option<&Tensor>,
        training: bool,
        momentum: f64,
        eps: f64,
    ) -> Result<Tensor> {
        let running = Running {
            mean: running_mean,
            var: running_var,
            batches: None,
            momentum,
        };
        if training {
            return self.batch_norm_local(&running, weight, bias, eps, Epilogue::default());
        }
        self.batch_norm_with(&running, weight, bias, None, eps)
    }

    /// `batch_norm` whose training statistics come from `stats` (None: evaluation, which uses the
    /// running statistics). SyncBatchNorm passes statistics gathered across replicas; the input
    /// checks, autocast widening, running-statistics update and normalisation stay shared.
    pub(crate) fn batch_norm_with(
        &self,
        running: &Running<'_>,
        weight: Option<&Tensor>,
        bias: Option<&Tensor>,
        stats: Option<&BatchStatsFn<'_>>,
        eps: f64,
    ) -> Result<Tensor> {
        if crate::autocast::active().is_some() && matches!(self.dtype(), DType::F16 | DType::BF16) {
            // Computed in f32 (its statistics and parameters are f32); the result keeps the
            // input's dtype, as PyTorch's autocast (batch norm is not on its f32 list).
            let y = crate::autocast::full(self)?.batch_norm_with(running, weight, bias, stats, eps)?;
            return y.to_dtype(self.dtype());
        }
        self.float_only("batch_norm")?;
        if self.rank() < 2 {
            return Err(Error::invalid(
                "batch_norm",
                format!("expects [N, C, …], got shape {}", self.shape()),
            ));
        }
        let c = self.dims()[1];
        let mut bshape = vec![1; self.rank()];
        bshape[1] = c;
        let axes: Vec<isize> = (0..self.rank() as isize).filter(|&a| a != 1).collect();
        let (mean, var) = match stats {
            Some(stats) => {
                let BatchStats { mean, var, count } = stats(self, &axes)?;
                if count <= 1 {
                    return Err(Error::invalid(
                        "batch_norm",
                        format!(
                            "expected more than 1 value per channel when training, got {count} (input of shape {})",
                            self.shape()
                        ),
                    ));
                }
                update_running_stats(running, &mean, &var, count)?;
                (mean, var)
            }
            None => (
                running.mean.reshape(bshape.clone())?,
                running.var.reshape(bshape.clone())?,
            ),
        };
        let mut y = self.sub(&mean)?.div(&var.add_scalar(eps)?.sqrt()?)?;
        if let Some(w) = weight {
            y = y.mul(&w.reshape(bshape.clone())?)?;
        }
        if let Some(b) = bias {
            y = y.add(&b.reshape(bshape)?)?;
        }
        Ok(y)
    }

    /// Zeroes each element with probability `p` and scales the rest by `1/(1-p)` when training.
    pub fn dropout(&self, p: f64, training: bool, generator: &Generator) -> Result<Tensor> {
        if !(0.0..=1.0).contains(&p) {
            return Err(Error::invalid(
                "dropout",
                format!("probability must be in [0, 1], got {p}"),
            ));
        }
        if !training || p == 0.0 {
            return Ok(self.clone());
        }
        if p == 1.0 {
            return self.mul_scalar(0.0);
        }
        self.float_only("dropout")?;
        // One backend pass each way: the mask is a function of (seed, counter, index), drawn
        // again for the gradient instead of stored (as `rand_uniform` would draw it).
        let x = self.contiguous()?;
        let len = x.elem_count();
        let seed = generator.seed();
        let place = generator.reserve(len, x.dims().first().copied().unwrap_or(1));
        if place.skip > 0 {
            return x.dropout_unaligned(p, seed, place);
        }
        let counter = place.counter;
        let buffer = x.backend().dropout(x.buffer(), len, p, seed, counter)?;
        let out = Tensor::from_buffer(buffer, x.shape().clone(), x.device());
        Ok(out.track("dropout", &[&x], move |g| {
            let g = g.contiguous()?;
            let dx = g.backend().dropout(g.buffer(), len, p, seed, counter)?;
            Ok(vec![Some(Tensor::from_buffer(dx, g.shape().clone(), g.device()))])
        }))
    }

    /// `dropout` of a replica's samples whose part of the global batch's stream starts inside a
    /// Philox block (`place.skip` > 0), which the backends' kernels cannot start at: the mask is
    /// drawn from the block's start on a tensor of ones, cut to the samples, and multiplied in.
    fn dropout_unaligned(&self, p: f64, seed: u64, place: StreamPlace) -> Result<Tensor> {
        let len = self.elem_count() + place.skip;
        let ones = Tensor::ones([len], self.dtype(), self.device())?;
        let scaled = ones.backend().dropout(ones.buffer(), len, p, seed, place.counter)?;
        let mask = Tensor::from_buffer(scaled, [len], self.device())
            .narrow(0, place.skip, self.elem_count())?
            .reshape(self.shape().clone())?;
        self.mul(&mask)
    }

    /// Mean squared error.
    pub fn mse_loss(&self, target: &Tensor) -> Result<Tensor> {
        if let Some(wide) = crate::autocast::recast(&[self, target], crate::autocast::full)? {
            return wide[0].mse_loss(&wide[1]);
        }
        if self.shape() != target.shape() {
            return Err(Error::shape(
                "mse_loss",
                self.shape(),
                target.shape(),
                "prediction and target must have one shape",
            ));
        }
        let d = self.sub(target)?;
        d.mul(&d)?.mean_all()
    }
}

/// Per-channel statistics of a training batch, shaped `[1, C, 1, …]` to broadcast over it.
pub(crate) struct BatchStats {
    pub mean: Tensor,
    /// Biased (divided by `count`), as normalisation uses it.
    pub var: Tensor,
    /// Values per channel the statistics cover (over every replica for SyncBatchNorm).
    pub count: usize,
}

/// Computes `BatchStats` of an input over the given axes (every axis but 1).
pub(crate) type BatchStatsFn<'a> = dyn Fn(&Tensor, &[isize]) -> Result<BatchStats> + 'a;

/// The statistics of this batch alone (plain BatchNorm).
pub(crate) fn local_batch_stats(x: &Tensor, axes: &[isize]) -> Result<BatchStats> {
    let count = x.elem_count() / x.dims()[1].max(1);
    let mean = x.mean(axes, true)?;
    let centered = x.sub(&mean)?;
    let var = centered.mul(&centered)?.mean(axes, true)?;
    Ok(BatchStats { mean, var, count })
}

/// The running statistics a training batch norm blends each batch into, in place, and the count
/// of those batches (a layer's `num_batches_tracked`; the functional `Tensor::batch_norm` keeps
/// none).
pub(crate) struct Running<'a> {
    pub mean: &'a Tensor,
    pub var: &'a Tensor,
    pub batches: Option<&'a Tensor>,
    /// Weight of each new batch, in [0, 1].
    pub momentum: f64,
}

/// `running = (1 - momentum) * running + momentum * batch`, in place and outside the graph, with
/// the unbiased variance (`count / (count - 1)`) as PyTorch keeps it, and the batch counted. One
/// backend pass where the backend has it, else element ops; never a read-back.
pub(super) fn update_running_stats(running: &Running<'_>, mean: &Tensor, var: &Tensor, count: usize) -> Result<()> {
    if crate::autograd::is_recomputing() {
        // A checkpoint's recompute: the first forward already blended and counted this batch.
        return Ok(());
    }
    let c = mean.elem_count();
    crate::autograd::no_grad(|| -> Result<()> {
        let (mean, var) = (mean.reshape([c])?.contiguous()?, var.reshape([c])?.contiguous()?);
        if update_in_one_pass(running, &mean, &var, count)? {
            return Ok(());
        }
        let momentum = running.momentum;
        let unbiased = var.affine(count as f64 / (count - 1) as f64, 0.0)?;
        running.mean.assign(
            &running
                .mean
                .affine(1.0 - momentum, 0.0)?
                .add(&mean.affine(momentum, 0.0)?)?,
        )?;
        running.var.assign(
            &running
                .var
                .affine(1.0 - momentum, 0.0)?
                .add(&unbiased.affine(momentum, 0.0)?)?,
        )?;
        match running.batches {
            Some(batches) => count_batch(batches),
            None => Ok(()),
        }
    })
}

/// `update_running_stats` by the backend's `batch_norm_running`, where every operand is a whole
/// buffer of its own on one device (f32 statistics, an I64 count) and the backend has the
/// kernel; false where it does nothing and the caller composes.
fn update_in_one_pass(running: &Running<'_>, mean: &Tensor, var: &Tensor, count: usize) -> Result<bool> {
    let whole = |t: &Tensor| t.is_contiguous() && t.layout().offset == 0 && t.buffer().len() == t.elem_count();
    let f32_channels =
        |t: &Tensor| t.dtype() == DType::F32 && t.elem_count() == mean.elem_count() && t.device() == mean.device();
    let stats_apply = [running.mean, running.var, mean, var]
        .iter()
        .all(|t| f32_channels(t) && whole(t));
    let count_applies = running
        .batches
        .is_none_or(|b| b.dtype() == DType::I64 && b.elem_count() == 1 && whole(b) && b.device() == mean.device());
    let distinct = !running.mean.same_storage(running.var)
        && running
            .batches
            .is_none_or(|b| !b.same_storage(running.mean) && !b.same_storage(running.var));
    if !(stats_apply && count_applies && distinct && count > 1) {
        return Ok(false);
    }
    let spec = RunningStatsSpec {
        channels: mean.elem_count(),
        count,
        momentum: running.momentum,
    };
    let done = mean.backend().batch_norm_running(
        [running.mean.buffer(), running.var.buffer()],
        [mean.buffer(), var.buffer()],
        running.batches.map(Tensor::buffer),
        &spec,
    );
    done.transpose().map(|done| done.is_some())
}

/// `batches += 1` for an I64 count, in element ops: tensor arithmetic is float-only, so the count
/// goes through f64 (exact to 2^53), or f32 (exact to 2^24 batches) on a backend without f64.
fn count_batch(batches: &Tensor) -> Result<()> {
    let wide = batches.to_dtype(DType::F64).or_else(|_| batches.to_dtype(DType::F32))?;
    batches.assign(&wide.add_scalar(1.0)?.to_dtype(batches.dtype())?)
}
