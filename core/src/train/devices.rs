//! `Trainer::devices`: the same program on one device or many, changed by one line. With more
//! than one device, `fit` trains the setup it is given as rank 0 (on the first device, on this
//! thread, with this trainer's listeners and callbacks) and one replica per further device on
//! threads of this process, each built by the factory the program already uses for its own
//! setup, their gradients averaged after every backward pass (PyTorch's DDP).
//!
//! The loaders are the program's: each replica takes its contiguous slice of every batch the
//! training loader would give one device (`ShardedBatches::of_sampler`), so the batch size
//! stays the global one and the run takes one device's steps; rank 0 validates on the
//! validation loader as it is. Dropout draws by each sample's place in the global batch, so
//! with `sync_batchnorm` the run follows the one-device run up to summation order (the
//! conventions of `DataParallel::on_threads`, `replicas.rs`).

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use super::replicas::batchnorm_groups;
use super::setup::TrainingSetup;
use super::strategy::{DataParallel, Strategy};
use super::trainer::{FitReport, Trainer};
use crate::backend::Communicator;
use crate::data::{BatchShares, DataLoader, DataLoaderConfig, ShardedBatches};
use crate::device::{Device, communicator_group};
use crate::distributed::{Reducer, ReducerConfig};
use crate::error::{Error, Result};

/// Builds a replica's model, optimizer and schedule on a device: the function a one-device
/// program calls for its own setup.
pub type SetupFactory = Arc<dyn Fn(&Device) -> Result<TrainingSetup> + Send + Sync>;

/// The devices a trainer's `fit` runs on, and how its replicas are made.
pub(super) struct Devices {
    pub(super) list: Vec<Device>,
    pub(super) build: SetupFactory,
}

/// How long a collective waits for a replica before the run fails (`DataParallel::on_threads`'
/// default).
const TIMEOUT: Duration = Duration::from_secs(600);

/// A replica's gradient reducer over `gradients`, its BatchNorm layers first made SyncBatchNorm
/// over `batchnorm` where the run asks for it (before the reducer, as DDP wants). Making it is a
/// collective: every replica's setup must be on its way.
pub(super) fn replica_reducer(
    setup: &mut TrainingSetup,
    gradients: Box<dyn Communicator>,
    batchnorm: Option<Arc<dyn Communicator>>,
    buckets: ReducerConfig,
) -> Result<Reducer> {
    if let Some(comm) = &batchnorm {
        setup.model.convert_sync_batchnorm(comm);
    }
    Reducer::for_model(setup.model.as_ref(), Arc::from(gradients), buckets)
}

/// Where `fit`'s replicas start from: the checkpoint rank 0 resumed from, read again by each.
fn resume_path(trainer: &Trainer) -> Option<String> {
    trainer.pending_resume.as_ref().map(|p| p.path.clone())
}

impl Trainer {
    /// `fit` over `devices`: `setup` as rank 0 on this thread, a replica per further device on
    /// threads of its own.
    pub(super) fn fit_on_devices(
        &mut self,
        devices: &Devices,
        setup: &mut TrainingSetup,
        train: &DataLoader,
        val: Option<&DataLoader>,
    ) -> Result<FitReport> {
        let world = devices.list.len();
        let refuse = |msg: String| Err(Error::invalid("Trainer::devices", msg));
        if setup.device.location() != devices.list[0].location() {
            return refuse(format!(
                "the setup given to fit is on {}, not on the first of the devices ({}): build it there, it is rank 0",
                setup.device.location(),
                devices.list[0].location()
            ));
        }
        let Some(sampler) = train.sampler() else {
            return refuse("the training loader gives its batches whole; give one made from a sampler".into());
        };
        let config = train.config();
        if config.drop_last || !config.batch_size.is_multiple_of(world) {
            return refuse(format!(
                "the training loader's batch of {} (the global batch) must split evenly over {world} devices, without drop_last",
                config.batch_size
            ));
        }
        let shares = BatchShares::equal(config.batch_size, world)?;
        let loaders = (0..world)
            .map(|rank| {
                let batches = ShardedBatches::of_sampler(sampler.clone(), rank, shares.clone())?;
                let replica_config = DataLoaderConfig {
                    batch_size: config.batch_size / world,
                    ..config.clone()
                };
                DataLoader::with_batch_sampler(train.dataset().clone(), Arc::new(batches), replica_config)
            })
            .collect::<Result<Vec<_>>>()?;
        let mut comms = communicator_group(&devices.list, TIMEOUT)?
            .into_iter()
            .zip(batchnorm_groups(&devices.list, self.sync_batchnorm, TIMEOUT)?);
        let Some((gradients, batchnorm)) = comms.next() else {
            return refuse("no communicator for rank 0".into());
        };
        let resume = resume_path(self);
        let config = self.config.clone();
        let (config, build) = (&config, &devices.build);
        std::thread::scope(|scope| {
            let others: Vec<_> = comms
                .zip(loaders.iter().skip(1))
                .zip(&devices.list[1..])
                .map(|(((gradients, batchnorm), loader), device)| {
                    let resume = resume.clone();
                    scope.spawn(move || -> Result<FitReport> {
                        let mut setup = build(device)?;
                        let reducer = replica_reducer(&mut setup, gradients, batchnorm, ReducerConfig::default())?;
                        let mut trainer = Trainer::new(config.clone())?.with_strategy(DataParallel::new(reducer));
                        if let Some(path) = resume {
                            trainer.resume(&mut setup, Path::new(&path))?;
                        }
                        trainer.fit(&mut setup, loader, None)
                    })
                })
                .collect();
            // After the others start: making a reducer is a collective.
            let leader = replica_reducer(setup, gradients, batchnorm, ReducerConfig::default())
                .and_then(|reducer| self.fit_as_rank_0(DataParallel::new(reducer), setup, &loaders[0], val));
            let (mut rate, mut state_bytes) = (0.0, Vec::new());
            for (rank, handle) in (1..).zip(others) {
                let report = handle
                    .join()
                    .unwrap_or_else(|_| Err(Error::invalid("replica", "panicked".to_string())))
                    .map_err(|e| {
                        Error::invalid(
                            "Trainer::devices",
                            format!("replica {rank} on {}: {e}", devices.list[rank].location()),
                        )
                    })?;
                rate += report.samples_per_sec;
                state_bytes.extend(report.optimizer_state_bytes);
            }
            let mut report = leader?;
            report.samples_per_sec += rate;
            report.optimizer_state_bytes.extend(state_bytes);
            Ok(report)
        })
    }

    /// `fit` with `strategy` in place of this trainer's own, which is put back after.
    fn fit_as_rank_0(
        &mut self,
        strategy: impl Strategy + 'static,
        setup: &mut TrainingSetup,
        train: &DataLoader,
        val: Option<&DataLoader>,
    ) -> Result<FitReport> {
        let own = std::mem::replace(&mut self.strategy, Box::new(strategy));
        let report = self.fit(setup, train, val);
        // The replicas' communicators end with the run: what follows (`test`) is one device's.
        self.strategy = own;
        report
    }
}
