//! Callbacks: model checkpointing (last, best by a monitored metric, top k), early stopping
//! and a learning-rate monitor. They see the epoch's metrics and may ask the trainer to save.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::numbered_checkpoints::{Keep, NumberedCheckpoints};
use crate::error::{Error, Result};

/// What a callback hook asks of the trainer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CallbackAction {
    /// Go on training.
    Continue,
    /// Stop training, as setting Lightning's `trainer.should_stop`; data-parallel replicas stop
    /// together.
    Stop,
}

/// What a callback sees: where the run is, the metrics so far, and a way to save a checkpoint.
pub struct CallbackContext<'a> {
    /// The epoch that just ended (`on_epoch_end`) or is running (the other hooks), from 0.
    pub epoch: u64,
    /// Optimizer steps taken so far, the step a checkpoint saved now resumes after.
    pub global_step: u64,
    /// `train_loss`, `val_loss`, `val_acc`, … of the epoch that just ended.
    pub metrics: &'a mut BTreeMap<String, f64>,
    pub(super) saver: &'a mut dyn FnMut(&Path, &str) -> Result<()>,
}

impl CallbackContext<'_> {
    /// Writes a training checkpoint of the current state to `path`; a `Checkpoint` event with
    /// `reason` follows once the hook returns.
    pub fn save_checkpoint(&mut self, path: &Path, reason: &str) -> Result<()> {
        (self.saver)(path, reason)
    }
}

/// Lightning's callbacks: hooks at epoch and step ends and at the end of training, with state
/// kept in checkpoints. `AsAny` lets `Trainer::callback::<T>()` hand one back after `fit`.
pub trait Callback: crate::nn::AsAny + Send {
    /// A stable name: the key of this callback's state in checkpoints.
    fn name(&self) -> String;
    /// After each epoch's validation (or training, without a validation loader).
    fn on_epoch_end(&mut self, _ctx: &mut CallbackContext) -> Result<CallbackAction> {
        Ok(CallbackAction::Continue)
    }
    /// After each optimizer step.
    fn on_train_step_end(&mut self, _ctx: &mut CallbackContext) -> Result<CallbackAction> {
        Ok(CallbackAction::Continue)
    }
    /// When fitting ends for any reason (finished, max steps, early stop, user stop).
    fn on_train_end(&mut self, _ctx: &mut CallbackContext) -> Result<()> {
        Ok(())
    }
    /// This callback's state to keep in checkpoints (Lightning's `state_dict`); `Null` for none.
    fn state(&self) -> serde_json::Value {
        serde_json::Value::Null
    }
    /// Restores what `state` returned, on `Trainer::resume` (Lightning's `load_state_dict`).
    fn load_state(&mut self, _state: &serde_json::Value) -> Result<()> {
        Ok(())
    }
}

/// A metric to watch and whether lower or higher is better.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Monitor {
    /// The key in `CallbackContext::metrics`, e.g. `val_loss`, `val_acc` or `train_loss`.
    pub metric: String,
    /// True for Lightning's `mode="max"`, false for `mode="min"`.
    pub higher_is_better: bool,
}

impl Monitor {
    /// Watches `metric`, lower being better (Lightning's `mode="min"`, e.g. for a loss).
    pub fn min(metric: &str) -> Monitor {
        Monitor {
            metric: metric.into(),
            higher_is_better: false,
        }
    }
    /// Watches `metric`, higher being better (Lightning's `mode="max"`, e.g. for an accuracy).
    pub fn max(metric: &str) -> Monitor {
        Monitor {
            metric: metric.into(),
            higher_is_better: true,
        }
    }
    fn better(&self, a: f64, b: f64) -> bool {
        if self.higher_is_better { a > b } else { a < b }
    }
    fn read(&self, metrics: &BTreeMap<String, f64>) -> Result<f64> {
        metrics.get(&self.metric).copied().ok_or_else(|| {
            let known: Vec<&str> = metrics.keys().map(String::as_str).collect();
            Error::invalid(
                "callback",
                format!(
                    "monitored metric `{}` is not logged; available: {}",
                    self.metric,
                    known.join(", ")
                ),
            )
        })
    }
}

/// Saves `last.safetensors` at each epoch end and when training ends, every N steps if asked,
/// the `top_k` best checkpoints by a monitored metric, and step- or epoch-numbered checkpoints
/// when asked (`keep_numbered`); older ones are deleted only after the new one is safely written.
pub struct ModelCheckpoint {
    /// The directory the checkpoints go to (created when first written).
    pub dir: PathBuf,
    /// Keep `last.safetensors` current at every epoch end and when training ends (Lightning's
    /// `save_last`); default true.
    pub save_last: bool,
    /// The metric that ranks the top-k checkpoints; `None` (the default) saves none.
    pub monitor: Option<Monitor>,
    /// How many of the best checkpoints to keep (Lightning's `save_top_k`); 0 keeps none.
    pub top_k: usize,
    /// Also overwrite `last.safetensors` every N optimizer steps (Lightning's
    /// `every_n_train_steps`), and write a numbered checkpoint there under `keep_numbered`.
    pub every_n_train_steps: Option<u64>,
    /// Write a numbered checkpoint every N epoch ends under `keep_numbered` (Lightning's
    /// `every_n_epochs`); `None`: every epoch unless `every_n_train_steps` sets the pace.
    pub every_n_epochs: Option<u64>,
    /// Keep `epoch=E-step=S.safetensors` checkpoints, all or the last K (Lightning's
    /// `save_top_k=-1` without a monitor); `None` (the default) writes none.
    pub keep_numbered: Option<Keep>,
    /// What a checkpoint that cannot be written (a full disk, a vanished directory) does.
    pub on_write_error: OnWriteError,
    failed_writes: u64,
    kept: Vec<(f64, PathBuf)>,
    numbered: NumberedCheckpoints,
    /// The step of the last epoch-end save: training that ends right there (nothing changed
    /// since) need not write `last.safetensors` again.
    epoch_end_step: Option<u64>,
}

/// What `ModelCheckpoint` does when a write fails; the file it was replacing stays whole
/// either way (writes go to a temporary file that is renamed over it).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum OnWriteError {
    /// The run ends with the error.
    #[default]
    Stop,
    /// A warning on stderr, the failure counted (`ModelCheckpoint::failed_writes`), and
    /// training goes on.
    Warn,
}

#[derive(Serialize, Deserialize)]
struct CheckpointState {
    kept: Vec<(f64, PathBuf)>,
    /// Absent from checkpoints older than numbered saves.
    #[serde(default)]
    numbered: NumberedCheckpoints,
}

impl ModelCheckpoint {
    /// Saves `last.safetensors` in `dir` at every epoch end: no monitor, no step saves.
    pub fn new(dir: impl Into<PathBuf>) -> ModelCheckpoint {
        let dir = dir.into();
        // What killed writers of an earlier run left there (see `write_atomically`).
        super::checkpoint::remove_stale_temporaries(&dir);
        ModelCheckpoint {
            dir,
            save_last: true,
            monitor: None,
            top_k: 1,
            every_n_train_steps: None,
            every_n_epochs: None,
            keep_numbered: None,
            on_write_error: OnWriteError::Stop,
            failed_writes: 0,
            kept: Vec::new(),
            numbered: NumberedCheckpoints::default(),
            epoch_end_step: None,
        }
    }
    /// Also keeps the `top_k` best checkpoints by `monitor`, each named
    /// `epoch=E-step=S-METRIC=SCORE.safetensors`.
    pub fn monitor(self, monitor: Monitor, top_k: usize) -> ModelCheckpoint {
        ModelCheckpoint {
            monitor: Some(monitor),
            top_k,
            ..self
        }
    }
    /// Also writes `last.safetensors` every `n` optimizer steps (0 never).
    pub fn every_n_train_steps(self, n: u64) -> ModelCheckpoint {
        ModelCheckpoint {
            every_n_train_steps: Some(n),
            ..self
        }
    }
    /// Also writes a numbered checkpoint every `n` epoch ends (0 never) under `keep_numbered`.
    pub fn every_n_epochs(self, n: u64) -> ModelCheckpoint {
        ModelCheckpoint {
            every_n_epochs: Some(n),
            ..self
        }
    }
    /// Keeps `epoch=E-step=S.safetensors` checkpoints, every one (`Keep::All`, Lightning's
    /// `save_top_k=-1`) or the newest K, written every `every_n_train_steps` steps and every
    /// `every_n_epochs` epochs (every epoch when neither is set), besides `last.safetensors`.
    pub fn keep_numbered(self, keep: Keep) -> ModelCheckpoint {
        ModelCheckpoint {
            keep_numbered: Some(keep),
            ..self
        }
    }
    /// The numbered checkpoints kept so far, oldest first.
    pub fn numbered(&self) -> &[PathBuf] {
        self.numbered.files()
    }
    /// Writes the numbered checkpoint of `ctx`'s epoch and step, if numbered ones are kept.
    fn save_numbered(&mut self, ctx: &mut CallbackContext, reason: &str) -> Result<()> {
        let Some(keep) = self.keep_numbered else {
            return Ok(());
        };
        let path = NumberedCheckpoints::path(&self.dir, ctx.epoch, ctx.global_step);
        if self.save(ctx, &path, reason)? {
            self.numbered.written(path, keep);
        }
        Ok(())
    }
    /// Whether the epoch that just ended (`epoch`, from 0) gets a numbered checkpoint.
    fn numbers_epoch(&self, epoch: u64) -> bool {
        let every = match (self.every_n_epochs, self.every_n_train_steps) {
            (Some(n), _) => n,
            (None, Some(_)) => 0,
            (None, None) => 1,
        };
        every > 0 && (epoch + 1).is_multiple_of(every)
    }
    /// Whether a failed write ends the run (the default) or only warns.
    pub fn on_write_error(self, on_write_error: OnWriteError) -> ModelCheckpoint {
        ModelCheckpoint { on_write_error, ..self }
    }
    /// Writes that failed and were let pass (`OnWriteError::Warn`).
    pub fn failed_writes(&self) -> u64 {
        self.failed_writes
    }
    /// Saves through `ctx`; true when the file was written. A failure ends the run or, under
    /// `OnWriteError::Warn`, is reported and counted.
    fn save(&mut self, ctx: &mut CallbackContext, path: &Path, reason: &str) -> Result<bool> {
        match ctx.save_checkpoint(path, reason) {
            Ok(()) => Ok(true),
            Err(e) if self.on_write_error == OnWriteError::Warn => {
                self.failed_writes += 1;
                eprintln!("warning: checkpoint not written, training goes on: {e}");
                Ok(false)
            }
            Err(e) => Err(Error::invalid(
                "ModelCheckpoint",
                format!(
                    "{e}; the previous checkpoint is intact. Free space or fix the directory, then resume from it \
                     (or --on-checkpoint-error warn to train on without checkpoints)"
                ),
            )),
        }
    }
    /// Where the last checkpoint goes: `dir/last.safetensors`.
    pub fn last_path(&self) -> PathBuf {
        self.dir.join("last.safetensors")
    }
    /// The best checkpoint so far with its score.
    pub fn best(&self) -> Option<(f64, &Path)> {
        self.kept.first().map(|(s, p)| (*s, p.as_path()))
    }
}

impl Callback for ModelCheckpoint {
    fn name(&self) -> String {
        "ModelCheckpoint".into()
    }
    fn on_epoch_end(&mut self, ctx: &mut CallbackContext) -> Result<CallbackAction> {
        if self.save_last && self.save(ctx, &self.last_path(), "last")? {
            self.epoch_end_step = Some(ctx.global_step);
        }
        if self.numbers_epoch(ctx.epoch) {
            self.save_numbered(ctx, "every_n_epochs")?;
        }
        let Some(monitor) = self.monitor.clone() else {
            return Ok(CallbackAction::Continue);
        };
        let score = monitor.read(ctx.metrics)?;
        let qualifies =
            self.kept.len() < self.top_k || self.kept.last().is_some_and(|(worst, _)| monitor.better(score, *worst));
        if self.top_k == 0 || !qualifies || !score.is_finite() {
            return Ok(CallbackAction::Continue);
        }
        let path = self.dir.join(format!(
            "epoch={}-step={}-{}={score:.4}.safetensors",
            ctx.epoch, ctx.global_step, monitor.metric
        ));
        if !self.save(ctx, &path, &format!("top-{} {}", self.top_k, monitor.metric))? {
            return Ok(CallbackAction::Continue);
        }
        self.kept.push((score, path));
        self.kept.sort_by(|a, b| {
            if monitor.better(a.0, b.0) {
                std::cmp::Ordering::Less
            } else {
                std::cmp::Ordering::Greater
            }
        });
        while self.kept.len() > self.top_k {
            if let Some((_, evicted)) = self.kept.pop() {
                let _ = std::fs::remove_file(evicted);
            }
        }
        Ok(CallbackAction::Continue)
    }
    fn on_train_step_end(&mut self, ctx: &mut CallbackContext) -> Result<CallbackAction> {
        if self
            .every_n_train_steps
            .is_some_and(|n| n > 0 && ctx.global_step.is_multiple_of(n))
        {
            self.save(ctx, &self.last_path(), "every_n_train_steps")?;
            self.save_numbered(ctx, "every_n_train_steps")?;
        }
        Ok(CallbackAction::Continue)
    }
    fn on_train_end(&mut self, ctx: &mut CallbackContext) -> Result<()> {
        if self.save_last && self.epoch_end_step != Some(ctx.global_step) {
            self.save(ctx, &self.last_path(), "last")?;
        }
        Ok(())
    }
    fn state(&self) -> serde_json::Value {
        serde_json::to_value(CheckpointState {
            kept: self.kept.clone(),
            numbered: self.numbered.clone(),
        })
        .unwrap_or_default()
    }
    fn load_state(&mut self, state: &serde_json::Value) -> Result<()> {
        if state.is_null() {
            return Ok(());
        }
        let s: CheckpointState = serde_json::from_value(state.clone())
            .map_err(|e| Error::invalid("ModelCheckpoint", format!("bad saved state: {e}")))?;
        self.kept = s.kept;
        self.numbered = s.numbered;
        Ok(())
    }
}

/// Stops when the monitored metric has not improved by `min_delta` for `patience` epochs.
pub struct EarlyStopping {
    /// The metric watched; an epoch whose metrics lack it is an error.
    pub monitor: Monitor,
    /// Epoch ends without improvement before stopping (Lightning's `patience`).
    pub patience: u64,
    /// The least change that counts as an improvement, in the metric's units (kept non-negative).
    pub min_delta: f64,
    best: Option<f64>,
    wait: u64,
}

#[derive(Serialize, Deserialize)]
struct EarlyStoppingState {
    best: Option<f64>,
    wait: u64,
}

impl EarlyStopping {
    /// Stops after `patience` epochs without an improvement of more than `min_delta` (its sign is
    /// ignored), or at once when the metric is not finite.
    pub fn new(monitor: Monitor, patience: u64, min_delta: f64) -> EarlyStopping {
        EarlyStopping {
            monitor,
            patience,
            min_delta: min_delta.abs(),
            best: None,
            wait: 0,
        }
    }
}

impl Callback for EarlyStopping {
    fn name(&self) -> String {
        "EarlyStopping".into()
    }
    fn on_epoch_end(&mut self, ctx: &mut CallbackContext) -> Result<CallbackAction> {
        let score = self.monitor.read(ctx.metrics)?;
        let delta = if self.monitor.higher_is_better {
            self.min_delta
        } else {
            -self.min_delta
        };
        let improved = match self.best {
            None => score.is_finite(),
            Some(best) => self.monitor.better(score - delta, best),
        };
        if improved {
            self.best = Some(score);
            self.wait = 0;
        } else {
            self.wait += 1;
        }
        Ok(if self.wait >= self.patience || !score.is_finite() {
            CallbackAction::Stop
        } else {
            CallbackAction::Continue
        })
    }
    fn state(&self) -> serde_json::Value {
        serde_json::to_value(EarlyStoppingState {
            best: self.best,
            wait: self.wait,
        })
        .unwrap_or_default()
    }
    fn load_state(&mut self, state: &serde_json::Value) -> Result<()> {
        if state.is_null() {
            return Ok(());
        }
        let s: EarlyStoppingState = serde_json::from_value(state.clone())
            .map_err(|e| Error::invalid("EarlyStopping", format!("bad saved state: {e}")))?;
        (self.best, self.wait) = (s.best, s.wait);
        Ok(())
    }
}

/// Adds the learning rate to each epoch's metrics as `lr-{optimizer}` (Lightning's
/// LearningRateMonitor key); step events carry it too.
pub struct LrMonitor {
    pub(super) key: String,
}

impl LrMonitor {
    /// Adds the rate under `lr-{optimizer_name}`; pass `Optimizer::name`, e.g. `lr-SGD`.
    pub fn new(optimizer_name: &str) -> LrMonitor {
        LrMonitor {
            key: format!("lr-{optimizer_name}"),
        }
    }
    /// The metrics key it writes, `lr-` followed by the optimizer's name.
    pub fn key(&self) -> &str {
        &self.key
    }
}

impl Callback for LrMonitor {
    fn name(&self) -> String {
        "LrMonitor".into()
    }
    fn on_epoch_end(&mut self, ctx: &mut CallbackContext) -> Result<CallbackAction> {
        if let Some(lr) = ctx.metrics.get("lr").copied() {
            ctx.metrics.insert(self.key.clone(), lr);
        }
        Ok(CallbackAction::Continue)
    }
}
