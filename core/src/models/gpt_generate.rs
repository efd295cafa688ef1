//! Text from a trained GPT: each next token drawn from the model's distribution over the
//! vocabulary given the last `block_size` tokens, sharpened by a temperature and cut to the `k`
//! most likely (nanoGPT's `generate`). Draws come from a seeded counter stream, so a seed gives
//! the same text on every device.

use super::gpt::Gpt;
use crate::autograd::no_grad;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::rng::uniform_at;
use crate::tensor::Tensor;

/// How `Gpt::generate` picks each next token.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sampling {
    /// Divides the logits: below 1 sharper, above 1 flatter.
    pub temperature: f64,
    /// Only the `k` most likely tokens may be drawn (None: any).
    pub top_k: Option<usize>,
    /// Seeds the draws: the same seed and prompt give the same tokens on every device (default 0).
    pub seed: u64,
}

impl Default for Sampling {
    fn default() -> Self {
        Sampling {
            temperature: 1.0,
            top_k: None,
            seed: 0,
        }
    }
}

impl Gpt {
    /// `tokens` new token ids following `prompt` (ids below the vocabulary size). Put the model
    /// in evaluation mode first (`eval()`), or dropout stays on.
    pub fn generate(&self, prompt: &[u32], tokens: usize, sampling: &Sampling) -> Result<Vec<u32>> {
        let vocab = self.config.vocab_size;
        if prompt.is_empty() {
            return Err(Error::invalid("generate", "the prompt needs at least one token"));
        }
        if let Some(&id) = prompt.iter().find(|&&id| id as usize >= vocab) {
            return Err(Error::invalid(
                "generate",
                format!("prompt token {id} is past the vocabulary of {vocab}"),
            ));
        }
        if !(sampling.temperature > 0.0 && sampling.temperature.is_finite()) || sampling.top_k == Some(0) {
            return Err(Error::invalid(
                "generate",
                format!(
                    "temperature must be a positive number and top-k at least 1, got {} and {:?}",
                    sampling.temperature, sampling.top_k
                ),
            ));
        }
        let device = self.transformer.wte.weight.device().clone();
        let mut ids = prompt.to_vec();
        no_grad(|| -> Result<()> {
            for step in 0..tokens {
                let window = &ids[ids.len().saturating_sub(self.config.block_size)..];
                let input = Tensor::from_vec(window.to_vec(), [1, window.len()], &device)?;
                let logits = self.forward(&input)?.narrow(1, window.len() - 1, 1)?;
                let logits = logits.to_dtype(DType::F32)?.to_vec::<f32>()?;
                ids.push(draw(&logits, sampling, uniform_at(sampling.seed, step as u64, 0)));
            }
            Ok(())
        })?;
        Ok(ids.split_off(prompt.len()))
    }
}

/// The token whose cumulative probability first passes `u` in [0, 1), over the `top_k` largest
/// logits (ties kept in id order) divided by the temperature.
fn draw(logits: &[f32], sampling: &Sampling, u: f64) -> u32 {
    let mut order: Vec<usize> = (0..logits.len()).collect();
    order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]).then(a.cmp(&b)));
    order.truncate(sampling.top_k.unwrap_or(order.len()).min(order.len()));
    let top = f64::from(logits[order[0]]);
    let weights: Vec<f64> = order
        .iter()
        .map(|&i| ((f64::from(logits[i]) - top) / sampling.temperature).exp())
        .collect();
    let mut left = u * weights.iter().sum::<f64>();
    for (&i, w) in order.iter().zip(&weights) {
        if left < *w {
            return i as u32;
        }
        left -= w;
    }
    order[order.len() - 1] as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn top_one_is_the_most_likely_token_whatever_the_draw() {
        let s = Sampling {
            top_k: Some(1),
            ..Sampling::default()
        };
        for u in [0.0, 0.5, 0.999] {
            assert_eq!(draw(&[0.1, 3.0, -1.0, 2.9], &s, u), 1);
        }
    }

    #[test]
    fn draws_follow_the_softmax_and_top_k_removes_the_rest() {
        let logits = [0f32, 2f32.ln(), f32::NEG_INFINITY];
        let s = Sampling::default();
        // Probabilities 1/3 and 2/3, likeliest first: u below 2/3 gives token 1, above token 0.
        assert_eq!(draw(&logits, &s, 0.65), 1);
        assert_eq!(draw(&logits, &s, 0.68), 0);
        let two = Sampling { top_k: Some(2), ..s };
        assert_ne!(draw(&[5.0, 4.0, 4.5], &two, 0.999), 1, "token 1 is outside the top 2");
    }
}
