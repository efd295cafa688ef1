//! Dropout: zeroes elements with probability `p` while training, scales the rest by 1/(1-p).

use std::sync::Arc;

use super::module::Module;
use crate::error::{Error, Result};
use crate::rng::Generator;
use crate::tensor::Tensor;

/// Zeroes each element with probability `p` in training and scales the rest by `1/(1-p)`, as `torch.nn.Dropout`;
/// the identity in evaluation. A clone shares the stream.
#[derive(Clone)]
pub struct Dropout {
    p: f64,
    training: bool,
    /// Shared so several layers can draw from one stream whose state a checkpoint restores.
    generator: Arc<Generator>,
}

impl Dropout {
    /// Dropout with probability `p` in `[0, 1]`, drawing its masks from `generator` (shareable between layers).
    pub fn new(p: f64, generator: Arc<Generator>) -> Result<Dropout> {
        if !(0.0..=1.0).contains(&p) {
            return Err(Error::invalid(
                "Dropout",
                format!("probability p must be in [0, 1], got {p}"),
            ));
        }
        Ok(Dropout {
            p,
            training: true,
            generator,
        })
    }
    /// The probability of zeroing an element.
    pub fn p(&self) -> f64 {
        self.p
    }
    /// The random stream the masks are drawn from (checkpointed by the Trainer).
    pub fn generator(&self) -> &Arc<Generator> {
        &self.generator
    }
    /// True in training mode; in evaluation dropout passes its input through unchanged.
    pub fn is_training(&self) -> bool {
        self.training
    }
}

impl Module for Dropout {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        x.dropout(self.p, self.training, &self.generator)
    }
    fn set_training(&mut self, training: bool) {
        self.training = training;
    }
    fn visit_generators(&self, f: &mut dyn FnMut(&Arc<Generator>)) {
        f(&self.generator)
    }
    fn describe(&self) -> String {
        format!("Dropout(p={}, inplace=False)", self.p)
    }
}
