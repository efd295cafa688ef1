//! A task of your own: regression with a mean-squared-error loss, in place of the Trainer's
//! default classification (cross-entropy and accuracy):
//!
//! ```text
//! cargo run -p lockstep-core --example regression_task
//! ```
//!
//! A single `Linear(1, 1)` fits noisy samples of y = 3x - 2. The example fails unless the learned
//! weight and bias are within 0.05 of 3 and -2 and the validation error is near the noise's
//! variance (0.01), which CI checks.

use std::sync::Arc;

use lockstep_core::data::{DataLoader, DataLoaderConfig, HostTensor, TensorDataset};
use lockstep_core::nn::{Linear, Module, ModuleExt};
use lockstep_core::optim::{Sgd, SgdConfig};
use lockstep_core::rng::{normal_at, uniform_at};
use lockstep_core::train::{Task, Trainer, TrainerConfig, TrainingSetup};
use lockstep_core::{Device, Error, Generator, HostVec, Result, Tensor};

const SLOPE: f32 = 3.0;
const INTERCEPT: f32 = -2.0;
const NOISE: f32 = 0.1;

/// Batches of `[inputs, targets]`, both f32; the loss is the mean squared error.
struct MeanSquaredError;

fn inputs_and_targets(batch: &[Tensor]) -> Result<(&Tensor, &Tensor)> {
    match batch {
        [x, y] => Ok((x, y)),
        _ => Err(Error::invalid(
            "MeanSquaredError",
            "expects batches of [inputs, targets]",
        )),
    }
}

impl Task for MeanSquaredError {
    /// What training minimises: one scalar for the batch.
    fn loss(&self, model: &dyn Module, batch: &[Tensor]) -> Result<Tensor> {
        let (x, y) = inputs_and_targets(batch)?;
        model.forward(x)?.mse_loss(y)
    }

    /// What evaluation adds up over batches: the sum of squared errors (the Trainer divides by
    /// the sample count, giving the mean) and a count of correct answers, which regression does
    /// not have: zero.
    fn eval_sums(&self, model: &dyn Module, batch: &[Tensor]) -> Result<(Tensor, Tensor)> {
        let (x, y) = inputs_and_targets(batch)?;
        let squared_errors = model.forward(x)?.sub(y)?.powf(2.0)?.sum_all()?;
        let no_accuracy = squared_errors.zeros_like()?;
        Ok((squared_errors, no_accuracy))
    }
}

/// `n` samples of x in [-1, 1) and y = SLOPE x + INTERCEPT + noise, as `[n, 1]` columns.
fn line(n: usize, seed: u64) -> Result<TensorDataset> {
    let x: Vec<f32> = (0..n)
        .map(|i| 2.0 * uniform_at(seed, i as u64, 0) as f32 - 1.0)
        .collect();
    let y: Vec<f32> = x
        .iter()
        .enumerate()
        .map(|(i, x)| SLOPE * x + INTERCEPT + NOISE * normal_at(seed, i as u64, 2) as f32)
        .collect();
    TensorDataset::new(vec![
        HostTensor::new(HostVec::F32(x), [n, 1])?,
        HostTensor::new(HostVec::F32(y), [n, 1])?,
    ])
}

fn main() -> std::result::Result<(), Box<dyn std::error::Error>> {
    let config = DataLoaderConfig {
        batch_size: 32,
        ..Default::default()
    };
    let train = DataLoader::simple(Arc::new(line(512, 1)?), true, 0, config.clone())?;
    let val = DataLoader::simple(Arc::new(line(256, 2)?), false, 0, config)?;

    let model = Linear::new(1, 1, true, &Device::cpu(), &Generator::new(0))?;
    let optimizer = Sgd::new(model.parameters(), SgdConfig::new(0.1))?;
    let mut setup = TrainingSetup::new(model, optimizer).task(MeanSquaredError).name("line");
    let mut trainer = Trainer::new(TrainerConfig {
        max_epochs: 10,
        ..Default::default()
    })?;
    let before = trainer.evaluate(&mut setup, &val)?.loss;
    trainer.fit(&mut setup, &train, None)?;
    let after = trainer.evaluate(&mut setup, &val)?.loss;

    // The model's parameters by their PyTorch names: `weight` [1, 1] and `bias` [1].
    let learned: Vec<(String, f32)> = setup
        .model
        .named_parameters()
        .into_iter()
        .map(|(name, t)| Ok((name, t.to_vec::<f32>()?[0])))
        .collect::<Result<_>>()?;
    println!("validation MSE {before:.4} -> {after:.4}; learned {learned:?}");
    let (weight, bias) = (learned[0].1, learned[1].1);
    if (weight - SLOPE).abs() > 0.05 || (bias - INTERCEPT).abs() > 0.05 {
        return Err(format!("y = {weight:.3}x + {bias:.3}, not {SLOPE}x + {INTERCEPT}").into());
    }
    if after > 1.5 * (NOISE * NOISE) as f64 {
        return Err(format!("validation MSE {after:.4}, more than 1.5x the noise's variance").into());
    }
    Ok(())
}
