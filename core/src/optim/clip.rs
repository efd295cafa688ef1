//! Gradient clipping with PyTorch's semantics. Norm clipping never reads a value back: the
//! coefficient is computed on the device and every gradient is always multiplied by it. The
//! 2-norm's squares and the scaling are multi-tensor backend calls, one per device.

use super::by_device::by_device;
use super::scaled_grads::scale_grads;
use crate::autograd::no_grad;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::shape::Shape;
use crate::tensor::Tensor;

/// PyTorch's guard against dividing by a zero norm in `clip_grad_norm_`.
const NORM_EPS: f64 = 1e-6;

/// The gradients that exist (PyTorch skips parameters whose `.grad` is None).
fn grads(params: &[Tensor]) -> Vec<Tensor> {
    params.iter().filter_map(Tensor::grad).collect()
}

/// Replaces each existing gradient with `f(grad)`, not in place (see `scale_grads` for why).
fn map_grads(params: &[Tensor], f: impl Fn(&Tensor) -> Result<Tensor>) -> Result<()> {
    no_grad(|| {
        for p in params {
            if let Some(g) = p.grad() {
                p.set_grad(Some(f(&g)?));
            }
        }
        Ok(())
    })
}

/// One gradient's contribution: `max |g|` for the infinity norm, else `sum |g|^p`.
fn partial(g: &Tensor, norm_type: f64) -> Result<Tensor> {
    if g.elem_count() == 0 {
        return Tensor::zeros(Shape::scalar(), g.dtype(), g.device());
    }
    if norm_type.is_infinite() {
        g.abs()?.reshape([g.elem_count()])?.max(0, false)
    } else if norm_type == 2.0 {
        g.mul(g)?.sum_all()
    } else {
        g.abs()?.powf(norm_type)?.sum_all()
    }
}

/// The `norm_type`-norm of all gradients of `params` taken together (PyTorch's
/// `get_total_norm`), as a scalar tensor on the first gradient's device and dtype; zero when no
/// parameter has a gradient. `norm_type` is a positive number or `f64::INFINITY`.
pub fn grad_norm(params: &[Tensor], norm_type: f64) -> Result<Tensor> {
    let total = sum_of_powers(params, norm_type)?;
    root(total, norm_type)
}

/// Before the root: `max |g|` (infinity norm) or `sum |g|^p` over every gradient of `params`.
fn sum_of_powers(params: &[Tensor], norm_type: f64) -> Result<Tensor> {
    if norm_type.is_nan() || norm_type <= 0.0 {
        return Err(Error::invalid(
            "grad_norm",
            format!("norm_type must be positive or infinity, got {norm_type}"),
        ));
    }
    no_grad(|| {
        let grads = grads(params);
        let Some(first) = grads.first() else {
            let device = params
                .first()
                .map_or_else(crate::device::Device::cpu, |p| p.device().clone());
            return Tensor::zeros(Shape::scalar(), DType::F32, &device);
        };
        if norm_type == 2.0 {
            return sum_of_squares(&grads)?.to_dtype(first.dtype());
        }
        let mut total: Option<Tensor> = None;
        for g in &grads {
            // Model-parallel gradients live on several devices: bring each partial to the first.
            let part = partial(g, norm_type)?
                .to_device(first.device())?
                .to_dtype(first.dtype())?;
            total = Some(match total {
                None => part,
                Some(t) if norm_type.is_infinite() => t.maximum(&part)?,
                Some(t) => t.add(&part)?,
            });
        }
        total.ok_or_else(|| Error::invalid("grad_norm", "no gradients"))
    })
}

/// `sum g^2` over every gradient of `grads` (not empty): one `sum_of_squares` call per device
/// (a launch or two, not several per gradient), the devices' sums added on the first
/// gradient's device in f32 (f64 where a gradient is f64).
fn sum_of_squares(grads: &[Tensor]) -> Result<Tensor> {
    let dense = grads.iter().map(Tensor::contiguous).collect::<Result<Vec<_>>>()?;
    let home = grads[0].device();
    let mut total: Option<Tensor> = None;
    for (device, bufs) in by_device(dense.iter().map(|g| (g.device().clone(), g.buffer()))) {
        let sum = device.backend().sum_of_squares(&bufs)?;
        let part = Tensor::from_buffer(sum, Shape::scalar(), &device).to_device(home)?;
        total = Some(match total {
            None => part,
            Some(t) if t.dtype() == part.dtype() => t.add(&part)?,
            Some(t) => t.to_dtype(DType::F64)?.add(&part.to_dtype(DType::F64)?)?,
        });
    }
    total.ok_or_else(|| Error::invalid("grad_norm", "no gradients"))
}

/// The norm from `sum_of_powers`' total.
fn root(total: Tensor, norm_type: f64) -> Result<Tensor> {
    no_grad(|| {
        if norm_type.is_infinite() {
            Ok(total)
        } else if norm_type == 2.0 {
            total.sqrt()
        } else {
            total.powf(1.0 / norm_type)
        }
    })
}

/// Scales all gradients of `params` by `min(1, max_norm / (total_norm + 1e-6))` (each `.grad`
/// is replaced), the total norm being the 2-norm, and returns it before clipping, as PyTorch's
/// `clip_grad_norm_(params, max_norm)` with its default `norm_type=2.0`, without a host sync.
/// [`clip_grad_norm_with_type`] takes another norm.
pub fn clip_grad_norm(params: &[Tensor], max_norm: f64) -> Result<Tensor> {
    clip_grad_norm_with_type(params, max_norm, 2.0)
}

/// [`clip_grad_norm`] with the `norm_type`-norm: a positive number or `f64::INFINITY`
/// (PyTorch's `clip_grad_norm_(params, max_norm, norm_type)`).
pub fn clip_grad_norm_with_type(params: &[Tensor], max_norm: f64, norm_type: f64) -> Result<Tensor> {
    check_max_norm(max_norm)?;
    let total = grad_norm(params, norm_type)?;
    scale_to(params, max_norm, total)
}

/// [`clip_grad_norm`] where each rank holds the gradients of only its share of the parameters
/// (ZeRO stage 2): `total_over_ranks` sums this rank's part of the squared norm (an f32 scalar)
/// with every other rank's, so each scales its gradients by the one global coefficient.
pub fn clip_grad_norm_of_shards(
    params: &[Tensor],
    max_norm: f64,
    total_over_ranks: &dyn Fn(&Tensor) -> Result<Tensor>,
) -> Result<Tensor> {
    clip_grad_norm_of_parts(params, params, max_norm, total_over_ranks)
}

/// [`clip_grad_norm_of_shards`] whose norm counts the gradients of `counted` alone (`params`
/// less the copies of a weight that another of them holds, as a pipeline's tied embedding on
/// its last stage) and scales those of every one of `params`.
pub fn clip_grad_norm_of_parts(
    params: &[Tensor],
    counted: &[Tensor],
    max_norm: f64,
    total_over_ranks: &dyn Fn(&Tensor) -> Result<Tensor>,
) -> Result<Tensor> {
    check_max_norm(max_norm)?;
    let mine = no_grad(|| sum_of_powers(counted, 2.0)?.to_dtype(DType::F32))?;
    let total = root(total_over_ranks(&mine)?, 2.0)?;
    scale_to(params, max_norm, total)
}

fn check_max_norm(max_norm: f64) -> Result<()> {
    if max_norm.is_nan() || max_norm < 0.0 {
        return Err(Error::invalid(
            "clip_grad_norm",
            format!("max_norm must be non-negative, got {max_norm}"),
        ));
    }
    Ok(())
}

/// Scales every gradient by `min(1, max_norm / (total + 1e-6))`; returns `total`. Each
/// `.grad` is replaced (see `scale_grads`).
fn scale_to(params: &[Tensor], max_norm: f64, total: Tensor) -> Result<Tensor> {
    let coef = no_grad(|| {
        let max = Tensor::full(Shape::scalar(), max_norm, total.dtype(), total.device())?;
        max.div(&total.add_scalar(NORM_EPS)?)?.clamp_max(1.0)
    })?;
    scale_grads(params, &coef)?;
    Ok(total)
}

/// Clamps every gradient element of `params` to `[-clip_value, clip_value]` (each `.grad` is
/// replaced), as PyTorch's `clip_grad_value_`.
pub fn clip_grad_value(params: &[Tensor], clip_value: f64) -> Result<()> {
    if clip_value.is_nan() || clip_value < 0.0 {
        return Err(Error::invalid(
            "clip_grad_value",
            format!("clip_value must be non-negative, got {clip_value}"),
        ));
    }
    map_grads(params, |g| g.clamp(-clip_value, clip_value))
}
