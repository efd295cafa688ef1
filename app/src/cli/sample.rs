//! `lockstep sample`: text from a language model that `lockstep train --dataset text` saved,
//! continuing a prompt token by token (nanoGPT's sample.py).

use std::collections::BTreeMap;

use anyhow::Context;
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
    let Some(chars) = hparams.get("vocab_chars") else {
        anyhow::bail!(
            "{what} was trained on token ids (train.bin), so there are no characters to decode; sample it with its tokenizer from the library"
        );
    };
    let vocab = CharVocab::from_chars(chars);
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
    let prompt = vocab
        .encode(&args.prompt)
        .with_context(|| format!("the prompt does not fit {what}'s vocabulary: {:?}", vocab.chars()))?;
    let sampling = Sampling {
        temperature: args.temperature,
        top_k: args.top_k,
        seed: args.seed,
    };
    let ids = net.generate(&prompt, args.tokens, &sampling)?;
    println!("{}{}", args.prompt, vocab.decode(&ids)?);
    Ok(())
}
