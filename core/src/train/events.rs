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
    pub model: String,
    pub devices: Vec<String>,
    pub max_epochs: u64,
    pub max_steps: Option<u64>,
    pub steps_per_epoch: u64,
    /// Hyper-parameters as given (optimizer, lr, batch size, …).
    pub hparams: BTreeMap<String, String>,
}

/// A device's counters; `None` where the backend cannot know (shown as "unknown", never 0).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct DeviceStats {
    pub device: String,
    pub utilization: Option<f64>,
    pub memory_allocated: u64,
    pub memory_reserved: u64,
    pub memory_peak: u64,
    pub memory_total: Option<u64>,
}

/// Where a training step's time went, in seconds per optimizer step averaged over the steps
/// since the last step event (host time: on an asynchronous GPU, queued work shows up where the
/// host waits for it).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct StepTimes {
    pub data_wait: f64,
    pub forward: f64,
    pub backward: f64,
    /// Waiting for gradient buckets to be averaged across replicas (data parallel): the
    /// communication not hidden behind backward.
    pub communication: f64,
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

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum Event {
    RunStart {
        run: RunInfo,
    },
    /// Every `log_every_n_steps` optimizer steps.
    Step {
        epoch: u64,
        step: u64,
        batch: u64,
        loss: f64,
        lr: f64,
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
    Epoch {
        epoch: u64,
        train_loss: f64,
        val_loss: Option<f64>,
        val_accuracy: Option<f64>,
        lr: f64,
        seconds: f64,
    },
    Device(DeviceStats),
    Checkpoint {
        path: String,
        reason: String,
    },
    Test {
        loss: f64,
        accuracy: f64,
        samples: u64,
    },
    RunEnd {
        epochs: u64,
        steps: u64,
        seconds: f64,
        samples_per_sec: f64,
        data_wait_seconds: f64,
        reason: String,
    },
}

/// An event with its time since the run started: one line of the JSONL log.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Record {
    /// Seconds since the run started.
    pub t: f64,
    #[serde(flatten)]
    pub event: Event,
}

pub trait EventListener: Send {
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
