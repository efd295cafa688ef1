//! What a resumed run must share with the run that wrote its checkpoint to go on along that
//! run's trajectory: the learning-rate schedule, the precision, gradient accumulation, the global
//! batch, the world size (where the model's batch statistics or random draws depend on it) and
//! the seeds. `fit` compares them once, before its first step, and refuses every difference in
//! one error unless the config accepts it (`TrainerConfig::resume_overrides`, the CLI's
//! `--resume-override`). A setting an older checkpoint did not record is not compared.

use serde::{Deserialize, Serialize};

use super::TrainingSetup;
use super::config::{SchedulerInterval, TrainerConfig};
use super::events::Event;
use super::state::TrainerState;
use super::strategy::Strategy;
use super::trainer::Trainer;
use crate::data::DataLoader;
use crate::error::{Error, Result};
use crate::nn::ModuleExt;

/// A setting a resumed run may change on purpose, named in `TrainerConfig::resume_overrides`
/// (and the CLI's `--resume-override`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ResumeSetting {
    /// The learning-rate schedule and when it steps (a constant rate is a schedule too).
    Schedule,
    /// `TrainerConfig::precision`.
    Precision,
    /// `TrainerConfig::accumulate_grad_batches`.
    Accumulation,
    /// The global batch size: the training loader's batch over all replicas.
    BatchSize,
    /// The number of data-parallel replicas.
    WorldSize,
    /// The seeds of the random streams (accepted, the streams go on with this run's seeds
    /// from the checkpoint's positions).
    Seed,
}

impl ResumeSetting {
    /// Every setting: accepts any change.
    pub const ALL: [ResumeSetting; 6] = [
        ResumeSetting::Schedule,
        ResumeSetting::Precision,
        ResumeSetting::Accumulation,
        ResumeSetting::BatchSize,
        ResumeSetting::WorldSize,
        ResumeSetting::Seed,
    ];

    /// The name errors and the CLI use: `schedule`, `precision`, `accumulate_grad_batches`,
    /// `batch_size`, `world_size`, `seed`.
    pub fn name(self) -> &'static str {
        match self {
            ResumeSetting::Schedule => "schedule",
            ResumeSetting::Precision => "precision",
            ResumeSetting::Accumulation => "accumulate_grad_batches",
            ResumeSetting::BatchSize => "batch_size",
            ResumeSetting::WorldSize => "world_size",
            ResumeSetting::Seed => "seed",
        }
    }

    /// The setting called `name`; an error listing the names otherwise.
    pub fn parse(name: &str) -> Result<ResumeSetting> {
        ResumeSetting::ALL
            .into_iter()
            .find(|s| s.name() == name)
            .ok_or_else(|| {
                let names: Vec<&str> = ResumeSetting::ALL.iter().map(|s| s.name()).collect();
                Error::invalid(
                    "resume override",
                    format!("`{name}` is not one of {} (or all)", names.join(", ")),
                )
            })
    }
}

/// The settings of a run that decide its trajectory, as its checkpoints record them (`None`:
/// not recorded, in a checkpoint older than this record).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RunSettings {
    /// The schedule as its type and values print, and when it steps; `constant` without one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schedule: Option<String>,
    /// Lightning's name of the precision (`32`, `16-mixed`, `bf16-mixed`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub precision: Option<String>,
    /// Micro-batches per optimizer step.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub accumulate_grad_batches: Option<u64>,
    /// Samples per micro-batch over all replicas.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub global_batch_size: Option<u64>,
    /// Data-parallel replicas.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub world_size: Option<u64>,
}

const CONSTANT: &str = "constant";
/// What an older checkpoint with a scheduler state but no description says of its schedule.
const UNRECORDED: &str = "a schedule (not recorded)";

impl RunSettings {
    /// This run's settings: `config`'s, `setup`'s schedule, and the batch `train` and `strategy`
    /// make together.
    pub(crate) fn of(
        config: &TrainerConfig,
        setup: &TrainingSetup,
        train: &DataLoader,
        strategy: &dyn Strategy,
    ) -> RunSettings {
        let interval = match config.scheduler_interval {
            SchedulerInterval::Epoch => "epoch",
            SchedulerInterval::Step => "step",
        };
        let world = strategy.world_size() as u64;
        let shares = strategy.shares();
        // A balanced run's loader cuts this rank's share; the shares add up to the global batch.
        let global_batch = if shares.is_empty() {
            train.config().batch_size as u64 * world
        } else {
            shares.iter().sum::<usize>() as u64
        };
        RunSettings {
            schedule: Some(setup.scheduler.as_ref().map_or_else(
                || CONSTANT.to_string(),
                |s| format!("{}, stepped per {interval}", s.describe()),
            )),
            precision: Some(config.precision.name().to_string()),
            accumulate_grad_batches: Some(config.accumulate_grad_batches as u64),
            global_batch_size: Some(global_batch),
            world_size: Some(world),
        }
    }
}

/// A checkpoint `resume` loaded, until `fit` has compared its run with this one.
pub(crate) struct PendingResume {
    /// The checkpoint, as errors and the resumed event name it.
    pub path: String,
    /// This run's seeds, before the checkpoint's streams replaced them.
    pub seeds: Vec<u64>,
}

/// One setting that differs: (setting, the checkpoint's value, this run's).
type Difference = (ResumeSetting, String, String);

/// The settings of `saved` (the checkpoint's state) that differ from `current` and `seeds`;
/// the world size only where `world_matters`.
fn differences(saved: &TrainerState, current: &RunSettings, seeds: &[u64], world_matters: bool) -> Vec<Difference> {
    let recorded = saved.run.clone().unwrap_or_default();
    // Every checkpoint tells whether it had a scheduler, if not always which.
    let saved_schedule = recorded.schedule.clone().unwrap_or_else(|| {
        if saved.scheduler.is_some() {
            UNRECORDED
        } else {
            CONSTANT
        }
        .to_string()
    });
    let mut found = Vec::new();
    let mut compare = |setting, old: Option<String>, new: Option<String>, same: fn(&str, &str) -> bool| {
        if let (Some(old), Some(new)) = (old, new)
            && !same(&old, &new)
        {
            found.push((setting, old, new));
        }
    };
    let text = |v: Option<u64>| v.map(|v| v.to_string());
    compare(
        ResumeSetting::Schedule,
        Some(saved_schedule),
        current.schedule.clone(),
        |old, new| old == new || (old == UNRECORDED && new != CONSTANT),
    );
    compare(
        ResumeSetting::Precision,
        recorded.precision,
        current.precision.clone(),
        str::eq,
    );
    compare(
        ResumeSetting::Accumulation,
        text(recorded.accumulate_grad_batches),
        text(current.accumulate_grad_batches),
        str::eq,
    );
    compare(
        ResumeSetting::BatchSize,
        text(recorded.global_batch_size),
        text(current.global_batch_size),
        str::eq,
    );
    if world_matters {
        compare(
            ResumeSetting::WorldSize,
            text(recorded.world_size),
            text(current.world_size),
            str::eq,
        );
    }
    let saved_seeds: Vec<u64> = saved.generators.iter().map(|&(seed, _)| seed).collect();
    compare(
        ResumeSetting::Seed,
        Some(format!("{saved_seeds:?}")),
        Some(format!("{seeds:?}")),
        str::eq,
    );
    found
}

/// The one error for every difference not overridden, saying how to resume.
fn refusal(path: &str, refused: &[Difference]) -> Error {
    let lines: Vec<String> = refused
        .iter()
        .map(|(s, old, new)| format!("  {}: {old} in the checkpoint, {new} in this run", s.name()))
        .collect();
    let variants: Vec<String> = refused.iter().map(|(s, ..)| format!("ResumeSetting::{s:?}")).collect();
    let names: Vec<&str> = refused.iter().map(|(s, ..)| s.name()).collect();
    Error::data(
        path,
        format!(
            "this run differs from the one that wrote the checkpoint, so resuming would not continue that run:\n{}\n\
             Resume with the checkpoint's settings, or accept the change on purpose: TrainerConfig::resume_overrides = \
             vec![{}] (CLI: --resume-override {})",
            lines.join("\n"),
            variants.join(", "),
            names.join(",")
        ),
    )
}

/// Whether a different number of replicas changes what the model computes: per-replica batch
/// statistics, or random draws per replica. Without either, the same global batch on more
/// replicas is the same run up to summation order.
fn world_size_matters(setup: &TrainingSetup) -> bool {
    let batch_norm = setup
        .model
        .named_buffers()
        .iter()
        .any(|(name, _)| name.ends_with("running_mean"));
    batch_norm || !setup.model.generators().is_empty()
}

impl Trainer {
    /// At the start of `fit`: records this run's settings for its checkpoints and, after a
    /// `resume`, refuses a run that differs from the checkpoint's where not overridden. Returns
    /// the event that says where the run resumed from.
    pub(super) fn check_resume(&mut self, setup: &TrainingSetup, train: &DataLoader) -> Result<Option<Event>> {
        let current = RunSettings::of(&self.config, setup, train, self.strategy.as_ref());
        let resumed = match self.pending_resume.take() {
            None => None,
            Some(pending) => {
                let world_matters = world_size_matters(setup);
                let (accepted, refused): (Vec<Difference>, Vec<Difference>) =
                    differences(&self.state, &current, &pending.seeds, world_matters)
                        .into_iter()
                        .partition(|(s, ..)| self.config.resume_overrides.contains(s));
                if !refused.is_empty() {
                    return Err(refusal(&pending.path, &refused));
                }
                Some(Event::Resumed {
                    path: pending.path,
                    epoch: self.state.epoch,
                    step: self.state.global_step,
                    changed: accepted
                        .iter()
                        .map(|(s, old, new)| format!("{} {old} -> {new}", s.name()))
                        .collect(),
                })
            }
        };
        self.state.run = Some(current);
        Ok(resumed)
    }
}
