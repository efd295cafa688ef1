//! What a `#[derive(Module)]` struct's non-tensor fields may be: a module (boxed ones too), a `Vec`
//! of them (PyTorch's `ModuleList`: children `name.0`, `name.1`, …) or an `Option` of one. The
//! derive calls these with the field's full dotted name; the type decides what that means.

use std::sync::Arc;

use super::module::{Module, describe_tree};
use crate::backend::Communicator;
use crate::error::Result;
use crate::rng::Generator;
use crate::tensor::Tensor;

/// A field type that a `#[derive(Module)]` struct holds as a child: any [`Module`], a `Vec` of children
/// (named `name.0`, `name.1`, …) or an `Option` of one; the derive's generated code calls these methods.
pub trait Child {
    /// Calls `f` for each parameter under the field's dotted `name`, as [`Module::visit_parameters`].
    fn visit_parameters(&self, name: &str, f: &mut dyn FnMut(String, &Tensor));
    /// Calls `f` for each buffer under the field's dotted `name`, as [`Module::visit_buffers`].
    fn visit_buffers(&self, name: &str, f: &mut dyn FnMut(String, &Tensor));
    /// Calls `f` for each parameter and buffer under `name` in `state_dict` order, as [`Module::visit_state`].
    fn visit_state(&self, name: &str, f: &mut dyn FnMut(String, &Tensor));
    /// Replaces every parameter and buffer with `f`'s result, as [`Module::map_tensors`].
    fn map_tensors(&mut self, f: &mut dyn FnMut(&Tensor) -> Result<Tensor>) -> Result<()>;
    /// Switches training behaviour on or off, as [`Module::set_training`].
    fn set_training(&mut self, training: bool);
    /// Calls `f` for each random stream the child draws from, as [`Module::visit_generators`].
    fn visit_generators(&self, f: &mut dyn FnMut(&Arc<Generator>));
    /// Hands `comm` to every batch-norm layer inside, as [`Module::convert_sync_batchnorm`].
    fn convert_sync_batchnorm(&mut self, comm: &Arc<dyn Communicator>);
    /// How the parent prints this child; None for an absent optional one.
    fn describe_child(&self) -> Option<String>;
}

/// A module under `name`: its tensors are `name.…`.
impl<M: Module> Child for M {
    fn visit_parameters(&self, name: &str, f: &mut dyn FnMut(String, &Tensor)) {
        Module::visit_parameters(self, &format!("{name}."), f)
    }
    fn visit_buffers(&self, name: &str, f: &mut dyn FnMut(String, &Tensor)) {
        Module::visit_buffers(self, &format!("{name}."), f)
    }
    fn visit_state(&self, name: &str, f: &mut dyn FnMut(String, &Tensor)) {
        Module::visit_state(self, &format!("{name}."), f)
    }
    fn map_tensors(&mut self, f: &mut dyn FnMut(&Tensor) -> Result<Tensor>) -> Result<()> {
        Module::map_tensors(self, f)
    }
    fn set_training(&mut self, training: bool) {
        Module::set_training(self, training)
    }
    fn visit_generators(&self, f: &mut dyn FnMut(&Arc<Generator>)) {
        Module::visit_generators(self, f)
    }
    fn convert_sync_batchnorm(&mut self, comm: &Arc<dyn Communicator>) {
        Module::convert_sync_batchnorm(self, comm)
    }
    fn describe_child(&self) -> Option<String> {
        Some(self.describe())
    }
}

impl<C: Child> Child for Vec<C> {
    fn visit_parameters(&self, name: &str, f: &mut dyn FnMut(String, &Tensor)) {
        self.iter()
            .enumerate()
            .for_each(|(i, c)| c.visit_parameters(&format!("{name}.{i}"), f));
    }
    fn visit_buffers(&self, name: &str, f: &mut dyn FnMut(String, &Tensor)) {
        self.iter()
            .enumerate()
            .for_each(|(i, c)| c.visit_buffers(&format!("{name}.{i}"), f));
    }
    fn visit_state(&self, name: &str, f: &mut dyn FnMut(String, &Tensor)) {
        self.iter()
            .enumerate()
            .for_each(|(i, c)| c.visit_state(&format!("{name}.{i}"), f));
    }
    fn map_tensors(&mut self, f: &mut dyn FnMut(&Tensor) -> Result<Tensor>) -> Result<()> {
        self.iter_mut().try_for_each(|c| c.map_tensors(f))
    }
    fn set_training(&mut self, training: bool) {
        self.iter_mut().for_each(|c| c.set_training(training));
    }
    fn visit_generators(&self, f: &mut dyn FnMut(&Arc<Generator>)) {
        self.iter().for_each(|c| c.visit_generators(f));
    }
    fn convert_sync_batchnorm(&mut self, comm: &Arc<dyn Communicator>) {
        self.iter_mut().for_each(|c| c.convert_sync_batchnorm(comm));
    }
    fn describe_child(&self) -> Option<String> {
        let items: Vec<(String, String)> = self
            .iter()
            .enumerate()
            .filter_map(|(i, c)| c.describe_child().map(|d| (i.to_string(), d)))
            .collect();
        Some(describe_tree("ModuleList", &items))
    }
}

impl<C: Child> Child for Option<C> {
    fn visit_parameters(&self, name: &str, f: &mut dyn FnMut(String, &Tensor)) {
        if let Some(c) = self {
            c.visit_parameters(name, f)
        }
    }
    fn visit_buffers(&self, name: &str, f: &mut dyn FnMut(String, &Tensor)) {
        if let Some(c) = self {
            c.visit_buffers(name, f)
        }
    }
    fn visit_state(&self, name: &str, f: &mut dyn FnMut(String, &Tensor)) {
        if let Some(c) = self {
            c.visit_state(name, f)
        }
    }
    fn map_tensors(&mut self, f: &mut dyn FnMut(&Tensor) -> Result<Tensor>) -> Result<()> {
        self.as_mut().map_or(Ok(()), |c| c.map_tensors(f))
    }
    fn set_training(&mut self, training: bool) {
        if let Some(c) = self {
            c.set_training(training)
        }
    }
    fn visit_generators(&self, f: &mut dyn FnMut(&Arc<Generator>)) {
        if let Some(c) = self {
            c.visit_generators(f)
        }
    }
    fn convert_sync_batchnorm(&mut self, comm: &Arc<dyn Communicator>) {
        if let Some(c) = self {
            c.convert_sync_batchnorm(comm)
        }
    }
    fn describe_child(&self) -> Option<String> {
        self.as_ref().and_then(Child::describe_child)
    }
}
