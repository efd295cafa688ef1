//! `lockstep sample`: text from a language model that `lockstep train --dataset text` saved,
//! continuing a prompt token by token (nanoGPT's sample.py), in the characters or GPT-2 tokens
//! it was trained on.

use std::collections::BTreeMap;

use anyhow::Context;
use lockstep_core::data::gpt2::{self, Gpt2Tokenizer};
use lockstep_core::data::text::CharVocab;
use lockstep_core::models::{GptConfig, Sampling, gpt};
use lockstep_core::nn::{GeluApproximate, ModuleExt};
use lockstep_core::train::checkpoint;
use lockstep_core::{Device, Generator};
pub use lockstep_flags::sample::Args;

/// A size the checkpoint's hyperparameters must hold.
fn size(hparams: &BTreeMap<String, String>, key: &str, what: &str) -> anyhow::Result<usize> {
    hparams
        .get(key)
        .and_then(|v| v.parse().ok())
        .with_context(|| format!("{what} has no readable `{key}` among its hyperparameters"))
}

/// What a checkpoint's token ids stand for.
enum Vocabulary {
    Chars(CharVocab),
    Gpt2(Gpt2Tokenizer),
}

impl Vocabulary {
    /// The vocabulary `lockstep train` recorded in the hyperparameters of `what`.
    fn of(hparams: &BTreeMap<String, String>, what: &str) -> anyhow::Result<Vocabulary> {
        match (hparams.get("tokenizer").map(String::as_str), hparams.get("vocab_chars")) {
            (Some(gpt2::NAME), _) => Ok(Vocabulary::Gpt2(Gpt2Tokenizer::new())),
            (Some(other), _) => anyhow::bail!(
                "{what} was trained with tokenizer {other:?}, which this lockstep does not know (it knows {}): sample it with the lockstep that trained it",
                gpt2::NAME
            ),
            (None, Some(chars)) => Ok(Vocabulary::Chars(CharVocab::from_chars(chars))),
            (None, None) => anyhow::bail!(
                "{what} was trained on token ids (train.bin) of a tokenizer it does not name, so there is nothing to decode them with; \
                 train with --tokenizer gpt2 if they are GPT-2's, or sample it with its tokenizer from the library"
            ),
        }
    }
    fn encode(&self, prompt: &str, what: &str) -> anyhow::Result<Vec<u32>> {
        match self {
            Vocabulary::Chars(vocab) => vocab
                .encode(prompt)
                .with_context(|| format!("the prompt does not fit {what}'s vocabulary: {:?}", vocab.chars())),
            Vocabulary::Gpt2(gpt2) => gpt2.encode(prompt).context("cannot encode the prompt"),
        }
    }
    fn decode(&self, ids: &[u32]) -> anyhow::Result<String> {
        Ok(match self {
            Vocabulary::Chars(vocab) => vocab.decode(ids)?,
            Vocabulary::Gpt2(gpt2) => gpt2.decode(ids)?,
        })
    }
}

/// The checkpoint's GELU; exact when it names none (checkpoints from before transformers' GPT-2).
fn gelu(hparams: &BTreeMap<String, String>, what: &str) -> anyhow::Result<GeluApproximate> {
    let Some(name) = hparams.get("gelu") else {
        return Ok(GeluApproximate::Exact);
    };
    GeluApproximate::from_name(name).with_context(|| {
        format!("{what} names gelu `{name}`, neither exact nor tanh: it was written by a newer Lockstep")
    })
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let what = args.checkpoint.display().to_string();
    let hparams = checkpoint::hparams(&args.checkpoint).with_context(|| format!("cannot sample from {what}"))?;
    let model = hparams.get("model").map_or("an unnamed model", String::as_str);
    let Some(preset) = GptConfig::named(model) else {
        anyhow::bail!(
            "{what} holds {model}, not a language model: sample from a checkpoint of --model {}",
            lockstep_core::models::gpt::NAMES.join(", ")
        );
    };
    let vocab = Vocabulary::of(&hparams, &what)?;
    let config = preset
        .vocab_size(size(&hparams, "vocab_size", &what)?)
        .block_size(size(&hparams, "block_size", &what)?)
        .layers(
            size(&hparams, "n_layer", &what)?,
            size(&hparams, "n_head", &what)?,
            size(&hparams, "n_embd", &what)?,
        )
        .gelu(gelu(&hparams, &what)?);
    let device = match args.device.as_str() {
        "auto" => lockstep_core::device::best_available()?,
        name => Device::parse(name)?,
    };
    let mut net = gpt(config, &device, &Generator::new(0))?;
    net.load(&args.checkpoint)
        .with_context(|| format!("cannot load the weights of {what}"))?;
    net.eval();
    let prompt = vocab.encode(&args.prompt, &what)?;
    let sampling = Sampling {
        temperature: args.temperature,
        top_k: args.top_k,
        seed: args.seed,
    };
    let ids = net.generate(&prompt, args.tokens, &sampling)?;
    println!("{}{}", args.prompt, vocab.decode(&ids)?);
    Ok(())
}
