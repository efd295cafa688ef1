//! Next-token prediction: batches are `[tokens, next tokens]`, both `[batch, t]`, and the model
//! gives logits `[batch, t, vocab]`. The loss is the mean cross-entropy over every position, as
//! nanoGPT computes it; the metric is the share of positions whose most likely token is right.

use super::task::Task;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::nn::Module;
use crate::tensor::Tensor;

/// Next-token prediction on `[tokens, next tokens]` batches: mean cross-entropy over every
/// position, as nanoGPT.
#[derive(Clone, Copy, Debug, Default)]
pub struct LanguageModeling;

/// Logits and targets flattened to `[batch·t, vocab]` and `[batch·t]`.
fn flat(model: &dyn Module, batch: &[Tensor]) -> Result<(Tensor, Tensor, usize)> {
    let [x, y] = batch else {
        return Err(Error::invalid(
            "LanguageModeling",
            format!("expects batches of [tokens, next tokens], got {} fields", batch.len()),
        ));
    };
    let logits = model.forward(x)?;
    if logits.rank() != 3 || y.dims() != &logits.dims()[..2] {
        return Err(Error::shape(
            "LanguageModeling",
            logits.shape(),
            y.shape(),
            "expects logits [batch, t, vocab] for targets [batch, t]",
        ));
    }
    let (rows, vocab) = (y.elem_count(), logits.dims()[2]);
    Ok((logits.reshape([rows, vocab])?, y.reshape([rows])?, y.dims()[0]))
}

impl Task for LanguageModeling {
    fn loss(&self, model: &dyn Module, batch: &[Tensor]) -> Result<Tensor> {
        let (logits, targets, _) = flat(model, batch)?;
        logits.cross_entropy(&targets)
    }
    /// Per sequence (the evaluation divides by sequences): the summed mean token loss and the
    /// summed share of right tokens. Every sequence has `t` tokens, so these average to the
    /// token means.
    fn eval_sums(&self, model: &dyn Module, batch: &[Tensor]) -> Result<(Tensor, Tensor)> {
        let (logits, targets, sequences) = flat(model, batch)?;
        let per_token = 1.0 / (targets.elem_count() / sequences.max(1)) as f64;
        let loss = logits.cross_entropy(&targets)?.mul_scalar(sequences as f64)?;
        let right = logits
            .argmax(-1, false)?
            .eq(&targets.to_dtype(DType::U32)?)?
            .to_dtype(logits.dtype())?
            .sum_all()?
            .mul_scalar(per_token)?;
        Ok((loss, right))
    }
}
