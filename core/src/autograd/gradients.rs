//! Gradients of a sub-graph's ends, handed back instead of accumulated (as
//! `torch.autograd.grad`): what a checkpoint's recomputed forward sends to its inputs and to the
//! outer tensors (parameters, captured activations) it used.

use std::collections::HashMap;
use std::sync::Arc;

use super::pending::Pending;
use super::{Ends, Node, walk};
use crate::error::{Error, Result};
use crate::tensor::Tensor;

/// The gradients that `seed`, the gradient of `output`, sends to each of `targets`: leaves
/// (matched by tensor) and tensors recorded before node id `first` (matched by their node,
/// where the walk stops). No leaf's `.grad` changes and no hook runs. A gradient for an end
/// that is not a target is an error: it would be lost.
pub(crate) fn gradients(output: &Tensor, seed: Tensor, targets: &[Tensor], first: u64) -> Result<Vec<Option<Tensor>>> {
    let mut ends = Collected {
        first,
        leaves: HashMap::new(),
        outer: HashMap::new(),
    };
    match output.node() {
        Some(root) => walk(root, seed, &mut ends)?,
        None if output.tracks_grad() => ends.leaf(output, Some(seed))?,
        None => {}
    }
    let mut out = Vec::with_capacity(targets.len());
    for target in targets {
        let arrived = match target.node() {
            Some(node) if node.id < first => ends.outer.remove(&node.id),
            Some(node) => {
                return Err(Error::Autograd(format!(
                    "a gradient target was recorded inside the graph being walked (`{}`)",
                    node.name
                )));
            }
            None => ends.leaves.remove(&target.id()),
        };
        out.push(arrived.map(Pending::into_tensor).transpose()?);
    }
    if !ends.leaves.is_empty() || !ends.outer.is_empty() {
        return Err(Error::Autograd(format!(
            "the walk reached {} tensor(s) needing a gradient that were not among its targets",
            ends.leaves.len() + ends.outer.len()
        )));
    }
    Ok(out)
}

/// The ends' gradients, summed per leaf and per outer node.
struct Collected {
    first: u64,
    leaves: HashMap<u64, Pending>,
    outer: HashMap<u64, Pending>,
}

impl Ends for Collected {
    fn first(&self) -> u64 {
        self.first
    }
    fn start(&mut self, _order: &[Arc<Node>]) {}
    fn leaf(&mut self, leaf: &Tensor, grad: Option<Tensor>) -> Result<()> {
        if let Some(g) = grad {
            let sum = Pending::add_whole(self.leaves.remove(&leaf.id()), g)?;
            self.leaves.insert(leaf.id(), sum);
        }
        Ok(())
    }
    fn outer(&mut self, node: &Arc<Node>, grad: Tensor) -> Result<()> {
        let sum = Pending::add_whole(self.outer.remove(&node.id), grad)?;
        self.outer.insert(node.id, sum);
        Ok(())
    }
}
