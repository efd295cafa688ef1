//! The model-parallel example: the GRU encoder-decoder on digit reversal, pipelined with the
//! encoder on one CPU device and the decoder on another, gives one device's gradients; a short
//! run on one device learns.

mod replica_support;

use std::sync::Arc;

use lockstep_core::data::reversal::{PAD, Reversal};
use lockstep_core::data::{DataLoader, DataLoaderConfig, Dataset};
use lockstep_core::models::seq2seq;
use lockstep_core::nn::{Module, ModuleExt, StagedModel};
use lockstep_core::optim::{Adam, AdamConfig};
use lockstep_core::train::pipeline::{Pipeline, ScheduleKind};
use lockstep_core::train::{MicroBatch, Seq2SeqTask, StepTimes, Strategy, Task, Trainer, TrainerConfig, TrainingSetup};
use lockstep_core::{Device, Generator, Tensor};

const TASK: Seq2SeqTask = Seq2SeqTask { pad: PAD };

fn cpu(i: usize) -> Device {
    Device::parse(&format!("cpu:{i}")).unwrap()
}

/// Samples 0..n as [input, target] on `device`.
fn batch(n: usize, device: &Device) -> Vec<Tensor> {
    let data = Reversal::new(n, 1);
    let indices: Vec<usize> = (0..n).collect();
    data.get_batch(&indices).unwrap().to_device(device).unwrap()
}

fn setup(model: Box<dyn Module>, device: &Device) -> TrainingSetup {
    let optimizer = Adam::new(model.parameters(), AdamConfig::adam().lr(3e-3)).unwrap();
    TrainingSetup {
        model,
        optimizer: Box::new(optimizer),
        scheduler: None,
        task: Box::new(TASK),
        device: device.clone(),
        generators: Vec::new(),
        model_name: "seq2seq".into(),
        hparams: Default::default(),
    }
}

fn grads(m: &dyn Module) -> Vec<(String, Vec<f32>)> {
    m.named_parameters()
        .into_iter()
        .map(|(n, p)| (n, p.grad().unwrap().to_vec::<f32>().unwrap()))
        .collect()
}

#[test]
fn the_encoder_and_decoder_pipelined_on_two_devices_have_one_devices_gradients() {
    let whole = seq2seq(64, &Device::cpu(), &Generator::new(2)).unwrap();
    let loss = TASK.loss(&whole, &batch(16, &Device::cpu())).unwrap();
    loss.backward().unwrap();
    let want = grads(&whole);
    for kind in [ScheduleKind::GPipe, ScheduleKind::OneFOneB] {
        for micro_batches in [1, 2, 4, 8] {
            let devices = [cpu(0), cpu(1)];
            let staged = StagedModel::place(&[1, 1], &devices, |d| seq2seq(64, d, &Generator::new(2))).unwrap();
            let mut s = setup(Box::new(staged), &devices[0]);
            let mut strategy = Pipeline::new(kind, micro_batches);
            strategy.setup(&mut s, &TrainerConfig::default()).unwrap();
            let mut tensors = batch(16, &devices[0]);
            tensors[1] = tensors[1].to_device(&devices[1]).unwrap();
            let micro = MicroBatch::whole(&tensors);
            let got_loss = strategy
                .forward_backward(&s, &micro, &mut StepTimes::default())
                .unwrap();
            let label = format!("{} M={micro_batches}", kind.name());
            let (a, b) = (got_loss.item().unwrap(), loss.item().unwrap());
            assert!((a - b).abs() <= 1e-5 * b, "{label}: loss {a} vs {b}");
            for ((name, g), (_, w)) in grads(s.model.as_ref()).iter().zip(&want) {
                let scale = w.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-12);
                let worst = g.iter().zip(w).fold(0f32, |m, (x, y)| m.max((x - y).abs()));
                assert!(
                    worst <= 1e-5 * scale,
                    "{label}: {name} differs by {worst} (largest {scale})"
                );
            }
        }
    }
}

#[test]
fn a_short_run_learns_and_greedy_decoding_is_evaluated() {
    let device = Device::cpu();
    let mut s = setup(Box::new(seq2seq(64, &device, &Generator::new(2)).unwrap()), &device);
    let loader_config = DataLoaderConfig {
        batch_size: 32,
        ..Default::default()
    };
    let train = DataLoader::simple(Arc::new(Reversal::new(4096, 1)), true, 0, loader_config.clone()).unwrap();
    let val = DataLoader::simple(Arc::new(Reversal::new(64, 2)), false, 0, loader_config).unwrap();
    let config = TrainerConfig {
        max_steps: Some(60),
        ..Default::default()
    };
    let mut trainer = Trainer::new(config).unwrap();
    let before = trainer.evaluate(&mut s, &val).unwrap();
    let report = trainer.fit(&mut s, &train, None).unwrap();
    let after = trainer.evaluate(&mut s, &val).unwrap();
    // ln(12) = 2.48 at chance; greedy decoding's loss must fall too.
    assert!(before.loss > 2.2, "{before:?}");
    assert!(after.loss < before.loss - 0.2, "{before:?} -> {after:?} ({report:?})");
    assert_eq!(after.samples, 64);
    assert!((0.0..=1.0).contains(&after.accuracy));
}
