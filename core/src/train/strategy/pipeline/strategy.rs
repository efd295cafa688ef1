//! The pipeline strategy: a `StagedModel`'s stages run at once on micro-batches of each batch,
//! on a GPipe or 1F1B schedule; each micro-batch's loss is weighted 1/M, so the gradients are
//! those of the whole batch on one device.

use super::executor::{StepProfile, run_step};
use super::schedule::{Schedule, ScheduleKind};
use crate::data::Batch;
use crate::distributed::Reducer;
use crate::error::{Error, Result};
use crate::nn::StagedModel;
use crate::tensor::Tensor;
use crate::train::TrainingSetup;
use crate::train::config::Precision;
use crate::train::events::StepTimes;
use crate::train::step::{self, MicroBatch};
use crate::train::strategy::replica_reports::{device_stats, distinct};
use crate::train::strategy::{StepReports, Strategy};

/// The pipeline-parallel strategy (as `torch.distributed.pipelining`): a `StagedModel`'s stages run
/// each batch as micro-batches on a GPipe or 1F1B schedule, a thread per stage.
pub struct Pipeline {
    kind: ScheduleKind,
    micro_batches: usize,
    /// Compute threads of each CPU stage (None: the process's shared pool).
    cpu_threads_per_stage: Option<usize>,
    /// Built by `setup`, once the stages are known.
    schedule: Option<Schedule>,
    pools: Vec<Option<rayon::ThreadPool>>,
    last_profile: Option<StepProfile>,
    /// Each stage's compute and waiting summed since the last step report, over
    /// `steps_summed` optimizer steps.
    stage_sums: Vec<StepTimes>,
    steps_summed: u64,
    /// Each stage's device as events name it (`cpu:0 (stage 1)` where two stages share one).
    stage_names: Vec<String>,
}

impl Pipeline {
    /// Each batch cut into `micro_batches` micro-batches, run on `kind`'s schedule.
    pub fn new(kind: ScheduleKind, micro_batches: usize) -> Pipeline {
        Pipeline {
            kind,
            micro_batches,
            cpu_threads_per_stage: None,
            schedule: None,
            pools: Vec::new(),
            last_profile: None,
            stage_sums: Vec::new(),
            steps_summed: 0,
            stage_names: Vec::new(),
        }
    }

    /// Gives each stage on a CPU device `threads` compute threads of its own, as separate
    /// devices would have, instead of all stages sharing the process's pool.
    pub fn with_cpu_threads_per_stage(mut self, threads: usize) -> Pipeline {
        self.cpu_threads_per_stage = Some(threads.max(1));
        self
    }

    /// The schedule built by `setup` at the start of `Trainer::fit`; `None` before.
    pub fn schedule(&self) -> Option<&Schedule> {
        self.schedule.as_ref()
    }

    /// One step's micro-batches through the stages; `reducers` (one per stage, or none) average
    /// each stage's gradients over the replicas of a hybrid run.
    pub(in crate::train::strategy) fn run(
        &mut self,
        setup: &TrainingSetup,
        micro: &MicroBatch<'_>,
        times: &mut StepTimes,
        reducers: &[Reducer],
    ) -> Result<Tensor> {
        let schedule = self
            .schedule
            .as_ref()
            .ok_or_else(|| Error::invalid("Pipeline", "setup() has not run: train through Trainer::fit"))?;
        let model = staged(setup)?;
        let (loss, profile) = run_step(
            model,
            setup.task.as_ref(),
            schedule,
            &self.pools,
            reducers,
            micro,
            times,
        )?;
        self.stage_sums.resize(profile.stages.len(), StepTimes::default());
        for (sum, c) in self.stage_sums.iter_mut().zip(&profile.stages) {
            sum.forward += c.forward;
            sum.backward += c.backward;
            sum.waiting += (profile.wall - c.forward - c.backward).max(0.0);
        }
        self.last_profile = Some(profile);
        Ok(loss)
    }

    /// Each stage's compute time in the last step, and the step's wall time.
    pub fn last_profile(&self) -> Option<&StepProfile> {
        self.last_profile.as_ref()
    }
}

/// The model as a `StagedModel`, or an error that says how to make one.
pub(in crate::train::strategy) fn staged(setup: &TrainingSetup) -> Result<&StagedModel> {
    setup
        .model
        .as_ref()
        .as_any()
        .downcast_ref::<StagedModel>()
        .ok_or_else(|| {
            Error::invalid(
                "Pipeline",
                "a pipeline trains a StagedModel: split the model's Sequential into stages (StagedModel::place)",
            )
        })
}

fn cpu_pool(threads: usize) -> Result<rayon::ThreadPool> {
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .map_err(|e| {
            Error::invalid(
                "Pipeline",
                format!("cannot start {threads} compute threads for a stage: {e}"),
            )
        })
}

impl Strategy for Pipeline {
    fn setup(&mut self, setup: &TrainingSetup, precision: Precision) -> Result<Vec<String>> {
        let model = staged(setup)?;
        for device in model.devices() {
            step::check_precision(precision, device)?;
        }
        let schedule = Schedule::new(self.kind, model.stages().len(), self.micro_batches)?;
        schedule.validate()?;
        self.schedule = Some(schedule);
        self.pools = model
            .devices()
            .iter()
            .map(|d| match self.cpu_threads_per_stage {
                Some(n) if d.location().starts_with("cpu") => cpu_pool(n).map(Some),
                _ => Ok(None),
            })
            .collect::<Result<_>>()?;
        let locations = model.devices().iter().map(|d| d.location().to_string()).collect();
        self.stage_names = distinct(locations, "stage");
        Ok(self.stage_names.clone())
    }

    /// The input onto the first stage's device, the targets onto the last's.
    fn batch_to_device(&self, setup: &TrainingSetup, batch: &Batch) -> Result<Vec<Tensor>> {
        let devices = staged(setup)?.devices();
        let (first, last) = (&devices[0], &devices[devices.len() - 1]);
        batch
            .fields
            .iter()
            .enumerate()
            .map(|(i, t)| t.to_device(if i == 0 { first } else { last }))
            .collect()
    }

    fn forward_backward(
        &mut self,
        setup: &TrainingSetup,
        micro: &MicroBatch<'_>,
        times: &mut StepTimes,
    ) -> Result<Tensor> {
        self.run(setup, micro, times, &[])
    }

    fn finish_gradients(&mut self, _times: &mut StepTimes) -> Result<()> {
        self.steps_summed += 1;
        Ok(())
    }

    /// Each stage's compute and waiting (as a stage's "worker" times, for its device's row),
    /// with the step's data, communication and optimizer times, which the stages share.
    fn step_reports(&mut self, setup: &TrainingSetup, mine: &StepTimes) -> Result<StepReports> {
        let steps = std::mem::take(&mut self.steps_summed);
        let worker_times = std::mem::take(&mut self.stage_sums)
            .into_iter()
            .map(|sum| {
                let stage = sum.per_step(steps);
                StepTimes {
                    forward: stage.forward,
                    backward: stage.backward,
                    waiting: stage.waiting,
                    ..*mine
                }
            })
            .collect();
        let devices = staged(setup)?
            .devices()
            .iter()
            .zip(&self.stage_names)
            .map(|(device, name)| device_stats(device, name))
            .collect();
        Ok(StepReports { worker_times, devices })
    }
}
