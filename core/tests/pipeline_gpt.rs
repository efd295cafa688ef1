//! A GPT in two pipeline stages, its head tied to the token embedding: the first stage holds
//! the embedding, the last a copy for the head; their gradients are summed before clipping by
//! the global norm (the weight counted once) and the AdamW step. Twenty steps end with one
//! device's weights, both copies equal bit for bit, in one process and with a "process" per
//! stage. Dropout is 0: the stages draw from the shared dropout stream in another order than
//! one device does.

mod stage_processes_support;

use std::sync::Arc;

use lockstep_core::data::{DataLoader, DataLoaderConfig, Dataset, HostTensor, Sample};
use lockstep_core::models::{GptConfig, gpt};
use lockstep_core::nn::{Module, ModuleExt, Sequential, StagedModel};
use lockstep_core::optim::{Adam, AdamConfig, DecayScope, Optimizer, Sgd, SgdConfig};
use lockstep_core::rng::uniform_at;
use lockstep_core::train::pipeline::{Pipeline, ScheduleKind};
use lockstep_core::train::{GradientClip, LanguageModeling, Trainer, TrainerConfig, TrainingSetup};
use lockstep_core::{Device, Generator, HostVec, Result};
use stage_processes_support::{cpu, in_processes};

const VOCAB: usize = 16;
const T: usize = 8;

/// Sequences of a noisy counting pattern: each token mostly one more than the one before.
struct Counting;

impl Dataset for Counting {
    fn len(&self) -> usize {
        64
    }
    fn get(&self, i: usize) -> Result<Sample> {
        let tokens: Vec<u32> = (0..=T)
            .map(|j| ((i + j) as u32 + u32::from(uniform_at(11, i as u64, j) < 0.2)) % VOCAB as u32)
            .collect();
        Ok(vec![
            HostTensor::new(HostVec::U32(tokens[..T].to_vec()), [T])?,
            HostTensor::new(HostVec::U32(tokens[1..].to_vec()), [T])?,
        ])
    }
}

fn loader() -> DataLoader {
    let config = DataLoaderConfig {
        batch_size: 8,
        ..Default::default()
    };
    DataLoader::simple(Arc::new(Counting), true, 4, config).unwrap()
}

fn config() -> GptConfig {
    GptConfig::named("gpt-tiny")
        .unwrap()
        .vocab_size(VOCAB)
        .block_size(T)
        .layers(2, 2, 16)
        .dropout(0.0)
}

/// The embeddings, two blocks, the final LayerNorm and the head: five layers.
fn layers(device: &Device) -> Result<Sequential> {
    Ok(gpt(config(), device, &Generator::new(5))?.into_sequential())
}

/// AdamW as nanoGPT sets it (betas 0.9, 0.95, weight decay on matrices only), or SGD. Its
/// eps is 1e-4: the attention's key bias has a gradient of exactly 0 in exact arithmetic,
/// whose rounding noise (~1e-10) Adam's default eps of 1e-8 would turn into steps near `lr`
/// that differ with the order the stages sum the clipping norm in.
fn setup(model: Box<dyn Module>, device: &Device, adamw: bool) -> TrainingSetup {
    let optimizer: Box<dyn Optimizer> = if adamw {
        let config = AdamConfig::adamw()
            .lr(3e-2)
            .betas(0.9, 0.95)
            .weight_decay(0.1)
            .eps(1e-4)
            .decay_scope(DecayScope::Weights);
        Box::new(Adam::adamw(model.parameters(), config).unwrap())
    } else {
        Box::new(Sgd::new(model.parameters(), SgdConfig::new(0.5).momentum(0.9)).unwrap())
    };
    TrainingSetup {
        optimizer,
        model,
        scheduler: None,
        task: Box::new(LanguageModeling),
        device: device.clone(),
        generators: Vec::new(),
        model_name: "gpt".into(),
        hparams: Default::default(),
    }
}

/// 20 steps, clipped by a global norm the gradients exceed.
fn trainer_config() -> TrainerConfig {
    TrainerConfig {
        max_epochs: 10,
        max_steps: Some(20),
        gradient_clip: Some(GradientClip::Norm(0.5)),
        log_every_n_steps: 5,
        ..Default::default()
    }
}

fn train(setup: &mut TrainingSetup, mut trainer: Trainer) -> Result<Vec<(String, Vec<f32>)>> {
    trainer.fit(setup, &loader(), None)?;
    setup
        .model
        .state_dict()
        .into_iter()
        .map(|(name, t)| Ok((name, t.to_vec::<f32>()?)))
        .collect()
}

fn one_device(adamw: bool) -> Vec<(String, Vec<f32>)> {
    let model = gpt(config(), &Device::cpu(), &Generator::new(5)).unwrap();
    let mut setup = setup(Box::new(model), &Device::cpu(), adamw);
    train(&mut setup, Trainer::new(trainer_config()).unwrap()).unwrap()
}

/// Every tensor of `got` (by name) within 1e-5 of `want`'s, relative to the tensor's largest
/// element, and the two names of the tied weight equal bit for bit.
fn assert_matches_one_device(label: &str, got: &[(String, Vec<f32>)], want: &[(String, Vec<f32>)]) {
    assert_eq!(got.len(), want.len(), "{label}: the same tensors");
    let mut worst = 0f32;
    for (name, w) in want {
        let g = &got
            .iter()
            .find(|(n, _)| n == name)
            .unwrap_or_else(|| panic!("{label}: no {name}"))
            .1;
        let scale = w.iter().fold(0f32, |m, x| m.max(x.abs()));
        for (a, b) in g.iter().zip(w) {
            worst = worst.max((a - b).abs() / scale);
        }
    }
    println!("{label}: largest difference from one device {worst:e} of a tensor's largest weight");
    assert!(worst <= 1e-5, "{label}: {worst:e}");
    let by_name = |name: &str| &got.iter().find(|(n, _)| n == name).unwrap().1;
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(
        bits(by_name("transformer.wte.weight")),
        bits(by_name("lm_head.weight")),
        "{label}: the copies of the tied weight differ"
    );
}

/// AdamW in one micro-batch (as one device sums); micro-batches sum the gradients in another
/// order, which Adam's division by tiny second moments magnifies, so they train with SGD.
#[test]
fn a_gpt_in_two_stages_trains_as_one_device_with_its_tied_weight_equal_on_both() {
    for (kind, micro_batches, adamw) in [(ScheduleKind::GPipe, 1, true), (ScheduleKind::OneFOneB, 4, false)] {
        let want = one_device(adamw);
        let devices = [cpu(0), cpu(1)];
        let model = StagedModel::place(&[2, 3], &devices, layers).unwrap();
        assert_eq!(model.ties().len(), 1, "the head's stage holds a copy of the embedding");
        let mut setup = setup(Box::new(model), &devices[0], adamw);
        let trainer = Trainer::new(trainer_config())
            .unwrap()
            .with_strategy(Pipeline::new(kind, micro_batches));
        let got = train(&mut setup, trainer).unwrap();
        assert_matches_one_device(&format!("{} x{micro_batches}", kind.name()), &got, &want);
    }
}

#[test]
fn a_gpt_with_a_stage_per_process_trains_as_one_device() {
    let want = one_device(true);
    let runs = in_processes(2, |stage, processes| {
        let model = StagedModel::place_one(&[2, 3], stage, &cpu(stage), layers)?;
        let mut setup = setup(Box::new(model), &cpu(stage), true);
        let strategy = Pipeline::new(ScheduleKind::OneFOneB, 1).across_processes(processes);
        train(&mut setup, Trainer::new(trainer_config())?.with_strategy(strategy))
    });
    let got: Vec<(String, Vec<f32>)> = runs
        .into_iter()
        .collect::<Result<Vec<_>>>()
        .unwrap()
        .into_iter()
        .flatten()
        .collect();
    assert_matches_one_device("a process per stage", &got, &want);
}

#[test]
fn a_gpt_on_one_stage_keeps_one_tied_parameter_and_one_device_s_state_dict() {
    let gpt_model = gpt(config(), &Device::cpu(), &Generator::new(5)).unwrap();
    let names = |m: &dyn Module| m.state_dict().into_iter().map(|(n, _)| n).collect::<Vec<_>>();
    let want = names(&gpt_model);
    let whole = StagedModel::place(&[5], &[cpu(1)], layers).unwrap();
    assert!(whole.ties().is_empty());
    assert_eq!(names(&whole), want);
    assert_eq!(
        whole.parameters().len(),
        gpt_model.parameters().len(),
        "the head's weight is the embedding's"
    );
    // Split, the head's stage names its copy `lm_head.weight`: the same state dict.
    let split = StagedModel::place(&[2, 3], &[cpu(0), cpu(1)], layers).unwrap();
    let mut split_names = names(&split);
    split_names.sort();
    let mut sorted = want.clone();
    sorted.sort();
    assert_eq!(split_names, sorted);
    assert_eq!(split.parameters().len(), gpt_model.parameters().len() + 1);
}
