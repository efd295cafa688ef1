//! A chain of modules; child i's parameters are named `i.<name>`, as in PyTorch's nn.Sequential,
//! or `<child>.<name>` for a child added under a name (`nn.Sequential(OrderedDict(…))`), which is
//! how a model whose forward is a chain (torchvision's ResNet) keeps its own names.

use std::sync::Arc;

use super::layer_error::name_failing_layer;
use super::module::{Module, describe_tree};
use crate::backend::Communicator;
use crate::error::{Error, Result};
use crate::rng::Generator;
use crate::tensor::Tensor;

/// A chain of modules run in order, as `torch.nn.Sequential`; an activation after a Linear or Conv2d is fused
/// into that layer's output pass.
#[derive(Default)]
pub struct Sequential {
    layers: Vec<Box<dyn Module>>,
    /// Each layer's name when it was added with one; None names it by its index.
    names: Vec<Option<String>>,
    /// The index of the first layer in names: 0, or where this part of a split model starts,
    /// so a pipeline stage's tensors keep the whole model's names.
    first_index: usize,
}

impl Sequential {
    /// An empty chain; append layers with [`Sequential::add`] or [`Sequential::add_named`].
    pub fn new() -> Self {
        Sequential::default()
    }
    /// Appends a layer (builder style, as `nn.Sequential(a, b, …)` reads).
    #[allow(clippy::should_implement_trait)]
    pub fn add(mut self, layer: impl Module + 'static) -> Self {
        self.push(Box::new(layer));
        self
    }
    /// Appends a layer named `name` instead of by its index (builder style).
    pub fn add_named(mut self, name: impl Into<String>, layer: impl Module + 'static) -> Self {
        self.layers.push(Box::new(layer));
        self.names.push(Some(name.into()));
        self
    }
    /// Appends a boxed layer, named by its index.
    pub fn push(&mut self, layer: Box<dyn Module>) {
        self.layers.push(layer);
        self.names.push(None);
    }
    /// The number of layers (activations included).
    pub fn len(&self) -> usize {
        self.layers.len()
    }
    /// True when the chain has no layers.
    pub fn is_empty(&self) -> bool {
        self.layers.is_empty()
    }
    /// The layers in order.
    pub fn layers(&self) -> &[Box<dyn Module>] {
        &self.layers
    }
    /// The index the first layer's names start from (0 unless this is a part of a split).
    pub fn first_index(&self) -> usize {
        self.first_index
    }
    /// Consecutive parts of `sizes[i]` layers each (together all of them), each naming its
    /// layers by their index in this whole: the stages of a pipeline.
    pub fn split(self, sizes: &[usize]) -> Result<Vec<Sequential>> {
        let total: usize = sizes.iter().sum();
        if total != self.layers.len() || sizes.contains(&0) {
            return Err(Error::invalid(
                "Sequential::split",
                format!(
                    "parts of {sizes:?} layers do not cover the {} layers once, each part at least one",
                    self.layers.len()
                ),
            ));
        }
        let mut layers = self.layers.into_iter();
        let mut names = self.names.into_iter();
        let mut first_index = self.first_index;
        Ok(sizes
            .iter()
            .map(|&n| {
                let part = Sequential {
                    layers: layers.by_ref().take(n).collect(),
                    names: names.by_ref().take(n).collect(),
                    first_index,
                };
                first_index += n;
                part
            })
            .collect())
    }
    /// Layer `i`'s name: the one it was added under, else its index in the whole model.
    fn name(&self, i: usize) -> String {
        match &self.names[i] {
            Some(name) => name.clone(),
            None => (self.first_index + i).to_string(),
        }
    }
    fn prefix(&self, prefix: &str, i: usize) -> String {
        format!("{prefix}{}.", self.name(i))
    }
    /// Each layer on the previous one's output (`forward` names a failing layer).
    fn run_layers(&self, x: &Tensor) -> Result<Tensor> {
        let mut h = x.clone();
        let mut i = 0;
        while i < self.layers.len() {
            // A layer followed by an activation module may apply both in one pass.
            let next_act = self.layers.get(i + 1).and_then(|l| l.activation());
            if let Some(fused) = next_act.and_then(|act| self.layers[i].forward_activated(&h, act)) {
                h = fused?;
                i += 2;
            } else {
                h = self.layers[i].forward(&h)?;
                i += 1;
            }
        }
        Ok(h)
    }
}

impl Module for Sequential {
    fn map_tensors(&mut self, f: &mut dyn FnMut(&Tensor) -> Result<Tensor>) -> Result<()> {
        self.layers.iter_mut().try_for_each(|l| l.map_tensors(f))
    }
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.run_layers(x).map_err(|e| name_failing_layer(self, e))
    }
    fn visit_parameters(&self, prefix: &str, f: &mut dyn FnMut(String, &Tensor)) {
        for (i, layer) in self.layers.iter().enumerate() {
            layer.visit_parameters(&self.prefix(prefix, i), f);
        }
    }
    fn visit_buffers(&self, prefix: &str, f: &mut dyn FnMut(String, &Tensor)) {
        for (i, layer) in self.layers.iter().enumerate() {
            layer.visit_buffers(&self.prefix(prefix, i), f);
        }
    }
    fn visit_state(&self, prefix: &str, f: &mut dyn FnMut(String, &Tensor)) {
        for (i, layer) in self.layers.iter().enumerate() {
            layer.visit_state(&self.prefix(prefix, i), f);
        }
    }
    fn set_training(&mut self, training: bool) {
        self.layers.iter_mut().for_each(|l| l.set_training(training));
    }
    fn visit_generators(&self, f: &mut dyn FnMut(&Arc<Generator>)) {
        self.layers.iter().for_each(|l| l.visit_generators(f));
    }
    fn convert_sync_batchnorm(&mut self, comm: &Arc<dyn Communicator>) {
        self.layers.iter_mut().for_each(|l| l.convert_sync_batchnorm(comm));
    }
    fn describe(&self) -> String {
        let children: Vec<(String, String)> = self
            .layers
            .iter()
            .enumerate()
            .map(|(i, l)| (self.name(i), l.describe()))
            .collect();
        describe_tree("Sequential", &children)
    }
}
