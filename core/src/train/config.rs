//! What a run does, as the Trainer's flags (Lightning's names where they exist).

use crate::error::{Error, Result};

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum GradientClip {
    /// Rescale all gradients together so their total 2-norm is at most this.
    Norm(f64),
    /// Clamp each gradient element to ±this.
    Value(f64),
}

/// When the learning-rate scheduler steps (Lightning's default is once per epoch).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SchedulerInterval {
    Epoch,
    Step,
}

#[derive(Clone, Debug, PartialEq)]
pub struct TrainerConfig {
    pub max_epochs: u64,
    /// Stop after this many optimizer steps, even mid-epoch.
    pub max_steps: Option<u64>,
    /// Use only the first N batches of each training epoch.
    pub limit_train_batches: Option<usize>,
    /// Optimizer step every K batches; gradients of the K batches are averaged.
    pub accumulate_grad_batches: usize,
    pub gradient_clip: Option<GradientClip>,
    /// Read the loss (a host sync) and emit a step event every N optimizer steps.
    pub log_every_n_steps: u64,
    /// Validate every N epochs (when a validation loader is given).
    pub check_val_every_n_epoch: u64,
    pub scheduler_interval: SchedulerInterval,
    pub seed: u64,
}

impl Default for TrainerConfig {
    fn default() -> Self {
        TrainerConfig {
            max_epochs: 1,
            max_steps: None,
            limit_train_batches: None,
            accumulate_grad_batches: 1,
            gradient_clip: None,
            log_every_n_steps: 50,
            check_val_every_n_epoch: 1,
            scheduler_interval: SchedulerInterval::Epoch,
            seed: 0,
        }
    }
}

impl TrainerConfig {
    /// Refuses settings that cannot run, with the flag's name.
    pub fn validate(&self) -> Result<()> {
        let bad = |msg: &str| Err(Error::invalid("Trainer", msg.to_string()));
        if self.accumulate_grad_batches == 0 {
            return bad("accumulate_grad_batches must be at least 1");
        }
        if self.log_every_n_steps == 0 {
            return bad("log_every_n_steps must be at least 1");
        }
        if self.check_val_every_n_epoch == 0 {
            return bad("check_val_every_n_epoch must be at least 1");
        }
        if self.limit_train_batches == Some(0) {
            return bad("limit_train_batches must be at least 1");
        }
        match self.gradient_clip {
            Some(GradientClip::Norm(v) | GradientClip::Value(v)) if !(v > 0.0 && v.is_finite()) => {
                bad("gradient clipping needs a positive, finite threshold")
            }
            _ => Ok(()),
        }
    }
}
