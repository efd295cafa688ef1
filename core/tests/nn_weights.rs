//! `model.save(path)` / `model.load(path)`: weights under PyTorch's names in one safetensors
//! file and back; a Lockstep checkpoint loads too (its optimizer part left out); a strict load
//! refuses any difference and writes nothing, a non-strict one loads what matches and reports
//! the rest as PyTorch's `load_state_dict(strict=False)` does.

use std::sync::Arc;

use lockstep_core::data::{DataLoader, DataLoaderConfig, HostTensor, TensorDataset};
use lockstep_core::nn::{Linear, LoadReport, ModuleExt, Relu, Sequential};
use lockstep_core::optim::{Sgd, SgdConfig};
use lockstep_core::train::{ModelCheckpoint, Trainer, TrainerConfig, TrainingSetup};
use lockstep_core::{Device, Generator, HostVec};

mod scratch_support;
use scratch_support::Scratch;

fn net(hidden: usize, seed: u64) -> Sequential {
    let (dev, g) = (Device::cpu(), Generator::new(seed));
    Sequential::new()
        .add(Linear::new(4, hidden, true, &dev, &g).unwrap())
        .add(Relu)
        .add(Linear::new(hidden, 2, true, &dev, &g).unwrap())
}

fn values(model: &Sequential) -> Vec<(String, Vec<f32>)> {
    model
        .state_dict()
        .into_iter()
        .map(|(n, t)| (n, t.to_vec::<f32>().unwrap()))
        .collect()
}

fn scratch(name: &str) -> Scratch {
    Scratch::new(&format!("weights-{name}"))
}

#[test]
fn saved_weights_load_into_a_fresh_model_and_a_checkpoint_loads_without_its_optimizer() {
    let dir = scratch("roundtrip");
    let trained = net(8, 1);
    trained.save(&dir.join("w.safetensors")).unwrap();
    let fresh = net(8, 2);
    assert_ne!(values(&fresh), values(&trained));
    fresh.load(&dir.join("w.safetensors")).unwrap();
    assert_eq!(values(&fresh), values(&trained));

    // A checkpoint written by the Trainer holds `optimizer.…` tensors beside the model's.
    let data = TensorDataset::new(vec![
        HostTensor::new(HostVec::F32((0..32).map(|i| i as f32 / 32.0).collect()), [8, 4]).unwrap(),
        HostTensor::new(HostVec::U32(vec![0, 1, 0, 1, 0, 1, 0, 1]), [8]).unwrap(),
    ])
    .unwrap();
    let config = DataLoaderConfig {
        batch_size: 4,
        ..Default::default()
    };
    let loader = DataLoader::simple(Arc::new(data), false, 0, config).unwrap();
    let model = net(8, 3);
    let optimizer = Sgd::new(model.parameters(), SgdConfig::new(0.1).momentum(0.9)).unwrap();
    let mut setup = TrainingSetup::new(model, optimizer);
    let mut trainer = Trainer::new(TrainerConfig {
        max_epochs: 1,
        ..Default::default()
    })
    .unwrap();
    trainer.add_callback(ModelCheckpoint::new(dir.path()));
    trainer.fit(&mut setup, &loader, None).unwrap();
    let from_checkpoint = net(8, 4);
    from_checkpoint.load(&dir.join("last.safetensors")).unwrap();
    let expected: Vec<(String, Vec<f32>)> = setup
        .model
        .state_dict()
        .into_iter()
        .map(|(n, t)| (n, t.to_vec::<f32>().unwrap()))
        .collect();
    assert_eq!(values(&from_checkpoint), expected);
}

#[test]
fn a_strict_load_refuses_differences_and_a_non_strict_one_reports_them() {
    let dir = scratch("strict");
    let path = dir.join("w.safetensors");
    // Saved from a model with a third Linear: `4.weight`, `4.bias` are unexpected here.
    let (dev, g) = (Device::cpu(), Generator::new(5));
    let bigger = net(8, 5).add(Relu).add(Linear::new(2, 2, true, &dev, &g).unwrap());
    bigger.save(&path).unwrap();

    let target = net(8, 6);
    let before = values(&target);
    let err = target.load(&path).unwrap_err().to_string();
    assert!(err.contains("unexpected: 4.bias, 4.weight"), "{err}");
    assert_eq!(values(&target), before, "a refused strict load writes nothing");

    let report = target.load_non_strict(&path).unwrap();
    assert_eq!(
        report,
        LoadReport {
            missing_keys: vec![],
            // In the file's order (safetensors sorts its names).
            unexpected_keys: vec!["4.bias".into(), "4.weight".into()],
        }
    );
    assert_eq!(values(&target), values(&bigger)[..4].to_vec());

    // The other way round: the file lacks names the model has; they keep their values.
    let smaller_file = dir.join("small.safetensors");
    net(8, 7).save(&smaller_file).unwrap();
    let wide = net(8, 8).add(Relu).add(Linear::new(2, 2, true, &dev, &g).unwrap());
    let kept = values(&wide)[4..].to_vec();
    let report = wide.load_non_strict(&smaller_file).unwrap();
    assert_eq!(report.missing_keys, ["4.weight", "4.bias"]);
    assert_eq!(values(&wide)[4..].to_vec(), kept);

    // A shape that differs is an error even when not strict, naming both shapes.
    let narrow = net(16, 9);
    let err = narrow.load_non_strict(&path).unwrap_err().to_string();
    assert!(err.contains("0.weight expected [16, 4] got [8, 4]"), "{err}");
}
