//! A weight two stages hold a copy each (`nn::TiedWeight`, a GPT's token embedding and head):
//! after the step's last backward, each copy's gradient becomes the sum of both, first stage's
//! plus the other's on every side, so both copies take the same optimizer step bit for bit (as
//! Megatron all-reduces its embedding group). The global gradient norm counts the weight once.

use super::processes::ProcessStages;
use crate::autograd::no_grad;
use crate::error::{Error, Result};
use crate::nn::{ModuleExt, Sequential, StagedModel, TiedWeight};
use crate::tensor::Tensor;

/// Sums each tied weight's gradients: between the stages of `model` in this process, or with the
/// other holder's process across `processes` (where `model` is this process's stage alone).
pub(super) fn sum_tied_gradients(model: &StagedModel, processes: Option<&ProcessStages>) -> Result<()> {
    no_grad(|| {
        for tie in model.ties() {
            match processes {
                None => {
                    let first = parameter(&model.stages()[tie.first.0], &tie.first.1)?;
                    let copy = parameter(&model.stages()[tie.copy.0], &tie.copy.1)?;
                    let sum = add_in_order(&gradient(&first)?, &gradient(&copy)?, first.device())?;
                    copy.set_grad(Some(sum.to_device(copy.device())?));
                    first.set_grad(Some(sum));
                }
                Some(p) => exchange(tie, &model.stages()[0], p)?,
            }
        }
        Ok(())
    })
}

/// This process's copy's gradient plus the other holder's, which it receives in exchange for
/// its own (the lower stage sends first, so the two never both wait to send).
fn exchange(tie: &TiedWeight, stage: &Sequential, p: &ProcessStages) -> Result<()> {
    let me = p.stage();
    let name = tie
        .name_in(me)
        .ok_or_else(|| Error::invalid("pipeline", format!("stage {me} holds no copy of {}", tie.first.1)))?;
    let mine = parameter(stage, name)?;
    let grad = gradient(&mine)?.contiguous()?;
    let theirs = Tensor::zeros(grad.dims().to_vec(), grad.dtype(), grad.device())?;
    let (other, comm) = (tie.other_stage(me), p.world());
    if me < other {
        comm.send(grad.buffer(), other)?;
        comm.recv(theirs.buffer(), other)?;
    } else {
        comm.recv(theirs.buffer(), other)?;
        comm.send(grad.buffer(), other)?;
    }
    let sum = if me == tie.first.0 {
        add_in_order(&grad, &theirs, mine.device())?
    } else {
        add_in_order(&theirs, &grad, mine.device())?
    };
    mine.set_grad(Some(sum));
    Ok(())
}

/// The copies of tied weights that `model` holds on a later stage: the global gradient norm
/// leaves them out, so each weight counts once. `processes`: this process's stage alone.
pub(super) fn copies(model: &StagedModel, processes: Option<&ProcessStages>) -> Result<Vec<Tensor>> {
    model
        .ties()
        .iter()
        .filter_map(|tie| match processes {
            None => Some(parameter(&model.stages()[tie.copy.0], &tie.copy.1)),
            Some(p) if p.stage() == tie.copy.0 => Some(parameter(&model.stages()[0], &tie.copy.1)),
            Some(_) => None,
        })
        .collect()
}

/// `first + copy` on `device`: the same order on both holders, so the sums are equal bit for bit.
fn add_in_order(first: &Tensor, copy: &Tensor, device: &crate::device::Device) -> Result<Tensor> {
    first.to_device(device)?.add(&copy.to_device(device)?)
}

fn parameter(stage: &Sequential, name: &str) -> Result<Tensor> {
    stage
        .named_parameters()
        .into_iter()
        .find(|(n, _)| n == name)
        .map(|(_, p)| p)
        .ok_or_else(|| {
            Error::invalid(
                "pipeline",
                format!("the tied weight {name} is not among its stage's parameters"),
            )
        })
}

/// A copy's gradient; zeros where the step gave it none (the sum then is the other copy's).
fn gradient(p: &Tensor) -> Result<Tensor> {
    match p.grad() {
        Some(g) => Ok(g),
        None => p.zeros_like(),
    }
}
