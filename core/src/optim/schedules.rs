//! PyTorch's learning-rate schedules in their closed forms (`_get_closed_form_lr`).

use super::lr_scheduler::LrSchedule;
use crate::error::{Error, Result};

/// Multiplies the rate by `gamma` every `step_size` steps.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StepLR {
    step_size: u64,
    gamma: f64,
}

impl StepLR {
    /// Multiplies the rate by `gamma` (finite) every `step_size` steps (at least 1).
    pub fn new(step_size: u64, gamma: f64) -> Result<Self> {
        if step_size == 0 || !gamma.is_finite() {
            return Err(Error::invalid(
                "StepLR",
                format!("step_size must be at least 1 and gamma finite, got {step_size} and {gamma}"),
            ));
        }
        Ok(StepLR { step_size, gamma })
    }
}

impl LrSchedule for StepLR {
    fn lr_at(&self, base_lr: f64, step: u64) -> f64 {
        base_lr * self.gamma.powf((step / self.step_size) as f64)
    }
}

/// Multiplies the rate by `gamma` at each milestone (a milestone listed twice counts twice).
#[derive(Clone, Debug, PartialEq)]
pub struct MultiStepLR {
    /// Sorted.
    milestones: Vec<u64>,
    gamma: f64,
}

impl MultiStepLR {
    /// Multiplies the rate by `gamma` (finite) at each of `milestones`, given in any order.
    pub fn new(milestones: &[u64], gamma: f64) -> Result<Self> {
        if !gamma.is_finite() {
            return Err(Error::invalid(
                "MultiStepLR",
                format!("gamma must be finite, got {gamma}"),
            ));
        }
        let mut milestones = milestones.to_vec();
        milestones.sort_unstable();
        Ok(MultiStepLR { milestones, gamma })
    }
}

impl LrSchedule for MultiStepLR {
    fn lr_at(&self, base_lr: f64, step: u64) -> f64 {
        // bisect_right: milestones at or before `step`.
        let passed = self.milestones.partition_point(|&m| m <= step);
        base_lr * self.gamma.powf(passed as f64)
    }
}

/// Half a cosine from the base rate down to `eta_min` over `t_max` steps (and back up after,
/// as PyTorch's formula continues).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CosineAnnealingLR {
    t_max: u64,
    eta_min: f64,
}

impl CosineAnnealingLR {
    /// Anneals from the base rate to `eta_min` (non-negative) over `t_max` steps (PyTorch's
    /// `T_max`, at least 1).
    pub fn new(t_max: u64, eta_min: f64) -> Result<Self> {
        if t_max == 0 || eta_min.is_nan() || eta_min < 0.0 {
            return Err(Error::invalid(
                "CosineAnnealingLR",
                format!("T_max must be at least 1 and eta_min non-negative, got {t_max} and {eta_min}"),
            ));
        }
        Ok(CosineAnnealingLR { t_max, eta_min })
    }
}

impl LrSchedule for CosineAnnealingLR {
    fn lr_at(&self, base_lr: f64, step: u64) -> f64 {
        let phase = std::f64::consts::PI * step as f64 / self.t_max as f64;
        self.eta_min + (base_lr - self.eta_min) * (1.0 + phase.cos()) / 2.0
    }
}

/// Moves the factor on the base rate linearly from `start_factor` to `end_factor` over
/// `total_iters` steps, then holds it: a linear warm-up with `end_factor` 1.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LinearLR {
    start_factor: f64,
    end_factor: f64,
    total_iters: u64,
}

impl LinearLR {
    /// PyTorch's checks: start_factor in (0, 1], end_factor in [0, 1], total_iters at least 1.
    pub fn new(start_factor: f64, end_factor: f64, total_iters: u64) -> Result<Self> {
        if start_factor.is_nan()
            || start_factor <= 0.0
            || start_factor > 1.0
            || !(0.0..=1.0).contains(&end_factor)
            || total_iters == 0
        {
            return Err(Error::invalid(
                "LinearLR",
                format!(
                    "needs start_factor in (0, 1], end_factor in [0, 1] and total_iters >= 1, got {start_factor}, {end_factor}, {total_iters}"
                ),
            ));
        }
        Ok(LinearLR {
            start_factor,
            end_factor,
            total_iters,
        })
    }
    /// A warm-up from `start_factor` times the base rate to the full rate over `total_iters` steps.
    pub fn warmup(start_factor: f64, total_iters: u64) -> Result<Self> {
        LinearLR::new(start_factor, 1.0, total_iters)
    }
}

impl LrSchedule for LinearLR {
    fn lr_at(&self, base_lr: f64, step: u64) -> f64 {
        let done = step.min(self.total_iters) as f64 / self.total_iters as f64;
        base_lr * (self.start_factor + (self.end_factor - self.start_factor) * done)
    }
}
