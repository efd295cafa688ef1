//! A run small enough to train in milliseconds: an MLP with dropout on 64 points.

// Not every test file calls every function.
#![allow(dead_code)]

use std::sync::Arc;

use lockstep_core::data::{DataLoader, DataLoaderConfig, HostTensor, TensorDataset};
use lockstep_core::nn::{Dropout, Linear, ModuleExt, Relu, Sequential};
use lockstep_core::optim::{Sgd, SgdConfig, StepLR};
use lockstep_core::train::TrainingSetup;
use lockstep_core::{Device, Generator, HostVec};

/// An MLP with dropout (stream seeded `dropout_seed`), optionally on a step schedule.
pub fn setup(scheduled: bool, dropout_seed: u64) -> TrainingSetup {
    let (device, init) = (Device::cpu(), Generator::new(1));
    let model = Sequential::new()
        .add(Linear::new(4, 8, true, &device, &init).unwrap())
        .add(Relu)
        .add(Dropout::new(0.1, Arc::new(Generator::new(dropout_seed))).unwrap())
        .add(Linear::new(8, 2, true, &device, &init).unwrap());
    let optimizer = Sgd::new(model.parameters(), SgdConfig::new(0.1)).unwrap();
    let setup = TrainingSetup::new(model, optimizer);
    if scheduled {
        setup.schedule(StepLR::new(2, 0.5).unwrap())
    } else {
        setup
    }
}

pub fn loader(batch_size: usize) -> DataLoader {
    let n = 64;
    let x: Vec<f32> = (0..n * 4).map(|i| ((i * 7) % 11) as f32 / 11.0).collect();
    let y: Vec<u32> = (0..n as u32).map(|i| i % 2).collect();
    let data = TensorDataset::new(vec![
        HostTensor::new(HostVec::F32(x), [n, 4]).unwrap(),
        HostTensor::new(HostVec::U32(y), [n]).unwrap(),
    ])
    .unwrap();
    let config = DataLoaderConfig {
        batch_size,
        ..Default::default()
    };
    DataLoader::simple(Arc::new(data), true, 3, config).unwrap()
}
