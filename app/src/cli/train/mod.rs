//! `lockstep train`: MNIST with a built-in model, as a thin layer over the core Trainer.

mod args;
mod dashboard;
mod download;
mod progress;
mod setup;
mod summary;

use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use anyhow::Context;
use lockstep_core::Device;
use lockstep_core::backend::Communicator;
use lockstep_core::data::mnist::{Mnist, Split};
use lockstep_core::data::{
    DataLoader, DataLoaderConfig, Dataset, DistributedSampler, RandomSampler, Sampler, SequentialSampler,
};
use lockstep_core::distributed::{Reducer, ReducerConfig};
use lockstep_core::train::{ChannelListener, EvalMetrics, FitReport, JsonlWriter, ModelCheckpoint, Monitor, Trainer};

pub use args::Args;
pub use dashboard::launcher;
pub(crate) use setup::communicators;

/// What a caller outside the CLI attaches to the run: the dashboard's event channel and its
/// stop and pause buttons (single-device runs only: replicas must stop at the same step).
#[derive(Clone, Default)]
pub struct Hooks {
    pub events: Option<ChannelListener>,
    pub controls: Option<(Arc<AtomicBool>, Arc<AtomicBool>)>,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    args.validate()?;
    // Before anything touches a tensor or lists devices (the dashboard does): rayon's pool is
    // sized once.
    super::threads::init(args.threads)?;
    if args.dashboard {
        return dashboard::run(args);
    }
    train(args, Hooks::default())
}

/// The whole run: data, devices, one or more replicas, the summary.
fn train(args: Args, hooks: Hooks) -> anyhow::Result<()> {
    let data_dir = args.data_dir();
    if args.download {
        download::fetch_missing(&data_dir, &args.download_url, &download::CONTENT_SHA256, !args.headless)?;
    }
    let train_set: Arc<dyn Dataset> =
        Arc::new(Mnist::load(&data_dir, Split::Train).with_context(|| missing_data_hint(&data_dir))?);
    let test_set: Arc<dyn Dataset> =
        Arc::new(Mnist::load(&data_dir, Split::Test).with_context(|| missing_data_hint(&data_dir))?);
    let devices = setup::devices(&args)?;
    let world = devices.len();
    let (device, mut report, result) = if devices.len() == 1 {
        replica(
            &args,
            devices[0].clone(),
            Collectives::default(),
            train_set,
            test_set,
            &hooks,
        )?
    } else {
        // One thread per replica; rank 0 reports.
        let comms = setup::communicators(&devices)?;
        let batchnorm_comms = setup::sync_batchnorm_communicators(&args, &devices)?;
        let handles: Vec<_> = comms
            .into_iter()
            .zip(batchnorm_comms)
            .zip(devices)
            .map(|((comm, batchnorm), device)| {
                let (args, train, test) = (args.clone(), train_set.clone(), test_set.clone());
                let hooks = Hooks {
                    controls: None,
                    ..hooks.clone()
                };
                let collectives = Collectives {
                    gradients: Some(comm),
                    batchnorm,
                };
                std::thread::spawn(move || replica(&args, device, collectives, train, test, &hooks))
            })
            .collect();
        let mut results = Vec::new();
        for (rank, h) in handles.into_iter().enumerate() {
            let r = h.join().map_err(|_| anyhow::anyhow!("replica {rank} panicked"))?;
            results.push(r.with_context(|| format!("replica {rank}"))?);
        }
        let (_, report, result) = results.swap_remove(0);
        (args.devices.join(","), report, result)
    };
    // Rank 0 counted its own samples; every replica processed as many.
    report.samples_per_sec *= world as f64;
    let summary = summary::Summary::new(&args, &device, &report, &result);
    summary.print();
    if let Some(path) = &args.summary_out {
        summary.write(path)?;
    }
    Ok(())
}

/// A replica's communicators in a data-parallel run; none on a single device.
#[derive(Default)]
struct Collectives {
    /// The gradient reducer's.
    gradients: Option<Box<dyn Communicator>>,
    /// SyncBatchNorm's (--sync-batchnorm): a group of its own.
    batchnorm: Option<Arc<dyn Communicator>>,
}

/// Trains one replica: the whole run without a gradient communicator, else that communicator's
/// rank of a data-parallel run (its DistributedSampler shard, gradients averaged by a reducer;
/// only rank 0 validates, shows progress, writes metrics and checkpoints).
fn replica(
    args: &Args,
    device: Device,
    collectives: Collectives,
    train_set: Arc<dyn Dataset>,
    test_set: Arc<dyn Dataset>,
    hooks: &Hooks,
) -> anyhow::Result<(String, FitReport, EvalMetrics)> {
    let location = device.location().to_string();
    let mut setup = setup::build(args, device)?;
    if let Some(comm) = &collectives.batchnorm {
        // Before the reducer exists, as PyTorch converts before wrapping in DDP.
        setup.model.convert_sync_batchnorm(comm);
    }
    let comm = collectives.gradients;
    let (rank, world) = comm.as_ref().map_or((0, 1), |c| (c.rank(), c.world_size()));
    let loader_config = DataLoaderConfig {
        batch_size: args.batch_size / world,
        num_workers: args.workers,
        ..Default::default()
    };
    let len = train_set.len();
    let sampler: Arc<dyn Sampler> = if world > 1 {
        Arc::new(DistributedSampler::new(
            len,
            world,
            rank,
            !args.no_shuffle,
            args.seed,
            false,
        )?)
    } else if args.no_shuffle {
        Arc::new(SequentialSampler { len })
    } else {
        Arc::new(RandomSampler { len, seed: args.seed })
    };
    let train = DataLoader::new(train_set, sampler, loader_config.clone())?;
    let eval_config = DataLoaderConfig {
        batch_size: 1000,
        ..loader_config
    };
    let test = DataLoader::simple(test_set, false, 0, eval_config)?;

    let mut trainer = Trainer::new(args.trainer_config())?;
    if let Some(comm) = comm {
        let reducer = Reducer::for_model(setup.model.as_ref(), Arc::from(comm), ReducerConfig::default())?;
        trainer = trainer.with_reducer(reducer);
    }
    if let Some((stop, pause)) = &hooks.controls {
        trainer = trainer.with_controls(stop.clone(), pause.clone());
    }
    let leader = rank == 0;
    if leader {
        if let Some(events) = &hooks.events {
            trainer.add_listener(events.clone());
        }
        if let Some(path) = &args.metrics_out {
            trainer.add_listener(JsonlWriter::create(path)?);
        }
        trainer.add_listener(progress::ProgressBar::new(args.headless));
        if let Some(dir) = &args.checkpoint_dir {
            // Without validation there is no val_acc to rank by (the run would fail at the first
            // epoch end): keep only last.safetensors.
            let checkpoint = ModelCheckpoint::new(dir);
            trainer.add_callback(if args.no_val {
                checkpoint
            } else {
                checkpoint.monitor(Monitor::max("val_acc"), 1)
            });
        }
    }
    if let Some(path) = &args.resume {
        trainer
            .resume(&mut setup, path)
            .with_context(|| format!("cannot resume from {}", path.display()))?;
    }
    let validate = leader && !args.no_val;
    let report = trainer.fit(&mut setup, &train, validate.then_some(&test))?;
    let result = if leader {
        trainer.test(&mut setup, &test)?
    } else {
        EvalMetrics::default()
    };
    Ok((location, report, result))
}

fn missing_data_hint(dir: &std::path::Path) -> String {
    format!(
        "cannot read MNIST from {}: put the four standard files (train-images-idx3-ubyte.gz, train-labels-idx1-ubyte.gz, t10k-images-idx3-ubyte.gz, t10k-labels-idx1-ubyte.gz) there, or pass --data DIR (or set LOCKSTEP_DATA), or add --download to fetch them",
        dir.display()
    )
}
