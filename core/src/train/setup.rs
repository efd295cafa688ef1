//! What the Trainer drives: the model, its optimizer and schedule, the task, the device, and
//! the random streams a checkpoint carries. `TrainingSetup::new(model, optimizer)` fills the
//! rest with defaults; the builder methods change them.

use std::any::Any;
use std::collections::BTreeMap;
use std::sync::Arc;

use super::task::{Classification, Task};
use crate::device::Device;
use crate::nn::{Module, ModuleExt};
use crate::optim::{LrSchedule, LrScheduler, Optimizer};
use crate::rng::Generator;

/// Everything the trainer drives: model, optimizer, optional scheduler, task, device, and the
/// random streams beyond the model's own (data augmentation's, say) whose state checkpoints
/// must carry.
pub struct TrainingSetup {
    /// The model trained, its parameters already on `device`.
    pub model: Box<dyn Module>,
    /// The optimizer over the model's parameters.
    pub optimizer: Box<dyn Optimizer>,
    /// The learning-rate scheduler, if any, stepped as `TrainerConfig::scheduler_interval` says.
    pub scheduler: Option<LrScheduler>,
    /// What the loss and the evaluation metrics are (`Classification` by default).
    pub task: Box<dyn Task>,
    /// Where batches go: the device of the model's parameters unless set.
    pub device: Device,
    /// Streams the model does not own; the model's (Dropout's) are found by themselves.
    pub generators: Vec<Arc<Generator>>,
    /// A short model name for events and summaries.
    pub model_name: String,
    /// Hyper-parameters recorded in the run-start event and in every checkpoint
    /// (`checkpoint::hparams` reads them back).
    pub hparams: BTreeMap<String, String>,
}

impl TrainingSetup {
    /// `model` trained by `optimizer` (made over `model.parameters()`): a classification task
    /// (cross-entropy, accuracy), on the device of the model's parameters, with a constant rate.
    pub fn new(model: impl Module + 'static, optimizer: impl Optimizer + 'static) -> TrainingSetup {
        let model = boxed(model, |m| Box::new(m) as Box<dyn Module>);
        let device = model
            .parameters()
            .first()
            .map_or_else(Device::cpu, |p| p.device().clone());
        TrainingSetup {
            model,
            optimizer: boxed(optimizer, |o| Box::new(o) as Box<dyn Optimizer>),
            scheduler: None,
            task: Box::new(Classification),
            device,
            generators: Vec::new(),
            model_name: "model".into(),
            hparams: BTreeMap::new(),
        }
    }

    /// What the model learns: `Classification` unless told (a regression, a sequence task).
    pub fn task(mut self, task: impl Task + 'static) -> TrainingSetup {
        self.task = Box::new(task);
        self
    }

    /// Moves the learning rate along `schedule` from the optimizer's rate (stepped as the
    /// Trainer's `scheduler_interval` says).
    pub fn schedule(mut self, schedule: impl LrSchedule + 'static) -> TrainingSetup {
        self.scheduler = Some(LrScheduler::new(schedule, self.optimizer.as_mut()));
        self
    }

    /// Where batches go (the model's parameters must already be there).
    pub fn device(mut self, device: Device) -> TrainingSetup {
        self.device = device;
        self
    }

    /// The name events, summaries and the dashboard show.
    pub fn name(mut self, name: impl Into<String>) -> TrainingSetup {
        self.model_name = name.into();
        self
    }

    /// A hyper-parameter to record with the run (events, checkpoints' metadata).
    pub fn hparam(mut self, key: impl Into<String>, value: impl ToString) -> TrainingSetup {
        self.hparams.insert(key.into(), value.to_string());
        self
    }

    /// A random stream outside the model whose state checkpoints must carry.
    pub fn generator(mut self, generator: Arc<Generator>) -> TrainingSetup {
        self.generators.push(generator);
        self
    }

    /// Every stream a checkpoint keeps: the model's own, then `generators` not among them.
    pub fn random_streams(&self) -> Vec<Arc<Generator>> {
        let mut streams = self.model.generators();
        for g in &self.generators {
            if !streams.iter().any(|s| Arc::ptr_eq(s, g)) {
                streams.push(g.clone());
            }
        }
        streams
    }
}

/// `wrap(value)`, unless `value` is already of the wrapped type `B` (a box inside a box would hide
/// the model's type from the strategies that look for it, such as the pipeline's `StagedModel`).
fn boxed<T: 'static, B: 'static>(value: T, wrap: impl FnOnce(T) -> B) -> B {
    let mut slot = Some(value);
    if let Some(boxed) = (&mut slot as &mut dyn Any).downcast_mut::<Option<B>>() {
        return boxed.take().expect("just filled");
    }
    wrap(slot.take().expect("just filled"))
}
