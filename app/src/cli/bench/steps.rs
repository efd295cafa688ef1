//! Whole training steps on one fixed batch (zero_grad, forward and loss under the precision's
//! autocast, backward, optional clipping, optimizer step, the loss read back), timed in each
//! precision asked for: what `bench resnet` and `bench gpt` share, and what the peer repeats.

use lockstep_core::autocast::AutocastGuard;
use lockstep_core::optim::{Optimizer, clip_grad_norm};
use lockstep_core::train::Precision;
use lockstep_core::{Device, Tensor};
use serde::{Deserialize, Serialize};

use super::timing::Timing;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StepResult {
    pub precision: String,
    pub batch: usize,
    pub steps: usize,
    pub median_step_s: f64,
    /// Images (ResNet) or tokens (GPT) trained on per second.
    pub items_per_s: f64,
    pub final_loss: f64,
    /// The process's peak resident memory after this precision's steps (both sides measure it
    /// the same way; it only grows, so the last row is the run's peak).
    #[serde(default)]
    pub peak_rss_bytes: Option<u64>,
}

/// How one model is stepped: its loss on the fixed batch, its optimizer, and the gradient norm
/// to clip to (with the parameters), if any.
pub struct Steps<'a> {
    pub loss: Box<dyn FnMut() -> lockstep_core::Result<Tensor> + 'a>,
    pub optimizer: &'a mut dyn Optimizer,
    pub clip: Option<(Vec<Tensor>, f64)>,
    pub batch: usize,
    /// Images or tokens in one step's batch.
    pub items_per_step: usize,
}

/// One result per precision (`32` or `bf16-mixed`; 16-mixed would need a loss scaler).
pub fn measure(
    device: &Device,
    timing: &Timing,
    precisions: &[String],
    mut steps: Steps,
) -> anyhow::Result<Vec<StepResult>> {
    precisions
        .iter()
        .map(|name| {
            let precision = Precision::parse(name)?;
            anyhow::ensure!(
                precision != Precision::Mixed16,
                "the model benchmarks measure 32 and bf16-mixed (16-mixed needs a loss scaler)"
            );
            let mut final_loss = f64::NAN;
            let m = timing.measure(|| {
                steps.optimizer.zero_grad();
                let loss = {
                    let _autocast = precision.autocast_dtype().map(AutocastGuard::new).transpose()?;
                    (steps.loss)()?
                };
                loss.backward()?;
                if let Some((params, max_norm)) = &steps.clip {
                    clip_grad_norm(params, *max_norm, 2.0)?;
                }
                steps.optimizer.step()?;
                final_loss = loss.item()?;
                device.synchronize()?;
                Ok(())
            })?;
            // The next precision's buffers have other dtypes: the kept ones would only add to
            // its peak (PyTorch's CPU allocator keeps nothing).
            device.empty_cache()?;
            Ok(StepResult {
                precision: name.clone(),
                batch: steps.batch,
                steps: m.reps,
                median_step_s: m.median_s,
                items_per_s: steps.items_per_step as f64 / m.median_s,
                final_loss,
                peak_rss_bytes: super::machine::peak_rss_bytes(),
            })
        })
        .collect()
}
