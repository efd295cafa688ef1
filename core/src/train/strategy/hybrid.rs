//! Hybrid data × pipeline parallel: this trainer is one replica of a data-parallel run whose
//! model is a pipeline. Each stage's gradients are averaged over the replicas' copies of that
//! stage with a communicator of its own (data parallel innermost, as DeepSpeed and Megatron lay
//! out the grid), started during the stage's last backward of the step.

use super::data_parallel::{any_wishes, finish_timed};
use super::pipeline::{Pipeline, staged};
use super::{StepReports, Strategy};
use crate::data::Batch;
use crate::distributed::{Reducer, ReplicaCheck, check_replicas};
use crate::error::{Error, Result};
use crate::nn::ModuleExt;
use crate::tensor::Tensor;
use crate::train::TrainingSetup;
use crate::train::config::TrainerConfig;
use crate::train::events::StepTimes;
use crate::train::state::TrainerState;
use crate::train::step::{self, MicroBatch};

/// One replica of a data × pipeline parallel run: a `Pipeline` whose stages each average their
/// gradients over the replicas with a `Reducer` of their own.
pub struct Hybrid {
    pipeline: Pipeline,
    /// One per stage, over that stage's parameters and the replicas' devices of that stage.
    reducers: Vec<Reducer>,
    /// `TrainerConfig::replica_check` (set by `setup`).
    replica_check: Option<ReplicaCheck>,
}

impl Hybrid {
    /// `pipeline` as one replica; `reducers[s]` averages stage `s`'s gradients (make each with
    /// `Reducer::new(&stage.parameters(), comm_of_stage_s, …)`). The training loader gives
    /// this replica its shard of each global batch, as for `DataParallel`.
    pub fn new(pipeline: Pipeline, reducers: Vec<Reducer>) -> Hybrid {
        Hybrid {
            pipeline,
            reducers,
            replica_check: None,
        }
    }
}

impl Strategy for Hybrid {
    fn rank(&self) -> usize {
        self.reducers.first().map_or(0, |r| r.communicator().rank())
    }
    fn world_size(&self) -> usize {
        self.reducers.first().map_or(1, |r| r.communicator().world_size())
    }
    fn setup(&mut self, setup: &mut TrainingSetup, config: &TrainerConfig) -> Result<Vec<String>> {
        step::check_no_zero(config, "a pipeline with replicas")?;
        // The pipeline has no replicas of its own: the check runs here, over each stage's group.
        let pipeline_config = TrainerConfig {
            replica_check: None,
            ..config.clone()
        };
        let devices = self.pipeline.setup(setup, &pipeline_config)?;
        if self.reducers.len() != devices.len() {
            return Err(Error::invalid(
                "Hybrid",
                format!(
                    "{} reducers for {} pipeline stages: give one per stage",
                    self.reducers.len(),
                    devices.len()
                ),
            ));
        }
        self.replica_check = config.replica_check;
        Ok(devices)
    }

    fn batch_to_device(&self, setup: &TrainingSetup, batch: &Batch) -> Result<Vec<Tensor>> {
        self.pipeline.batch_to_device(setup, batch)
    }

    fn forward_backward(
        &mut self,
        setup: &TrainingSetup,
        micro: &MicroBatch<'_>,
        times: &mut StepTimes,
    ) -> Result<Tensor> {
        self.pipeline.run(setup, micro, times, &self.reducers)
    }

    /// Each stage's gradients averaged over the replicas, then its tied weights' summed.
    fn finish_gradients(&mut self, setup: &TrainingSetup, times: &mut StepTimes) -> Result<()> {
        self.reducers.iter().try_for_each(|r| finish_timed(r, times))?;
        self.pipeline.finish_gradients(setup, times)
    }

    fn tied_copies(&self, setup: &TrainingSetup) -> Result<Vec<Tensor>> {
        self.pipeline.tied_copies(setup)
    }

    /// Each stage's copies are compared over that stage's group, stage after stage.
    fn after_optimizer_step(
        &mut self,
        setup: &TrainingSetup,
        state: &TrainerState,
        _times: &StepTimes,
    ) -> Result<bool> {
        if let Some(check) = self.replica_check.filter(|c| c.due(state.global_step)) {
            for (stage, reducer) in staged(setup)?.stages().iter().zip(&self.reducers) {
                let named = stage.named_parameters();
                check_replicas(&check, state.global_step, &named, reducer.communicator().as_ref())?;
            }
        }
        Ok(false)
    }

    fn stops_together(&self) -> bool {
        true
    }

    /// Over the first stage's group, which every replica is in.
    fn any_stops(&self, setup: &TrainingSetup, mine: bool) -> Result<bool> {
        let first = &staged(setup)?.devices()[0];
        any_wishes(self.reducers[0].communicator().as_ref(), first, mine)
    }

    /// This replica's stages only.
    fn step_reports(&mut self, setup: &TrainingSetup, mine: &StepTimes) -> Result<StepReports> {
        self.pipeline.step_reports(setup, mine)
    }
}
