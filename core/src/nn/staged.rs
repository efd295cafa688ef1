//! A layer sequence split into stages, each on its own device: the model of model-parallel and
//! pipeline training. Called directly it runs stage after stage, moving the activations
//! between devices (naive model parallel, also how it evaluates); a pipeline strategy runs the
//! stages at once on micro-batches. Tensors keep the whole model's names, so a checkpoint loads
//! on one device or on another placement.

use std::sync::Arc;

use super::module::{Module, ModuleExt};
use super::sequential::Sequential;
use crate::backend::Communicator;
use crate::device::Device;
use crate::error::{Error, Result};
use crate::tensor::Tensor;

pub struct StagedModel {
    stages: Vec<Sequential>,
    devices: Vec<Device>,
}

impl StagedModel {
    /// Stages (the parts of a `Sequential::split`) with the device each one's tensors live on.
    pub fn new(stages: Vec<(Sequential, Device)>) -> Result<StagedModel> {
        if stages.is_empty() {
            return Err(Error::invalid("StagedModel", "a staged model needs at least one stage"));
        }
        for (i, (stage, device)) in stages.iter().enumerate() {
            if let Some((name, t)) = stage.state_dict().into_iter().find(|(_, t)| t.device() != device) {
                return Err(Error::invalid(
                    "StagedModel",
                    format!(
                        "stage {i} is placed on {device} but its tensor {name} is on {}",
                        t.device()
                    ),
                ));
            }
        }
        let (stages, devices) = stages.into_iter().unzip();
        Ok(StagedModel { stages, devices })
    }

    /// `sizes[i]` consecutive layers on `devices[i]`: builds the model on each device with
    /// `build` (from the same seed each time, so every stage gets the weights the model would
    /// have on one device) and keeps each stage's layers.
    pub fn place(
        sizes: &[usize],
        devices: &[Device],
        mut build: impl FnMut(&Device) -> Result<Sequential>,
    ) -> Result<StagedModel> {
        if sizes.len() != devices.len() {
            return Err(Error::invalid(
                "StagedModel::place",
                format!("{} stage sizes for {} devices", sizes.len(), devices.len()),
            ));
        }
        let mut stages = Vec::with_capacity(sizes.len());
        for (i, device) in devices.iter().enumerate() {
            let stage = build(device)?.split(sizes)?.swap_remove(i);
            stages.push((stage, device.clone()));
        }
        StagedModel::new(stages)
    }

    pub fn stages(&self) -> &[Sequential] {
        &self.stages
    }

    pub fn devices(&self) -> &[Device] {
        &self.devices
    }
}

impl Module for StagedModel {
    /// Stage after stage; the output comes back to the input's device, where the targets are.
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let mut h = x.clone();
        for (stage, device) in self.stages.iter().zip(&self.devices) {
            h = stage.forward(&h.to_device(device)?)?;
        }
        h.to_device(x.device())
    }
    fn visit_parameters(&self, prefix: &str, f: &mut dyn FnMut(String, &Tensor)) {
        self.stages.iter().for_each(|s| s.visit_parameters(prefix, f));
    }
    fn visit_buffers(&self, prefix: &str, f: &mut dyn FnMut(String, &Tensor)) {
        self.stages.iter().for_each(|s| s.visit_buffers(prefix, f));
    }
    fn visit_state(&self, prefix: &str, f: &mut dyn FnMut(String, &Tensor)) {
        self.stages.iter().for_each(|s| s.visit_state(prefix, f));
    }
    fn set_training(&mut self, training: bool) {
        self.stages.iter_mut().for_each(|s| s.set_training(training));
    }
    fn convert_sync_batchnorm(&mut self, comm: &Arc<dyn Communicator>) {
        self.stages.iter_mut().for_each(|s| s.convert_sync_batchnorm(comm));
    }
    fn describe(&self) -> String {
        let body: Vec<String> = self
            .stages
            .iter()
            .zip(&self.devices)
            .enumerate()
            .map(|(i, (s, d))| format!("stage {i} on {d}: {}", s.describe()))
            .collect();
        body.join("\n")
    }
}
