//! The one event stream of a run. The progress bar, the JSONL metrics log, the dashboard and
//! other ranks are listeners; a listener that cannot keep up drops step events, never blocks
//! training (`ChannelListener`).

use std::collections::BTreeMap;
use std::sync::mpsc::{Receiver, SyncSender, TrySendError, sync_channel};

use serde::{Deserialize, Serialize};

use crate::error::Result;

/// What the run is, once at its start.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RunInfo {
    /// The setup's short model name (`TrainingSetup::name`).
    pub model: String,
    /// One name per replica or pipeline stage (`cpu:0`, `cuda:1`); a name that repeats carries its
    /// rank or stage, e.g. `cuda:0 (rank 1)`.
    pub devices: Vec<String>,
    /// `TrainerConfig::max_epochs`: the epoch limit, counting epochs done before a resume.
    pub max_epochs: u64,
    /// `TrainerConfig::max_steps`: the optimizer-step limit, if any.
    pub max_steps: Option<u64>,
    /// Optimizer steps per epoch, after `limit_train_batches` and gradient accumulation.
    pub steps_per_epoch: u64,
    /// Hyper-parameters as given (optimizer, lr, batch size, …).
    pub hparams: BTreeMap<String, String>,
}

/// A device's counters; `None` where the backend cannot know (shown as "unknown", never 0).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct DeviceStats {
    /// The device's name, as in `RunInfo::devices`.
    pub device: String,
    /// The share of wall time the device was busy since its previous report, in [0, 1].
    pub utilization: Option<f64>,
    /// Bytes held by live tensors now, as `torch.cuda.memory_allocated`.
    pub memory_allocated: u64,
    /// Bytes the caching allocator holds, in use or free, as `torch.cuda.memory_reserved`.
    pub memory_reserved: u64,
    /// The most bytes allocated at once so far, as `torch.cuda.max_memory_allocated`.
    pub memory_peak: u64,
    /// The device's total memory in bytes.
    pub memory_total: Option<u64>,
}

/// Where a training step's time went, in seconds per optimizer step averaged over the steps
/// since the last step event (host time: on an asynchronous GPU, queued work shows up where the
/// host waits for it).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct StepTimes {
    /// Waiting for the loader's next batch and copying it to the device.
    pub data_wait: f64,
    /// Forward passes, including the loss and its weighting and scaling.
    pub forward: f64,
    /// Backward passes (with data parallel, only the all-reduce wait not hidden behind them is
    /// `communication`).
    pub backward: f64,
    /// Waiting for gradient buckets to be averaged across replicas (data parallel): the
    /// communication not hidden behind backward.
    pub communication: f64,
    /// The optimizer step: unscaling, clipping, the update, zeroing gradients and a per-step
    /// scheduler.
    pub optimizer: f64,
    /// How long the gradient all-reduces ran, hidden behind backward or not (not a phase of
    /// its own: it overlaps `backward`).
    #[serde(default)]
    pub all_reduce: f64,
    /// A pipeline stage's time waiting for its neighbours' activations or gradients (its share
    /// of the bubble).
    #[serde(default)]
    pub waiting: f64,
}

impl StepTimes {
    /// These sums divided by `steps` (unchanged when there were none).
    pub fn per_step(self, steps: u64) -> StepTimes {
        let n = steps.max(1) as f64;
        StepTimes {
            data_wait: self.data_wait / n,
            forward: self.forward / n,
            backward: self.backward / n,
            communication: self.communication / n,
            optimizer: self.optimizer / n,
            all_reduce: self.all_reduce / n,
            waiting: self.waiting / n,
        }
    }
    /// Each phase's time since `earlier` (these being running totals).
    pub fn since(&self, earlier: &StepTimes) -> StepTimes {
        let (now, then) = (self.values(), earlier.values());
        StepTimes::from_values(std::array::from_fn(|i| now[i] - then[i]))
    }
    /// The time the device computed: forward, backward and optimizer (no data or
    /// communication waits).
    pub fn compute(&self) -> f64 {
        self.forward + self.backward + self.optimizer
    }
    /// The fields as numbers, for gathering across ranks (`from_values` reads them back).
    pub fn values(&self) -> [f64; 7] {
        [
            self.data_wait,
            self.forward,
            self.backward,
            self.communication,
            self.optimizer,
            self.all_reduce,
            self.waiting,
        ]
    }
    /// The inverse of `values`: the fields from numbers in the same order.
    pub fn from_values(v: [f64; 7]) -> StepTimes {
        let [
            data_wait,
            forward,
            backward,
            communication,
            optimizer,
            all_reduce,
            waiting,
        ] = v;
        StepTimes {
            data_wait,
            forward,
            backward,
            communication,
            optimizer,
            all_reduce,
            waiting,
        }
    }
    /// (name, seconds) of each phase, in step order (a pipeline stage's waiting spreads over
    /// its forward and backward passes; it is shown last).
    pub fn phases(&self) -> [(&'static str, f64); 6] {
        [
            ("data", self.data_wait),
            ("forward", self.forward),
            ("backward", self.backward),
            ("communication", self.communication),
            ("optimizer", self.optimizer),
            ("waiting", self.waiting),
        ]
    }
}

/// One thing that happened in a run, as every listener receives it; serialised with its kind in an
/// `event` field in snake_case (`"event":"step"`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum Event {
    /// Once, when `fit` starts (a resumed run starts again here).
    RunStart {
        /// The model, devices, limits and hyper-parameters of this run.
        run: RunInfo,
    },
    /// Right after `RunStart` when the run resumed from a checkpoint.
    Resumed {
        /// The checkpoint, as displayed.
        path: String,
        /// The epoch the run goes on in, from 0.
        epoch: u64,
        /// Optimizer steps the checkpoint's run had taken.
        step: u64,
        /// Settings changed on purpose (`TrainerConfig::resume_overrides`): `name old -> new`.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        changed: Vec<String>,
    },
    /// Every `log_every_n_steps` optimizer steps.
    Step {
        /// The epoch in progress, from 0.
        epoch: u64,
        /// Optimizer steps taken so far, this one included (`TrainerState::global_step`, so from
        /// 1).
        step: u64,
        /// Loader batches of this epoch consumed so far: with accumulation, K per optimizer step.
        batch: u64,
        /// The loss of the step's last micro-batch on this worker, before the 1/K accumulation
        /// weight and loss scaling (not averaged over replicas).
        loss: f64,
        /// The learning rate after this step, a per-step scheduler having already advanced.
        lr: f64,
        /// This worker's training samples per second of wall time since the previous step event.
        samples_per_sec: f64,
        /// The loss scale of a `16-mixed` run.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        loss_scale: Option<f64>,
        /// Optimizer steps skipped so far for inf/NaN gradients (mixed precision).
        #[serde(default)]
        skipped_steps: u64,
        /// Where the time of the steps since the last step event went.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        times: Option<StepTimes>,
        /// Data parallel: every rank's `times`, by rank, gathered to rank 0.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        rank_times: Vec<StepTimes>,
        /// A balanced run (devices of different speeds): each rank's samples of the global
        /// batch, by rank, in force for this step.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        shares: Vec<usize>,
    },
    /// At each epoch's end, after validation and before the epoch scheduler and the callbacks.
    Epoch {
        /// The epoch that ended, from 0.
        epoch: u64,
        /// The mean of the epoch's micro-batch losses on this worker (unweighted).
        train_loss: f64,
        /// The mean per-sample validation loss; `None` when this epoch did not validate (no loader,
        /// or `check_val_every_n_epoch`).
        val_loss: Option<f64>,
        /// The validation accuracy in [0, 1]; `None` when `val_loss` is.
        val_accuracy: Option<f64>,
        /// The learning rate at the epoch's end, before a per-epoch scheduler steps.
        lr: f64,
        /// Wall-clock seconds of the epoch, validation included (from the resume point when resumed
        /// mid-epoch).
        seconds: f64,
    },
    /// A device's counters, right after each step event, one per replica or stage.
    Device(DeviceStats),
    /// A callback wrote a training checkpoint.
    Checkpoint {
        /// The file written, as displayed.
        path: String,
        /// Why it was written: `last`, `every_n_train_steps`, `every_n_epochs`, or `top-K METRIC`
        /// for a top-k save.
        reason: String,
    },
    /// The result of `Trainer::test`.
    Test {
        /// The mean per-sample loss over the test loader.
        loss: f64,
        /// The task's accuracy over the test loader, in [0, 1].
        accuracy: f64,
        /// Test samples evaluated.
        samples: u64,
    },
    /// Once, when `fit` returns normally, after the `on_train_end` callbacks.
    RunEnd {
        /// Epochs completed, counting those before a resume.
        epochs: u64,
        /// Optimizer steps taken, counting those before a resume.
        steps: u64,
        /// Wall-clock seconds of this `fit` call.
        seconds: f64,
        /// This worker's training samples per second over this `fit` call.
        samples_per_sec: f64,
        /// Seconds this `fit` call waited for the data loader.
        data_wait_seconds: f64,
        /// Why training stopped: `max_epochs`, `max_steps`, `early stopping`, `stopped by request`
        /// or `stopped by another replica`.
        reason: String,
    },
}

/// An event with its time since the run started: one line of the JSONL log.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Record {
    /// Seconds since the run started.
    pub t: f64,
    /// What happened; its fields sit next to `t` in the JSON line.
    #[serde(flatten)]
    pub event: Event,
}

/// Receives every record of a run, in order, on the training thread (the role of Lightning's
/// loggers).
pub trait EventListener: Send {
    /// Handles one record; training waits until it returns, and an error ends `fit` with that
    /// error.
    fn on_event(&mut self, record: &Record) -> Result<()>;
}

/// A closure is a listener: `trainer.add_listener(|r: &Record| { println!("{r:?}"); Ok(()) })`.
impl<F: FnMut(&Record) -> Result<()> + Send> EventListener for F {
    fn on_event(&mut self, record: &Record) -> Result<()> {
        self(record)
    }
}

/// Forwards records over a bounded channel. When the receiver falls behind, step and device
/// records are dropped (the next ones carry newer values); the rest wait for room.
#[derive(Clone)]
pub struct ChannelListener {
    tx: SyncSender<Record>,
}

impl ChannelListener {
    /// A listener and the receiving end of its channel, which holds up to `capacity` records (at
    /// least 1).
    pub fn new(capacity: usize) -> (ChannelListener, Receiver<Record>) {
        let (tx, rx) = sync_channel(capacity.max(1));
        (ChannelListener { tx }, rx)
    }
}

impl EventListener for ChannelListener {
    fn on_event(&mut self, record: &Record) -> Result<()> {
        let droppable = matches!(record.event, Event::Step { .. } | Event::Device(_));
        match self.tx.try_send(record.clone()) {
            Ok(()) | Err(TrySendError::Disconnected(_)) => Ok(()),
            Err(TrySendError::Full(r)) if !droppable => {
                // A closed window must not stop training: ignore a disconnect here too.
                let _ = self.tx.send(r);
                Ok(())
            }
            Err(TrySendError::Full(_)) => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn step_lines_without_shares_still_parse_and_shares_round_trip() {
        let old =
            r#"{"t":0.5,"event":"step","epoch":0,"step":5,"batch":5,"loss":2.0,"lr":0.05,"samples_per_sec":1000.0}"#;
        let mut record: Record = serde_json::from_str(old).unwrap();
        let Event::Step { shares, .. } = &mut record.event else {
            panic!("a step event: {record:?}")
        };
        assert!(shares.is_empty());
        *shares = vec![96, 32];
        let line = serde_json::to_string(&record).unwrap();
        assert!(line.contains(r#""shares":[96,32]"#), "{line}");
        assert_eq!(serde_json::from_str::<Record>(&line).unwrap(), record);
    }
}
