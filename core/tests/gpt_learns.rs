//! gpt-tiny learns English through the library: on a real text (the fortune cookies of
//! Debian's `fortunes` package, which .ci/run installs), 300 AdamW steps on the CPU bring the
//! validation loss to at most 0.6x its initial value, and the trained model writes text in its
//! vocabulary.

use std::path::Path;
use std::sync::Arc;

use lockstep_core::data::text::char_text;
use lockstep_core::data::{DataLoader, DataLoaderConfig};
use lockstep_core::models::{GptConfig, Sampling, gpt};
use lockstep_core::nn::ModuleExt;
use lockstep_core::optim::{Adam, AdamConfig, DecayScope};
use lockstep_core::train::{GradientClip, LanguageModeling, Trainer, TrainerConfig, TrainingSetup};
use lockstep_core::{Device, Generator};

const TEXT: &str = "/usr/share/games/fortunes/cookie";

/// The text, or None (said loudly) when it is missing where CI does not promise it.
fn english() -> Option<&'static Path> {
    let path = Path::new(TEXT);
    if path.is_file() {
        return Some(path);
    }
    assert!(
        std::env::var_os("LOCKSTEP_EXPECT_TEXT").is_none(),
        "{TEXT} is missing but LOCKSTEP_EXPECT_TEXT is set: install Debian's fortunes package"
    );
    eprintln!("SKIPPED: {TEXT} is missing; install Debian's fortunes package (apt-get install fortunes)");
    None
}

#[test]
fn gpt_tiny_brings_the_validation_loss_below_six_tenths_of_its_start_in_300_steps() {
    let Some(path) = english() else { return };
    let config = GptConfig::named("gpt-tiny").unwrap();
    let (vocab, train, val) = char_text(path, config.block_size).unwrap();
    let loader = |set, shuffle| {
        let config = DataLoaderConfig {
            batch_size: 16,
            ..Default::default()
        };
        DataLoader::simple(Arc::new(set), shuffle, 0, config).unwrap()
    };
    let (train, val) = (loader(train, true), loader(val, false));

    let model = gpt(config.vocab_size(vocab.len()), &Device::cpu(), &Generator::new(0)).unwrap();
    let adamw = AdamConfig::adamw()
        .lr(2e-3)
        .betas(0.9, 0.95)
        .weight_decay(0.1)
        .decay_scope(DecayScope::Weights);
    let optimizer = Adam::adamw(model.parameters(), adamw).unwrap();
    let mut setup = TrainingSetup::new(model, optimizer)
        .task(LanguageModeling)
        .name("gpt-tiny");
    let mut trainer = Trainer::new(TrainerConfig {
        max_epochs: u64::MAX,
        max_steps: Some(300),
        gradient_clip: Some(GradientClip::Norm(1.0)),
        ..Default::default()
    })
    .unwrap();
    let before = trainer.evaluate(&mut setup, &val).unwrap().loss;
    trainer.fit(&mut setup, &train, None).unwrap();
    let after = trainer.evaluate(&mut setup, &val).unwrap().loss;
    eprintln!("validation loss {before:.4} -> {after:.4} ({:.3}x)", after / before);
    assert!(
        (before - (vocab.len() as f64).ln()).abs() < 0.1,
        "an untrained model is nearly uniform over the {} characters: {before}",
        vocab.len()
    );
    assert!(after <= 0.6 * before, "validation loss {before} -> {after}");

    let net = setup
        .model
        .as_any()
        .downcast_ref::<lockstep_core::models::Gpt>()
        .expect("the setup holds the GPT");
    let prompt = vocab.encode("The ").unwrap();
    let text = net.generate(&prompt, 80, &Sampling::default()).unwrap();
    let text = vocab.decode(&text).unwrap();
    assert_eq!(text.chars().count(), 80, "{text:?}");
    eprintln!("sample: The {text}");
}
