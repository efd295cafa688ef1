//! One replica of a data-parallel run (threads, processes or machines alike): gradients are
//! averaged across replicas by the reducer as backward produces them, a balancer may size each
//! replica's share of the global batch by its device's speed, replicas stop together, and rank
//! 0 reports every replica's times and counters.

use std::time::Instant;

use super::replica_reports::{gather_reports, replica_names};
use super::{StepReports, Strategy};
use crate::backend::{Communicator, ReduceOp};
use crate::device::Device;
use crate::distributed::{
    Balancer, Reducer, ReplicaCheck, ShardedOptimizer, WorkDone, ZeroStage, adopt_rank0_streams, all_gather_values,
    check_replicas, state_bytes,
};
use crate::error::Result;
use crate::nn::ModuleExt;
use crate::rng::BatchWindow;
use crate::tensor::Tensor;
use crate::train::TrainingSetup;
use crate::train::config::TrainerConfig;
use crate::train::events::StepTimes;
use crate::train::state::TrainerState;
use crate::train::step::{self, MicroBatch};

/// One replica of a data-parallel run (PyTorch's DDP): its `Reducer` averages the gradients across
/// replicas during backward, and all replicas stop together.
pub struct DataParallel {
    reducer: Reducer,
    balancer: Option<Balancer>,
    /// Every replica's device, by rank (set by `setup`).
    replica_names: Vec<String>,
    /// `TrainerConfig::replica_check` (set by `setup`).
    replica_check: Option<ReplicaCheck>,
    /// With `TrainerConfig::zero`: the optimizer `setup` partitioned, handed back by `after_fit`.
    sharded: Option<ShardedOptimizer>,
}

impl DataParallel {
    /// This trainer as one replica: accumulation micro-batches skip communication and each
    /// optimizer step uses the gradients averaged across replicas.
    pub fn new(reducer: Reducer) -> DataParallel {
        DataParallel {
            reducer,
            balancer: None,
            replica_names: Vec::new(),
            replica_check: None,
            sharded: None,
        }
    }

    /// Makes this replica's share of each global batch follow the devices' measured speeds
    /// (the training loader must cut its batches by the balancer's shares, as `ShardedBatches`
    /// does): its loss is weighted by its share, so the averaged gradient is the global batch's
    /// mean, and after each re-balance the loader starts a new iterator. Each step then waits
    /// for this device once after backward, to time its own computation.
    pub fn with_balancer(mut self, balancer: Balancer) -> DataParallel {
        self.balancer = Some(balancer);
        self
    }
}

/// Whether any rank of `comm` wishes (`mine` being this rank's wish); every rank takes part.
pub(super) fn any_wishes(comm: &dyn Communicator, device: &Device, mine: bool) -> Result<bool> {
    let wishes = all_gather_values(comm, device, vec![f32::from(u8::from(mine))])?;
    Ok(wishes.iter().any(|&w| w > 0.0))
}

/// `reducer.finish()`, its wait counted as communication.
pub(super) fn finish_timed(reducer: &Reducer, times: &mut StepTimes) -> Result<()> {
    let phase = Instant::now();
    reducer.finish()?;
    times.communication += phase.elapsed().as_secs_f64();
    times.all_reduce += reducer.last_comm_times().all_reduce;
    Ok(())
}

impl DataParallel {
    /// Where this replica's `samples` lie in the step's global batch: its slice by the
    /// balancer's shares, else the rank's equal slice (each replica a contiguous slice of the
    /// global batch, as `ShardedBatches` cuts it).
    fn window(&self, samples: usize) -> BatchWindow {
        let comm = self.reducer.communicator();
        let shares = self.shares();
        if shares.len() == comm.world_size() && shares.get(comm.rank()) == Some(&samples) {
            return BatchWindow {
                start: shares[..comm.rank()].iter().sum(),
                len: samples,
                global: shares.iter().sum(),
            };
        }
        BatchWindow {
            start: comm.rank() * samples,
            len: samples,
            global: comm.world_size() * samples,
        }
    }
}

impl Strategy for DataParallel {
    fn rank(&self) -> usize {
        self.reducer.communicator().rank()
    }
    fn world_size(&self) -> usize {
        self.reducer.communicator().world_size()
    }
    fn setup(&mut self, setup: &mut TrainingSetup, config: &TrainerConfig) -> Result<Vec<String>> {
        step::check_precision(config.precision, &setup.device)?;
        let comm = self.reducer.communicator();
        self.replica_names = replica_names(comm.as_ref(), &setup.device)?;
        adopt_rank0_streams(comm.as_ref(), &setup.device, &setup.random_streams())?;
        self.replica_check = config.replica_check;
        if let Some(stage) = config.zero.filter(|_| comm.world_size() > 1) {
            let sharded = ShardedOptimizer::shard(&mut setup.optimizer, comm.clone())?;
            if stage >= ZeroStage::Gradients {
                self.reducer.shard_gradients(sharded.owners().to_vec())?;
            }
            self.sharded = Some(sharded);
        }
        Ok(self.replica_names.clone())
    }

    fn forward_backward(
        &mut self,
        setup: &TrainingSetup,
        micro: &MicroBatch<'_>,
        times: &mut StepTimes,
    ) -> Result<Tensor> {
        self.reducer.set_sync(micro.ends_step);
        // Weighting the loss, not the gradients in the reducer's buckets, costs no pass over
        // the gradients and also weights what flows to other replicas through SyncBatchNorm.
        let share = self.balancer.as_ref().map_or(1.0, Balancer::gradient_weight);
        let window = self.window(micro.samples() as usize);
        let loss = {
            let _draws_by_sample = window.enter();
            step::forward_backward(setup, micro, micro.weight * share, times)?
        };
        if self.balancer.is_some() {
            // This device's own compute ends here, not inside the all-reduce where waiting for
            // the other ranks would mix in.
            let phase = Instant::now();
            setup.device.synchronize()?;
            times.backward += phase.elapsed().as_secs_f64();
        }
        // The global batch's loss is the replicas' losses weighted by their shares of it, as
        // their gradients are.
        loss.affine(window.fraction(), 0.0)
    }

    fn sum_over_workers(&self, _setup: &TrainingSetup, part: &Tensor) -> Result<Tensor> {
        let sum = part.deep_copy()?;
        self.reducer.communicator().all_reduce(sum.buffer(), ReduceOp::Sum)?;
        Ok(sum)
    }

    fn finish_gradients(&mut self, _setup: &TrainingSetup, times: &mut StepTimes) -> Result<()> {
        finish_timed(&self.reducer, times)
    }

    fn after_optimizer_step(&mut self, setup: &TrainingSetup, state: &TrainerState, times: &StepTimes) -> Result<bool> {
        if let Some(check) = self.replica_check.filter(|c| c.due(state.global_step)) {
            let named = setup.model.as_ref().named_parameters();
            check_replicas(&check, state.global_step, &named, self.reducer.communicator().as_ref())?;
        }
        let Some(balancer) = &mut self.balancer else {
            return Ok(false);
        };
        let done = WorkDone {
            samples: state.samples_seen,
            compute_seconds: times.compute(),
        };
        balancer.after_step(state.global_step, done, &setup.device)
    }

    fn stops_together(&self) -> bool {
        true
    }

    /// Every rank gathers every wish, so all stop at the same step. A replica that stopped
    /// alone would leave the others waiting in their next all-reduce (Lightning reduces its
    /// `should_stop` across ranks the same way).
    fn any_stops(&self, setup: &TrainingSetup, mine: bool) -> Result<bool> {
        any_wishes(self.reducer.communicator().as_ref(), &setup.device, mine)
    }

    /// The communication thread is idle here, after `finish`.
    fn step_reports(&mut self, setup: &TrainingSetup, mine: &StepTimes) -> Result<StepReports> {
        let comm = self.reducer.communicator();
        let replicas = gather_reports(comm.as_ref(), &setup.device, mine, &self.replica_names)?;
        let (worker_times, devices) = replicas.into_iter().unzip();
        Ok(StepReports { worker_times, devices })
    }

    fn callbacks_start(&self) -> Result<()> {
        self.sharded.as_ref().map_or(Ok(()), ShardedOptimizer::open_window)
    }

    fn callbacks_done(&self) -> Result<()> {
        self.sharded.as_ref().map_or(Ok(()), ShardedOptimizer::close_window)
    }

    fn gradients_sharded(&self) -> bool {
        self.reducer.shards_gradients()
    }

    fn optimizer_state_bytes(&self, setup: &TrainingSetup) -> u64 {
        match &self.sharded {
            Some(sharded) => sharded.own_state_bytes(),
            None => state_bytes(&setup.optimizer.state()),
        }
    }

    fn after_fit(&mut self, setup: &mut TrainingSetup) -> Result<()> {
        match self.sharded.take() {
            Some(sharded) => sharded.unshard(&mut setup.optimizer),
            None => Ok(()),
        }
    }

    fn shares(&self) -> Vec<usize> {
        self.balancer.as_ref().map(Balancer::shares).unwrap_or_default()
    }

    fn restore_shares(&mut self, saved: &[usize]) {
        if let Some(balancer) = &mut self.balancer {
            balancer.restore(saved);
        }
    }
}
