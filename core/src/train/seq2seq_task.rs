//! Sequence to sequence: batches are `[input, target tokens]`, the model gives logits
//! `[batch, steps, vocab]`; padded positions count for nothing. The loss is each sequence's
//! mean cross-entropy over its real tokens, averaged over sequences; the metric is exact-sequence accuracy (every real token
//! right).

use super::task::Task;
use crate::backend::CmpOp;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::nn::Module;
use crate::tensor::Tensor;

/// Sequence-to-sequence on `[input, target tokens]` batches, padded targets ignored; its accuracy
/// counts sequences with every real token right.
#[derive(Clone, Copy, Debug)]
pub struct Seq2SeqTask {
    /// The target token that marks padding.
    pub pad: u32,
}

/// Per position: the negative log-likelihood of the target (0 at padding), and 1 where the
/// target is real; both `[batch, steps]`.
fn token_losses(logits: &Tensor, target: &Tensor, pad: u32) -> Result<(Tensor, Tensor)> {
    let (batch, steps) = (target.dims()[0], target.dims()[1]);
    if logits.rank() != 3 || logits.dims()[..2] != [batch, steps] {
        return Err(Error::shape(
            "Seq2SeqTask",
            logits.shape(),
            target.shape(),
            "expects logits [batch, steps, vocab] for targets [batch, steps]",
        ));
    }
    let vocab = logits.dims()[2];
    let target = target.to_dtype(DType::F32)?;
    let real = target.cmp_scalar(CmpOp::Ne, f64::from(pad))?.to_dtype(DType::F32)?;
    // Padding picks class 0 (masked out below), so every index is in range.
    let safe = target.mul(&real)?.to_dtype(DType::U32)?;
    let real = real.to_dtype(logits.dtype())?;
    let log_probs = logits.contiguous()?.reshape([batch * steps, vocab])?.log_softmax(-1)?;
    let picked = log_probs.gather(1, &safe.reshape([batch * steps, 1])?)?;
    let nll = picked.reshape([batch, steps])?.affine(-1.0, 0.0)?.mul(&real)?;
    Ok((nll, real))
}

/// Each sequence's mean over its real tokens, `[batch]`.
fn sequence_means(nll: &Tensor, real: &Tensor) -> Result<Tensor> {
    nll.sum(&[1], false)?.div(&real.sum(&[1], false)?.clamp_min(1.0)?)
}

fn split(batch: &[Tensor]) -> Result<(&Tensor, &Tensor)> {
    match batch {
        [x, y] if y.rank() == 2 => Ok((x, y)),
        _ => Err(Error::invalid(
            "Seq2SeqTask",
            "expects batches of [input, target tokens [batch, steps]]",
        )),
    }
}

impl Task for Seq2SeqTask {
    /// The mean over sequences of each one's mean token loss: every sequence counts the same
    /// whatever its length, so micro-batches of equal size average to the whole batch's loss.
    fn loss(&self, model: &dyn Module, batch: &[Tensor]) -> Result<Tensor> {
        let (x, y) = split(batch)?;
        let (nll, real) = token_losses(&model.forward(x)?, y, self.pad)?;
        sequence_means(&nll, &real)?.mean_all()
    }

    /// (sum over sequences of their mean token loss, sequences entirely right).
    fn eval_sums(&self, model: &dyn Module, batch: &[Tensor]) -> Result<(Tensor, Tensor)> {
        let (x, y) = split(batch)?;
        let logits = model.forward(x)?;
        let (nll, real) = token_losses(&logits, y, self.pad)?;
        let per_sequence = sequence_means(&nll, &real)?;
        let wrong = logits
            .argmax(-1, false)?
            .eq(&y.to_dtype(DType::U32)?)?
            .to_dtype(real.dtype())?
            .affine(-1.0, 1.0)?
            .mul(&real)?
            .sum(&[1], false)?;
        let right = wrong.cmp_scalar(CmpOp::Eq, 0.0)?.to_dtype(real.dtype())?.sum_all()?;
        Ok((per_sequence.sum_all()?, right))
    }
}
