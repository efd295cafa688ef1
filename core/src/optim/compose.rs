//! Combining schedules: one after another at milestones (PyTorch's `SequentialLR`) or applied
//! together (PyTorch's `ChainedScheduler`).

use super::lr_scheduler::LrSchedule;
use crate::error::{Error, Result};

/// Runs `schedules[i]` from `milestones[i-1]` on, each restarting its own count at its milestone.
#[derive(Debug)]
pub struct SequentialLR {
    schedules: Vec<Box<dyn LrSchedule>>,
    /// Non-decreasing, one fewer than the schedules.
    milestones: Vec<u64>,
}

impl SequentialLR {
    /// Runs `schedules[0]` until `milestones[0]`, then each next one from its milestone; needs one
    /// milestone fewer than schedules, in non-decreasing order.
    pub fn new(schedules: Vec<Box<dyn LrSchedule>>, milestones: &[u64]) -> Result<Self> {
        if schedules.is_empty() || milestones.len() + 1 != schedules.len() {
            return Err(Error::invalid(
                "SequentialLR",
                format!(
                    "needs at least one schedule and one milestone fewer than schedules, got {} schedules and {} milestones",
                    schedules.len(),
                    milestones.len()
                ),
            ));
        }
        if milestones.windows(2).any(|w| w[0] > w[1]) {
            return Err(Error::invalid(
                "SequentialLR",
                format!("milestones must be in increasing order, got {milestones:?}"),
            ));
        }
        Ok(SequentialLR {
            schedules,
            milestones: milestones.to_vec(),
        })
    }
}

impl LrSchedule for SequentialLR {
    fn lr_at(&self, base_lr: f64, step: u64) -> f64 {
        let idx = self.milestones.partition_point(|&m| m <= step);
        let start = if idx == 0 { 0 } else { self.milestones[idx - 1] };
        self.schedules[idx].lr_at(base_lr, step - start)
    }
}

/// Applies every schedule at each step, each to the rate the previous one produced: for the
/// multiplicative schedules (step, multi-step, linear, cosine to 0) the factors multiply.
#[derive(Debug)]
pub struct ChainedLR {
    schedules: Vec<Box<dyn LrSchedule>>,
}

impl ChainedLR {
    /// Applies all of `schedules` (at least one) at every step, in order.
    pub fn new(schedules: Vec<Box<dyn LrSchedule>>) -> Result<Self> {
        if schedules.is_empty() {
            return Err(Error::invalid("ChainedLR", "needs at least one schedule"));
        }
        Ok(ChainedLR { schedules })
    }
}

impl LrSchedule for ChainedLR {
    fn lr_at(&self, base_lr: f64, step: u64) -> f64 {
        self.schedules.iter().fold(base_lr, |lr, s| s.lr_at(lr, step))
    }
}
