//! `lockstep train`: MNIST with a built-in model, as a thin layer over the core Trainer.

mod balance;
mod dashboard;
mod data;
mod download;
mod memory_estimate;
mod pipeline;
mod process_group;
mod setup;
mod summary;
mod weights_dump;

use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use anyhow::Context;
use lockstep_core::Device;
use lockstep_core::backend::Communicator;
use lockstep_core::data::{
    BatchShares, DataLoader, DataLoaderConfig, Dataset, RandomSampler, Sampler, SequentialSampler,
};
use lockstep_core::device::communicator_group;
use lockstep_core::distributed::{Balancer, Reducer};
use lockstep_core::train::pipeline::{Pipeline, ProcessStages};
use lockstep_core::train::{
    ChannelListener, DataParallel, EvalMetrics, FitReport, JsonlWriter, ModelCheckpoint, Monitor, OnWriteError,
    TensorBoardWriter, Trainer, batchnorm_groups, each_replica,
};

pub use dashboard::launcher;
pub use lockstep_flags::train::Args;
use lockstep_flags::train::OnCheckpointError;
pub use process_group::NO_MPI;

use self::pipeline::StagePlan;
use lockstep_flags::world::WorldEnv;

/// What a caller outside the CLI attaches to the run: the dashboard's event channel and its
/// stop and pause buttons (single-device runs only: a paused replica would hold the others in
/// their all-reduces), or the flag that Ctrl-C sets (every replica; they agree on the step).
#[derive(Clone, Default)]
pub struct Hooks {
    pub events: Option<ChannelListener>,
    pub controls: Option<(Arc<AtomicBool>, Arc<AtomicBool>)>,
    pub interrupted: Option<Arc<AtomicBool>>,
}

/// Runs a training whose flags `lockstep_flags::validate` accepted.
pub fn run(args: Args) -> anyhow::Result<()> {
    // Before anything touches a tensor or lists devices (the dashboard does): rayon's pool is
    // sized once.
    super::threads::init(args.threads)?;
    if args.dashboard {
        anyhow::ensure!(
            WorldEnv::from_env()?.is_none(),
            "--dashboard opens a window in every process of a launched job: instead, give rank 0 --metrics-out \
             FILE and watch it with `lockstep dashboard --follow FILE`"
        );
        return dashboard::run(args);
    }
    let hooks = Hooks {
        interrupted: Some(crate::cli::interrupt::stop_on_signal(
            "stopping after this step and saving the checkpoint",
        )?),
        ..Hooks::default()
    };
    train(args, hooks)
}

/// The whole run: the data, then one of three ways to train (one process of a launched job,
/// several devices on threads of this process, one device), then rank 0's summary.
fn train(args: Args, hooks: Hooks) -> anyhow::Result<()> {
    let (train_set, test_set) = data::load(&args)?;
    if args.estimate_memory {
        return memory_estimate::print(&args, train_set.as_ref());
    }
    let finished = match WorldEnv::from_env()? {
        Some(world) => process_group::train(&args, &world, train_set, test_set, &hooks)?,
        None => {
            let mut devices = setup::devices(&args)?;
            if let Some(stages) = StagePlan::from_args(&args, train_set.as_ref())? {
                Some(match stages.replicas.len() {
                    1 => alone(&args, Placement::Stages(stages), train_set, test_set, &hooks)?,
                    _ => pipeline_replicas(&args, &stages, train_set, test_set, &hooks)?,
                })
            } else if devices.len() == 1 {
                let placement = Placement::Device(devices.remove(0));
                Some(alone(&args, placement, train_set, test_set, &hooks)?)
            } else {
                Some(on_threads(&args, devices, train_set, test_set, &hooks)?)
            }
        }
    };
    // Only rank 0 of a process group reports.
    finished.map_or(Ok(()), |f| f.summarize(&args))
}

/// One model, in this thread: on one device, or split into pipeline stages (a thread each).
fn alone(
    args: &Args,
    placement: Placement,
    train_set: Arc<dyn Dataset>,
    test_set: Arc<dyn Dataset>,
    hooks: &Hooks,
) -> anyhow::Result<Finished> {
    let (device, report, result) = replica(args, placement, Collectives::default(), train_set, test_set, hooks)?;
    Ok(Finished {
        device,
        samples_per_sec: report.samples_per_sec,
        report,
        result,
    })
}

/// One thread per replica of a pipeline, each running its stages on threads of their own;
/// each stage's gradients averaged over the replicas' devices of that stage; rank 0 reports.
fn pipeline_replicas(
    args: &Args,
    stages: &StagePlan,
    train_set: Arc<dyn Dataset>,
    test_set: Arc<dyn Dataset>,
    hooks: &Hooks,
) -> anyhow::Result<Finished> {
    let replicas = stages.replicas.len();
    let mut comms: Vec<Vec<Box<dyn Communicator>>> = (0..replicas).map(|_| Vec::new()).collect();
    for s in 0..stages.sizes.len() {
        let group = communicator_group(&stages.stage_devices(s), args.collective_timeout())?;
        comms.iter_mut().zip(group).for_each(|(mine, c)| mine.push(c));
    }
    let work = comms
        .into_iter()
        .enumerate()
        .map(|(r, stage_comms)| {
            let collectives = Collectives {
                stages: stage_comms,
                ..Collectives::default()
            };
            (Placement::Stages(stages.replica(r)), collectives)
        })
        .collect();
    side_by_side(args, work, stages.describe(), train_set, test_set, hooks)
}

/// One thread per device, each a replica; rank 0 reports.
fn on_threads(
    args: &Args,
    devices: Vec<Device>,
    train_set: Arc<dyn Dataset>,
    test_set: Arc<dyn Dataset>,
    hooks: &Hooks,
) -> anyhow::Result<Finished> {
    let comms = communicator_group(&devices, args.collective_timeout())?;
    let batchnorm_comms = batchnorm_groups(&devices, args.sync_batchnorm, args.collective_timeout())?;
    let work = comms
        .into_iter()
        .zip(batchnorm_comms)
        .zip(devices)
        .map(|((comm, batchnorm), device)| {
            let collectives = Collectives {
                gradients: Some(comm),
                batchnorm,
                ..Collectives::default()
            };
            (Placement::Device(device), collectives)
        })
        .collect();
    side_by_side(args, work, args.devices.join(","), train_set, test_set, hooks)
}

/// Every replica of `work` on a thread of its own; rank 0 reports, as `name` for its device.
fn side_by_side(
    args: &Args,
    work: Vec<(Placement, Collectives)>,
    name: String,
    train_set: Arc<dyn Dataset>,
    test_set: Arc<dyn Dataset>,
    hooks: &Hooks,
) -> anyhow::Result<Finished> {
    let hooks = Hooks {
        controls: None,
        ..hooks.clone()
    };
    let results = each_replica(work, |_, (placement, collectives)| {
        replica(
            args,
            placement,
            collectives,
            train_set.clone(),
            test_set.clone(),
            &hooks,
        )
    });
    Ok(Finished {
        device: name,
        ..rank_0_of(results)?
    })
}

/// Rank 0's report once every replica is done, with the run's rate: the sum of the replicas'
/// (they trained side by side; their shares differ in a balanced run). The first failure, by
/// rank, fails the run.
fn rank_0_of(results: Vec<anyhow::Result<(String, FitReport, EvalMetrics)>>) -> anyhow::Result<Finished> {
    let mut done = Vec::with_capacity(results.len());
    for (rank, r) in results.into_iter().enumerate() {
        done.push(r.with_context(|| format!("replica {rank}"))?);
    }
    let samples_per_sec = done.iter().map(|(_, r, _)| r.samples_per_sec).sum();
    let state_bytes: Vec<u64> = done
        .iter()
        .flat_map(|(_, r, _)| r.optimizer_state_bytes.clone())
        .collect();
    let (device, mut report, result) = done.swap_remove(0);
    report.optimizer_state_bytes = state_bytes;
    Ok(Finished {
        device,
        samples_per_sec,
        report,
        result,
    })
}

/// What the reporting replica (rank 0) hands to the summary.
struct Finished {
    /// The device(s), as the summary names them.
    device: String,
    /// The whole run's rate, every replica's samples counted.
    samples_per_sec: f64,
    report: FitReport,
    result: EvalMetrics,
}

impl Finished {
    fn summarize(mut self, args: &Args) -> anyhow::Result<()> {
        self.report.samples_per_sec = self.samples_per_sec;
        let peaks = summary::peaks(&setup::devices(args)?);
        let summary = summary::Summary::new(args, &self.device, &self.report, &self.result, peaks);
        summary.print();
        if let Some(path) = &args.summary_out {
            summary.write(path)?;
        }
        Ok(())
    }
}

/// A replica's communicators in a data-parallel run; none on a single device.
#[derive(Default)]
struct Collectives {
    /// The gradient reducer's.
    gradients: Option<Box<dyn Communicator>>,
    /// SyncBatchNorm's (--sync-batchnorm): a group of its own.
    batchnorm: Option<Arc<dyn Communicator>>,
    /// A replica of a pipeline: one per stage, over every replica's device of that stage.
    stages: Vec<Box<dyn Communicator>>,
    /// One stage of a pipeline whose stages are the job's processes.
    pipeline: Option<ProcessStages>,
}

impl Collectives {
    /// This replica's rank and the number of replicas.
    fn rank_and_world(&self) -> (usize, usize) {
        let group = self.gradients.as_deref().or(self.stages.first().map(|c| c.as_ref()));
        group.map_or((0, 1), |c| (c.rank(), c.world_size()))
    }
}

/// Trains one replica: the whole run without a gradient communicator, else that communicator's
/// rank of a data-parallel run (its slice of every global batch, gradients averaged by a reducer;
/// only rank 0 validates, shows progress, writes metrics and checkpoints).
/// The trainer with the strategy of `placement` and `collectives`: one device, a data-parallel
/// replica (balanced by `shares`), a pipeline, or one replica of a pipeline.
fn with_strategy(
    trainer: Trainer,
    args: &Args,
    placement: &Placement,
    collectives: Collectives,
    setup: &lockstep_core::train::TrainingSetup,
    shares: Option<BatchShares>,
) -> anyhow::Result<Trainer> {
    if let Some(processes) = collectives.pipeline {
        let strategy = Pipeline::new(args.schedule, args.micro_batches).across_processes(processes);
        return Ok(trainer.with_strategy(strategy));
    }
    if let Placement::Stages(stages) = placement {
        return Ok(if collectives.stages.is_empty() {
            trainer.with_strategy(stages.strategy(args))
        } else {
            trainer.with_strategy(stages.hybrid(args, setup, collectives.stages)?)
        });
    }
    let Some(comm) = collectives.gradients else {
        return Ok(trainer);
    };
    let reducer = Reducer::for_model(setup.model.as_ref(), Arc::from(comm), args.reducer_config())?;
    let balancer = match shares {
        Some(shares) => Some(Balancer::new(shares, reducer.communicator(), args.rebalance_every)?),
        None => None,
    };
    let strategy = DataParallel::new(reducer);
    Ok(trainer.with_strategy(match balancer {
        Some(balancer) => strategy.with_balancer(balancer),
        None => strategy,
    }))
}

/// Where a replica's model lives.
enum Placement {
    Device(Device),
    /// Split into pipeline stages, each on its own device.
    Stages(StagePlan),
}

/// `--device-memory-limit` on every device of `placement`, before anything is allocated there.
fn limit_memory(args: &Args, placement: &Placement) -> anyhow::Result<()> {
    let Some(mib) = args.device_memory_limit else {
        return Ok(());
    };
    let devices: Vec<&Device> = match placement {
        Placement::Device(device) => vec![device],
        Placement::Stages(stages) => stages.replicas.iter().flatten().collect(),
    };
    for device in devices {
        device.backend().set_memory_limit(Some(mib << 20))?;
    }
    Ok(())
}

fn replica(
    args: &Args,
    placement: Placement,
    collectives: Collectives,
    train_set: Arc<dyn Dataset>,
    test_set: Arc<dyn Dataset>,
    hooks: &Hooks,
) -> anyhow::Result<(String, FitReport, EvalMetrics)> {
    // A pipeline of processes: this one's stage. Every stage validates, tests and checkpoints
    // (its own layers); only the first reports.
    let stage = collectives.pipeline.as_ref().map(|p| (p.stage(), p.stages()));
    limit_memory(args, &placement)?;
    let (location, mut setup) = match (&placement, stage) {
        (Placement::Device(device), Some((stage, stages))) => (
            device.location().to_string(),
            pipeline::process_stage_setup(args, stage, stages, device)?,
        ),
        (Placement::Device(device), None) => (device.location().to_string(), setup::build(args, device.clone())?),
        (Placement::Stages(stages), _) => (stages.describe(), stages.setup(args)?),
    };
    let stage = stage.map(|(stage, _)| stage);
    if let Some(comm) = &collectives.batchnorm {
        // Before the reducer exists, as PyTorch converts before wrapping in DDP.
        setup.model.convert_sync_batchnorm(comm);
    }
    let (rank, world) = collectives.rank_and_world();
    let loader_config = DataLoaderConfig {
        batch_size: args.batch_size / world,
        num_workers: args.workers,
        ..Default::default()
    };
    let shares = balance::initial_shares(args, world)?;
    let train = if world > 1 {
        // Every replica a contiguous slice of each global batch (equal unless balanced), so
        // draws keyed to a sample's place in the global batch (dropout) are one device's.
        let cut = match &shares {
            Some(balanced) => balanced.clone(),
            None => BatchShares::equal(args.batch_size, world)?,
        };
        balance::loader(args, train_set, rank, &cut, loader_config.clone())?
    } else {
        let len = train_set.len();
        let sampler: Arc<dyn Sampler> = if args.no_shuffle {
            Arc::new(SequentialSampler { len })
        } else {
            Arc::new(RandomSampler { len, seed: args.seed })
        };
        DataLoader::new(train_set, sampler, loader_config.clone())?
    };
    setup.scheduler = setup::scheduler(args, train.len(), setup.optimizer.as_mut())?;
    // Evaluation at the training batch size: its batches then fit the memory that training's
    // already do (at 1000 images a ResNet-18's evaluation held 9 GiB, mostly in the CPU pool's
    // cache of its larger activations and convolution columns).
    let eval_config = loader_config;
    let test = DataLoader::simple(test_set, false, 0, eval_config)?;

    let mut trainer = with_strategy(
        Trainer::new(args.trainer_config())?,
        args,
        &placement,
        collectives,
        &setup,
        shares,
    )?;
    if let Some((stop, pause)) = &hooks.controls {
        trainer = trainer.with_controls(stop.clone(), pause.clone());
    } else if let Some(stop) = &hooks.interrupted {
        trainer = trainer.with_controls(stop.clone(), Arc::new(AtomicBool::new(false)));
    }
    let leader = rank == 0 && stage.unwrap_or(0) == 0;
    if leader {
        if let Some(events) = &hooks.events {
            trainer.add_listener(events.clone());
        }
        if let Some(path) = &args.metrics_out {
            trainer.add_listener(JsonlWriter::create(path)?);
        }
        if let Some(dir) = &args.tensorboard {
            let writer = TensorBoardWriter::create(dir)
                .with_context(|| format!("cannot write TensorBoard files to {}", dir.display()))?;
            trainer.add_listener(writer);
        }
    }
    if let Some(dir) = args.checkpoint_dir_of(stage).filter(|_| leader || stage.is_some()) {
        // Without validation there is no val_acc to rank by (the run would fail at the first
        // epoch end): keep only last.safetensors.
        let mut checkpoint = ModelCheckpoint::new(dir).on_write_error(match args.on_checkpoint_error {
            OnCheckpointError::Stop => OnWriteError::Stop,
            OnCheckpointError::Warn => OnWriteError::Warn,
        });
        checkpoint.every_n_train_steps = args.checkpoint_every_n_steps;
        checkpoint.keep_numbered = args.keep_checkpoints;
        trainer.add_callback(if args.no_val {
            checkpoint
        } else {
            checkpoint.monitor(Monitor::max("val_acc"), 1)
        });
    }
    match args.resume_from(stage)? {
        Some(path) => {
            same_model_as(&setup.hparams, &path)?;
            // The trainer's progress lines say where it resumed from (epoch and step), once
            // `fit` has checked that this run continues the checkpoint's.
            trainer
                .resume(&mut setup, &path)
                .with_context(|| format!("cannot resume from {}", path.display()))?;
        }
        None if args.resume.is_some() && leader => {
            eprintln_whole!(
                "--resume last: no checkpoint in --checkpoint-dir yet, so training starts from the beginning"
            )
        }
        None => {}
    }
    let evaluates = leader || stage.is_some();
    let validate = evaluates && !args.no_val;
    let report = trainer.fit(&mut setup, &train, validate.then_some(&test))?;
    if let Some(dir) = &args.dump_weights {
        weights_dump::write(dir, stage.unwrap_or(rank), setup.model.as_ref())?;
    }
    let result = if evaluates {
        trainer.test(&mut setup, &test)?
    } else {
        EvalMetrics::default()
    };
    Ok((location, report, result))
}

/// A GPT resumed as another model would compute something else with the same weights: a GELU
/// (from Hugging Face weights) or a tokenizer that differs from the checkpoint's is refused. The
/// sizes need no check here: loading the weights refuses a shape that differs.
fn same_model_as(hparams: &std::collections::BTreeMap<String, String>, path: &std::path::Path) -> anyhow::Result<()> {
    let Ok(recorded) = lockstep_core::train::checkpoint::hparams(path) else {
        return Ok(());
    };
    for key in ["gelu", "tokenizer"] {
        let (was, now) = (recorded.get(key), hparams.get(key));
        anyhow::ensure!(
            was.is_none() || was == now,
            "{} was trained with {key} {:?}, this run would go on with {:?}: resume with the flags it was started \
             with (its GELU comes from --init-weights, its tokenizer from --tokenizer)",
            path.display(),
            was.map_or("none", String::as_str),
            now.map_or("none", String::as_str)
        );
    }
    Ok(())
}
