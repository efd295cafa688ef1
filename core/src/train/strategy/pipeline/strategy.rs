//! The pipeline strategy: a `StagedModel`'s stages run at once on micro-batches of each batch,
//! on a GPipe or 1F1B schedule; each micro-batch's loss is weighted 1/M, so the gradients are
//! those of the whole batch on one device. The stages run as threads of this process, or one
//! per process (`Pipeline::across_processes`).

use super::executor::{StepProfile, run_step};
use super::processes::ProcessStages;
use super::schedule::{Schedule, ScheduleKind};
use super::ties;
use crate::backend::ReduceOp;
use crate::data::Batch;
use crate::distributed::{Reducer, all_gather_strings};
use crate::error::{Error, Result};
use crate::nn::StagedModel;
use crate::tensor::Tensor;
use crate::train::TrainingSetup;
use crate::train::config::{OnNan, TrainerConfig};
use crate::train::events::StepTimes;
use crate::train::step::{self, MicroBatch};
use crate::train::strategy::data_parallel::any_wishes;
use crate::train::strategy::replica_reports::{device_stats, distinct, gather_reports};
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
    /// Where this process is one stage of a pipeline of processes.
    processes: Option<ProcessStages>,
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
            processes: None,
        }
    }

    /// Runs one stage in this process and the others in theirs, one stage per rank of
    /// `processes` (as `torch.distributed.pipelining`). The model is this stage alone
    /// (`StagedModel::place_one`); every stage gets the step's loss and evaluates together.
    pub fn across_processes(mut self, processes: ProcessStages) -> Pipeline {
        self.processes = Some(processes);
        self
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
            self.processes.as_ref(),
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
        match (&self.processes, loss) {
            (Some(p), loss) => p.shared_from_last_stage(loss, &model.devices()[0]),
            (None, Some(loss)) => Ok(loss),
            (None, None) => Err(Error::invalid("pipeline", "the last stage computed no loss")),
        }
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

/// What a pipeline of processes cannot do yet, refused before the first step rather than
/// computed on one stage's gradients alone.
fn check_across_processes(model: &StagedModel, config: &TrainerConfig) -> Result<()> {
    let refuse = |msg: &str| Err(Error::invalid("pipeline across processes", msg));
    if model.stages().len() != 1 {
        return refuse(
            "each process holds only its own stage: make the model with StagedModel::place_one (this one has several stages)",
        );
    }
    // f16 loss scaling works: the stages agree on overflow through `sum_over_gradient_shards`.
    if config.on_nan == OnNan::Skip {
        return refuse(
            "skipping a step with a non-finite gradient needs every stage to agree, which is not built yet: use on_nan Stop",
        );
    }
    Ok(())
}

impl Strategy for Pipeline {
    fn setup(&mut self, setup: &mut TrainingSetup, config: &TrainerConfig) -> Result<Vec<String>> {
        let model = staged(setup)?;
        for device in model.devices() {
            step::check_precision(config.precision, device)?;
        }
        step::check_no_replica_check(config, "a pipeline without replicas")?;
        step::check_no_zero(config, "a pipeline")?;
        let stages = match &self.processes {
            Some(p) => {
                check_across_processes(model, config)?;
                p.stages()
            }
            None => model.stages().len(),
        };
        let schedule = Schedule::new(self.kind, stages, self.micro_batches)?;
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
        let locations = match &self.processes {
            Some(p) => {
                let device = &model.devices()[0];
                all_gather_strings(p.world().as_ref(), device, device.location())?
            }
            None => model.devices().iter().map(|d| d.location().to_string()).collect(),
        };
        self.stage_names = distinct(locations, "stage");
        Ok(self.stage_names.clone())
    }

    /// The input onto the first stage's device, the targets onto the last's (this process's
    /// one stage, across processes).
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

    /// Each tied weight's copies get the sum of their gradients.
    fn finish_gradients(&mut self, setup: &TrainingSetup, _times: &mut StepTimes) -> Result<()> {
        self.steps_summed += 1;
        ties::sum_tied_gradients(staged(setup)?, self.processes.as_ref())
    }

    /// Across processes each stage holds its own layers' gradients: the inf/NaN verdict and the
    /// clipping norm are totalled over the stages.
    fn gradients_sharded(&self) -> bool {
        self.processes.is_some()
    }

    fn sum_over_gradient_shards(&self, setup: &TrainingSetup, part: &Tensor) -> Result<Tensor> {
        let Some(p) = &self.processes else {
            return Ok(part.clone());
        };
        let sum = part.to_device(&staged(setup)?.devices()[0])?.deep_copy()?;
        p.world().all_reduce(sum.buffer(), ReduceOp::Sum)?;
        Ok(sum)
    }

    fn tied_copies(&self, setup: &TrainingSetup) -> Result<Vec<Tensor>> {
        ties::copies(staged(setup)?, self.processes.as_ref())
    }

    /// Across processes, the batch goes forward stage by stage and the last stage's sums
    /// reach every stage.
    fn eval_sums(&self, setup: &TrainingSetup, batch: &[Tensor]) -> Result<(Tensor, Tensor)> {
        let Some(p) = &self.processes else {
            return setup.task.eval_sums(setup.model.as_ref(), batch);
        };
        let model = staged(setup)?;
        p.eval_sums(&model.stages()[0], &model.devices()[0], setup.task.as_ref(), batch)
    }

    fn stops_together(&self) -> bool {
        self.processes.is_some()
    }

    fn any_stops(&self, setup: &TrainingSetup, mine: bool) -> Result<bool> {
        match &self.processes {
            Some(p) => any_wishes(p.world().as_ref(), &staged(setup)?.devices()[0], mine),
            None => Ok(mine),
        }
    }

    fn rank(&self) -> usize {
        self.processes.as_ref().map_or(0, ProcessStages::stage)
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
            .collect::<Vec<StepTimes>>();
        if let Some(p) = &self.processes {
            // This process's one stage; every stage's comes from its own process.
            let device = &staged(setup)?.devices()[0];
            let mine = worker_times.first().copied().unwrap_or(*mine);
            let all = gather_reports(p.world().as_ref(), device, &mine, &self.stage_names)?;
            let (worker_times, devices) = all.into_iter().unzip();
            return Ok(StepReports { worker_times, devices });
        }
        let devices = staged(setup)?
            .devices()
            .iter()
            .zip(&self.stage_names)
            .map(|(device, name)| device_stats(device, name))
            .collect();
        Ok(StepReports { worker_times, devices })
    }
}
