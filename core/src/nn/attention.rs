//! Causal multi-head self-attention as GPT-2 and nanoGPT build it: one projection to queries,
//! keys and values (`c_attn`), heads of `n_embd / n_head`, the causal scaled dot-product, and
//! the output projection (`c_proj`), with dropout on the attention weights and on the output.

use std::sync::Arc;

use super::{Dropout, Linear, Module};
use crate::device::Device;
use crate::error::{Error, Result};
use crate::rng::Generator;
use crate::tensor::Tensor;

/// Causal multi-head self-attention as GPT-2 and nanoGPT build it: `[batch, t, n_embd]` in and out.
/// A clone shares the parameters and the dropout stream.
#[derive(Module, Clone)]
pub struct CausalSelfAttention {
    /// Joint query/key/value projection, `n_embd` to `3 * n_embd` (q, k, v concatenated on the last axis).
    pub c_attn: Linear,
    /// Output projection, `n_embd` to `n_embd`.
    pub c_proj: Linear,
    /// Dropout on the attention weights; its `p` and stream are passed to `Tensor::causal_attention`.
    pub attn_dropout: Dropout,
    /// Dropout on the output of `c_proj`.
    pub resid_dropout: Dropout,
    /// Number of heads; each attends over `n_embd / n_head` channels.
    #[module(skip)]
    pub n_head: usize,
}

impl CausalSelfAttention {
    /// Width `n_embd` in `n_head` heads (`n_embd` a multiple of `n_head`), projections with
    /// biases, PyTorch's default initialisation; `dropout` draws from `generator`.
    pub fn new(
        n_embd: usize,
        n_head: usize,
        dropout: f64,
        device: &Device,
        generator: &Generator,
        dropout_stream: &Arc<Generator>,
    ) -> Result<CausalSelfAttention> {
        if n_head == 0 || !n_embd.is_multiple_of(n_head) {
            return Err(Error::invalid(
                "CausalSelfAttention",
                format!("the width {n_embd} must split into {n_head} equal heads"),
            ));
        }
        Ok(CausalSelfAttention {
            c_attn: Linear::new(n_embd, 3 * n_embd, true, device, generator)?,
            c_proj: Linear::new(n_embd, n_embd, true, device, generator)?,
            attn_dropout: Dropout::new(dropout, dropout_stream.clone())?,
            resid_dropout: Dropout::new(dropout, dropout_stream.clone())?,
            n_head,
        })
    }

    /// `[batch, t, n_embd]` to `[batch, t, n_embd]`.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let &[batch, t, width] = x.dims() else {
            return Err(Error::invalid(
                "CausalSelfAttention",
                format!("expects [batch, tokens, width], got shape {}", x.shape()),
            ));
        };
        let (heads, head_dim) = (self.n_head, width / self.n_head);
        let qkv = self.c_attn.forward(x)?.reshape([batch, t, 3, heads, head_dim])?;
        let drop = &self.attn_dropout;
        let dropout = (drop.is_training() && drop.p() > 0.0).then(|| (drop.p(), drop.generator().as_ref()));
        let y = qkv.causal_self_attention(dropout)?.reshape([batch, t, width])?;
        self.resid_dropout.forward(&self.c_proj.forward(&y)?)
    }
}
