//! A model of your own (`#[derive(Module)]`) and a data set of your own (a `Dataset` impl)
//! trained by the Trainer, with a closure listening to the run:
//!
//! ```text
//! cargo run -p lockstep-core --example custom_model
//! ```
//!
//! The data are points on two interleaved spirals in the plane, labelled by spiral, computed
//! from the sample's index when the loader asks (nothing is stored). The example fails unless
//! the model labels at least 95% of a held-out set correctly, which CI checks.

use std::f32::consts::PI;
use std::sync::Arc;

use lockstep_core::data::{DataLoader, DataLoaderConfig, Dataset, HostTensor, Sample};
use lockstep_core::nn::{Linear, Module, ModuleExt};
use lockstep_core::optim::{Adam, AdamConfig};
use lockstep_core::train::{Event, Record, Trainer, TrainerConfig, TrainingSetup};
use lockstep_core::{Device, Generator, HostVec, Result, Tensor};

const EPOCHS: u64 = 30;
const TURNS: f32 = 1.25;

/// `len` points, half on each spiral, jittered by a noise that `seed` fixes.
struct Spirals {
    len: usize,
    seed: u64,
}

impl Dataset for Spirals {
    fn len(&self) -> usize {
        self.len
    }

    /// Sample `index`: its point `[2]` (f32) and its spiral `[]` (u32), the fields a
    /// classification batch wants: `[inputs, labels]`.
    fn get(&self, index: usize) -> Result<Sample> {
        let spiral = (index % 2) as u32;
        let along = lockstep_core::rng::uniform_at(self.seed, index as u64, 0) as f32;
        let angle = 2.0 * PI * TURNS * along + PI * spiral as f32;
        let noise = |i| 0.04 * lockstep_core::rng::normal_at(self.seed, index as u64, i) as f32;
        let point = vec![along * angle.cos() + noise(2), along * angle.sin() + noise(3)];
        Ok(vec![
            HostTensor::new(HostVec::F32(point), [2])?,
            HostTensor::new(HostVec::U32(vec![spiral]), [])?,
        ])
    }
}

/// Two hidden layers with a skip connection around the second; the fields' names are the
/// parameters' names (`input.weight`, `hidden.bias`, …).
#[derive(Module)]
struct SpiralNet {
    input: Linear,
    hidden: Linear,
    output: Linear,
}

impl SpiralNet {
    fn new(width: usize, device: &Device, g: &Generator) -> Result<SpiralNet> {
        Ok(SpiralNet {
            input: Linear::new(2, width, true, device, g)?,
            hidden: Linear::new(width, width, true, device, g)?,
            output: Linear::new(width, 2, true, device, g)?,
        })
    }

    /// Points `[batch, 2]` to the two classes' logits `[batch, 2]`.
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let h = self.input.forward(x)?.tanh()?;
        let h = h.add(&self.hidden.forward(&h)?.tanh()?)?;
        self.output.forward(&h)
    }
}

fn main() -> std::result::Result<(), Box<dyn std::error::Error>> {
    let config = DataLoaderConfig {
        batch_size: 32,
        ..Default::default()
    };
    let train = Spirals { len: 1024, seed: 1 };
    let val = Spirals { len: 512, seed: 2 };
    let train = DataLoader::simple(Arc::new(train), true, 0, config.clone())?;
    let val = DataLoader::simple(Arc::new(val), false, 0, config)?;

    let model = SpiralNet::new(64, &Device::cpu(), &Generator::new(0))?;
    println!("{} parameters:\n{}", model.num_parameters(), model.describe());
    let optimizer = Adam::new(model.parameters(), AdamConfig::adam().lr(1e-2))?;
    let mut setup = TrainingSetup::new(model, optimizer).name("spirals");

    let mut trainer = Trainer::new(TrainerConfig {
        max_epochs: EPOCHS,
        log_every_n_steps: 64,
        ..Default::default()
    })?;
    // Every event of the run passes through its listeners; a closure is one.
    trainer.add_listener(|r: &Record| {
        if let Event::Step { epoch, step, loss, .. } = &r.event {
            println!("step {step:4} (epoch {epoch:2}): loss {loss:.4}");
        }
        Ok(())
    });
    let report = trainer.fit(&mut setup, &train, Some(&val))?;

    let accuracy = report.last_val.ok_or("the run did not validate")?.accuracy;
    println!(
        "{} steps in {:.1} s: validation accuracy {accuracy:.3}",
        report.steps, report.train_seconds
    );
    if accuracy < 0.95 {
        return Err(format!("validation accuracy {accuracy:.3}, short of 0.95").into());
    }
    Ok(())
}
