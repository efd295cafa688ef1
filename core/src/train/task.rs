//! What a training step computes from a batch: the loss, and metrics for evaluation.

use crate::error::{Error, Result};
use crate::nn::Module;
use crate::tensor::Tensor;

/// Evaluation totals over a loader, kept on the device until the end.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct EvalMetrics {
    /// The mean loss per sample (per sequence, for sequence tasks).
    pub loss: f64,
    /// The share right, in [0, 1]: of samples, of tokens for `LanguageModeling`, of whole sequences
    /// for `Seq2SeqTask`.
    pub accuracy: f64,
    /// Samples evaluated: the batches' leading dimensions summed.
    pub samples: u64,
}

/// What the model learns from a batch: its training loss and evaluation sums (as Lightning's
/// `training_step` and `validation_step`).
pub trait Task: Send + Sync {
    /// The scalar loss of one batch (already on the device).
    fn loss(&self, model: &dyn Module, batch: &[Tensor]) -> Result<Tensor>;
    /// (sum of per-sample losses, number correct) of one batch, as device scalars: the
    /// evaluation loop adds them up without reading them back.
    fn eval_sums(&self, model: &dyn Module, batch: &[Tensor]) -> Result<(Tensor, Tensor)>;
}

/// Classification with cross-entropy: batches are `[inputs, integer labels]`, or
/// `[input_1, …, input_n, labels]` for a model of several inputs (`Module::forward_inputs`).
#[derive(Clone, Copy, Debug, Default)]
pub struct Classification;

/// The model's inputs (every field but the last) and the labels (the last).
fn split(batch: &[Tensor]) -> Result<(&[Tensor], &Tensor)> {
    match batch {
        [inputs @ .., y] if !inputs.is_empty() => Ok((inputs, y)),
        _ => Err(Error::invalid(
            "Classification",
            format!("expects batches of [inputs…, labels], got {} field(s)", batch.len()),
        )),
    }
}

impl Task for Classification {
    fn loss(&self, model: &dyn Module, batch: &[Tensor]) -> Result<Tensor> {
        let (inputs, y) = split(batch)?;
        model.forward_inputs(inputs)?.cross_entropy(y)
    }
    fn eval_sums(&self, model: &dyn Module, batch: &[Tensor]) -> Result<(Tensor, Tensor)> {
        let (inputs, y) = split(batch)?;
        let logits = model.forward_inputs(inputs)?;
        let n = y.elem_count() as f64;
        let loss_sum = logits.cross_entropy(y)?.affine(n, 0.0)?;
        let labels = y.to_dtype(crate::dtype::DType::U32)?;
        let correct = logits
            .argmax(-1, false)?
            .eq(&labels)?
            .to_dtype(logits.dtype())?
            .sum_all()?;
        Ok((loss_sum, correct))
    }
}
