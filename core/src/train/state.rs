//! The trainer's position in a run: everything besides tensors that exact resume needs.

use serde::{Deserialize, Serialize};

/// Where a run stands, as Lightning's loop state: stored as JSON in every checkpoint so
/// `Trainer::resume` continues at the same batch.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct TrainerState {
    /// The epoch in progress (0-based).
    pub epoch: u64,
    /// Batches of `epoch` already consumed (the sampler position).
    pub batch_in_epoch: u64,
    /// Optimizer steps taken.
    pub global_step: u64,
    /// Sum and count of the current epoch's batch losses so far.
    pub epoch_loss_sum: f64,
    /// Micro-batches whose losses `epoch_loss_sum` holds.
    pub epoch_loss_count: u64,
    /// Training samples this worker has consumed over the whole run (its shard, in data parallel).
    pub samples_seen: u64,
    /// (seed, counter) of each registered random stream, in registration order.
    pub generators: Vec<(u64, u64)>,
    /// (base_lr, last_epoch) of the learning-rate scheduler.
    pub scheduler: Option<(f64, u64)>,
    /// Callback state by callback name (best scores, patience counters, kept checkpoints).
    pub callbacks: std::collections::BTreeMap<String, serde_json::Value>,
    /// The loss scaler of a `16-mixed` run (absent from older checkpoints).
    #[serde(default)]
    pub grad_scaler: Option<crate::optim::GradScaler>,
    /// Optimizer steps skipped because a gradient was inf or NaN.
    #[serde(default)]
    pub skipped_steps: u64,
    /// A balanced run's shares of the global batch, by rank, so a resumed run goes on with the
    /// split it had measured (empty for unbalanced runs and older checkpoints).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub shares: Vec<usize>,
    /// The settings that decide the run's trajectory, which a resumed run must share (absent
    /// from older checkpoints, and before the first `fit`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run: Option<super::resume_check::RunSettings>,
}
