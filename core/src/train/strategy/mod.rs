//! How a batch becomes a loss and gradients, apart from the loop that feeds batches (as
//! Lightning splits its loops from its strategies). The loop asks the strategy to run each
//! micro-batch, to finish the gradients before the optimizer steps, whether anyone stops, and
//! what to report; it never names a communicator. One file per strategy.

mod data_parallel;
mod hybrid;
pub mod pipeline;
mod replica_reports;
mod single;

pub use data_parallel::DataParallel;
pub use hybrid::Hybrid;
pub use single::SingleDevice;

use super::TrainingSetup;
use super::config::TrainerConfig;
use super::events::{DeviceStats, StepTimes};
use super::state::TrainerState;
use super::step::MicroBatch;
use crate::data::Batch;
use crate::error::Result;
use crate::tensor::Tensor;

/// What a logged step reports besides the loss: each worker's step times (empty with one
/// worker) and each device's counters.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct StepReports {
    /// Each worker's step times, by rank (data parallel) or stage (pipeline); empty with one
    /// worker.
    pub worker_times: Vec<StepTimes>,
    /// Every device's counters, one per rank or stage.
    pub devices: Vec<DeviceStats>,
}

/// How the training loop turns each batch into gradients (Lightning's `Strategy`): `SingleDevice`,
/// `DataParallel`, `pipeline::Pipeline` or `Hybrid`.
pub trait Strategy: Send {
    /// Before the loop: checks that `setup` can train this way with `config` (its precision,
    /// above all), and returns the run's devices (one per replica or stage) for its start event.
    fn setup(&mut self, setup: &mut TrainingSetup, config: &TrainerConfig) -> Result<Vec<String>>;

    /// A batch from the loader, on the device(s) that compute it.
    fn batch_to_device(&self, setup: &TrainingSetup, batch: &Batch) -> Result<Vec<Tensor>> {
        batch.to_device(&setup.device)
    }

    /// Forward and backward of one micro-batch; returns, detached, its part of the loss of the
    /// global micro-batch that every worker's together make: its loss itself (not weighted) on
    /// one worker, its loss times its share of the samples on a data-parallel replica, so that
    /// `sum_over_workers` of the parts is the loss one device would compute.
    fn forward_backward(
        &mut self,
        setup: &TrainingSetup,
        micro: &MicroBatch<'_>,
        times: &mut StepTimes,
    ) -> Result<Tensor>;

    /// The sum over the workers of a step of `part` (one value on each, from the parts that
    /// `forward_backward` returns): the global batch's loss, as one device would log it. Every
    /// worker takes part; with one worker, `part` itself.
    fn sum_over_workers(&self, _setup: &TrainingSetup, part: &Tensor) -> Result<Tensor> {
        Ok(part.clone())
    }

    /// After the step's last micro-batch, before the optimizer: the gradients are final.
    fn finish_gradients(&mut self, _setup: &TrainingSetup, _times: &mut StepTimes) -> Result<()> {
        Ok(())
    }

    /// The sum over the workers that each hold a share of the step's gradients
    /// (`gradients_sharded`) of `part`, one scalar from each: the squared norm of its share,
    /// or whether it saw an inf/NaN. Every such worker takes part.
    fn sum_over_gradient_shards(&self, setup: &TrainingSetup, part: &Tensor) -> Result<Tensor> {
        self.sum_over_workers(setup, part)
    }

    /// Parameters that are this worker's copies of a weight another parameter of the step also
    /// holds (a pipeline's tied weight on its later stage): the same gradient, counted once in
    /// the clipping norm, so these are left out of it.
    fn tied_copies(&self, _setup: &TrainingSetup) -> Result<Vec<Tensor>> {
        Ok(Vec::new())
    }

    /// The loss and correct-prediction sums of one evaluation batch (on the setup's device),
    /// as the task computes them; every worker that evaluates takes part.
    fn eval_sums(&self, setup: &TrainingSetup, batch: &[Tensor]) -> Result<(Tensor, Tensor)> {
        setup.task.eval_sums(setup.model.as_ref(), batch)
    }

    /// After each optimizer step, with the totals so far: true when the loader must cut the
    /// rest of the epoch anew (a balanced run's shares changed).
    fn after_optimizer_step(
        &mut self,
        _setup: &TrainingSetup,
        _state: &TrainerState,
        _times: &StepTimes,
    ) -> Result<bool> {
        Ok(false)
    }

    /// Whether workers in lockstep must agree to stop: a wish then waits for a logged step,
    /// where `any_stops` gathers every worker's.
    fn stops_together(&self) -> bool {
        false
    }

    /// Whether any worker wishes to stop, `mine` being this one's wish.
    fn any_stops(&self, _setup: &TrainingSetup, mine: bool) -> Result<bool> {
        Ok(mine)
    }

    /// At a logged step (every worker takes part): step times and device counters.
    fn step_reports(&mut self, setup: &TrainingSetup, mine: &StepTimes) -> Result<StepReports>;

    /// This worker's rank among the replicas (0 without data parallelism): only rank 0 prints
    /// its progress, as Lightning's `rank_zero_only`.
    fn rank(&self) -> usize {
        0
    }

    /// The number of data-parallel replicas (1 without data parallelism; pipeline stages are
    /// not replicas).
    fn world_size(&self) -> usize {
        1
    }

    /// Whether each worker holds the gradients of only its share of the parameters when the
    /// optimizer steps (ZeRO stage 2, pipeline stages in processes of their own): inf/NaN
    /// verdicts and clipping norms are then totalled with `sum_over_gradient_shards`.
    fn gradients_sharded(&self) -> bool {
        false
    }

    /// Every worker calls it before rank 0's callbacks, which may save checkpoints, and
    /// `callbacks_done` after them: a worker holding state rank 0's checkpoints need (ZeRO's
    /// shares, in another process) sends it here when rank 0 asks.
    fn callbacks_start(&self) -> Result<()> {
        Ok(())
    }

    /// After rank 0's callbacks (every worker calls it): see `callbacks_start`.
    fn callbacks_done(&self) -> Result<()> {
        Ok(())
    }

    /// The bytes of optimizer state this worker holds (its share with ZeRO).
    fn optimizer_state_bytes(&self, setup: &TrainingSetup) -> u64 {
        crate::distributed::state_bytes(&setup.optimizer.state())
    }

    /// When the run is over (every worker takes part): undoes what `setup` changed in the
    /// setup for the run (ZeRO hands the whole optimizer back).
    fn after_fit(&mut self, _setup: &mut TrainingSetup) -> Result<()> {
        Ok(())
    }

    /// A balanced run's shares of the global batch, by rank (empty otherwise).
    fn shares(&self) -> Vec<usize> {
        Vec::new()
    }

    /// Goes on with the shares a checkpoint saved, where they fit this run.
    fn restore_shares(&mut self, _saved: &[usize]) {}
}
