//! A callback of your own: it watches each epoch's training loss and learning rate, stops the
//! run once the loss is below a target, and is asked afterwards what it saw:
//!
//! ```text
//! cargo run -p lockstep-core --example custom_callback
//! ```
//!
//! The model learns XOR of the signs of two coordinates, with a learning rate halved every five
//! epochs. The example fails unless the callback stopped the run before its epoch limit, right
//! after the first epoch under the target, and recorded the rate the schedule set each epoch.

use lockstep_core::data::{DataLoader, DataLoaderConfig, HostTensor, TensorDataset};
use lockstep_core::nn::{Linear, ModuleExt, Relu, Sequential};
use lockstep_core::optim::{Sgd, SgdConfig, StepLR};
use lockstep_core::train::{Callback, CallbackAction, CallbackContext, Trainer, TrainerConfig, TrainingSetup};
use lockstep_core::{Device, Generator, HostVec, Result};

const TARGET: f64 = 0.06;
const MAX_EPOCHS: u64 = 60;
const LR: f64 = 0.2;

/// One epoch as the callback saw it.
#[derive(Debug)]
struct Seen {
    epoch: u64,
    lr: f64,
    train_loss: f64,
}

/// Stops once an epoch's mean training loss is below `target`; keeps every epoch it saw.
struct StopBelowLoss {
    target: f64,
    seen: Vec<Seen>,
}

impl Callback for StopBelowLoss {
    /// Names this callback's entry in checkpoints (see `state` and `load_state` for resuming).
    fn name(&self) -> String {
        "StopBelowLoss".into()
    }

    /// After each epoch: `ctx.metrics` holds `train_loss` and `lr` (and `val_loss`, `val_acc`
    /// when there is a validation loader).
    fn on_epoch_end(&mut self, ctx: &mut CallbackContext) -> Result<CallbackAction> {
        let (train_loss, lr) = (ctx.metrics["train_loss"], ctx.metrics["lr"]);
        self.seen.push(Seen {
            epoch: ctx.epoch,
            lr,
            train_loss,
        });
        Ok(if train_loss < self.target {
            CallbackAction::Stop
        } else {
            CallbackAction::Continue
        })
    }
}

/// Points in [-1, 1)², labelled 1 where exactly one coordinate is negative.
fn xor(n: usize) -> Result<TensorDataset> {
    let points: Vec<f32> = (0..2 * n)
        .map(|i| 2.0 * lockstep_core::rng::uniform_at(7, i as u64, 0) as f32 - 1.0)
        .collect();
    let labels = points
        .chunks(2)
        .map(|p| u32::from((p[0] < 0.0) != (p[1] < 0.0)))
        .collect();
    TensorDataset::new(vec![
        HostTensor::new(HostVec::F32(points), [n, 2])?,
        HostTensor::new(HostVec::U32(labels), [n])?,
    ])
}

fn main() -> std::result::Result<(), Box<dyn std::error::Error>> {
    let config = DataLoaderConfig {
        batch_size: 16,
        ..Default::default()
    };
    let train = DataLoader::simple(std::sync::Arc::new(xor(512)?), true, 0, config)?;
    let (device, g) = (Device::cpu(), Generator::new(3));
    let model = Sequential::new()
        .add(Linear::new(2, 32, true, &device, &g)?)
        .add(Relu)
        .add(Linear::new(32, 2, true, &device, &g)?);
    let optimizer = Sgd::new(model.parameters(), SgdConfig::new(LR).momentum(0.9))?;
    let mut setup = TrainingSetup::new(model, optimizer)
        .schedule(StepLR::new(5, 0.5)?)
        .name("xor");

    let mut trainer = Trainer::new(TrainerConfig {
        max_epochs: MAX_EPOCHS,
        ..Default::default()
    })?;
    trainer.add_callback(StopBelowLoss {
        target: TARGET,
        seen: Vec::new(),
    });
    let report = trainer.fit(&mut setup, &train, None)?;

    // The trainer keeps its callbacks: ask for ours by its type.
    let seen = &trainer.callback::<StopBelowLoss>().ok_or("the callback is gone")?.seen;
    for s in seen {
        println!("epoch {:2}: lr {:.4}, train loss {:.4}", s.epoch, s.lr, s.train_loss);
    }
    println!("{} epochs, {}", report.epochs, report.stop_reason);
    let last = seen.last().ok_or("no epoch was seen")?;
    if report.epochs >= MAX_EPOCHS || last.train_loss >= TARGET || !report.stop_reason.contains("StopBelowLoss") {
        return Err(format!("the run did not stop below a loss of {TARGET}").into());
    }
    if seen[..seen.len() - 1].iter().any(|s| s.train_loss < TARGET) {
        return Err("the run went on after an epoch below the target".into());
    }
    // StepLR: the base rate times 0.5 for every five epochs done.
    if let Some(s) = seen.iter().find(|s| s.lr != LR * 0.5f64.powi((s.epoch / 5) as i32)) {
        return Err(format!("epoch {} ran at {}, not the schedule's rate", s.epoch, s.lr).into());
    }
    Ok(())
}
