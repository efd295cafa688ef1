//! Activation checkpointing, as PyTorch's `torch.utils.checkpoint` (its non-reentrant flavour):
//! a block's forward runs without recording the graph and keeps only its inputs; one node
//! stands for the whole block, and in backward it re-runs the block's forward with the graph
//! on and back-propagates through it. Memory for the block's activations is traded for a
//! second forward.
//!
//! The recompute is the first forward bit for bit: it takes the same places in the random
//! streams (dropout) without advancing them, runs in the same autocast state and batch window,
//! and layers with side effects skip them ([`is_recomputing`]: BatchNorm does not update its
//! running statistics twice). The parameters the block reads are the node's edges, so their
//! gradients arrive through the outer backward walk and their grad-ready hooks (a data-parallel
//! reducer's) run once, when each gradient is complete.
//!
//! ```
//! use lockstep_core::nn::{self, Linear, Module};
//! use lockstep_core::{DType, Device, Generator, Tensor};
//!
//! let (device, g) = (Device::cpu(), Generator::new(0));
//! let layer = Linear::new(4, 4, true, &device, &g)?;
//! let x = Tensor::rand_normal([2, 4], 0.0, 1.0, DType::F32, &g, &device)?;
//! let block = layer.clone();
//! let y = nn::checkpoint(&x, move |x| block.forward(x)?.relu())?;
//! y.sum_all()?.backward()?;
//! assert!(layer.weight.grad().is_some());
//! # Ok::<(), lockstep_core::Error>(())
//! ```

mod checkpointed;
mod recompute;
#[cfg(test)]
mod tests;

pub use crate::autograd::is_recomputing;
pub use checkpointed::Checkpointed;

use crate::autograd;
use crate::error::Result;
use crate::tensor::Tensor;
use recompute::Recompute;

/// `forward(input)`, checkpointed: the activations inside `forward` are not kept for backward
/// but recomputed then. `forward` owns what it runs (a clone of the block: clones share
/// parameters), as it runs again during backward. Without the graph (`no_grad`) it is a plain call.
pub fn checkpoint<F>(input: &Tensor, forward: F) -> Result<Tensor>
where
    F: Fn(&Tensor) -> Result<Tensor> + Send + 'static,
{
    checkpoint_inputs(std::slice::from_ref(input), move |inputs: &[Tensor]| {
        forward(&inputs[0])
    })
}

/// [`checkpoint`] of a block of several inputs.
pub fn checkpoint_inputs<F>(inputs: &[Tensor], forward: F) -> Result<Tensor>
where
    F: Fn(&[Tensor]) -> Result<Tensor> + Send + 'static,
{
    if !autograd::is_grad_enabled() {
        return forward(inputs);
    }
    let (output, recompute) = Recompute::first_forward(inputs, forward)?;
    let used = recompute.used().to_vec();
    let edges: Vec<&Tensor> = inputs.iter().chain(&used).collect();
    Ok(output.track("checkpoint", &edges, move |grad| recompute.backward(grad)))
}
