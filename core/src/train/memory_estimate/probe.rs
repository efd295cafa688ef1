//! The measuring half of the estimate: one forward and backward of the model on a small batch,
//! on a CPU device of its own (a fresh buffer pool, so its peak counts nothing else), and one
//! optimizer step to see how much state the optimizer keeps per parameter.

use std::sync::Arc;

use crate::backend::cpu::CpuBackend;
use crate::data::Dataset;
use crate::device::Device;
use crate::distributed::parameter_index;
use crate::error::{Error, Result};
use crate::nn::ModuleExt;
use crate::tensor::Tensor;
use crate::train::config::Precision;
use crate::train::events::StepTimes;
use crate::train::setup::TrainingSetup;
use crate::train::step::{self, MicroBatch};

/// Builds the run's model, optimizer and task on the device given (the probe's own).
pub type BuildSetup<'a> = &'a dyn Fn(&Device) -> Result<TrainingSetup>;

/// A fresh CPU device outside the registry: its peak starts at zero.
fn fresh_cpu() -> Device {
    Device::from_backend(Arc::new(CpuBackend::new(0)))
}

fn bytes_of(t: &Tensor) -> u64 {
    (t.elem_count() * t.dtype().size_in_bytes()) as u64
}

/// Whether a probe's gradients stay as backward makes them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Gradients {
    /// Each dropped as it becomes ready: the peak is the activations' alone.
    Dropped,
    /// Kept, as a run keeps them for its optimizer step.
    Kept,
}

/// The highest bytes one forward and backward of `batch` samples holds above what was live
/// before the batch came onto the device: the batch itself, what autograd saves for backward,
/// the largest transient, and the gradients unless `gradients` drops them.
pub fn step_peak(
    build: BuildSetup<'_>,
    data: &dyn Dataset,
    batch: usize,
    precision: Precision,
    gradients: Gradients,
) -> Result<u64> {
    let device = fresh_cpu();
    let setup = build(&device)?;
    if gradients == Gradients::Dropped {
        for p in setup.model.parameters() {
            p.add_grad_ready_hook(Arc::new(|p: &Tensor| {
                p.set_grad(None);
                Ok(())
            }));
        }
    }
    if data.is_empty() {
        return Err(Error::invalid(
            "memory estimate",
            "the data set has no samples to measure with",
        ));
    }
    let indices: Vec<usize> = (0..batch).map(|i| i % data.len()).collect();
    let samples = data.get_batch(&indices)?;
    let before = device.backend().memory_stats().allocated_bytes;
    let tensors = samples.to_device(&setup.device)?;
    let micro = MicroBatch {
        precision,
        ..MicroBatch::whole(&tensors)
    };
    step::forward_backward(&setup, &micro, 1.0, &mut StepTimes::default())?;
    let peak = device.backend().memory_stats().peak_allocated_bytes;
    Ok(peak.saturating_sub(before))
}

/// What the model holds per parameter, in the optimizer's order: the parameter's bytes and the
/// bytes of its optimizer state (after one step, as every optimizer here makes its state
/// lazily); and the bytes of the model's buffers (running statistics).
pub struct ModelBytes {
    /// Each parameter's elements (ZeRO shares parameters out by these).
    pub elements: Vec<usize>,
    /// Each parameter's bytes (its gradient has as many).
    pub parameters: Vec<u64>,
    /// Each parameter's optimizer state.
    pub optimizer_state: Vec<u64>,
    /// Every buffer's together.
    pub buffers: u64,
    /// The model's name, as the setup gives it.
    pub model_name: String,
}

/// Builds the setup on a fresh device, gives every parameter a zero gradient and steps once.
pub fn model_bytes(build: BuildSetup<'_>) -> Result<ModelBytes> {
    let mut setup = build(&fresh_cpu())?;
    let params = setup.optimizer.parameters().to_vec();
    for p in &params {
        p.set_grad(Some(p.detach().zeros_like()?));
    }
    crate::autograd::no_grad(|| setup.optimizer.step())?;
    let mut optimizer_state = vec![0; params.len()];
    for (name, t) in &setup.optimizer.state().tensors {
        if let Some(i) = parameter_index(name).filter(|&i| i < params.len()) {
            optimizer_state[i] += bytes_of(t);
        }
    }
    Ok(ModelBytes {
        elements: params.iter().map(Tensor::elem_count).collect(),
        parameters: params.iter().map(bytes_of).collect(),
        optimizer_state,
        buffers: setup.model.named_buffers().iter().map(|(_, b)| bytes_of(b)).sum(),
        model_name: setup.model_name.clone(),
    })
}
