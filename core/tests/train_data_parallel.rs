//! The Trainer as one replica of a data-parallel run: two replicas on cpu:0 and cpu:1, each
//! loading its DistributedSampler shard with batch B, end with weights identical to each other
//! bit for bit and equal (to f32 rounding) to one device trained with batch 2B on the same order.

mod parallel_support;
mod replica_support;

use std::sync::Arc;
use std::time::Duration;

use lockstep_core::backend::Communicator;
use lockstep_core::data::{DataLoader, DataLoaderConfig, DistributedSampler};
use lockstep_core::distributed::{Reducer, ReducerConfig};
use lockstep_core::nn::ModuleExt;
use lockstep_core::optim::GradScaler;
use lockstep_core::train::{
    Callback, CallbackAction, CallbackContext, ChannelListener, DataParallel, Event, Precision, StepTimes, Trainer,
    TrainerConfig,
};
use lockstep_core::{Device, Result};
use parallel_support::{on_cpu_ranks, on_cpu_ranks_with_timeout};
use replica_support::{LEN, Points, SEED, assert_close, config, setup, single_device, weights};

fn replicas(batch: usize, accumulate: usize) -> Vec<Vec<Vec<f32>>> {
    replicas_with_events(batch, accumulate)
        .into_iter()
        .map(|(w, _)| w)
        .collect()
}

/// Rank `rank`'s DistributedSampler shard of the points (world 2), in batches of `batch`.
fn shard(rank: usize, batch: usize, num_workers: usize) -> DataLoader {
    let sampler = Arc::new(DistributedSampler::new(LEN, 2, rank, true, SEED, false).unwrap());
    let loader_config = DataLoaderConfig {
        batch_size: batch,
        num_workers,
        ..Default::default()
    };
    DataLoader::new(Arc::new(Points), sampler, loader_config).unwrap()
}

/// A replica's final weights and its events.
type Outcome = (Vec<Vec<f32>>, Vec<Event>);

fn replicas_with_events(batch: usize, accumulate: usize) -> Vec<Outcome> {
    on_cpu_ranks(2, move |device, comm| {
        let rank = comm.rank();
        let mut s = setup(&device);
        let reducer = Reducer::new(&s.model.parameters(), Arc::new(comm), ReducerConfig::default()).unwrap();
        let loader = shard(rank, batch, 1);
        let mut trainer = Trainer::new(config(accumulate))
            .unwrap()
            .with_strategy(DataParallel::new(reducer));
        let (listener, events) = ChannelListener::new(1 << 12);
        trainer.add_listener(listener);
        trainer.fit(&mut s, &loader, None).unwrap();
        drop(trainer);
        (weights(&s), events.iter().map(|r| r.event).collect())
    })
}

#[test]
fn two_trainer_replicas_equal_one_device_with_the_global_batch() {
    let reference = single_device(16, 1);
    let r = replicas(8, 1);
    assert_eq!(r[0], r[1], "replicas must stay identical bit for bit");
    assert_close(&r[0], &reference);
}

#[test]
fn accumulation_across_replicas_equals_the_global_batch() {
    // Each step: 2 replicas x 2 micro-batches of 4 = the single device's batch of 16.
    let reference = single_device(16, 1);
    let r = replicas(4, 2);
    assert_eq!(r[0], r[1]);
    assert_close(&r[0], &reference);
}

/// 16-mixed across replicas: when only rank 0's f16 gradients overflow (its loss scale is set
/// absurdly high here), the all-reduce carries the inf to rank 1, so both skip the step and the
/// replicas stay identical; PyTorch's DDP + GradScaler behave the same way.
#[test]
fn an_overflow_on_one_rank_skips_the_step_on_every_rank() {
    let r = on_cpu_ranks(2, |device, comm| {
        let rank = comm.rank();
        let mut s = setup(&device);
        let before = weights(&s);
        let reducer = Reducer::new(&s.model.parameters(), Arc::new(comm), ReducerConfig::default()).unwrap();
        let loader = shard(rank, 16, 0);
        let scale = if rank == 0 { 2f64.powi(100) } else { 1.0 };
        let config = TrainerConfig {
            max_steps: Some(1),
            precision: Precision::Mixed16,
            grad_scaler: Some(GradScaler::new(scale, 2.0, 0.5, 2000).unwrap()),
            ..Default::default()
        };
        let mut trainer = Trainer::new(config).unwrap().with_strategy(DataParallel::new(reducer));
        trainer.fit(&mut s, &loader, None).unwrap();
        (before, weights(&s), trainer.state().skipped_steps)
    });
    for (rank, (before, after, skipped)) in r.iter().enumerate() {
        assert_eq!(*skipped, 1, "rank {rank} skipped the step");
        assert_eq!(after, before, "rank {rank} did not step");
    }
    assert_eq!(r[0].1, r[1].1, "the replicas are identical");
}

#[test]
fn every_rank_receives_every_ranks_step_times() {
    for (rank, (_, events)) in replicas_with_events(16, 1).into_iter().enumerate() {
        let steps: Vec<Vec<StepTimes>> = events
            .into_iter()
            .filter_map(|e| match e {
                Event::Step { rank_times, .. } => Some(rank_times),
                _ => None,
            })
            .collect();
        assert!(!steps.is_empty(), "rank {rank} logged no steps");
        for times in steps {
            assert_eq!(times.len(), 2, "one entry per rank");
            for t in times {
                assert!(t.forward > 0.0 && t.backward > 0.0 && t.all_reduce > 0.0, "{t:?}");
                assert!(t.communication >= 0.0 && t.optimizer > 0.0, "{t:?}");
            }
        }
    }
}

#[test]
fn the_run_names_every_replicas_device_and_reports_each_ones_counters() {
    let (_, events) = replicas_with_events(16, 1).remove(0);
    let Some(Event::RunStart { run }) = events.first() else {
        panic!("the first event is run_start: {:?}", events.first());
    };
    assert_eq!(run.devices, ["cpu:0", "cpu:1"]);
    let steps = events.iter().filter(|e| matches!(e, Event::Step { .. })).count();
    let reported: Vec<&str> = events
        .iter()
        .filter_map(|e| match e {
            Event::Device(stats) => Some(stats.device.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(
        reported.len(),
        2 * steps,
        "both devices after every logged step: {reported:?}"
    );
    assert!(
        reported.chunks(2).all(|pair| pair == ["cpu:0", "cpu:1"]),
        "{reported:?}"
    );
    for e in &events {
        if let Event::Device(stats) = e {
            assert!(stats.memory_peak > 0, "{stats:?}");
        }
    }
}

/// Asks to stop after optimizer step `step` (`on_train_step_end`) or after epoch `epoch`
/// (`on_epoch_end`), as a user's callback or EarlyStopping would.
struct StopAt {
    step: Option<u64>,
    epoch: Option<u64>,
}

impl Callback for StopAt {
    fn name(&self) -> String {
        "stop_at".into()
    }
    fn on_train_step_end(&mut self, ctx: &mut CallbackContext) -> Result<CallbackAction> {
        Ok(match Some(ctx.global_step) == self.step {
            true => CallbackAction::Stop,
            false => CallbackAction::Continue,
        })
    }
    fn on_epoch_end(&mut self, ctx: &mut CallbackContext) -> Result<CallbackAction> {
        Ok(match Some(ctx.epoch) == self.epoch {
            true => CallbackAction::Stop,
            false => CallbackAction::Continue,
        })
    }
}

/// A replica's final (epoch, global step), weights and stop reason.
type Stopped = ((u64, u64), Vec<Vec<f32>>, String);

/// Two replicas where only rank 0 carries `stop` (as only rank 0 carries callbacks in the
/// app): each replica's `Stopped`.
fn stopped_by_rank_0(stop: StopAt) -> Vec<Stopped> {
    let stop = std::sync::Mutex::new(Some(stop));
    on_cpu_ranks_with_timeout(2, Duration::from_secs(20), move |device, comm| {
        let rank = comm.rank();
        let mut s = setup(&device);
        let reducer = Reducer::new(&s.model.parameters(), Arc::new(comm), ReducerConfig::default()).unwrap();
        let loader = shard(rank, 8, 0);
        let mut trainer = Trainer::new(config(1))
            .unwrap()
            .with_strategy(DataParallel::new(reducer));
        if rank == 0 {
            trainer.add_callback(stop.lock().unwrap().take().unwrap());
        }
        let report = trainer.fit(&mut s, &loader, None).unwrap();
        let state = trainer.state();
        ((state.epoch, state.global_step), weights(&s), report.stop_reason)
    })
}

#[test]
fn a_stop_on_one_replica_stops_every_replica_at_the_same_step() {
    // Asked after step 3; the replicas agree at the next logged step (every 2).
    let r = stopped_by_rank_0(StopAt {
        step: Some(3),
        epoch: None,
    });
    assert_eq!(r[0].0, (0, 4), "rank 0 stopped at the logged step after its wish");
    assert_eq!(r[1].0, r[0].0, "rank 1 stopped with it");
    assert_eq!(r[0].1, r[1].1, "the replicas are identical");
    assert_eq!(r[1].2, "stopped by another replica");

    // A stop asked at an epoch's end (8 steps per epoch), named by the rank whose callback asked.
    let r = stopped_by_rank_0(StopAt {
        step: None,
        epoch: Some(0),
    });
    for (rank, (position, _, _)) in r.iter().enumerate() {
        assert_eq!(*position, (1, 8), "rank {rank}");
    }
    assert_eq!(r[0].2, "stopped by the stop_at callback");
    assert_eq!(r[1].2, "stopped by another replica");
}

/// The one-call form: `DataParallel::on_threads` builds the communicators, the reducer, each
/// rank's shard of the global batch and the trainers itself, and ends equal to one device.
#[test]
fn data_parallel_in_one_call_equals_one_device_with_the_global_batch() {
    let reference = single_device(16, 1);
    let devices = vec![Device::parse("cpu:0").unwrap(), Device::parse("cpu:1").unwrap()];
    let steps = Arc::new(std::sync::Mutex::new(0));
    let seen = steps.clone();
    let trained = DataParallel::on_threads(devices.clone())
        .config(config(1))
        .batch_size(16)
        .shuffle(true, SEED)
        .leader(move |trainer| {
            trainer.add_listener(move |r: &lockstep_core::train::Record| {
                if matches!(r.event, Event::Step { .. }) {
                    *seen.lock().unwrap() += 1;
                }
                Ok(())
            });
            Ok(())
        })
        .fit(Arc::new(Points), None, |replica| Ok(setup(&replica.device)))
        .unwrap();
    assert_close(&weights(&trained.setup), &reference);
    assert_eq!(trained.report.steps, 3 * (LEN / 16) as u64);
    assert!(*steps.lock().unwrap() > 0, "rank 0's listener heard nothing");
    // A global batch that does not split over the devices is refused before anything runs.
    let err = DataParallel::on_threads(devices)
        .batch_size(15)
        .fit(Arc::new(Points), None, |replica| Ok(setup(&replica.device)))
        .err()
        .unwrap()
        .to_string();
    assert!(
        err.contains("global batch 15") && err.contains("multiple of 2"),
        "{err}"
    );
}

/// A device kind whose devices are CPU backends and whose provider brings its own communicator
/// group, as CUDA's brings NCCL's; it counts the groups it makes.
struct Twin;

static TWIN_GROUPS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

impl lockstep_core::device::DeviceProvider for Twin {
    fn prefix(&self) -> &'static str {
        "twin"
    }
    fn open(&self, ordinal: usize) -> lockstep_core::Result<Arc<dyn lockstep_core::backend::Backend>> {
        Ok(Arc::new(lockstep_core::backend::cpu::CpuBackend::new(ordinal)))
    }
    fn list(&self) -> Vec<lockstep_core::backend::DeviceInfo> {
        Vec::new()
    }
    fn communicators(
        &self,
        devices: &[Device],
        timeout: Duration,
    ) -> Option<lockstep_core::Result<Vec<Box<dyn Communicator>>>> {
        TWIN_GROUPS.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let backends = devices.iter().map(|d| d.backend().clone()).collect();
        let group = lockstep_core::backend::LocalCommunicator::group_with_timeout(backends, timeout);
        Some(Ok(group
            .into_iter()
            .map(|c| Box::new(c) as Box<dyn Communicator>)
            .collect()))
    }
}

/// `on_threads` over devices of one kind uses that kind's own communicators (NCCL's for
/// `cuda:*`), and the host-staged group for a mix of kinds.
#[test]
fn data_parallel_in_one_call_uses_the_device_kinds_own_communicators() {
    lockstep_core::device::register_provider(Box::new(Twin));
    let devices = vec![Device::parse("twin:0").unwrap(), Device::parse("twin:1").unwrap()];
    let trained = DataParallel::on_threads(devices)
        .config(config(1))
        .batch_size(16)
        .shuffle(true, SEED)
        .fit(Arc::new(Points), None, |replica| Ok(setup(&replica.device)))
        .unwrap();
    assert_close(&weights(&trained.setup), &single_device(16, 1));
    assert_eq!(TWIN_GROUPS.load(std::sync::atomic::Ordering::SeqCst), 1);

    let mixed = vec![Device::parse("twin:0").unwrap(), Device::parse("cpu:1").unwrap()];
    assert_eq!(
        lockstep_core::device::communicator_group(&mixed, Duration::from_secs(5))
            .unwrap()
            .len(),
        2
    );
    assert_eq!(
        TWIN_GROUPS.load(std::sync::atomic::Ordering::SeqCst),
        1,
        "a mix of kinds is host-staged"
    );
}
