//! Devices of different speeds in one data-parallel run: two Trainer replicas on cpu:0 and
//! cpu:1 take unequal shares of each global batch of 16 (`ShardedBatches`), each loss weighted
//! by its share, and end identical to each other bit for bit and equal (to f32 rounding) to one
//! device trained with batch 16 on the same order, whether the shares are fixed or follow the
//! ranks' measured speeds.

mod parallel_support;
mod replica_support;
mod scratch_support;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use lockstep_core::backend::{Communicator, LocalCommunicator};
use lockstep_core::data::{BatchShares, DataLoader, DataLoaderConfig, ShardedBatches};
use lockstep_core::distributed::{Balancer, Reducer, ReducerConfig};
use lockstep_core::nn::{Module, ModuleExt};
use lockstep_core::tensor::Tensor;
use lockstep_core::train::{ChannelListener, Classification, DataParallel, Event, Task, Trainer};
use lockstep_core::{Device, Result};
use parallel_support::on_cpu_ranks;
use replica_support::{LEN, Points, SEED, assert_close, config, setup, single_device, weights};
use scratch_support::Scratch;

/// Classification that sleeps before each loss: a slower device. (The test asserts only which
/// way the shares move, never a time.)
struct Slowed(Duration);

impl Task for Slowed {
    fn loss(&self, model: &dyn Module, batch: &[Tensor]) -> Result<Tensor> {
        std::thread::sleep(self.0);
        Classification.loss(model, batch)
    }
    fn eval_sums(&self, model: &dyn Module, batch: &[Tensor]) -> Result<(Tensor, Tensor)> {
        Classification.eval_sums(model, batch)
    }
}

struct Outcome {
    weights: Vec<Vec<f32>>,
    /// The shares at the end of the run (`FitReport::shares`).
    shares: Vec<usize>,
    /// The shares of each step event.
    logged: Vec<Vec<usize>>,
}

/// Two replicas starting from `shares` of a global batch of 16, re-balanced every `every`
/// steps (0: never); the replica `slow` (if any) sleeps 25 ms per step.
fn heterogeneous(shares: &[usize], every: u64, slow: Option<usize>) -> Vec<Outcome> {
    run(shares, every, slow, &Checkpoints::default())
}

/// Where a run resumes from and where rank 0 saves its last state, and how many epochs it ends
/// at (3 unless given).
#[derive(Clone, Default)]
struct Checkpoints {
    resume: Option<PathBuf>,
    save: Option<PathBuf>,
    max_epochs: Option<u64>,
}

fn run(shares: &[usize], every: u64, slow: Option<usize>, checkpoints: &Checkpoints) -> Vec<Outcome> {
    let shares = shares.to_vec();
    let checkpoints = checkpoints.clone();
    on_cpu_ranks(2, move |device, comm| {
        let shares = BatchShares::new(shares.clone()).unwrap();
        let rank = comm.rank();
        let mut s = setup(&device);
        if slow == Some(rank) {
            s.task = Box::new(Slowed(Duration::from_millis(25)));
        }
        let reducer = Reducer::new(&s.model.parameters(), Arc::new(comm), ReducerConfig::default()).unwrap();
        let batches = ShardedBatches::new(LEN, rank, true, SEED, shares.clone()).unwrap();
        let loader_config = DataLoaderConfig {
            num_workers: 1,
            ..Default::default()
        };
        let loader = DataLoader::with_batch_sampler(Arc::new(Points), Arc::new(batches), loader_config).unwrap();
        let balancer = Balancer::new(shares, reducer.communicator(), every).unwrap();
        let mut config = config(1);
        config.max_epochs = checkpoints.max_epochs.unwrap_or(config.max_epochs);
        let mut trainer = Trainer::new(config)
            .unwrap()
            .with_strategy(DataParallel::new(reducer).with_balancer(balancer));
        let (listener, events) = ChannelListener::new(1 << 12);
        trainer.add_listener(listener);
        if let Some(path) = &checkpoints.resume {
            trainer.resume(&mut s, path).unwrap();
        }
        let report = trainer.fit(&mut s, &loader, None).unwrap();
        if let (Some(path), 0) = (&checkpoints.save, rank) {
            trainer.save_checkpoint(&s, path).unwrap();
        }
        drop(trainer);
        let logged = events
            .iter()
            .filter_map(|r| match r.event {
                Event::Step { shares, .. } => Some(shares),
                _ => None,
            })
            .collect();
        Outcome {
            weights: weights(&s),
            shares: report.shares,
            logged,
        }
    })
}

#[test]
fn fixed_unequal_shares_equal_one_device_with_the_global_batch() {
    let reference = single_device(16, 1);
    let r = heterogeneous(&[12, 4], 0, None);
    assert_eq!(r[0].weights, r[1].weights, "replicas must stay identical bit for bit");
    assert_close(&r[0].weights, &reference);
    for o in &r {
        assert_eq!(o.shares, vec![12, 4]);
        assert_eq!(o.logged.len(), 12, "3 epochs of 8 steps, logged every 2");
        assert!(o.logged.iter().all(|s| *s == [12, 4]), "{:?}", o.logged);
    }
}

#[test]
fn a_slow_rank_gets_a_smaller_share_and_the_result_stays_the_global_batch_mean() {
    let reference = single_device(16, 1);
    let r = heterogeneous(&[8, 8], 2, Some(1));
    assert_eq!(r[0].weights, r[1].weights, "replicas must stay identical bit for bit");
    assert_close(&r[0].weights, &reference);
    assert_eq!(r[0].shares, r[1].shares, "every rank sets the same shares");
    let shares = &r[0].shares;
    assert_eq!(
        shares.iter().sum::<usize>(),
        16,
        "the global batch is fixed: {shares:?}"
    );
    assert!(shares[1] < 8, "the slow rank's share went down: {shares:?}");
    assert_eq!(
        r[0].logged.first(),
        Some(&vec![8, 8]),
        "the first steps run on the initial shares"
    );
    assert!(
        r[0].logged.iter().any(|s| s[1] < 8),
        "step events show the change: {:?}",
        r[0].logged
    );
}

#[test]
fn a_resumed_run_goes_on_with_the_shares_it_had_measured() {
    let dir = Scratch::new("shares-resume");
    let path = dir.join("last.safetensors");
    let save = Checkpoints {
        save: Some(path.clone()),
        ..Checkpoints::default()
    };
    let measured = run(&[8, 8], 2, Some(1), &save).remove(0).shares;
    assert_ne!(measured, vec![8, 8], "the slow rank's share went down");

    // The resumed replicas start from an equal split, as a new run does, and never re-balance:
    // whatever their steps use came from the checkpoint.
    let resume = Checkpoints {
        resume: Some(path),
        max_epochs: Some(4),
        ..Checkpoints::default()
    };
    let resumed = run(&[8, 8], 0, None, &resume);
    for o in &resumed {
        assert_eq!(o.logged.len(), 4, "one more epoch of 8 steps, logged every 2");
        assert!(
            o.logged.iter().all(|s| *s == measured),
            "{:?} (saved {measured:?})",
            o.logged
        );
        assert_eq!(o.shares, measured);
    }
}

/// (A balancer without a reducer cannot be written: it is part of `DataParallel`.)
#[test]
fn a_balancer_needs_shares_for_every_rank() {
    let device = Device::cpu();
    let one = LocalCommunicator::group(vec![device.backend().clone()]).remove(0);
    let one: Arc<dyn Communicator> = Arc::new(one);
    let shares = BatchShares::equal(16, 2).unwrap();
    let err = Balancer::new(shares, one, 0).err().unwrap().to_string();
    assert!(err.contains("2 ranks") && err.contains("joins 1"), "{err}");
}
