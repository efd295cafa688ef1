//! Builds the model, optimizer and task that `lockstep train` asks for.

use std::collections::BTreeMap;

use anyhow::Context;
use lockstep_core::data::{gpt2, reversal};
use lockstep_core::models::{Gpt, GptConfig, GptLayout};
use lockstep_core::nn::{Module, ModuleExt, Sequential};
use lockstep_core::optim::{
    Adam, AdamConfig, CosineAnnealingLR, LinearLR, LrSchedule as Schedule, LrScheduler, Optimizer, SequentialLR, Sgd,
    SgdConfig,
};
use lockstep_core::train::checkpoint::{TensorFile, load_tensors};
use lockstep_core::train::{Classification, LanguageModeling, Seq2SeqTask, Task, TrainingSetup};
use lockstep_core::{Device, Generator, models};
use std::path::Path;

use super::data::{TextVocabulary, text_vocabulary};
use lockstep_flags::train::{Args, LrSchedule, OptimizerKind};

/// The devices of the run: `--devices a,b,…` (one replica each), else `--device`.
pub fn devices(args: &Args) -> anyhow::Result<Vec<Device>> {
    if !args.devices.is_empty() {
        return args.devices.iter().map(|d| Ok(Device::parse(d)?)).collect();
    }
    Ok(vec![match args.device.as_str() {
        "auto" => lockstep_core::device::best_available()?,
        name => Device::parse(name)?,
    }])
}

/// Model (same seed on every replica, so all start identical), optimizer and task on `device`.
/// A GPT reads its text's vocabulary once here, for its size and for the checkpoint's hparams.
pub fn build(args: &Args, device: Device) -> anyhow::Result<TrainingSetup> {
    let Some(preset) = GptConfig::named(&args.model) else {
        let model = build_sequential(args, &device)?;
        return build_with(args, Box::new(model), device);
    };
    let (model, hparams) = build_gpt(args, preset, &device)?;
    let mut setup = build_with(args, Box::new(model), device)?;
    setup.hparams.extend(hparams);
    Ok(setup)
}

/// The GPT recipe `preset` sized by the flags and its text's vocabulary, started from
/// --init-weights when given (transformers' GPT-2 brings its tanh GELU along), with what a
/// checkpoint records of it for `lockstep sample`.
fn build_gpt(args: &Args, preset: GptConfig, device: &Device) -> anyhow::Result<(Gpt, Vec<(String, String)>)> {
    let (config, vocab, init) = gpt_recipe(args, preset)?;
    let model = models::gpt(config, device, &Generator::new(args.seed))?;
    if let Some((path, file)) = &init {
        model.load_pretrained(file).with_context(|| {
            let hint = flags_for(GptLayout::of(file));
            format!(
                "--init-weights {} does not fit model {}{hint}",
                path.display(),
                args.model
            )
        })?;
    }
    Ok((model, gpt_hparams(&config, &vocab)))
}

/// The GPT's sizes, its vocabulary and the --init-weights file read whole (its layout is told
/// from its names and shapes).
fn gpt_recipe(
    args: &Args,
    preset: GptConfig,
) -> anyhow::Result<(GptConfig, TextVocabulary, Option<(&Path, TensorFile)>)> {
    let vocab = text_vocabulary(args)?;
    let init = args.init_weights.as_deref().map(read_init_weights).transpose()?;
    let layout = init
        .as_ref()
        .map_or(GptLayout::NanoGpt, |(_, file)| GptLayout::of(file));
    let config = gpt_config(args, preset, vocab.size()).gelu(layout.gelu());
    Ok((config, vocab, init))
}

/// What a checkpoint records of the model besides the run's settings: a GPT's sizes, GELU and
/// vocabulary (nothing for the other models).
pub fn model_hparams(args: &Args) -> anyhow::Result<Vec<(String, String)>> {
    match GptConfig::named(&args.model) {
        Some(preset) => {
            let (config, vocab, _) = gpt_recipe(args, preset)?;
            Ok(gpt_hparams(&config, &vocab))
        }
        None => Ok(Vec::new()),
    }
}

/// The --init-weights file, read whole.
fn read_init_weights(path: &Path) -> anyhow::Result<(&Path, TensorFile)> {
    let file = load_tensors(path).with_context(|| format!("cannot read --init-weights {}", path.display()))?;
    Ok((path, file))
}

/// For a transformers GPT-2 file: the flags that size the model as the file is.
fn flags_for(layout: GptLayout) -> String {
    match layout {
        GptLayout::NanoGpt => String::new(),
        GptLayout::HuggingFace(s) => format!(
            " (train it with --n-layer {} --n-embd {} --block-size {} --vocab-size {} and the --n-head of its config.json)",
            s.n_layer, s.n_embd, s.block_size, s.vocab_size
        ),
    }
}

/// The GPT `preset`, sized by the flags and a vocabulary of `vocab_size`.
pub fn gpt_config(args: &Args, preset: GptConfig, vocab_size: usize) -> GptConfig {
    preset
        .vocab_size(vocab_size)
        .block_size(args.block_size.unwrap_or(preset.block_size))
        .layers(
            args.n_layer.unwrap_or(preset.n_layer),
            args.n_head.unwrap_or(preset.n_head),
            args.n_embd.unwrap_or(preset.n_embd),
        )
        .dropout(args.dropout.unwrap_or(preset.dropout))
        .activation_checkpointing(args.activation_checkpointing)
}

/// The model as a chain of layers, for the pipeline's stages; a GPT's head shares its token
/// embedding until the stages are cut (`nn::TiedWeight`).
pub fn build_sequential(args: &Args, device: &Device) -> anyhow::Result<Sequential> {
    if let Some(preset) = GptConfig::named(&args.model) {
        return Ok(build_gpt(args, preset, device)?.0.into_sequential());
    }
    let init = Generator::new(args.seed);
    let input = super::data::input(args)?;
    let model = models::build_checkpointed(
        &args.model,
        &args.hidden,
        input,
        args.activation_checkpointing,
        device,
        &init,
    )?;
    load_init_weights(args, &model)?;
    Ok(model)
}

fn load_init_weights(args: &Args, model: &impl Module) -> anyhow::Result<()> {
    if let Some(path) = &args.init_weights {
        // A weights file (ours or PyTorch's) or a whole checkpoint, whose optimizer part stays out.
        model
            .load(path)
            .with_context(|| format!("--init-weights {} does not fit model {}", path.display(), args.model))?;
    }
    Ok(())
}

/// The `--lr-schedule` over the run's optimizer steps (`batches` per epoch); None when constant.
pub fn scheduler(args: &Args, batches: usize, optimizer: &mut dyn Optimizer) -> anyhow::Result<Option<LrScheduler>> {
    match args.lr_schedule() {
        LrSchedule::Constant => Ok(None),
        LrSchedule::Cosine => {
            let per_epoch = args.limit_train_batches.map_or(batches, |l| l.min(batches));
            let epoch_steps = (per_epoch.div_ceil(args.accumulate) as u64).saturating_mul(args.epochs);
            let steps = args.max_steps.unwrap_or(epoch_steps).max(1);
            let warmup = args.warmup_steps(steps).min(steps - 1);
            // nanoGPT decays to a tenth of the peak rate; the ResNet recipe to 0.
            let floor = if args.gpt_recipe() { args.lr() / 10.0 } else { 0.0 };
            let cosine = CosineAnnealingLR::new((steps - warmup).max(1), floor)?;
            let schedule: Box<dyn Schedule> = if warmup == 0 {
                Box::new(cosine)
            } else {
                let ramp = LinearLR::new(1.0 / warmup as f64, 1.0, warmup)?;
                Box::new(SequentialLR::new(vec![Box::new(ramp), Box::new(cosine)], &[warmup])?)
            };
            Ok(Some(LrScheduler::new(schedule, optimizer)))
        }
    }
}

/// What `--model` learns: digit reversal (sequence to sequence), the next token, or classes.
fn task(model: &str) -> Box<dyn Task> {
    match model {
        "seq2seq" => Box::new(Seq2SeqTask { pad: reversal::PAD }),
        _ if GptConfig::named(model).is_some() => Box::new(LanguageModeling),
        _ => Box::new(Classification),
    }
}

/// `model` with the optimizer and task the flags ask for; batches are loaded onto `device`.
pub fn build_with(args: &Args, model: Box<dyn Module>, device: Device) -> anyhow::Result<TrainingSetup> {
    let params = model.parameters();
    let (lr, wd, scope) = (args.lr(), args.weight_decay(), args.decay_scope());
    // nanoGPT's second moment forgets faster than PyTorch's default 0.999.
    let beta2 = if args.gpt_recipe() { 0.95 } else { 0.999 };
    let optimizer: Box<dyn Optimizer> = match args.optimizer() {
        OptimizerKind::Sgd => Box::new(Sgd::new(
            params,
            SgdConfig::new(lr)
                .momentum(args.momentum)
                .weight_decay(wd)
                .decay_scope(scope),
        )?),
        OptimizerKind::Adam => Box::new(Adam::new(
            params,
            AdamConfig::adam()
                .lr(lr)
                .betas(0.9, beta2)
                .weight_decay(wd)
                .decay_scope(scope),
        )?),
        OptimizerKind::Adamw => Box::new(Adam::adamw(
            params,
            AdamConfig::adamw()
                .lr(lr)
                .betas(0.9, beta2)
                .weight_decay(wd)
                .decay_scope(scope),
        )?),
    };
    let mut hparams = BTreeMap::from([
        ("model".to_string(), args.model.clone()),
        (
            "optimizer".to_string(),
            format!("{:?}", args.optimizer()).to_lowercase(),
        ),
        ("lr".to_string(), lr.to_string()),
        ("weight_decay".to_string(), wd.to_string()),
        ("decay_scope".to_string(), format!("{scope:?}").to_lowercase()),
        ("dataset".to_string(), format!("{:?}", args.dataset).to_lowercase()),
        ("batch_size".to_string(), args.batch_size.to_string()),
        ("seed".to_string(), args.seed.to_string()),
        ("accumulate".to_string(), args.accumulate.to_string()),
        ("precision".to_string(), args.precision.clone()),
    ]);
    // Only SGD has a momentum: an Adam run must not show one.
    if args.optimizer() == OptimizerKind::Sgd {
        hparams.insert("momentum".to_string(), args.momentum.to_string());
    }
    Ok(TrainingSetup {
        model,
        optimizer,
        scheduler: None,
        task: task(&args.model),
        device,
        generators: Vec::new(),
        model_name: args.model.clone(),
        hparams,
    })
}

/// What `lockstep sample` needs to rebuild a GPT from its checkpoint: its sizes and what its
/// ids stand for: a character model's characters, or the tokenizer's name.
fn gpt_hparams(config: &GptConfig, vocab: &TextVocabulary) -> Vec<(String, String)> {
    let mut out = vec![
        ("vocab_size".to_string(), config.vocab_size.to_string()),
        ("block_size".to_string(), config.block_size.to_string()),
        ("n_layer".to_string(), config.n_layer.to_string()),
        ("n_head".to_string(), config.n_head.to_string()),
        ("n_embd".to_string(), config.n_embd.to_string()),
        ("dropout".to_string(), config.dropout.to_string()),
        ("gelu".to_string(), config.gelu.name().to_string()),
    ];
    match vocab {
        TextVocabulary::Chars(chars) => out.push(("vocab_chars".to_string(), chars.chars())),
        TextVocabulary::Gpt2 => out.push(("tokenizer".to_string(), gpt2::NAME.to_string())),
        TextVocabulary::Ids(_) => {}
    }
    out
}
