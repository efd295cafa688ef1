//! A run as the dashboard knows it: the series and facts folded from its event records, whether
//! they arrive live over a channel, from a metrics log being written (`Follower`), or from a
//! finished log. Bad lines never stop a load: they become warnings.

use std::collections::BTreeMap;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use lockstep_core::train::{DeviceStats, Event, Record, RunInfo, StepTimes, parse_metrics_line, parse_metrics_log};

use super::series::Point;

#[derive(Clone, Debug, Default, PartialEq)]
pub struct EpochPoint {
    pub epoch: u64,
    pub train_loss: f64,
    pub val_loss: Option<f64>,
    pub val_accuracy: Option<f64>,
    pub seconds: f64,
}

/// A device's utilization over time (t seconds, percent) and its latest counters.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct DeviceSeries {
    pub utilization: Vec<Point>,
    pub latest: DeviceStats,
}

#[derive(Clone, Debug, PartialEq)]
pub struct RunEnd {
    pub steps: u64,
    pub seconds: f64,
    pub samples_per_sec: f64,
    pub reason: String,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct RunData {
    /// What the legend shows: the log's name, or "this run".
    pub name: String,
    pub info: Option<RunInfo>,
    /// (step, loss) at every logged step.
    pub loss: Vec<Point>,
    pub lr: Vec<Point>,
    pub samples_per_sec: Vec<Point>,
    pub epochs: Vec<EpochPoint>,
    pub devices: BTreeMap<String, DeviceSeries>,
    /// The latest checkpoint written: (path, why).
    pub checkpoint: Option<(String, String)>,
    /// Test loss and accuracy, once tested.
    pub test: Option<(f64, f64)>,
    pub end: Option<RunEnd>,
    /// Seconds since the run started, at the newest record.
    pub elapsed: f64,
    pub step: u64,
    pub epoch: u64,
    /// Where the latest logged steps' time went (rank 0, host time).
    pub step_times: Option<StepTimes>,
    /// The same for every replica of a data-parallel run, by rank.
    pub rank_times: Vec<StepTimes>,
    /// A balanced run's latest shares of the global batch, by rank.
    pub shares: Vec<usize>,
    pub warnings: Vec<String>,
}

impl RunData {
    pub fn new(name: impl Into<String>) -> RunData {
        RunData {
            name: name.into(),
            ..RunData::default()
        }
    }

    /// Whether any plot has something to draw.
    pub fn has_points(&self) -> bool {
        !(self.loss.is_empty() && self.epochs.is_empty() && self.lr.is_empty())
    }

    pub fn apply(&mut self, record: &Record) {
        self.elapsed = self.elapsed.max(record.t);
        match &record.event {
            Event::RunStart { run } => self.info = Some(run.clone()),
            Event::Step {
                epoch,
                step,
                loss,
                lr,
                samples_per_sec,
                times,
                rank_times,
                shares,
                ..
            } => {
                let x = *step as f64;
                if times.is_some() {
                    self.step_times = *times;
                }
                if !rank_times.is_empty() {
                    self.rank_times.clone_from(rank_times);
                }
                if !shares.is_empty() {
                    self.shares.clone_from(shares);
                }
                self.loss.push([x, *loss]);
                self.lr.push([x, *lr]);
                self.samples_per_sec.push([x, *samples_per_sec]);
                self.step = *step;
                self.epoch = *epoch;
            }
            Event::Epoch {
                epoch,
                train_loss,
                val_loss,
                val_accuracy,
                seconds,
                ..
            } => self.epochs.push(EpochPoint {
                epoch: *epoch,
                train_loss: *train_loss,
                val_loss: *val_loss,
                val_accuracy: *val_accuracy,
                seconds: *seconds,
            }),
            Event::Device(stats) => {
                let series = self.devices.entry(stats.device.clone()).or_default();
                if let Some(u) = stats.utilization {
                    series.utilization.push([record.t, u * 100.0]);
                }
                series.latest = stats.clone();
            }
            // The run goes on from the checkpoint's step.
            Event::Resumed { step, .. } => self.step = *step,
            Event::Checkpoint { path, reason } => self.checkpoint = Some((path.clone(), reason.clone())),
            Event::Test { loss, accuracy, .. } => self.test = Some((*loss, *accuracy)),
            Event::RunEnd {
                steps,
                seconds,
                samples_per_sec,
                reason,
                ..
            } => {
                self.step = *steps;
                self.end = Some(RunEnd {
                    steps: *steps,
                    seconds: *seconds,
                    samples_per_sec: *samples_per_sec,
                    reason: reason.clone(),
                })
            }
        }
    }

    /// Folds a whole metrics log; lines that do not parse become warnings.
    pub fn from_jsonl(name: impl Into<String>, text: &str) -> RunData {
        let mut run = RunData::new(name);
        for line in parse_metrics_log(text) {
            match line {
                Ok(record) => run.apply(&record),
                Err(warning) => run.warnings.push(warning),
            }
        }
        run
    }

    /// Loads a finished (or still growing) metrics log.
    pub fn load(path: &Path) -> anyhow::Result<RunData> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| anyhow::anyhow!("cannot read the metrics log {}: {e}", path.display()))?;
        Ok(RunData::from_jsonl(run_name(path), &text))
    }

    /// The best validation accuracy so far and its epoch.
    pub fn best_val_accuracy(&self) -> Option<(u64, f64)> {
        self.epochs
            .iter()
            .filter_map(|e| e.val_accuracy.map(|a| (e.epoch, a)))
            .max_by(|a, b| a.1.total_cmp(&b.1))
    }

    /// The step the run stops at, when it says (max_steps, or max_epochs full epochs).
    pub fn total_steps(&self) -> Option<u64> {
        let info = self.info.as_ref()?;
        let by_epochs = info.max_epochs.checked_mul(info.steps_per_epoch).filter(|&s| s > 0);
        match (info.max_steps, by_epochs) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Seconds left at the pace so far, while the run is going.
    pub fn remaining_seconds(&self) -> Option<f64> {
        if self.end.is_some() || self.step == 0 {
            return None;
        }
        let total = self.total_steps()? as f64;
        Some(self.elapsed / self.step as f64 * (total - self.step as f64).max(0.0))
    }
}

/// A log's name in a legend: its file stem, with the directory when the stem is generic.
pub fn run_name(path: &Path) -> String {
    let stem = path
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    match path.parent().and_then(|p| p.file_name()) {
        Some(dir) if stem == "metrics" => format!("{}/{stem}", dir.to_string_lossy()),
        _ => stem,
    }
}

/// Every metrics log under `path`: the file itself, or the `*.jsonl` files in the directory and
/// in its immediate subdirectories (one per run), sorted.
pub fn find_logs(path: &Path) -> anyhow::Result<Vec<PathBuf>> {
    if path.is_file() {
        return Ok(vec![path.to_path_buf()]);
    }
    let read = |dir: &Path| -> anyhow::Result<Vec<PathBuf>> {
        Ok(std::fs::read_dir(dir)
            .map_err(|e| anyhow::anyhow!("cannot open {}: {e}", dir.display()))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .collect())
    };
    let mut logs = Vec::new();
    for entry in read(path)? {
        if entry.is_dir() {
            logs.extend(read(&entry)?.into_iter().filter(|p| is_log(p)));
        } else if is_log(&entry) {
            logs.push(entry);
        }
    }
    logs.sort();
    anyhow::ensure!(!logs.is_empty(), "no metrics logs (*.jsonl) in {}", path.display());
    Ok(logs)
}

fn is_log(p: &Path) -> bool {
    p.extension().is_some_and(|e| e == "jsonl")
}

/// Reads a metrics log as it grows: each `poll` returns the records of the lines completed since
/// the last one (a half-written last line waits for its end). A log that shrinks was restarted:
/// reading starts over.
pub struct Follower {
    path: PathBuf,
    offset: u64,
    pending: String,
    line: usize,
}

impl Follower {
    pub fn new(path: impl Into<PathBuf>) -> Follower {
        Follower {
            path: path.into(),
            offset: 0,
            pending: String::new(),
            line: 0,
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// New records and warnings; `restarted` when the log was replaced by a new run.
    pub fn poll(&mut self) -> std::io::Result<Polled> {
        let mut polled = Polled::default();
        let mut file = match std::fs::File::open(&self.path) {
            Ok(f) => f,
            // Not there yet: the run has not started writing.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(polled),
            Err(e) => return Err(e),
        };
        let len = file.metadata()?.len();
        if len < self.offset {
            *self = Follower::new(self.path.clone());
            polled.restarted = true;
        }
        file.seek(SeekFrom::Start(self.offset))?;
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes)?;
        self.offset += bytes.len() as u64;
        self.pending.push_str(&String::from_utf8_lossy(&bytes));
        while let Some(end) = self.pending.find('\n') {
            let line: String = self.pending.drain(..=end).collect();
            self.line += 1;
            match parse_metrics_line(line.trim_end(), self.line, false) {
                Ok(Some(r)) => polled.records.push(r),
                Ok(None) => {}
                Err(w) => polled.warnings.push(w),
            }
        }
        Ok(polled)
    }
}

#[derive(Debug, Default)]
pub struct Polled {
    pub records: Vec<Record>,
    pub warnings: Vec<String>,
    pub restarted: bool,
}

#[cfg(test)]
mod tests;
