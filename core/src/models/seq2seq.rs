//! The model-parallel example: a GRU encoder and a GRU decoder with teacher forcing, as two
//! layers of a `Sequential`, so `--place encoder=…,decoder=…` puts each on its own device.
//!
//! One tensor crosses between them: the encoder's final state beside the decoder's input tokens
//! (as f32, exact for small integers), `[batch, hidden + steps]`, so the pair also runs as a
//! pipeline on micro-batches. In training the decoder reads those tokens (teacher forcing); in
//! evaluation it decodes greedily from the start token, feeding back its own predictions.

use crate::data::reversal::{MAX_LEN, START, VOCAB};
use crate::device::Device;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::nn::{Embedding, Linear, Module, Recurrent, RecurrentConfig, RecurrentState, Sequential, gru};
use crate::rng::Generator;
use crate::tensor::Tensor;

pub const EMBEDDING: usize = 32;
/// The GRUs' width unless given.
pub const HIDDEN: usize = 128;

/// `[encoder, decoder]` for the digit-reversal task, GRUs of `hidden` features.
pub fn seq2seq(hidden: usize, device: &Device, generator: &Generator) -> Result<Sequential> {
    if hidden == 0 {
        return Err(Error::invalid("seq2seq", "the hidden width must be at least 1"));
    }
    let config = RecurrentConfig::new(EMBEDDING, hidden).batch_first(true);
    Ok(Sequential::new()
        .add(Encoder {
            embedding: Embedding::new(VOCAB, EMBEDDING, device, generator)?,
            gru: gru(config, device, generator)?,
        })
        .add(Decoder {
            embedding: Embedding::new(VOCAB, EMBEDDING, device, generator)?,
            gru: gru(config, device, generator)?,
            out: Linear::new(hidden, VOCAB, true, device, generator)?,
            training: true,
        }))
}

/// Reads `[batch, 2 * steps]` tokens (source, then the decoder's input); returns the final
/// state beside the decoder's input, `[batch, hidden + steps]`.
#[derive(Module)]
pub struct Encoder {
    /// Embedding of the source tokens: 12 ids (digits 0-9, padding, start) to 32 features.
    pub embedding: Embedding,
    /// Single-layer, batch-first GRU over the embedded source; its final state is what the encoder passes on.
    pub gru: Recurrent,
}

impl Encoder {
    /// Tokens `[batch, 40]` (20 source ids, then 20 decoder-input ids) to `[batch, hidden + 20]` f32: the GRU's
    /// final state beside the decoder input.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        if x.rank() != 2 || x.dims()[1] != 2 * MAX_LEN {
            return Err(Error::invalid(
                "seq2seq encoder",
                format!("expects [batch, {}] tokens, got {}", 2 * MAX_LEN, x.shape()),
            ));
        }
        let source = x.narrow(1, 0, MAX_LEN)?;
        let (_, state) = self.gru.forward_with_state(&self.embedding.forward(&source)?, None)?;
        let decoder_input = x.narrow(1, MAX_LEN, MAX_LEN)?.to_dtype(DType::F32)?;
        Tensor::concat(&[&state.h.squeeze(0)?, &decoder_input], 1)
    }
}

/// Reads the encoder's `[batch, hidden + steps]`; returns logits `[batch, steps, vocab]`.
#[derive(Module)]
pub struct Decoder {
    /// Embedding of the decoder's input tokens (its own table, not the encoder's).
    pub embedding: Embedding,
    /// Single-layer, batch-first GRU started from the encoder's final state.
    pub gru: Recurrent,
    /// Projection of each GRU output step, `hidden` to the 12 token logits.
    pub out: Linear,
    #[module(training)]
    training: bool,
}

impl Decoder {
    /// The encoder's `[batch, hidden + 20]` to logits `[batch, 20, 12]`: teacher-forced in training, greedy decoding
    /// from the start token in evaluation.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let hidden = self.hidden();
        if x.rank() != 2 || x.dims()[1] != hidden + MAX_LEN {
            return Err(Error::invalid(
                "seq2seq decoder",
                format!("expects the encoder's [batch, {}], got {}", hidden + MAX_LEN, x.shape()),
            ));
        }
        let h = x.narrow(1, 0, hidden)?.unsqueeze(0)?;
        if !self.training {
            return self.decode_greedily(h.contiguous()?);
        }
        let tokens = x.narrow(1, hidden, MAX_LEN)?.to_dtype(DType::U32)?;
        let state = RecurrentState { h, c: None };
        let (outputs, _) = self
            .gru
            .forward_with_state(&self.embedding.forward(&tokens)?, Some(&state))?;
        self.project(&outputs)
    }

    fn hidden(&self) -> usize {
        self.gru.config.hidden_size
    }

    /// Logits `[batch, steps, vocab]` of the GRU's outputs `[batch, steps, hidden]`.
    fn project(&self, outputs: &Tensor) -> Result<Tensor> {
        let (batch, steps) = (outputs.dims()[0], outputs.dims()[1]);
        let flat = outputs.contiguous()?.reshape([batch * steps, self.hidden()])?;
        self.out.forward(&flat)?.reshape([batch, steps, VOCAB])
    }

    /// Greedy decoding: each step's most likely token is the next step's input.
    fn decode_greedily(&self, h: Tensor) -> Result<Tensor> {
        let (batch, device) = (h.dims()[1], h.device().clone());
        let mut state = RecurrentState { h, c: None };
        let mut token = Tensor::full([batch, 1], f64::from(START), DType::U32, &device)?;
        let mut steps = Vec::with_capacity(MAX_LEN);
        for _ in 0..MAX_LEN {
            let (out, next) = self
                .gru
                .forward_with_state(&self.embedding.forward(&token)?, Some(&state))?;
            let logits = self.project(&out)?;
            token = logits.argmax(-1, false)?;
            steps.push(logits);
            state = next;
        }
        Tensor::concat(&steps.iter().collect::<Vec<_>>(), 1)
    }
}
