//! A small transformer of your own, defined from the library's layers and trained on a text
//! file with the Trainer, then asked to continue a prompt:
//!
//! ```text
//! cargo run --release -p lockstep-core --example char_transformer -- [FILE] [STEPS]
//! ```
//!
//! FILE is any UTF-8 text (default: the repository's README.md); its characters are the tokens.
//! The example trains STEPS steps (default 150) and fails unless the validation loss falls to
//! 0.7x its start, which CI checks. The built-in `models::gpt` is the same idea at nanoGPT's
//! sizes and names; this shows what a model of your own takes.

use std::path::PathBuf;
use std::sync::Arc;

use lockstep_core::data::text::{CharVocab, char_text};
use lockstep_core::data::{DataLoader, DataLoaderConfig};
use lockstep_core::nn::{CausalSelfAttention, Embedding, LayerNorm, Linear, Module, ModuleExt};
use lockstep_core::optim::{Adam, AdamConfig, DecayScope};
use lockstep_core::train::{GradientClip, LanguageModeling, Trainer, TrainerConfig, TrainingSetup};
use lockstep_core::{Device, Generator, Result, Tensor};

const CONTEXT: usize = 32;
const WIDTH: usize = 64;
const HEADS: usize = 4;
const LAYERS: usize = 2;

/// Pre-norm attention, then a ReLU feed-forward, each added back to its input.
#[derive(Module)]
struct Layer {
    norm_1: LayerNorm,
    attn: CausalSelfAttention,
    norm_2: LayerNorm,
    widen: Linear,
    narrow: Linear,
}

impl Layer {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let x = x.add(&self.attn.forward(&self.norm_1.forward(x)?)?)?;
        let hidden = self.widen.forward(&self.norm_2.forward(&x)?)?.relu()?;
        x.add(&self.narrow.forward(&hidden)?)
    }
}

/// Token and position embeddings, the layers, a norm and a head to the vocabulary.
#[derive(Module)]
struct CharTransformer {
    tokens: Embedding,
    positions: Embedding,
    layers: Vec<Layer>,
    norm: LayerNorm,
    head: Linear,
}

impl CharTransformer {
    fn new(vocab: usize, device: &Device, g: &Generator) -> Result<CharTransformer> {
        let no_dropout = Arc::new(Generator::new(0));
        let layer = || -> Result<Layer> {
            Ok(Layer {
                norm_1: LayerNorm::new(WIDTH, device)?,
                attn: CausalSelfAttention::new(WIDTH, HEADS, 0.0, device, g, &no_dropout)?,
                norm_2: LayerNorm::new(WIDTH, device)?,
                widen: Linear::new(WIDTH, 4 * WIDTH, true, device, g)?,
                narrow: Linear::new(4 * WIDTH, WIDTH, true, device, g)?,
            })
        };
        Ok(CharTransformer {
            tokens: Embedding::new(vocab, WIDTH, device, g)?,
            positions: Embedding::new(CONTEXT, WIDTH, device, g)?,
            layers: (0..LAYERS).map(|_| layer()).collect::<Result<_>>()?,
            norm: LayerNorm::new(WIDTH, device)?,
            head: Linear::new(WIDTH, vocab, true, device, g)?,
        })
    }

    /// Token ids `[batch, t]` to next-token logits `[batch, t, vocab]`.
    fn forward(&self, ids: &Tensor) -> Result<Tensor> {
        let t = ids.dims()[1];
        let at = Tensor::arange(0, t as i64, lockstep_core::DType::U32, ids.device())?;
        let mut x = self.tokens.forward(ids)?.add(&self.positions.forward(&at)?)?;
        for layer in &self.layers {
            x = layer.forward(&x)?;
        }
        self.head.forward(&self.norm.forward(&x)?)
    }

    /// The most likely continuation of `prompt`, one character at a time.
    fn continue_greedily(&self, vocab: &CharVocab, prompt: &str, chars: usize) -> Result<String> {
        let mut ids = vocab.encode(prompt)?;
        for _ in 0..chars {
            let window = &ids[ids.len().saturating_sub(CONTEXT)..];
            let input = Tensor::from_vec(window.to_vec(), [1, window.len()], &Device::cpu())?;
            let next = self
                .forward(&input)?
                .narrow(1, window.len() - 1, 1)?
                .argmax(-1, false)?;
            ids.push(next.to_vec::<u32>()?[0]);
        }
        vocab.decode(&ids)
    }
}

fn main() -> std::result::Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let file = args.next().map_or_else(
        || PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md")),
        PathBuf::from,
    );
    let steps: u64 = args.next().map_or(Ok(150), |s| s.parse())?;

    let (vocab, train, val) = char_text(&file, CONTEXT)?;
    let config = DataLoaderConfig {
        batch_size: 32,
        ..Default::default()
    };
    let train = DataLoader::simple(Arc::new(train), true, 0, config.clone())?;
    let val = DataLoader::simple(Arc::new(val), false, 0, config)?;

    let model = CharTransformer::new(vocab.len(), &Device::cpu(), &Generator::new(0))?;
    let adamw = AdamConfig::adamw()
        .lr(3e-3)
        .weight_decay(0.1)
        .decay_scope(DecayScope::Weights);
    let optimizer = Adam::adamw(model.parameters(), adamw)?;
    let mut setup = TrainingSetup::new(model, optimizer)
        .task(LanguageModeling)
        .name("char-transformer");
    let mut trainer = Trainer::new(TrainerConfig {
        max_epochs: u64::MAX,
        max_steps: Some(steps),
        gradient_clip: Some(GradientClip::Norm(1.0)),
        ..Default::default()
    })?;
    let before = trainer.evaluate(&mut setup, &val)?.loss;
    trainer.fit(&mut setup, &train, None)?;
    let after = trainer.evaluate(&mut setup, &val)?.loss;
    println!(
        "{} characters of {}: validation loss {before:.3} -> {after:.3} in {steps} steps",
        vocab.len(),
        file.display()
    );
    let model = setup
        .model
        .as_any()
        .downcast_ref::<CharTransformer>()
        .ok_or("the setup holds the model it was given")?;
    let prompt = vocab.decode(&vocab.encode("cargo ").unwrap_or_default())?;
    if !prompt.is_empty() {
        println!("{:?}", model.continue_greedily(&vocab, &prompt, 60)?);
    }
    if after > 0.7 * before {
        return Err(format!("the validation loss fell only from {before:.3} to {after:.3}").into());
    }
    Ok(())
}
