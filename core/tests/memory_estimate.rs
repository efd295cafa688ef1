//! The memory estimate before a run against the peak the run itself reaches: a small MLP and
//! a small convnet trained for a few steps on a fresh CPU device (its own buffer pool, so its
//! peak counts only that run), in f32 and bf16-mixed, on one device and data parallel (with
//! the reducer's buckets and ZeRO's shares); and the estimate's parts: ZeRO's shares add up to
//! the whole, activations grow with the batch while the rest stays.

use std::sync::Arc;

use lockstep_core::backend::cpu::CpuBackend;
use lockstep_core::data::{DataLoader, DataLoaderConfig, Dataset, HostTensor, Sample};
use lockstep_core::distributed::ZeroStage;
use lockstep_core::models;
use lockstep_core::nn::ModuleExt;
use lockstep_core::optim::{Adam, AdamConfig, Sgd, SgdConfig};
use lockstep_core::train::{
    MemoryEstimate, MemoryEstimateConfig, Precision, Progress, Trainer, TrainerConfig, TrainingSetup, estimate_memory,
};
use lockstep_core::{Device, Generator, HostVec, Result};

/// MNIST-shaped noise: only the shapes matter to memory.
struct Digits;

impl Dataset for Digits {
    fn len(&self) -> usize {
        256
    }
    fn get(&self, i: usize) -> Result<Sample> {
        let pixels = (0..28 * 28)
            .map(|j| lockstep_core::rng::uniform_at(3, i as u64, j) as f32)
            .collect();
        Ok(vec![
            HostTensor::new(HostVec::F32(pixels), [1, 28, 28])?,
            HostTensor::new(HostVec::U32(vec![(i % 10) as u32]), [])?,
        ])
    }
}

/// The MLP with SGD and momentum, as `lockstep train --model mlp` trains it.
fn mlp(device: &Device) -> Result<TrainingSetup> {
    let model = models::mlp(&[256, 256], device, &Generator::new(1))?;
    let sgd = Sgd::new(model.parameters(), SgdConfig::new(0.05).momentum(0.9))?;
    Ok(TrainingSetup::new(model, sgd))
}

/// A convnet with BatchNorm, with Adam (two moments per parameter).
fn convnet(device: &Device) -> Result<TrainingSetup> {
    let model = models::convnet_bn(device, &Generator::new(1))?;
    let adam = Adam::new(model.parameters(), AdamConfig::adam())?;
    Ok(TrainingSetup::new(model, adam))
}

fn fresh_cpu(ordinal: usize) -> Device {
    Device::from_backend(Arc::new(CpuBackend::new(ordinal)))
}

/// Each rank's peak after 3 steps of `batch` samples per rank on `world` fresh devices.
fn measured_peaks(
    build: fn(&Device) -> Result<TrainingSetup>,
    batch: usize,
    config: TrainerConfig,
    world: usize,
) -> Vec<u64> {
    let devices: Vec<Device> = (0..world).map(fresh_cpu).collect();
    let mut setup = build(&devices[0]).unwrap();
    let config = TrainerConfig {
        max_steps: Some(3),
        progress: Progress::Off,
        ..config
    };
    let mut trainer = Trainer::new(config).unwrap();
    if world > 1 {
        trainer = trainer.devices(devices.clone(), build);
    }
    let loader_config = DataLoaderConfig {
        batch_size: batch * world,
        ..Default::default()
    };
    let loader = DataLoader::simple(Arc::new(Digits), true, 5, loader_config).unwrap();
    trainer.fit(&mut setup, &loader, None).unwrap();
    devices
        .iter()
        .map(|d| d.backend().memory_stats().peak_allocated_bytes)
        .collect()
}

fn estimate(build: fn(&Device) -> Result<TrainingSetup>, config: MemoryEstimateConfig) -> MemoryEstimate {
    estimate_memory(&build, &Digits, config).unwrap()
}

/// The estimate of every rank within 25% of its measured peak.
fn agrees(build: fn(&Device) -> Result<TrainingSetup>, config: MemoryEstimateConfig) {
    let trainer = TrainerConfig {
        precision: config.precision,
        zero: config.zero,
        ..Default::default()
    };
    let measured = measured_peaks(build, config.batch_per_rank, trainer, config.world_size);
    let estimated = estimate(build, config);
    for (rank, (m, e)) in measured.iter().zip(&estimated.ranks).enumerate() {
        let ratio = e.total() as f64 / *m as f64;
        eprintln!(
            "{config:?} rank {rank}: estimated {} measured {m} ratio {ratio:.3}",
            e.total()
        );
        assert!(
            (0.75..=1.25).contains(&ratio),
            "rank {rank}: estimated {} bytes ({e:?}), measured peak {m}: ratio {ratio:.2}",
            e.total()
        );
    }
}

fn one_device(batch: usize, precision: Precision) -> MemoryEstimateConfig {
    MemoryEstimateConfig {
        batch_per_rank: batch,
        precision,
        ..Default::default()
    }
}

#[test]
fn the_mlp_estimate_is_within_a_quarter_of_its_peak() {
    agrees(mlp, one_device(64, Precision::Full));
    agrees(mlp, one_device(64, Precision::MixedBf16));
}

#[test]
fn the_convnet_estimate_is_within_a_quarter_of_its_peak() {
    agrees(convnet, one_device(32, Precision::Full));
    agrees(convnet, one_device(32, Precision::MixedBf16));
}

#[test]
fn data_parallel_estimates_count_the_buckets_and_zero_shares() {
    for zero in [None, Some(ZeroStage::OptimizerState), Some(ZeroStage::Gradients)] {
        let config = MemoryEstimateConfig {
            world_size: 2,
            zero,
            ..one_device(32, Precision::Full)
        };
        agrees(convnet, config);
    }
}

#[test]
fn zero_gives_each_rank_its_share_and_the_shares_add_up_to_the_whole() {
    let whole = estimate(convnet, one_device(8, Precision::Full)).ranks[0];
    assert_eq!(whole.buckets, 0, "one device has no reducer");
    for (stage, world) in [(ZeroStage::OptimizerState, 2), (ZeroStage::Gradients, 3)] {
        let config = MemoryEstimateConfig {
            world_size: world,
            zero: Some(stage),
            ..one_device(8, Precision::Full)
        };
        let ranks = estimate(convnet, config).ranks;
        assert_eq!(ranks.len(), world);
        let state: u64 = ranks.iter().map(|r| r.optimizer_state).sum();
        assert_eq!(state, whole.optimizer_state, "{stage:?}");
        assert!(
            ranks.iter().all(|r| r.optimizer_state < whole.optimizer_state),
            "{ranks:?}"
        );
        let gradients: u64 = ranks.iter().map(|r| r.gradients).sum();
        let expected = match stage {
            ZeroStage::OptimizerState => whole.gradients * world as u64,
            ZeroStage::Gradients => whole.gradients,
        };
        assert_eq!(gradients, expected, "{stage:?}");
        match stage {
            ZeroStage::OptimizerState => assert!(
                ranks.iter().all(|r| r.buckets == whole.gradients),
                "every gradient has a bucket: {ranks:?}"
            ),
            ZeroStage::Gradients => assert!(
                ranks.iter().all(|r| r.buckets == r.gradients),
                "a rank keeps the buckets of its own share: {ranks:?}"
            ),
        }
    }
}

#[test]
fn activations_grow_with_the_batch_and_nothing_else_does() {
    let at = |batch| estimate(mlp, one_device(batch, Precision::Full)).ranks[0];
    let (small, large) = (at(16), at(256));
    // Each further sample brings at least itself: 28x28 f32 pixels.
    let input = (28 * 28 * 4) as u64;
    assert!(
        large.activations >= small.activations + 240 * input,
        "{small:?} vs {large:?}"
    );
    let rest = |r: lockstep_core::train::RankMemory| r.total() - r.activations;
    assert_eq!(rest(small), rest(large));
}
