//! Data parallel as one call: `DataParallel::on_threads(devices)` runs one replica per device on
//! threads of this process, each a Trainer whose gradients are averaged by a bucketed reducer
//! over a local communicator group (PyTorch's DDP, one replica per device, without launching
//! processes).
//!
//! The conventions, as PyTorch's DDP and Lightning have them:
//! - the batch size given is the **global** batch: each of `n` replicas gets `batch / n`
//!   samples of every step, its contiguous slice of each global batch (`ShardedBatches`: the
//!   same shuffle on every rank), so the run takes the steps a single device would, on the
//!   batches a single device would;
//! - every replica's weights and random streams (Dropout's) start as rank 0's (broadcast), so
//!   `build` need not seed identically; a draw depends on the sample's place in the global
//!   batch, not on the replica (`rng::BatchWindow`), so dropout masks are one device's, and
//!   with `sync_batchnorm` the run follows the one-device run up to summation order;
//! - validation, listeners and callbacks (checkpoints) run on rank 0 only (`leader`);
//! - the result is rank 0's trained setup and report, its rate summed over the replicas.

use std::sync::Arc;
use std::time::Duration;

use super::config::TrainerConfig;
use super::setup::TrainingSetup;
use super::strategy::DataParallel;
use super::trainer::{FitReport, Trainer};
use crate::backend::Communicator;
use crate::data::{BatchShares, DataLoader, DataLoaderConfig, Dataset, ShardedBatches};
use crate::device::{Device, communicator_group};
use crate::distributed::ReducerConfig;
use crate::error::{Error, Result};

/// Where `build` is making a replica: its rank among `world`, and its device.
#[derive(Clone, Debug)]
pub struct Replica {
    /// This replica's rank, from 0; rank 0 validates, logs and saves checkpoints.
    pub rank: usize,
    /// Replicas in the run: one per device.
    pub world: usize,
    /// The device this replica trains on: build its model there.
    pub device: Device,
}

/// Rank 0's trainer, before `fit`: add listeners and callbacks here.
type Leader = Box<dyn FnOnce(&mut Trainer) -> Result<()> + Send>;

/// A data-parallel run on threads, configured by its builder methods, started by `fit`.
pub struct OnThreads {
    devices: Vec<Device>,
    plan: Plan,
    timeout: Duration,
    leader: Option<Leader>,
}

/// What every replica's thread reads to build its run.
struct Plan {
    config: TrainerConfig,
    batch_size: usize,
    workers: usize,
    shuffle: bool,
    seed: u64,
    reducer: ReducerConfig,
    sync_batchnorm: bool,
}

/// A replica's communicators: the reducer's, and SyncBatchNorm's (a group of its own, so its
/// collectives never interleave with the reducer's, which run on another thread).
type Comms = (Box<dyn Communicator>, Option<Arc<dyn Communicator>>);

/// Rank 0's model, optimizer and report after training.
pub struct Trained {
    /// Rank 0's trained model, optimizer and scheduler.
    pub setup: TrainingSetup,
    /// Rank 0's report, its `samples_per_sec` summed over every replica.
    pub report: FitReport,
}

impl DataParallel {
    /// One replica per device of `devices` (e.g. `cpu:0,cpu:1`, `cuda:0,cuda:1`), on threads.
    pub fn on_threads(devices: Vec<Device>) -> OnThreads {
        OnThreads {
            devices,
            plan: Plan {
                config: TrainerConfig::default(),
                batch_size: 64,
                workers: 0,
                shuffle: true,
                seed: 0,
                reducer: ReducerConfig::default(),
                sync_batchnorm: false,
            },
            timeout: Duration::from_secs(600),
            leader: None,
        }
    }
}

impl OnThreads {
    /// Epochs, steps, precision, clipping, accumulation: every replica runs this config.
    pub fn config(mut self, config: TrainerConfig) -> OnThreads {
        self.plan.config = config;
        self
    }
    /// The global batch (default 64), split evenly over the replicas.
    pub fn batch_size(mut self, global: usize) -> OnThreads {
        self.plan.batch_size = global;
        self
    }
    /// Loader threads per replica (default 0: batches are read on the training thread).
    pub fn workers(mut self, workers: usize) -> OnThreads {
        self.plan.workers = workers;
        self
    }
    /// Whether the sampler shuffles each epoch (default true), from `seed` (default 0).
    pub fn shuffle(mut self, shuffle: bool, seed: u64) -> OnThreads {
        self.plan.shuffle = shuffle;
        self.plan.seed = seed;
        self
    }
    /// Gradient buckets (PyTorch's 1 MiB first bucket, then 25 MiB).
    pub fn buckets(mut self, reducer: ReducerConfig) -> OnThreads {
        self.plan.reducer = reducer;
        self
    }
    /// BatchNorm layers normalise over the global batch, every replica's samples together
    /// (PyTorch's `SyncBatchNorm.convert_sync_batchnorm`, made before the reducer as DDP wants).
    pub fn sync_batchnorm(mut self, sync: bool) -> OnThreads {
        self.plan.sync_batchnorm = sync;
        self
    }
    /// How long a collective waits for a replica before the run fails (default 10 minutes).
    pub fn timeout(mut self, timeout: Duration) -> OnThreads {
        self.timeout = timeout;
        self
    }
    /// Prepares rank 0's trainer: listeners (progress, logs) and callbacks (checkpoints).
    pub fn leader(mut self, prepare: impl FnOnce(&mut Trainer) -> Result<()> + Send + 'static) -> OnThreads {
        self.leader = Some(Box::new(prepare));
        self
    }

    /// Trains `build`'s setups on `train` (rank 0 validating on `val`) and returns rank 0's.
    pub fn fit(
        self,
        train: Arc<dyn Dataset>,
        val: Option<Arc<dyn Dataset>>,
        build: impl Fn(&Replica) -> Result<TrainingSetup> + Sync,
    ) -> Result<Trained> {
        let OnThreads {
            devices,
            plan,
            timeout,
            mut leader,
        } = self;
        let world = devices.len();
        if world == 0 {
            return Err(Error::invalid("DataParallel::on_threads", "needs at least one device"));
        }
        if plan.batch_size == 0 || !plan.batch_size.is_multiple_of(world) {
            return Err(Error::invalid(
                "DataParallel::on_threads",
                format!(
                    "the global batch {} does not split evenly over {world} devices: use a multiple of {world}",
                    plan.batch_size
                ),
            ));
        }
        let gradients = communicator_group(&devices, timeout)?;
        let batchnorm = batchnorm_groups(&devices, plan.sync_batchnorm, timeout)?;
        let comms: Vec<Comms> = gradients.into_iter().zip(batchnorm).collect();
        let (plan, train, val, build) = (&plan, &train, &val, &build);
        let work: Vec<_> = comms
            .into_iter()
            .zip(devices)
            .enumerate()
            .map(|(rank, (comm, device))| {
                (
                    Replica { rank, world, device },
                    comm,
                    if rank == 0 { leader.take() } else { None },
                )
            })
            .collect();
        let results = each_replica(work, |rank, (replica, comm, prepare)| {
            let val = if rank == 0 { val.clone() } else { None };
            plan.replica(&replica, comm, train.clone(), val, prepare, build)
        });
        let mut done = Vec::with_capacity(world);
        for (rank, result) in results.into_iter().enumerate() {
            done.push(result.map_err(|e| Error::invalid("DataParallel::on_threads", format!("replica {rank}: {e}")))?);
        }
        let rate: f64 = done.iter().map(|t| t.report.samples_per_sec).sum();
        let state_bytes: Vec<u64> = done
            .iter()
            .flat_map(|t| t.report.optimizer_state_bytes.clone())
            .collect();
        let mut first = done.swap_remove(0);
        first.report.samples_per_sec = rate;
        first.report.optimizer_state_bytes = state_bytes;
        Ok(first)
    }
}

impl Plan {
    /// One replica's whole run, on its own thread.
    fn replica(
        &self,
        replica: &Replica,
        (gradients, batchnorm): Comms,
        train: Arc<dyn Dataset>,
        val: Option<Arc<dyn Dataset>>,
        prepare: Option<Leader>,
        build: &(impl Fn(&Replica) -> Result<TrainingSetup> + Sync),
    ) -> Result<Trained> {
        let mut setup = build(replica)?;
        let reducer = super::devices::replica_reducer(&mut setup, gradients, batchnorm, self.reducer)?;
        let loader_config = DataLoaderConfig {
            batch_size: self.batch_size / replica.world,
            num_workers: self.workers,
            ..Default::default()
        };
        let shares = BatchShares::equal(self.batch_size, replica.world)?;
        let batches = ShardedBatches::new(train.len(), replica.rank, self.shuffle, self.seed, shares)?;
        let train = DataLoader::with_batch_sampler(train, Arc::new(batches), loader_config.clone())?;
        let val = val
            .map(|v| DataLoader::simple(v, false, 0, loader_config))
            .transpose()?;
        let mut trainer = Trainer::new(self.config.clone())?.with_strategy(DataParallel::new(reducer));
        if let Some(prepare) = prepare {
            prepare(&mut trainer)?;
        }
        let report = trainer.fit(&mut setup, &train, val.as_ref())?;
        Ok(Trained { setup, report })
    }
}

/// SyncBatchNorm's communicators for replicas on `devices`, one each by rank: a group of their
/// own, so their collectives never interleave with the gradient reducer's (which communicates
/// on its own thread); none where `sync` is off or there is only one device.
#[doc(hidden)]
pub fn batchnorm_groups(
    devices: &[Device],
    sync: bool,
    timeout: Duration,
) -> Result<Vec<Option<Arc<dyn Communicator>>>> {
    if !sync || devices.len() < 2 {
        return Ok(vec![None; devices.len()]);
    }
    Ok(communicator_group(devices, timeout)?
        .into_iter()
        .map(|c| Some(Arc::from(c)))
        .collect())
}

/// Runs `run(rank, item)` for every item of `work` (a replica's communicator and whatever else
/// it needs), each on a thread of its own, and returns their results by rank once all are done.
/// A replica that panics gives an error naming its rank, and does not take the others down.
/// `DataParallel::on_threads` runs on it, and so does the `lockstep` binary's data parallel.
#[doc(hidden)]
pub fn each_replica<W: Send, T: Send, E: Send + From<Error>>(
    work: Vec<W>,
    run: impl Fn(usize, W) -> std::result::Result<T, E> + Sync,
) -> Vec<std::result::Result<T, E>> {
    let run = &run;
    std::thread::scope(|scope| {
        let handles: Vec<_> = work
            .into_iter()
            .enumerate()
            .map(|(rank, item)| scope.spawn(move || run(rank, item)))
            .collect();
        handles
            .into_iter()
            .enumerate()
            .map(|(rank, h)| {
                h.join()
                    .unwrap_or_else(|_| Err(Error::invalid("replica", format!("replica {rank} panicked")).into()))
            })
            .collect()
    })
}
