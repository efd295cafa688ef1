//! Optimizers (fused, in-place updates on the parameters' device), learning-rate schedules and
//! gradient clipping, with PyTorch's semantics.

mod adam;
mod by_device;
mod clip;
mod compose;
mod grad_scaler;
mod lr_scheduler;
mod optimizer;
mod scaled_grads;
mod schedules;
mod sgd;
mod state_reader;

pub use adam::{Adam, AdamConfig};
pub use clip::{
    clip_grad_norm, clip_grad_norm_of_parts, clip_grad_norm_of_shards, clip_grad_norm_with_type, clip_grad_value,
    grad_norm,
};
pub use compose::{ChainedLR, SequentialLR};
pub use grad_scaler::{GradScaler, grads_finite, non_finite_elements};
pub use lr_scheduler::{LrSchedule, LrScheduler, SchedulerState};
pub use optimizer::{DecayScope, Optimizer, OptimizerState, zero_grad};
pub use schedules::{CosineAnnealingLR, LinearLR, MultiStepLR, StepLR};
pub use sgd::{Sgd, SgdConfig};
