//! Short real-MNIST runs through the Trainer: the built-in models learn (the full-epoch
//! numbers, next to PyTorch's, are in BENCHMARKS.md). On the committed subset (2,000 training
//! images) they learn too, to a lower bar; mixed precision's 0.3-point bar needs the full set.

mod data_support;
use data_support::{full_mnist, mnist};
use std::path::Path;
use std::sync::Arc;

use lockstep_core::data::mnist::{Mnist, Split};
use lockstep_core::data::{DataLoader, DataLoaderConfig, Dataset};
use lockstep_core::nn::ModuleExt;
use lockstep_core::optim::{Adam, AdamConfig, Optimizer, Sgd, SgdConfig};
use lockstep_core::train::{Classification, Precision, Trainer, TrainerConfig, TrainingSetup};
use lockstep_core::{Device, Generator, Tensor, models};

/// Trains `steps` optimizer steps of batch 128 on the MNIST in `dir` and returns the test accuracy.
fn train(
    dir: &Path,
    model: &str,
    optimizer: impl FnOnce(Vec<Tensor>) -> Box<dyn Optimizer>,
    steps: u64,
    precision: Precision,
) -> f64 {
    let device = Device::cpu();
    let net = models::build(model, &[512, 512], &device, &Generator::new(0)).unwrap();
    let optimizer = optimizer(net.parameters());
    let mut setup = TrainingSetup {
        model: Box::new(net),
        optimizer,
        scheduler: None,
        task: Box::new(Classification),
        device,
        generators: Vec::new(),
        model_name: model.into(),
        hparams: Default::default(),
    };
    let config = DataLoaderConfig {
        batch_size: 128,
        num_workers: 2,
        ..Default::default()
    };
    let train = DataLoader::simple(
        Arc::new(Mnist::load(dir, Split::Train).unwrap()),
        true,
        0,
        config.clone(),
    )
    .unwrap();
    let test_set: Arc<dyn Dataset> = Arc::new(Mnist::load(dir, Split::Test).unwrap());
    let test = DataLoader::simple(
        test_set,
        false,
        0,
        DataLoaderConfig {
            batch_size: 1000,
            ..config
        },
    )
    .unwrap();
    let mut trainer = Trainer::new(TrainerConfig {
        // As many epochs as the steps need (the subset's epoch is 16 steps).
        max_epochs: u64::MAX,
        max_steps: Some(steps),
        precision,
        ..Default::default()
    })
    .unwrap();
    let report = trainer.fit(&mut setup, &train, None).unwrap();
    assert_eq!(report.steps, steps);
    trainer.test(&mut setup, &test).unwrap().accuracy
}

/// The recipes: SGD with momentum for the MLP, Adam for LeNet-5.
fn sgd(p: Vec<Tensor>) -> Box<dyn Optimizer> {
    Box::new(Sgd::new(p, SgdConfig::new(0.05).momentum(0.9)).unwrap())
}
fn adam(p: Vec<Tensor>) -> Box<dyn Optimizer> {
    Box::new(Adam::new(p, AdamConfig::adam().lr(1e-3)).unwrap())
}

/// The bars on the committed subset (2,000 training, 500 test images): the runs reached 91.8%
/// (mlp) and 95.0% (lenet5) there; the margin allows other CPUs' summation orders.
const SUBSET_MLP: f64 = 0.88;
const SUBSET_LENET: f64 = 0.90;

/// The accuracy a short run must reach: the full set's bar, or the subset's.
fn bar(full: f64, subset: f64) -> (std::path::PathBuf, f64) {
    let copy = mnist();
    let bar = if copy.is_full() { full } else { subset };
    (copy.dir, bar)
}

#[test]
fn mlp_with_sgd_momentum_learns_mnist() {
    // PyTorch reaches about 95% after 300 steps of this recipe on the full set.
    let (dir, bar) = bar(0.93, SUBSET_MLP);
    let accuracy = train(&dir, "mlp", sgd, 300, Precision::Full);
    assert!(accuracy > bar, "test accuracy {accuracy}");
}

#[test]
fn lenet5_with_adam_learns_mnist() {
    let (dir, bar) = bar(0.93, SUBSET_LENET);
    let accuracy = train(&dir, "lenet5", adam, 200, Precision::Full);
    assert!(accuracy > bar, "test accuracy {accuracy}");
}

/// Mixed precision (f16 with loss scaling, bf16) reaches the accuracy of f32 within 0.3 points
/// on the same seed and batches (issue: "within 0.3 points"): 30 of the full set's 10,000 test
/// images, where the subset's 500 would allow 1.5.
#[test]
fn mixed_precision_matches_full_precision_on_mnist() {
    let Some(dir) = full_mnist("mixed precision's 0.3-point bar") else {
        return;
    };
    for (model, steps) in [("mlp", 300), ("lenet5", 150)] {
        let optimizer = if model == "mlp" { sgd } else { adam };
        let full = train(&dir, model, optimizer, steps, Precision::Full);
        for precision in [Precision::Mixed16, Precision::MixedBf16] {
            let mixed = train(&dir, model, optimizer, steps, precision);
            assert!(
                (mixed - full).abs() <= 0.003,
                "{model} {}: {:.2}% vs {:.2}% in f32",
                precision.name(),
                mixed * 100.0,
                full * 100.0
            );
        }
    }
}
