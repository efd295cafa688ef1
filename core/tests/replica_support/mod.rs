//! What the data-parallel Trainer tests share: a small classification data set, the model every
//! replica starts from, and the single-device run they must equal.
#![allow(dead_code)]

use std::sync::Arc;

use lockstep_core::data::{DataLoader, DataLoaderConfig, Dataset, HostTensor, Sample};
use lockstep_core::nn::{Flatten, Linear, Module, ModuleExt, Relu, Sequential};
use lockstep_core::optim::{Sgd, SgdConfig};
use lockstep_core::train::{Classification, Trainer, TrainerConfig, TrainingSetup};
use lockstep_core::{Device, Generator, HostVec, Result};

pub const LEN: usize = 128;
pub const SEED: u64 = 9;

/// Points in 8-D labelled by which of the first three coordinates is largest.
pub struct Points;

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

/// The model every run starts from (same seed) on `device`.
pub fn points_model(device: &Device) -> Result<Sequential> {
    let init = Generator::new(1);
    Ok(Sequential::new()
        .add(Flatten::new())
        .add(Linear::new(8, 32, true, device, &init)?)
        .add(Relu)
        .add(Linear::new(32, 3, true, device, &init)?))
}

/// The same model (same seed) on `device`, with SGD and momentum.
pub fn setup(device: &Device) -> TrainingSetup {
    setup_with(Box::new(points_model(device).unwrap()), device)
}

/// `model` trained with SGD and momentum, its batches loaded onto `device`.
pub fn setup_with(model: Box<dyn Module>, device: &Device) -> TrainingSetup {
    let optimizer = Sgd::new(model.parameters(), SgdConfig::new(0.2).momentum(0.9)).unwrap();
    TrainingSetup {
        model,
        optimizer: Box::new(optimizer),
        scheduler: None,
        task: Box::new(Classification),
        device: device.clone(),
        generators: Vec::new(),
        model_name: "points".into(),
        hparams: Default::default(),
    }
}

pub fn config(accumulate: usize) -> TrainerConfig {
    TrainerConfig {
        max_epochs: 3,
        accumulate_grad_batches: accumulate,
        log_every_n_steps: 2,
        ..Default::default()
    }
}

pub fn weights(s: &TrainingSetup) -> Vec<Vec<f32>> {
    s.model
        .parameters()
        .iter()
        .map(|p| p.to_vec::<f32>().unwrap())
        .collect()
}

/// One device trained with `batch` on the order every replica's shard is cut from.
pub fn single_device(batch: usize, accumulate: usize) -> Vec<Vec<f32>> {
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

/// Equal to f32 rounding (the replicas sum in another order than one device).
pub fn assert_close(a: &[Vec<f32>], b: &[Vec<f32>]) {
    for (pa, pb) in a.iter().zip(b) {
        for (x, y) in pa.iter().zip(pb) {
            assert!((x - y).abs() <= 1e-5 + 1e-4 * y.abs(), "{x} vs {y}");
        }
    }
}
