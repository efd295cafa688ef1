//! What `Trainer::test` and `Trainer::validate` evaluate: a training setup, or a model alone (a
//! loaded model needs no optimizer to be scored), as Lightning's `trainer.test(model, loader)`.

use super::setup::TrainingSetup;
use super::strategy::Strategy;
use super::task::{Classification, Task};
use crate::device::Device;
use crate::error::Result;
use crate::nn::{Module, ModuleExt};
use crate::tensor::Tensor;

/// Something the Trainer can score on a loader: a [`TrainingSetup`] (through the trainer's
/// strategy, with the setup's task), a [`Module`] alone (scored as `Classification`), or a
/// `(model, task)` pair for another task (`LanguageModeling`, say).
pub trait Evaluable {
    /// Evaluation mode (`false`: dropout off, batch norm on running statistics) or back.
    fn set_training(&mut self, training: bool);
    /// Where the loader's batches go.
    fn device(&self) -> Device;
    /// The loss sum and correct count of one batch already on `device()`.
    fn eval_sums(&self, strategy: &dyn Strategy, batch: &[Tensor]) -> Result<(Tensor, Tensor)>;
}

impl Evaluable for TrainingSetup {
    fn set_training(&mut self, training: bool) {
        Module::set_training(&mut self.model, training);
    }
    fn device(&self) -> Device {
        self.device.clone()
    }
    fn eval_sums(&self, strategy: &dyn Strategy, batch: &[Tensor]) -> Result<(Tensor, Tensor)> {
        strategy.eval_sums(self, batch)
    }
}

impl<M: Module> Evaluable for M {
    fn set_training(&mut self, training: bool) {
        Module::set_training(self, training);
    }
    fn device(&self) -> Device {
        model_device(self)
    }
    fn eval_sums(&self, _strategy: &dyn Strategy, batch: &[Tensor]) -> Result<(Tensor, Tensor)> {
        Classification.eval_sums(self, batch)
    }
}

impl<M: Module, T: Task> Evaluable for (M, T) {
    fn set_training(&mut self, training: bool) {
        Module::set_training(&mut self.0, training);
    }
    fn device(&self) -> Device {
        model_device(&self.0)
    }
    fn eval_sums(&self, _strategy: &dyn Strategy, batch: &[Tensor]) -> Result<(Tensor, Tensor)> {
        self.1.eval_sums(&self.0, batch)
    }
}

/// The device of the model's parameters (the CPU for a model without any).
fn model_device(model: &dyn Module) -> Device {
    model
        .parameters()
        .first()
        .map_or_else(Device::cpu, |p| p.device().clone())
}
