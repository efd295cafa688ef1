//! GPT weights files in the two layouts the built-in GPT reads: nanoGPT's, which is also
//! Lockstep's own (`transformer.h.0.attn.c_attn.weight` an nn.Linear weight `[out, in]`,
//! `lm_head.weight` tied to `transformer.wte.weight`), and Hugging Face transformers' GPT-2
//! (`GPT2Model` or `GPT2LMHeadModel`: the same names with or without `transformer.`, the four
//! projections Conv1D weights stored `[in, out]`, the tied head usually left out, causal-mask
//! buffers in files of older versions). [`GptLayout::of`] is the one place that tells them
//! apart; a transformers file is rewritten into nanoGPT's names and shapes and then loaded
//! through the ordinary strict path, which checks every name and shape.

use std::fmt;

use super::gpt::{Gpt, GptConfig};
use crate::data::HostTensor;
use crate::device::Device;
use crate::error::{Error, Result};
use crate::nn::{GeluApproximate, load_weights};
use crate::tensor::Tensor;
use crate::train::checkpoint::TensorFile;

/// The projections transformers stores as Conv1D, `[in, out]`: the transpose of nn.Linear's.
const CONV1D: [&str; 4] = [
    "attn.c_attn.weight",
    "attn.c_proj.weight",
    "mlp.c_fc.weight",
    "mlp.c_proj.weight",
];

/// What an error about these files is reported as.
const OP: &str = "load GPT-2 weights";

/// The sizes a GPT weights file shows: `n_layer` from its block names, `n_embd` and
/// `vocab_size` from `wte`, `block_size` from `wpe` (0 where the tensor is absent). The head
/// count is not among them (transformers keeps it in the checkpoint's config.json).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GptSizes {
    /// Transformer blocks.
    pub n_layer: usize,
    /// Width of the residual stream.
    pub n_embd: usize,
    /// Rows of the token embedding.
    pub vocab_size: usize,
    /// Rows of the position embedding: the longest context.
    pub block_size: usize,
}

impl From<&GptConfig> for GptSizes {
    fn from(c: &GptConfig) -> Self {
        GptSizes {
            n_layer: c.n_layer,
            n_embd: c.n_embd,
            vocab_size: c.vocab_size,
            block_size: c.block_size,
        }
    }
}

impl fmt::Display for GptSizes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "n_layer {}, n_embd {}, vocab_size {}, block_size {}",
            self.n_layer, self.n_embd, self.vocab_size, self.block_size
        )
    }
}

/// Which naming a GPT weights file uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GptLayout {
    /// nanoGPT's and Lockstep's own; also anything that is not transformers' (the strict load
    /// then says what does not fit).
    NanoGpt,
    /// Hugging Face transformers' GPT-2, with the sizes its tensors show.
    HuggingFace(GptSizes),
}

impl GptLayout {
    /// The layout of `file`: transformers' when a block's `attn.c_attn.weight` is stored
    /// Conv1D-style, `[n_embd, 3 n_embd]`, where nanoGPT's nn.Linear stores `[3 n_embd, n_embd]`.
    /// The shape decides, not the names: with the `transformer.` prefix both layouts name it alike.
    pub fn of(file: &TensorFile) -> GptLayout {
        let conv1d = file.tensors.iter().any(|(name, t)| {
            let dims = t.shape.dims();
            block_index(unprefixed(name)).is_some_and(|(_, rest)| rest == "attn.c_attn.weight")
                && dims.len() == 2
                && dims[1] == 3 * dims[0]
        });
        if !conv1d {
            return GptLayout::NanoGpt;
        }
        let rows_cols = |name: &str| {
            file.tensors
                .iter()
                .find(|(n, _)| unprefixed(n) == name)
                .map_or((0, 0), |(_, t)| match t.shape.dims() {
                    [rows, cols] => (*rows, *cols),
                    _ => (0, 0),
                })
        };
        let ((vocab_size, n_embd), (block_size, _)) = (rows_cols("wte.weight"), rows_cols("wpe.weight"));
        let n_layer = file
            .tensors
            .iter()
            .filter_map(|(name, _)| block_index(unprefixed(name)).map(|(i, _)| i + 1))
            .max()
            .unwrap_or(0);
        GptLayout::HuggingFace(GptSizes {
            n_layer,
            n_embd,
            vocab_size,
            block_size,
        })
    }
    /// The GELU the file's weights were trained with: transformers' GPT-2 uses the tanh
    /// approximation ("gelu_new"), nanoGPT the exact one.
    pub fn gelu(self) -> GeluApproximate {
        match self {
            GptLayout::NanoGpt => GeluApproximate::Exact,
            GptLayout::HuggingFace(_) => GeluApproximate::Tanh,
        }
    }
}

impl Gpt {
    /// Loads weights read from a file in either layout ([`GptLayout`]), strictly: every tensor
    /// of the model must be there with its shape, and nothing else (transformers' causal-mask
    /// buffers aside). A transformers GPT-2 needs a model built with its sizes and
    /// `GptConfig::gelu(GeluApproximate::Tanh)`; otherwise the error says what the file holds.
    pub fn load_pretrained(&self, file: &TensorFile) -> Result<()> {
        let GptLayout::HuggingFace(sizes) = GptLayout::of(file) else {
            return load_weights(self, file, true).map(|_| ());
        };
        if self.config.gelu != GeluApproximate::Tanh {
            return Err(Error::invalid(
                OP,
                "the file is a Hugging Face transformers GPT-2, trained with the tanh GELU (\"gelu_new\"): \
                 build the model with GptConfig::gelu(GeluApproximate::Tanh)",
            ));
        }
        let ours = GptSizes::from(&self.config);
        load_weights(self, &to_nanogpt(file)?, true).map(|_| ()).map_err(|e| {
            Error::invalid(
                OP,
                format!(
                    "{e}. The file is a Hugging Face transformers GPT-2 with {sizes}; the model has {ours}: \
                     build it with the file's sizes (and the n_head of its config.json)"
                ),
            )
        })
    }
}

/// A name without transformers' `transformer.` prefix (`GPT2LMHeadModel` has it, `GPT2Model` not).
fn unprefixed(name: &str) -> &str {
    name.strip_prefix("transformer.").unwrap_or(name)
}

/// `h.{i}.{rest}` as `(i, rest)`.
fn block_index(name: &str) -> Option<(usize, &str)> {
    let (index, rest) = name.strip_prefix("h.")?.split_once('.')?;
    Some((index.parse().ok()?, rest))
}

/// transformers' `file` in nanoGPT's names and shapes: Conv1D weights transposed, the
/// causal-mask buffers (`attn.bias`, `attn.masked_bias`) left out, and the head tied.
fn to_nanogpt(file: &TensorFile) -> Result<TensorFile> {
    let mut tensors = Vec::with_capacity(file.tensors.len() + 1);
    for (name, t) in &file.tensors {
        let short = unprefixed(name);
        let rest = block_index(short).map(|(_, rest)| rest);
        if matches!(rest, Some("attn.bias" | "attn.masked_bias")) {
            continue;
        }
        let t = if rest.is_some_and(|r| CONV1D.contains(&r)) {
            transposed(name, t)?
        } else {
            t.clone()
        };
        let ours = match short {
            "lm_head.weight" => short.to_string(),
            _ => format!("transformer.{short}"),
        };
        tensors.push((ours, t));
    }
    let find = |name: &str| tensors.iter().find(|(n, _)| n == name).map(|(_, t)| t.clone());
    match (find("lm_head.weight"), find("transformer.wte.weight")) {
        (Some(head), Some(wte)) if head != wte => {
            return Err(Error::invalid(
                OP,
                "the file's lm_head.weight differs from its wte.weight, but the built-in GPT ties its head \
                 to the token embedding: use a GPT-2 saved with tie_word_embeddings=True",
            ));
        }
        // GPT2LMHeadModel leaves the tied head out, GPT2Model has none: ours names it too.
        (None, Some(wte)) => tensors.push(("lm_head.weight".to_string(), wte)),
        _ => {}
    }
    tensors.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(TensorFile {
        tensors,
        metadata: file.metadata.clone(),
    })
}

/// A Conv1D weight `[in, out]` as nn.Linear's `[out, in]`, in its own dtype.
fn transposed(name: &str, t: &HostTensor) -> Result<HostTensor> {
    if t.shape.rank() != 2 {
        return Err(Error::invalid(
            OP,
            format!(
                "{name} should be a 2-D Conv1D weight [in, out], but its shape is {}",
                t.shape
            ),
        ));
    }
    let cpu = Device::cpu();
    let flipped = Tensor::from_host(t.data.clone(), t.shape.clone(), &cpu)?
        .t()?
        .contiguous()?;
    Ok(HostTensor {
        data: flipped.to_host()?,
        shape: flipped.shape().clone(),
    })
}
