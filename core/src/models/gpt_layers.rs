//! A GPT as a chain of layers, for pipeline stages: the embeddings, each block, the final
//! LayerNorm and the tied head, under nanoGPT's names. On one stage the head shares the token
//! embedding's tensor (one parameter, as in `Gpt`); split over stages, the head's stage gets a
//! copy of its own and the pipeline keeps the two equal (`nn::TiedWeight`).

use super::gpt::{Gpt, embed, head_logits};
use crate::error::Result;
use crate::nn::{Dropout, Embedding, Module, Sequential, remap};
use crate::tensor::Tensor;

/// The first layer: token ids `[batch, t]` to `drop(wte(ids) + wpe(positions))`; its
/// parameters are `transformer.wte.weight` and `transformer.wpe.weight`.
#[derive(Module)]
pub struct GptEmbedding {
    /// Token embedding `[vocab_size, n_embd]`, which the head reuses.
    pub wte: Embedding,
    /// Learned position embedding `[block_size, n_embd]`.
    pub wpe: Embedding,
    /// Dropout on the sum of the two embeddings.
    pub drop: Dropout,
}

impl GptEmbedding {
    /// Token ids `[batch, t]` (`1 <= t <= block_size`) to states `[batch, t, n_embd]`.
    pub fn forward(&self, ids: &Tensor) -> Result<Tensor> {
        embed(&self.wte, &self.wpe, &self.drop, ids)
    }
}

/// The last layer: logits `[batch, t, vocab_size]` = states · `weight`ᵀ, `weight` being the
/// token embedding (`lm_head.weight` in the state dict).
pub struct GptHead {
    /// The token embedding's tensor itself, or this stage's copy of it.
    pub weight: Tensor,
}

impl Module for GptHead {
    fn forward(&self, states: &Tensor) -> Result<Tensor> {
        head_logits(states, &self.weight)
    }
    /// Visited as `lm_head.weight`; where it is the embedding's own tensor, `named_parameters`
    /// keeps the embedding's name alone, so optimizers see the weight once.
    fn visit_parameters(&self, prefix: &str, f: &mut dyn FnMut(String, &Tensor)) {
        f(format!("{prefix}weight"), &self.weight)
    }
    fn map_tensors(&mut self, f: &mut dyn FnMut(&Tensor) -> Result<Tensor>) -> Result<()> {
        remap(&mut self.weight, f)
    }
    fn describe(&self) -> String {
        let d = self.weight.dims();
        format!("Linear(in_features={}, out_features={}, bias=False)", d[1], d[0])
    }
}

impl Gpt {
    /// The same model (the same tensors) as a chain of layers named as nanoGPT names them:
    /// `transformer` (the embeddings), `transformer.h.<i>`, `transformer.ln_f`, `lm_head`, the
    /// head sharing the token embedding. Its forward is this model's.
    pub fn into_sequential(self) -> Sequential {
        let t = self.transformer;
        let head = GptHead {
            weight: t.wte.weight.clone(),
        };
        let embedding = GptEmbedding {
            wte: t.wte,
            wpe: t.wpe,
            drop: t.drop,
        };
        let mut model = Sequential::new().add_named("transformer", embedding);
        for (i, block) in t.h.into_iter().enumerate() {
            model = model.add_named(format!("transformer.h.{i}"), block);
        }
        model.add_named("transformer.ln_f", t.ln_f).add_named("lm_head", head)
    }
}
