//! The Trainer as one replica of a data-parallel run: two replicas on cpu:0 and cpu:1, each
//! loading its DistributedSampler shard with batch B, end with weights identical to each other
//! bit for bit and equal (to f32 rounding) to one device trained with batch 2B on the same order.

use std::sync::Arc;

use lockstep_core::backend::{Communicator, LocalCommunicator};
use lockstep_core::data::{DataLoader, DataLoaderConfig, Dataset, DistributedSampler, HostTensor, Sample};
use lockstep_core::distributed::{Reducer, ReducerConfig};
use lockstep_core::nn::{Flatten, Linear, ModuleExt, Relu, Sequential};
use lockstep_core::optim::{GradScaler, Sgd, SgdConfig};
use lockstep_core::train::{
    ChannelListener, Classification, Event, Precision, StepTimes, Trainer, TrainerConfig, TrainingSetup,
};
use lockstep_core::{Device, Generator, HostVec, Result};

const LEN: usize = 128;
const SEED: u64 = 9;

/// Points in 8-D labelled by which of the first three coordinates is largest.
struct Points;

impl Dataset for Points {
    fn len(&self) -> usize {
        LEN
    }
    fn get(&self, i: usize) -> Result<Sample> {
        let x: Vec<f32> = (0..8)
            .map(|j| lockstep_core::rng::uniform_at(5, i as u64, j) as f32 * 2.0 - 1.0)
            .collect();
        let label = (0..3).max_by(|&a, &b| x[a].total_cmp(&x[b])).unwrap_or(0) as u32;
        Ok(vec![
            HostTensor::new(HostVec::F32(x), [8])?,
            HostTensor::new(HostVec::U32(vec![label]), [])?,
        ])
    }
}

fn setup(device: &Device) -> TrainingSetup {
    let init = Generator::new(1);
    let model = Sequential::new()
        .add(Flatten::new())
        .add(Linear::new(8, 32, true, device, &init).unwrap())
        .add(Relu)
        .add(Linear::new(32, 3, true, device, &init).unwrap());
    let optimizer = Sgd::new(model.parameters(), SgdConfig::new(0.2).momentum(0.9)).unwrap();
    TrainingSetup {
        model: Box::new(model),
        optimizer: Box::new(optimizer),
        scheduler: None,
        task: Box::new(Classification),
        device: device.clone(),
        generators: Vec::new(),
        model_name: "points".into(),
        hparams: Default::default(),
    }
}

fn config(accumulate: usize) -> TrainerConfig {
    TrainerConfig {
        max_epochs: 3,
        accumulate_grad_batches: accumulate,
        log_every_n_steps: 2,
        ..Default::default()
    }
}

fn weights(s: &TrainingSetup) -> Vec<Vec<f32>> {
    s.model
        .parameters()
        .iter()
        .map(|p| p.to_vec::<f32>().unwrap())
        .collect()
}

fn single_device(batch: usize, accumulate: usize) -> Vec<Vec<f32>> {
    let mut s = setup(&Device::cpu());
    let loader = DataLoader::simple(
        Arc::new(Points),
        true,
        SEED,
        DataLoaderConfig {
            batch_size: batch,
            ..Default::default()
        },
    )
    .unwrap();
    Trainer::new(config(accumulate))
        .unwrap()
        .fit(&mut s, &loader, None)
        .unwrap();
    weights(&s)
}

fn replicas(batch: usize, accumulate: usize) -> Vec<Vec<Vec<f32>>> {
    replicas_with_events(batch, accumulate)
        .into_iter()
        .map(|(w, _)| w)
        .collect()
}

/// A replica's final weights and the `rank_times` of its step events.
type Outcome = (Vec<Vec<f32>>, Vec<Vec<StepTimes>>);

fn replicas_with_events(batch: usize, accumulate: usize) -> Vec<Outcome> {
    let devices: Vec<Device> = (0..2).map(|i| Device::parse(&format!("cpu:{i}")).unwrap()).collect();
    let comms = LocalCommunicator::group(devices.iter().map(|d| d.backend().clone()).collect());
    let threads: Vec<_> = comms
        .into_iter()
        .zip(devices)
        .map(|(comm, device)| {
            std::thread::spawn(move || {
                let rank = comm.rank();
                let mut s = setup(&device);
                let reducer = Reducer::new(&s.model.parameters(), Arc::new(comm), ReducerConfig::default()).unwrap();
                let sampler = Arc::new(DistributedSampler::new(LEN, 2, rank, true, SEED, false).unwrap());
                let loader_config = DataLoaderConfig {
                    batch_size: batch,
                    num_workers: 1,
                    ..Default::default()
                };
                let loader = DataLoader::new(Arc::new(Points), sampler, loader_config).unwrap();
                let mut trainer = Trainer::new(config(accumulate)).unwrap().with_reducer(reducer);
                let (listener, events) = ChannelListener::new(1 << 12);
                trainer.add_listener(listener);
                trainer.fit(&mut s, &loader, None).unwrap();
                drop(trainer);
                let rank_times = events
                    .iter()
                    .filter_map(|r| match r.event {
                        Event::Step { rank_times, .. } => Some(rank_times),
                        _ => None,
                    })
                    .collect();
                (weights(&s), rank_times)
            })
        })
        .collect();
    threads.into_iter().map(|t| t.join().unwrap()).collect()
}

fn assert_close(a: &[Vec<f32>], b: &[Vec<f32>]) {
    for (pa, pb) in a.iter().zip(b) {
        for (x, y) in pa.iter().zip(pb) {
            assert!((x - y).abs() <= 1e-5 + 1e-4 * y.abs(), "{x} vs {y}");
        }
    }
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
    let devices: Vec<Device> = (0..2).map(|i| Device::parse(&format!("cpu:{i}")).unwrap()).collect();
    let comms = LocalCommunicator::group(devices.iter().map(|d| d.backend().clone()).collect());
    let threads: Vec<_> = comms
        .into_iter()
        .zip(devices)
        .map(|(comm, device)| {
            std::thread::spawn(move || {
                let rank = comm.rank();
                let mut s = setup(&device);
                let before = weights(&s);
                let reducer = Reducer::new(&s.model.parameters(), Arc::new(comm), ReducerConfig::default()).unwrap();
                let sampler = Arc::new(DistributedSampler::new(LEN, 2, rank, true, SEED, false).unwrap());
                let loader_config = DataLoaderConfig {
                    batch_size: 16,
                    ..Default::default()
                };
                let loader = DataLoader::new(Arc::new(Points), sampler, loader_config).unwrap();
                let scale = if rank == 0 { 2f64.powi(100) } else { 1.0 };
                let config = TrainerConfig {
                    max_steps: Some(1),
                    precision: Precision::Mixed16,
                    grad_scaler: Some(GradScaler::new(scale, 2.0, 0.5, 2000).unwrap()),
                    ..Default::default()
                };
                let mut trainer = Trainer::new(config).unwrap().with_reducer(reducer);
                trainer.fit(&mut s, &loader, None).unwrap();
                (before, weights(&s), trainer.state().skipped_steps)
            })
        })
        .collect();
    let r: Vec<_> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    for (rank, (before, after, skipped)) in r.iter().enumerate() {
        assert_eq!(*skipped, 1, "rank {rank} skipped the step");
        assert_eq!(after, before, "rank {rank} did not step");
    }
    assert_eq!(r[0].1, r[1].1, "the replicas are identical");
}

#[test]
fn every_rank_receives_every_ranks_step_times() {
    for (rank, (_, steps)) in replicas_with_events(16, 1).into_iter().enumerate() {
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
