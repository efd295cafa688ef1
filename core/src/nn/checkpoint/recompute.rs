//! What a checkpoint's node keeps from the block's first forward, and its backward: the
//! recompute and the walk through the recomputed graph.

use crate::autocast;
use crate::autograd::capture::capture_used;
use crate::autograd::{Node, gradients, no_grad, recomputing, with_grad};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::rng::BatchWindow;
use crate::rng::replay::{self, Draws};
use crate::tensor::Tensor;

/// The block's forward and everything its second run needs to be the first one.
pub(super) struct Recompute<F> {
    forward: F,
    /// The inputs, detached (the only activations the checkpoint keeps).
    inputs: Vec<Tensor>,
    /// Which inputs needed a gradient.
    needs_grad: Vec<bool>,
    /// Tensors needing a gradient the forward read from outside: parameters, captured activations.
    used: Vec<Tensor>,
    /// Where the forward's random draws fell in their streams.
    draws: Draws,
    autocast: Option<DType>,
    window: Option<BatchWindow>,
}

impl<F: Fn(&[Tensor]) -> Result<Tensor>> Recompute<F> {
    /// Runs `forward` on `inputs` without recording the graph; its output and what the backward needs.
    pub(super) fn first_forward(inputs: &[Tensor], forward: F) -> Result<(Tensor, Recompute<F>)> {
        let detached: Vec<Tensor> = inputs.iter().map(Tensor::detach).collect();
        let ((output, used), draws) = no_grad(|| replay::record(|| capture_used(|| forward(&detached))));
        let recompute = Recompute {
            forward,
            inputs: detached,
            needs_grad: inputs.iter().map(Tensor::tracks_grad).collect(),
            used,
            draws,
            autocast: autocast::active(),
            window: BatchWindow::current(),
        };
        Ok((output?, recompute))
    }

    /// The node's edges after the inputs', in order.
    pub(super) fn used(&self) -> &[Tensor] {
        &self.used
    }

    /// The gradients of the inputs, then of the used tensors, for the output's gradient `grad`.
    pub(super) fn backward(self, grad: &Tensor) -> Result<Vec<Option<Tensor>>> {
        let first = Node::next_id();
        let leaves: Vec<Tensor> = self
            .inputs
            .iter()
            .zip(&self.needs_grad)
            .map(|(x, &needs)| x.requires_grad(needs))
            .collect();
        let output = {
            let _autocast = autocast::enter(self.autocast);
            let _window = BatchWindow::restore(self.window);
            let (output, same) = with_grad(|| recomputing(|| replay::replay(&self.draws, || (self.forward)(&leaves))));
            if !same {
                return Err(Error::Autograd(
                    "checkpoint: the recomputed forward drew random numbers unlike the first (did the block change between forward and backward?)".into(),
                ));
            }
            output?
        };
        let targets: Vec<Tensor> = leaves
            .iter()
            .zip(&self.needs_grad)
            .filter(|(_, needs)| **needs)
            .map(|(x, _)| x.clone())
            .chain(self.used.iter().cloned())
            .collect();
        let mut found = gradients(&output, grad.clone(), &targets, first)?.into_iter();
        let mut out: Vec<Option<Tensor>> = self
            .needs_grad
            .iter()
            .map(|&needs| if needs { found.next().flatten() } else { None })
            .collect();
        out.extend(found);
        Ok(out)
    }
}
