//! Data parallel as one option of the Trainer: this program is the one-device program plus one
//! line, `.devices(devices, build)`. A replica of the model goes on each device, on threads of
//! this process, their gradients averaged after every backward pass (PyTorch's DDP, Lightning's
//! `Trainer(devices=…)`):
//!
//! ```text
//! cargo run -p lockstep-core --example data_parallel -- [DEVICES]
//! ```
//!
//! DEVICES is a comma-separated list (default `cpu:0,cpu:1`; `cpu:0` trains on one device).
//! A program linking lockstep-core alone knows CPU devices only; `lockstep_cuda::register()` or
//! `lockstep_wgpu::register()` at the start of `main` adds `cuda:N` or `wgpu:N`.
//! The loaders are the one-device program's: the training loader's batch is the global batch,
//! each replica taking its slice of every batch, so the run takes the steps one device would;
//! it must divide evenly (48 does for 1, 2, 3, 4, 6, 8 … devices). The data are four Gaussian
//! blobs in the plane; the example fails unless the run takes the steps one device would and
//! labels at least 95% of held-out points correctly, which CI checks.

use std::sync::Arc;

use lockstep_core::data::{DataLoader, DataLoaderConfig, HostTensor, TensorDataset};
use lockstep_core::nn::{Linear, ModuleExt, Relu, Sequential};
use lockstep_core::optim::{Adam, AdamConfig};
use lockstep_core::rng::normal_at;
use lockstep_core::train::{Event, Record, Trainer, TrainerConfig, TrainingSetup};
use lockstep_core::{Device, Generator, HostVec, Result};

const CENTERS: [[f32; 2]; 4] = [[1.0, 1.0], [-1.0, 1.0], [-1.0, -1.0], [1.0, -1.0]];
const TRAIN: usize = 960;
const BATCH: usize = 48;
const EPOCHS: u64 = 5;

/// `n` points, `[n, 2]` f32, each near the center its label `[n]` (u32) names.
fn blobs(n: usize, seed: u64) -> Result<TensorDataset> {
    let labels: Vec<u32> = (0..n).map(|i| (i % CENTERS.len()) as u32).collect();
    let points: Vec<f32> = labels
        .iter()
        .enumerate()
        .flat_map(|(i, &label)| {
            let [x, y] = CENTERS[label as usize];
            let jitter = |k| 0.4 * normal_at(seed, i as u64, k) as f32;
            [x + jitter(0), y + jitter(1)]
        })
        .collect();
    TensorDataset::new(vec![
        HostTensor::new(HostVec::F32(points), [n, 2])?,
        HostTensor::new(HostVec::U32(labels), [n])?,
    ])
}

/// A listener: with several devices, rank 0's step events carry every rank's time per step.
fn print_steps(r: &Record) -> Result<()> {
    if let Event::Step {
        step, loss, rank_times, ..
    } = &r.event
    {
        let ms: Vec<String> = rank_times
            .iter()
            .map(|t| format!("{:.2} ms", 1e3 * t.compute()))
            .collect();
        println!("step {step:3}: loss {loss:.4}, compute per rank {}", ms.join(", "));
    }
    Ok(())
}

/// The model and optimizer on `device`: what a one-device program builds for itself, and what
/// `devices` calls for each further replica. Every replica starts from rank 0's weights and
/// random streams (a Dropout's), whatever the seed here, and draws for each sample what one
/// device would.
fn build(device: &Device) -> Result<TrainingSetup> {
    let g = Generator::new(0);
    let model = Sequential::new()
        .add(Linear::new(2, 32, true, device, &g)?)
        .add(Relu)
        .add(Linear::new(32, CENTERS.len(), true, device, &g)?);
    let optimizer = Adam::new(model.parameters(), AdamConfig::adam().lr(1e-2))?;
    Ok(TrainingSetup::new(model, optimizer).name("blobs"))
}

fn main() -> std::result::Result<(), Box<dyn std::error::Error>> {
    let devices: Vec<Device> = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "cpu:0,cpu:1".into())
        .split(',')
        .map(Device::parse)
        .collect::<Result<_>>()?;
    let config = TrainerConfig {
        max_epochs: EPOCHS,
        log_every_n_steps: 25,
        ..Default::default()
    };
    let loader = |data, shuffle| {
        let config = DataLoaderConfig {
            batch_size: BATCH,
            ..Default::default()
        };
        DataLoader::simple(Arc::new(data), shuffle, 0, config)
    };
    let (train, val) = (loader(blobs(TRAIN, 1)?, true)?, loader(blobs(400, 2)?, false)?);

    let mut trainer = Trainer::new(config)?
        // The one line a one-device program lacks.
        .devices(devices.clone(), build);
    trainer.add_listener(print_steps);
    let mut setup = build(&devices[0])?;
    let report = trainer.fit(&mut setup, &train, Some(&val))?;

    let accuracy = report.last_val.as_ref().ok_or("rank 0 did not validate")?.accuracy;
    let names: Vec<&str> = devices.iter().map(Device::location).collect();
    println!(
        "on {}: {} steps, {:.0} samples/s, validation accuracy {accuracy:.3}",
        names.join(", "),
        report.steps,
        report.samples_per_sec
    );
    let one_device_steps = EPOCHS * (TRAIN / BATCH) as u64;
    if report.steps != one_device_steps {
        return Err(format!("{} steps, not one device's {one_device_steps}", report.steps).into());
    }
    if accuracy < 0.95 {
        return Err(format!("validation accuracy {accuracy:.3}, short of 0.95").into());
    }
    Ok(())
}
