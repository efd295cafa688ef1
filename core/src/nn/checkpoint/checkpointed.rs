//! A module whose forward is checkpointed: the built-in models wrap their blocks in it.

use std::sync::Arc;

use super::checkpoint_inputs;
use crate::backend::Communicator;
use crate::error::Result;
use crate::nn::Module;
use crate::rng::Generator;
use crate::tensor::Tensor;

/// `M` run through [`checkpoint`](super::checkpoint) when `enabled`, otherwise as itself; its
/// parameters, state and printing are `M`'s own, so wrapping changes no names.
#[derive(Clone)]
pub struct Checkpointed<M> {
    /// The wrapped block.
    pub inner: M,
    /// Whether `forward` checkpoints.
    pub enabled: bool,
}

impl<M> Checkpointed<M> {
    /// `inner`, checkpointed when `enabled`.
    pub fn new(inner: M, enabled: bool) -> Self {
        Checkpointed { inner, enabled }
    }
}

impl<M: Module + Clone + 'static> Module for Checkpointed<M> {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.forward_inputs(std::slice::from_ref(x))
    }
    fn forward_inputs(&self, inputs: &[Tensor]) -> Result<Tensor> {
        if !self.enabled {
            return self.inner.forward_inputs(inputs);
        }
        // The node runs the block again in backward: it owns a clone (sharing the parameters).
        let block = self.inner.clone();
        checkpoint_inputs(inputs, move |inputs: &[Tensor]| block.forward_inputs(inputs))
    }
    fn visit_parameters(&self, prefix: &str, f: &mut dyn FnMut(String, &Tensor)) {
        self.inner.visit_parameters(prefix, f)
    }
    fn visit_buffers(&self, prefix: &str, f: &mut dyn FnMut(String, &Tensor)) {
        self.inner.visit_buffers(prefix, f)
    }
    fn visit_state(&self, prefix: &str, f: &mut dyn FnMut(String, &Tensor)) {
        self.inner.visit_state(prefix, f)
    }
    fn map_tensors(&mut self, f: &mut dyn FnMut(&Tensor) -> Result<Tensor>) -> Result<()> {
        self.inner.map_tensors(f)
    }
    fn set_training(&mut self, training: bool) {
        self.inner.set_training(training)
    }
    fn visit_generators(&self, f: &mut dyn FnMut(&Arc<Generator>)) {
        self.inner.visit_generators(f)
    }
    fn convert_sync_batchnorm(&mut self, comm: &Arc<dyn Communicator>) {
        self.inner.convert_sync_batchnorm(comm)
    }
    fn describe(&self) -> String {
        self.inner.describe()
    }
}
