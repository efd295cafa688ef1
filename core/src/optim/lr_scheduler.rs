//! Learning-rate scheduling in closed form: the rate is a function of the step count alone, so
//! resuming needs only (base_lr, last_epoch). The values equal PyTorch's schedulers'.

use std::fmt::Debug;

use super::optimizer::Optimizer;
use crate::error::{Error, Result};

/// A schedule: the learning rate after `step` scheduler steps, starting from `base_lr`
/// (PyTorch's `_get_closed_form_lr` with `last_epoch = step`).
pub trait LrSchedule: Send + Sync + Debug {
    /// The learning rate after `step` scheduler steps from `base_lr` (step 0 is the rate at the
    /// start).
    fn lr_at(&self, base_lr: f64, step: u64) -> f64;
}

impl LrSchedule for Box<dyn LrSchedule> {
    fn lr_at(&self, base_lr: f64, step: u64) -> f64 {
        (**self).lr_at(base_lr, step)
    }
}

/// What a checkpoint needs to resume a scheduler (PyTorch's `base_lrs` and `last_epoch`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SchedulerState {
    /// The optimizer's rate when the scheduler was made (PyTorch's `base_lrs[0]`).
    pub base_lr: f64,
    /// Scheduler steps taken (PyTorch's `last_epoch`: optimizer steps or epochs, whichever it is
    /// stepped by).
    pub last_epoch: u64,
}

/// Drives an optimizer's learning rate along a schedule: call `step` once per optimizer step
/// (or per epoch), after `optimizer.step()`, as in PyTorch.
#[derive(Debug)]
pub struct LrScheduler {
    schedule: Box<dyn LrSchedule>,
    base_lr: f64,
    last_epoch: u64,
}

impl LrScheduler {
    /// Takes the optimizer's current rate as the base and applies step 0 (so a warm-up starts
    /// low at once), as constructing a PyTorch scheduler does.
    pub fn new(schedule: impl LrSchedule + 'static, optimizer: &mut dyn Optimizer) -> Self {
        let scheduler = LrScheduler {
            schedule: Box::new(schedule),
            base_lr: optimizer.lr(),
            last_epoch: 0,
        };
        optimizer.set_lr(scheduler.get_last_lr());
        scheduler
    }
    /// Advances one step and sets the optimizer's rate.
    pub fn step(&mut self, optimizer: &mut dyn Optimizer) {
        self.last_epoch += 1;
        optimizer.set_lr(self.get_last_lr());
    }
    /// The rate the last step set.
    pub fn get_last_lr(&self) -> f64 {
        self.schedule.lr_at(self.base_lr, self.last_epoch)
    }
    /// Scheduler steps taken so far (PyTorch's `last_epoch`).
    pub fn last_epoch(&self) -> u64 {
        self.last_epoch
    }
    /// The rate the schedule scales: the optimizer's rate when this scheduler was made.
    pub fn base_lr(&self) -> f64 {
        self.base_lr
    }
    /// The schedule's type and values as they print (`StepLR { step_size: 2, gamma: 0.5 }`):
    /// what a resumed run's schedule is compared by.
    pub fn describe(&self) -> String {
        format!("{:?}", self.schedule)
    }
    /// What a checkpoint keeps to resume this scheduler with `load_state`.
    pub fn state(&self) -> SchedulerState {
        SchedulerState {
            base_lr: self.base_lr,
            last_epoch: self.last_epoch,
        }
    }
    /// Resumes at `state` and sets the optimizer's rate to match.
    pub fn load_state(&mut self, state: SchedulerState, optimizer: &mut dyn Optimizer) -> Result<()> {
        if !state.base_lr.is_finite() || state.base_lr < 0.0 {
            return Err(Error::invalid(
                "LrScheduler",
                format!("base_lr must be a non-negative number, got {}", state.base_lr),
            ));
        }
        self.base_lr = state.base_lr;
        self.last_epoch = state.last_epoch;
        optimizer.set_lr(self.get_last_lr());
        Ok(())
    }
}
