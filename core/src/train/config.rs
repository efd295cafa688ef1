//! What a run does, as the Trainer's flags (Lightning's names where they exist).

use crate::dtype::DType;
use crate::error::{Error, Result};

/// How gradients are clipped before each optimizer step, after unscaling (Lightning's
/// `gradient_clip_algorithm` with `gradient_clip_val`).
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
    /// Once after each epoch, after validation (the default).
    Epoch,
    /// After every optimizer step (Lightning's `interval: "step"`): for warm-ups and per-iteration
    /// schedules.
    Step,
}

/// Numeric precision of training, with Lightning's names: `32`, `16-mixed`, `bf16-mixed`.
/// Mixed precision autocasts the forward pass (products in f16/bf16, reductions and losses in
/// f32) while parameters and optimizer state stay f32; `16-mixed` also scales the loss.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Precision {
    /// `32`: everything in f32 (Lightning's `32-true`).
    #[default]
    Full,
    /// `16-mixed`: autocast to f16, with a dynamic `GradScaler` on the loss.
    Mixed16,
    /// `bf16-mixed`: autocast to bf16; no loss scaling, as bf16 has f32's range.
    MixedBf16,
}

impl Precision {
    /// Reads Lightning's spellings `32`/`32-true`, `16-mixed`/`16` and `bf16-mixed`/`bf16`;
    /// anything else is an error listing them.
    pub fn parse(s: &str) -> Result<Precision> {
        match s {
            "32" | "32-true" => Ok(Precision::Full),
            "16-mixed" | "16" => Ok(Precision::Mixed16),
            "bf16-mixed" | "bf16" => Ok(Precision::MixedBf16),
            other => Err(Error::invalid(
                "precision",
                format!("`{other}` is not one of 32, 16-mixed, bf16-mixed"),
            )),
        }
    }
    /// The canonical Lightning spelling (`32`, `16-mixed`, `bf16-mixed`), which `parse` reads back.
    pub fn name(self) -> &'static str {
        match self {
            Precision::Full => "32",
            Precision::Mixed16 => "16-mixed",
            Precision::MixedBf16 => "bf16-mixed",
        }
    }
    /// The dtype the forward pass autocasts products to.
    pub fn autocast_dtype(self) -> Option<DType> {
        match self {
            Precision::Full => None,
            Precision::Mixed16 => Some(DType::F16),
            Precision::MixedBf16 => Some(DType::BF16),
        }
    }
}

/// What a step whose loss or gradients are inf or NaN does (mixed precision's loss scaler
/// skips such steps whatever this says, as PyTorch's `GradScaler` does).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum OnNan {
    /// The run stops with an error naming the step, the batch and the first parameter that is
    /// no longer finite; checked when a step is logged (`log_every_n_steps`), so it costs nothing
    /// between.
    #[default]
    Stop,
    /// The step is skipped (its gradients dropped, the weights untouched) and counted in
    /// `FitReport::skipped_steps`; every step's gradients are checked, one device read each.
    Skip,
}

/// What the Trainer prints while it runs (Lightning's `enable_progress_bar`), through
/// `ConsoleProgress` on stderr; needs the `console` feature, on by default.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Progress {
    /// A bar over the run's steps with the loss and throughput (where stderr is a terminal),
    /// and a line per epoch and checkpoint.
    #[default]
    Bar,
    /// Only the lines: for logs and headless runs.
    Lines,
    /// Nothing; for replicas other than rank 0, and for callers with their own listeners.
    Off,
}

/// How the Trainer runs a fit: epochs, steps, accumulation, clipping, logging, precision.
///
/// There is no seed here, unlike Lightning's `seed_everything`: Lockstep has no global random
/// state. Every random stream is made from a seed the caller passes where the stream is made
/// (`Generator::new(seed)` for initialisation and each Dropout, the samplers' seed for
/// shuffling, `DataParallel::on_threads(..).shuffle(true, seed)`), and checkpoints store each
/// stream's position, so a run is reproduced and resumed exactly without a process-wide seed.
#[derive(Clone, Debug, PartialEq)]
pub struct TrainerConfig {
    /// Epochs to train in all, counting those a resumed run already did (default 1).
    pub max_epochs: u64,
    /// Stop after this many optimizer steps, even mid-epoch.
    pub max_steps: Option<u64>,
    /// Use only the first N batches of each training epoch.
    pub limit_train_batches: Option<usize>,
    /// Optimizer step every K batches; gradients of the K batches are averaged.
    pub accumulate_grad_batches: usize,
    /// Clips gradients before each optimizer step; `None` (the default) leaves them as they are.
    pub gradient_clip: Option<GradientClip>,
    /// Read the loss (a host sync) and emit a step event every N optimizer steps.
    pub log_every_n_steps: u64,
    /// Validate every N epochs (when a validation loader is given).
    pub check_val_every_n_epoch: u64,
    /// When the setup's scheduler steps: once per epoch (the default) or once per optimizer step.
    pub scheduler_interval: SchedulerInterval,
    /// Numeric precision (Lightning's `precision` flag); f32 by default.
    pub precision: Precision,
    /// The loss scaler a `16-mixed` run starts with (None: PyTorch's defaults).
    pub grad_scaler: Option<crate::optim::GradScaler>,
    /// What the run prints to the terminal (default: a step bar and a line per epoch).
    pub progress: Progress,
    /// What a step with an inf or NaN loss or gradient does (default: stop the run).
    pub on_nan: OnNan,
    /// Data parallel: compare the replicas' parameters bit for bit every N steps and stop or
    /// re-broadcast rank 0's where they drifted apart (devices of different vendors round
    /// differently); `None` (the default) never checks.
    pub replica_check: Option<crate::distributed::ReplicaCheck>,
    /// Settings a resumed run may change on purpose. `fit` after `Trainer::resume` refuses a
    /// run whose schedule, precision, accumulation, global batch, world size or seeds differ
    /// from the checkpoint's, naming each difference, unless it is listed here (empty by
    /// default; `ResumeSetting::ALL` accepts every change).
    pub resume_overrides: Vec<super::ResumeSetting>,
    /// Data parallel: partition the optimizer state (stage 1) and the averaged gradients
    /// (stage 2) over the replicas, as DeepSpeed's ZeRO; the weights end as without it. `None`
    /// (the default) replicates everything. One device trains as without it.
    pub zero: Option<crate::distributed::ZeroStage>,
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
            precision: Precision::Full,
            grad_scaler: None,
            progress: Progress::Bar,
            on_nan: OnNan::Stop,
            replica_check: None,
            resume_overrides: Vec::new(),
            zero: None,
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
        if self.replica_check.is_some_and(|c| c.every_n_steps == 0) {
            return bad("replica_check.every_n_steps must be at least 1");
        }
        match self.gradient_clip {
            Some(GradientClip::Norm(v) | GradientClip::Value(v)) if !(v > 0.0 && v.is_finite()) => {
                bad("gradient clipping needs a positive, finite threshold")
            }
            _ => Ok(()),
        }
    }
}
