//! One training step's pieces that every strategy shares: a micro-batch's forward and backward
//! (autocast, loss weighting, loss scaling), and the optimizer step (unscale, clip, step, zero).

use std::time::Instant;

use super::TrainingSetup;
use super::config::{GradientClip, OnNan, Precision, SchedulerInterval, TrainerConfig};
use super::events::StepTimes;
use super::state::TrainerState;
use super::strategy::Strategy;
use crate::autocast::AutocastGuard;
use crate::autograd::no_grad;
use crate::device::Device;
use crate::error::{Error, Result};
use crate::nn::{Module, ModuleExt};
use crate::optim::{
    GradScaler, clip_grad_norm, clip_grad_norm_of_parts, clip_grad_value, grads_finite, non_finite_elements,
};
use crate::tensor::Tensor;

/// One micro-batch of an optimizer step, as the loop hands it to the strategy.
pub struct MicroBatch<'a> {
    /// The batch's tensors (inputs first, then targets), on the host's chosen device.
    pub tensors: &'a [Tensor],
    /// The factor on this micro-batch's loss: 1/K over K accumulated micro-batches.
    pub weight: f64,
    /// The run's precision: the forward pass autocasts to its dtype.
    pub precision: Precision,
    /// The loss scaler of a `16-mixed` run.
    pub scaler: Option<&'a GradScaler>,
    /// Whether this micro-batch ends the optimizer step: only then do gradients communicate
    /// (DDP's `no_sync` on the others).
    pub ends_step: bool,
}

impl<'a> MicroBatch<'a> {
    /// `tensors` as a whole step in full precision (weight 1, no loss scaling): for driving a
    /// strategy directly, in benchmarks and tests.
    pub fn whole(tensors: &'a [Tensor]) -> MicroBatch<'a> {
        MicroBatch {
            tensors,
            weight: 1.0,
            precision: Precision::Full,
            scaler: None,
            ends_step: true,
        }
    }

    /// Samples in this micro-batch (the first tensor's leading dimension).
    pub fn samples(&self) -> u64 {
        self.tensors
            .first()
            .map_or(0, |t| t.dims().first().copied().unwrap_or(1)) as u64
    }
}

/// The forward pass in mixed precision (backward runs outside the autocast region), the loss
/// times `weight` and the scaler's scale, then backward. Returns the loss as computed (not
/// weighted), detached.
pub(crate) fn forward_backward(
    setup: &TrainingSetup,
    micro: &MicroBatch<'_>,
    weight: f64,
    times: &mut StepTimes,
) -> Result<Tensor> {
    let phase = Instant::now();
    let loss = {
        let _autocast = micro.precision.autocast_dtype().map(AutocastGuard::new).transpose()?;
        // The weights' low-precision copies in one launch per device, not one each (those the
        // last step lowered).
        crate::autocast::prefetch(&setup.model.parameters())?;
        setup.task.loss(setup.model.as_ref(), micro.tensors)?
    };
    let mut scaled = if weight != 1.0 {
        loss.affine(weight, 0.0)?
    } else {
        loss.clone()
    };
    if let Some(scaler) = micro.scaler {
        scaled = scaler.scale_loss(&scaled)?;
    }
    times.forward += phase.elapsed().as_secs_f64();
    let phase = Instant::now();
    scaled.backward()?;
    times.backward += phase.elapsed().as_secs_f64();
    Ok(loss.detach())
}

/// Unscale (mixed precision), clip, step (unless a gradient is inf/NaN), zero the gradients,
/// advance the per-step scheduler; false when the step was skipped. Where `strategy` shards the
/// gradients (ZeRO stage 2, pipeline stages in processes) each worker holds only its share, so
/// the verdict on inf/NaN and the clipping norm are totalled over the workers; a tied weight's
/// copies count once in the norm.
pub fn optimizer_step(
    config: &TrainerConfig,
    state: &mut TrainerState,
    setup: &mut TrainingSetup,
    strategy: &dyn Strategy,
) -> Result<bool> {
    let sharded = strategy.gradients_sharded();
    let total = |part: &Tensor| strategy.sum_over_gradient_shards(setup, part);
    let copies = strategy.tied_copies(setup)?;
    let params = setup.optimizer.parameters();
    // Unscaled once per optimizer step, before clipping; with DDP the gradients are already
    // averaged, so every rank reaches the same verdict.
    let mut finite = match &state.grad_scaler {
        Some(scaler) => scaler.unscale(params)?,
        None if config.on_nan == OnNan::Skip => grads_finite(params)?,
        None => true,
    };
    if sharded && (state.grad_scaler.is_some() || config.on_nan == OnNan::Skip) {
        let poisoned = Tensor::from_slice(&[f32::from(u8::from(!finite))], [1], &setup.device)?;
        finite = total(&poisoned)?.item()? == 0.0;
    }
    if let Some(scaler) = &mut state.grad_scaler {
        scaler.update(finite);
    }
    if finite {
        no_grad(|| -> Result<()> {
            match config.gradient_clip {
                Some(GradientClip::Norm(max)) if sharded || !copies.is_empty() => {
                    let counted: Vec<Tensor> = params
                        .iter()
                        .filter(|p| !copies.iter().any(|c| c.id() == p.id()))
                        .cloned()
                        .collect();
                    clip_grad_norm_of_parts(params, &counted, max, &total)?;
                }
                Some(GradientClip::Norm(max)) => {
                    clip_grad_norm(params, max)?;
                }
                Some(GradientClip::Value(v)) => clip_grad_value(params, v)?,
                None => {}
            }
            Ok(())
        })?;
        no_grad(|| setup.optimizer.step())?;
    } else {
        state.skipped_steps += 1;
    }
    setup.optimizer.zero_grad();
    state.global_step += 1;
    if config.scheduler_interval == SchedulerInterval::Step
        && let Some(s) = setup.scheduler.as_mut()
    {
        s.step(setup.optimizer.as_mut());
    }
    Ok(finite)
}

/// Refuses ZeRO where there are no data-parallel replicas to partition over, naming what has
/// them.
pub fn check_no_zero(config: &TrainerConfig, strategy: &str) -> Result<()> {
    if config.zero.is_none() {
        return Ok(());
    }
    Err(Error::invalid(
        "ZeRO",
        format!(
            "{strategy} does not partition its optimizer over replicas yet: ZeRO (--zero) is for data parallel (--devices)"
        ),
    ))
}

/// Refuses a replica check where there are no replicas to compare, naming what has them.
pub fn check_no_replica_check(config: &TrainerConfig, strategy: &str) -> Result<()> {
    if config.replica_check.is_none() {
        return Ok(());
    }
    Err(Error::invalid(
        "replica check",
        format!(
            "{strategy} has no replicas to compare: the check (--check-replicas-every) is for data parallel (--devices, a launcher, or replicas of a pipeline)"
        ),
    ))
}

/// An error unless `device` can compute in `precision`'s autocast dtype.
pub fn check_precision(precision: Precision, device: &Device) -> Result<()> {
    let Some(dtype) = precision.autocast_dtype() else {
        return Ok(());
    };
    device.backend().zeros(dtype, 1).map(drop).map_err(|e| {
        Error::invalid(
            "Trainer",
            format!(
                "precision {} needs {dtype} on {device}: {e}; choose another precision (32, 16-mixed, bf16-mixed)",
                precision.name()
            ),
        )
    })
}

/// An error that says where the loss became inf or NaN, which parameter went first, and what
/// to do.
pub fn check_finite(loss: f64, state: &TrainerState, setup: &TrainingSetup) -> Result<()> {
    if loss.is_finite() {
        return Ok(());
    }
    let parameter = match first_non_finite_parameter(setup.model.as_ref())? {
        Some(name) => format!("the first parameter no longer finite is `{name}`"),
        None => "every parameter is still finite (look at the data and the loss)".into(),
    };
    Err(Error::invalid(
        "Trainer",
        format!(
            "the loss became {loss} at step {} (epoch {}, batch {}); {parameter}: training diverged; lower the \
             learning rate, enable gradient clipping (--clip-grad-norm), skip such steps (--on-nan skip), or check \
             the data for NaN/inf",
            state.global_step, state.epoch, state.batch_in_epoch
        ),
    ))
}

/// The name of the model's first parameter, in registration order, holding an inf or NaN.
fn first_non_finite_parameter(model: &dyn Module) -> Result<Option<String>> {
    for (name, p) in model.named_parameters() {
        if non_finite_elements(&[p])? > 0 {
            return Ok(Some(name));
        }
    }
    Ok(None)
}
