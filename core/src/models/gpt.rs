//! A GPT as nanoGPT builds it: token and position embeddings, pre-norm blocks of causal
//! self-attention and a GELU MLP, a final LayerNorm, and an output head tied to the token
//! embedding. Parameter names are nanoGPT's (`transformer.wte.weight`, `transformer.h.0.ln_1.weight`,
//! `transformer.h.0.attn.c_attn.weight`, …, `lm_head.weight`), so state dicts move both ways,
//! and so is its initialisation: normal(0, 0.02), residual projections 0.02/sqrt(2·n_layer).
//! `Gpt::load_pretrained` (gpt_weights.rs) also reads Hugging Face transformers' GPT-2 files,
//! which need `GptConfig::gelu(GeluApproximate::Tanh)`.

use std::sync::Arc;

use crate::backend::UnaryOp;
use crate::device::Device;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::nn::{
    CausalSelfAttention, Checkpointed, Dropout, Embedding, GeluApproximate, LayerNorm, Linear, Module, describe_tree,
    remap,
};
use crate::rng::Generator;
use crate::tensor::Tensor;

/// A GPT's shape. `named` gives nanoGPT's sizes; the vocabulary comes from the data.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct GptConfig {
    /// Distinct token ids: the rows of `wte` and the width of the logits (50304 in the `named` sizes).
    pub vocab_size: usize,
    /// The longest context (positions the model has embeddings for).
    pub block_size: usize,
    /// Number of transformer blocks.
    pub n_layer: usize,
    /// Attention heads per block; must divide `n_embd`.
    pub n_head: usize,
    /// Width of the residual stream (the embedding size); each MLP is 4x wider.
    pub n_embd: usize,
    /// Probability of every dropout layer (embeddings, attention weights, residual outputs); 0 disables them.
    pub dropout: f64,
    /// Whether each transformer block is checkpointed ([`crate::nn::checkpoint()`]): its
    /// activations recomputed in backward instead of kept.
    #[serde(default)]
    pub activation_checkpointing: bool,
    /// The MLP's GELU: exact as nanoGPT's (the default), or tanh-approximated as transformers'
    /// GPT-2, whose weights need it.
    #[serde(default)]
    pub gelu: GeluApproximate,
}

/// The names `GptConfig::named` knows.
pub const NAMES: [&str; 3] = ["gpt-tiny", "gpt-char", "gpt2"];

impl GptConfig {
    /// `gpt-tiny` (2 layers, 2 heads, 128 wide, block 64), `gpt-char` (nanoGPT's
    /// shakespeare-char: 6/6/384, block 256, dropout 0.2) and `gpt2` (124M: 12/12/768, block
    /// 1024, vocabulary 50304, GPT-2's 50257 padded to a multiple of 64).
    pub fn named(name: &str) -> Option<GptConfig> {
        let (n_layer, n_head, n_embd, block_size, dropout) = match name {
            "gpt-tiny" => (2, 2, 128, 64, 0.0),
            "gpt-char" => (6, 6, 384, 256, 0.2),
            "gpt2" => (12, 12, 768, 1024, 0.0),
            _ => return None,
        };
        Some(GptConfig {
            vocab_size: 50304,
            block_size,
            n_layer,
            n_head,
            n_embd,
            dropout,
            activation_checkpointing: false,
            gelu: GeluApproximate::Exact,
        })
    }
    /// Sets the vocabulary size, usually the data set's.
    pub fn vocab_size(self, vocab_size: usize) -> Self {
        GptConfig { vocab_size, ..self }
    }
    /// Sets the longest context, which is the number of position embeddings.
    pub fn block_size(self, block_size: usize) -> Self {
        GptConfig { block_size, ..self }
    }
    /// Sets the depth `n_layer`, the heads `n_head` and the width `n_embd` (a multiple of `n_head`).
    pub fn layers(self, n_layer: usize, n_head: usize, n_embd: usize) -> Self {
        GptConfig {
            n_layer,
            n_head,
            n_embd,
            ..self
        }
    }
    /// Sets the probability of every dropout layer.
    pub fn dropout(self, dropout: f64) -> Self {
        GptConfig { dropout, ..self }
    }
    /// Checkpoints every transformer block (or none).
    pub fn activation_checkpointing(self, activation_checkpointing: bool) -> Self {
        GptConfig {
            activation_checkpointing,
            ..self
        }
    }

    /// Sets the MLP's GELU (`Tanh` for transformers' GPT-2 weights).
    pub fn gelu(self, gelu: GeluApproximate) -> Self {
        GptConfig { gelu, ..self }
    }

    fn check(&self) -> Result<()> {
        let sizes = [self.vocab_size, self.block_size, self.n_layer, self.n_head, self.n_embd];
        if sizes.contains(&0) || !self.n_embd.is_multiple_of(self.n_head) {
            return Err(Error::invalid(
                "gpt",
                format!("sizes must be at least 1 and n_embd a multiple of n_head, got {self:?}"),
            ));
        }
        Ok(())
    }
}

/// The feed-forward half of a block: widen 4x, GELU, project back.
#[derive(Module, Clone)]
pub struct Mlp {
    /// Widening projection, `n_embd` to `4 * n_embd`, with the GELU fused into its output.
    pub c_fc: Linear,
    /// Projection back, `4 * n_embd` to `n_embd`, initialised with the residual std `0.02/sqrt(2·n_layer)`.
    pub c_proj: Linear,
    /// Dropout on the MLP's output.
    pub dropout: Dropout,
    /// Which GELU follows `c_fc`.
    #[module(skip)]
    pub gelu: GeluApproximate,
}

impl Mlp {
    /// `[batch, t, n_embd]` to the same shape.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let hidden = match self.gelu {
            GeluApproximate::Exact => self.c_fc.forward_act(x, Some(UnaryOp::Gelu))?,
            GeluApproximate::Tanh => self.c_fc.forward(x)?.gelu_tanh()?,
        };
        self.dropout.forward(&self.c_proj.forward(&hidden)?)
    }
}

/// One pre-norm transformer block: `x + attn(ln_1(x))`, then `x + mlp(ln_2(x))`.
#[derive(Module, Clone)]
pub struct Block {
    /// LayerNorm applied before attention.
    pub ln_1: LayerNorm,
    /// Causal self-attention on `ln_1`'s output, added back to the residual stream.
    pub attn: CausalSelfAttention,
    /// LayerNorm applied before the MLP.
    pub ln_2: LayerNorm,
    /// Feed-forward network on `ln_2`'s output, added back to the residual stream.
    pub mlp: Mlp,
}

impl Block {
    /// `[batch, t, n_embd]` to the same shape, both residual additions included.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let (residual, branch) = self.forward_unsummed(x, &self.ln_1.forward_for_product(x)?)?;
        residual.add(&branch)
    }

    /// The block on `x`, given `ln_1`'s output on it, its last residual add left to the caller:
    /// `(residual, branch)`, whose sum is `forward(x)`, so that the next LayerNorm takes the add
    /// in its own pass (`LayerNorm::add_forward_for_product`).
    fn forward_unsummed(&self, x: &Tensor, normed: &Tensor) -> Result<(Tensor, Tensor)> {
        let attended = self.attn.forward(normed)?;
        let (x, normed) = self.ln_2.add_forward_for_product(x, &attended)?;
        Ok((x, self.mlp.forward(&normed)?))
    }
}

/// Everything but the head: token ids `[batch, t]` to normalised states `[batch, t, n_embd]`.
#[derive(Module)]
pub struct Transformer {
    /// Token embedding `[vocab_size, n_embd]`, also the output head's weight (tied).
    pub wte: Embedding,
    /// Learned position embedding `[block_size, n_embd]`.
    pub wpe: Embedding,
    /// Dropout on the sum of token and position embeddings.
    pub drop: Dropout,
    /// The `n_layer` blocks in order (`transformer.h.0`, `transformer.h.1`, …), each checkpointed
    /// when the config says so.
    pub h: Vec<Checkpointed<Block>>,
    /// Final LayerNorm before the head.
    pub ln_f: LayerNorm,
}

impl Transformer {
    /// Token ids `[batch, t]` (`1 <= t <= block_size`) to normalised states `[batch, t, n_embd]`,
    /// the head's input: under autocast already in the region's dtype.
    pub fn forward(&self, ids: &Tensor) -> Result<Tensor> {
        let mut x = embed(&self.wte, &self.wpe, &self.drop, ids)?;
        let Some(first) = self.h.first().filter(|_| !self.h.iter().any(|b| b.enabled)) else {
            // Checkpointed blocks are recomputed from their input alone: each ends in its add.
            for block in &self.h {
                x = Module::forward(block, &x)?;
            }
            return self.ln_f.forward_for_product(&x);
        };
        // Each block's last residual add is taken by the LayerNorm after it (the next block's
        // `ln_1`, or `ln_f`) in its own pass: the same bits as `Block::forward` in turn.
        let mut normed = first.inner.ln_1.forward_for_product(&x)?;
        for (i, block) in self.h.iter().enumerate() {
            let (residual, branch) = block.inner.forward_unsummed(&x, &normed)?;
            let next = self.h.get(i + 1).map_or(&self.ln_f, |b| &b.inner.ln_1);
            (x, normed) = next.add_forward_for_product(&residual, &branch)?;
        }
        Ok(normed)
    }
}

/// Token ids `[batch, t]` (`1 <= t <= block_size`) to `drop(wte(ids) + wpe(positions))`, the
/// input of the first block.
pub(super) fn embed(wte: &Embedding, wpe: &Embedding, drop: &Dropout, ids: &Tensor) -> Result<Tensor> {
    let (t, block_size) = (ids.dims().last().copied().unwrap_or(0), wpe.weight.dims()[0]);
    if ids.rank() != 2 || t == 0 || t > block_size {
        return Err(Error::invalid(
            "gpt",
            format!(
                "expects token ids [batch, t] with 1 <= t <= block_size {block_size}, got shape {}",
                ids.shape()
            ),
        ));
    }
    let positions = Tensor::arange(0, t as i64, DType::U32, ids.device())?;
    drop.forward(&wte.forward(ids)?.add(&wpe.forward(&positions)?)?)
}

/// The tied head: states `[batch, t, n_embd]` times the token embedding `weight`ᵀ, logits
/// `[batch, t, vocab_size]`.
pub(super) fn head_logits(states: &Tensor, weight: &Tensor) -> Result<Tensor> {
    // Cast before the transpose, as Linear does: once per autocast region, contiguously.
    let head = crate::autocast::lower(weight)?;
    states.matmul(&head.t()?)
}

/// The model: the transformer and a bias-free head that shares `transformer.wte.weight`.
pub struct Gpt {
    /// Embeddings, blocks and final LayerNorm, under `transformer.` in the state dict.
    pub transformer: Transformer,
    /// The sizes the model was built with.
    pub config: GptConfig,
}

impl Gpt {
    /// Logits `[batch, t, vocab_size]` for token ids `[batch, t]`.
    pub fn forward(&self, ids: &Tensor) -> Result<Tensor> {
        head_logits(&self.transformer.forward(ids)?, &self.transformer.wte.weight)
    }
}

impl Module for Gpt {
    fn forward(&self, ids: &Tensor) -> Result<Tensor> {
        Gpt::forward(self, ids)
    }
    /// The tied head is the token embedding: visited once, so optimizers step it once.
    fn visit_parameters(&self, prefix: &str, f: &mut dyn FnMut(String, &Tensor)) {
        self.transformer.visit_parameters(&format!("{prefix}transformer."), f)
    }
    /// nanoGPT's state dict names the tied weight twice; so does ours, so it loads either way.
    fn visit_state(&self, prefix: &str, f: &mut dyn FnMut(String, &Tensor)) {
        self.transformer.visit_state(&format!("{prefix}transformer."), f);
        f(format!("{prefix}lm_head.weight"), &self.transformer.wte.weight);
    }
    fn map_tensors(&mut self, f: &mut dyn FnMut(&Tensor) -> Result<Tensor>) -> Result<()> {
        self.transformer.map_tensors(f)
    }
    fn set_training(&mut self, training: bool) {
        self.transformer.set_training(training)
    }
    fn visit_generators(&self, f: &mut dyn FnMut(&Arc<Generator>)) {
        self.transformer.visit_generators(f)
    }
    fn describe(&self) -> String {
        let c = &self.config;
        let head = format!(
            "Linear(in_features={}, out_features={}, bias=False)",
            c.n_embd, c.vocab_size
        );
        describe_tree(
            "GPT",
            &[
                ("transformer".into(), self.transformer.describe()),
                ("lm_head".into(), head),
            ],
        )
    }
}

/// normal(0, std) in place of a parameter's initial value.
fn normal(t: &mut Tensor, std: f64, generator: &Generator, device: &Device) -> Result<()> {
    remap(t, &mut |old| {
        Ok(Tensor::rand_normal(old.dims().to_vec(), 0.0, std, DType::F32, generator, device)?.requires_grad(true))
    })
}

/// A linear layer initialised as nanoGPT does: weight normal(0, std), bias zero.
fn linear(inputs: usize, outputs: usize, std: f64, device: &Device, generator: &Generator) -> Result<Linear> {
    let mut layer = Linear::new(inputs, outputs, true, device, generator)?;
    normal(&mut layer.weight, std, generator, device)?;
    layer.bias = Some(Tensor::zeros([outputs], DType::F32, device)?.requires_grad(true));
    Ok(layer)
}

/// Builds the GPT `config` describes; dropout layers share one stream seeded from `generator`.
pub fn gpt(config: GptConfig, device: &Device, generator: &Generator) -> Result<Gpt> {
    config.check()?;
    const STD: f64 = 0.02;
    let residual_std = STD / (2.0 * config.n_layer as f64).sqrt();
    let stream = Arc::new(Generator::new(generator.seed() ^ 0x6770_745f_6472_6f70));
    let (c, p) = (config.n_embd, config.dropout);
    let embedding = |rows: usize| -> Result<Embedding> {
        let mut e = Embedding::new(rows, c, device, generator)?;
        normal(&mut e.weight, STD, generator, device)?;
        Ok(e)
    };
    let (wte, wpe) = (embedding(config.vocab_size)?, embedding(config.block_size)?);
    let h = (0..config.n_layer)
        .map(|_| -> Result<Checkpointed<Block>> {
            let mut attn = CausalSelfAttention::new(c, config.n_head, p, device, generator, &stream)?;
            attn.c_attn = linear(c, 3 * c, STD, device, generator)?;
            attn.c_proj = linear(c, c, residual_std, device, generator)?;
            let block = Block {
                ln_1: LayerNorm::new(c, device)?,
                attn,
                ln_2: LayerNorm::new(c, device)?,
                mlp: Mlp {
                    c_fc: linear(c, 4 * c, STD, device, generator)?,
                    c_proj: linear(4 * c, c, residual_std, device, generator)?,
                    dropout: Dropout::new(p, stream.clone())?,
                    gelu: config.gelu,
                },
            };
            Ok(Checkpointed::new(block, config.activation_checkpointing))
        })
        .collect::<Result<_>>()?;
    Ok(Gpt {
        transformer: Transformer {
            wte,
            wpe,
            drop: Dropout::new(p, stream.clone())?,
            h,
            ln_f: LayerNorm::new(c, device)?,
        },
        config,
    })
}
