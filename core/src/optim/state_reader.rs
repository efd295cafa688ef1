//! Reading an `OptimizerState` back into an optimizer: tensors are copied onto the parameter's
//! device and dtype, and a name nobody asked for is an error (e.g. Adam state given to SGD).

use std::collections::HashSet;

use super::optimizer::OptimizerState;
use crate::autograd::no_grad;
use crate::error::{Error, Result};
use crate::tensor::Tensor;

/// `state.{i}.{name}`: per-parameter state, as in PyTorch's optimizer state dict.
pub(super) fn param_key(i: usize, name: &str) -> String {
    format!("state.{i}.{name}")
}

/// `param_groups.0.{name}`: a hyper-parameter of the (single) parameter group.
pub(super) fn group_key(name: &str) -> String {
    format!("param_groups.0.{name}")
}

pub(super) struct StateReader<'a> {
    op: &'static str,
    state: &'a OptimizerState,
    used: HashSet<&'a str>,
}

impl<'a> StateReader<'a> {
    pub fn new(op: &'static str, state: &'a OptimizerState) -> Self {
        StateReader {
            op,
            state,
            used: HashSet::new(),
        }
    }

    /// A private copy of tensor `name` with `like`'s shape, device and dtype, if present.
    /// Private because the optimizer updates it in place.
    pub fn tensor(&mut self, name: &str, like: &Tensor) -> Result<Option<Tensor>> {
        let Some((key, src)) = self.state.tensors.iter().find(|(n, _)| n == name) else {
            return Ok(None);
        };
        self.used.insert(key);
        if src.shape() != like.shape() {
            return Err(Error::shape(
                self.op,
                src.shape(),
                like.shape(),
                format!("`{name}` must have its parameter's shape"),
            ));
        }
        let copy = like.detach().zeros_like()?;
        no_grad(|| copy.assign(&src.to_device(like.device())?.to_dtype(like.dtype())?))?;
        Ok(Some(copy))
    }

    pub fn scalar(&mut self, name: &str) -> Option<f64> {
        let (key, value) = self.state.scalars.iter().find(|(n, _)| n == name)?;
        self.used.insert(key);
        Some(*value)
    }

    /// Hyper-parameter `name` of the group, or `current` when the state does not carry it.
    pub fn group_or(&mut self, name: &str, current: f64) -> f64 {
        self.scalar(&group_key(name)).unwrap_or(current)
    }

    /// Errors if any name in the state was not read.
    pub fn finish(self) -> Result<()> {
        let names = self
            .state
            .tensors
            .iter()
            .map(|(n, _)| n)
            .chain(self.state.scalars.iter().map(|(n, _)| n));
        let unexpected: Vec<&str> = names.map(String::as_str).filter(|n| !self.used.contains(n)).collect();
        if unexpected.is_empty() {
            return Ok(());
        }
        Err(Error::invalid(
            self.op,
            format!(
                "unexpected state: {} (is this state from another optimizer or a model with other parameters?)",
                unexpected.join(", ")
            ),
        ))
    }
}
