//! Models of several inputs: `#[module(inputs)]` gives a derived model a `forward` over
//! `&[Tensor]`, the classification task hands it every field of the batch but the labels, and a
//! one-input model given several says what to do.

use std::sync::Arc;

use lockstep_core::data::{DataLoader, DataLoaderConfig, HostTensor, TensorDataset};
use lockstep_core::nn::{Linear, Module, ModuleExt};
use lockstep_core::optim::{Adam, AdamConfig};
use lockstep_core::train::{Progress, Trainer, TrainerConfig, TrainingSetup};
use lockstep_core::{Device, Error, Generator, HostVec, Result, Tensor};

/// A point `[2]` and a shift `[1]`, each through its own layer, summed, then a head.
#[derive(Module)]
#[module(inputs)]
struct TwoTowers {
    point: Linear,
    shift: Linear,
    head: Linear,
}

impl TwoTowers {
    fn new(g: &Generator) -> Result<TwoTowers> {
        let device = Device::cpu();
        Ok(TwoTowers {
            point: Linear::new(2, 16, true, &device, g)?,
            shift: Linear::new(1, 16, false, &device, g)?,
            head: Linear::new(16, 2, true, &device, g)?,
        })
    }

    fn forward(&self, inputs: &[Tensor]) -> Result<Tensor> {
        let [point, shift] = inputs else {
            return Err(Error::invalid(
                "TwoTowers",
                format!("takes [point, shift], got {} inputs", inputs.len()),
            ));
        };
        let hidden = self.point.forward(point)?.add(&self.shift.forward(shift)?)?.relu()?;
        self.head.forward(&hidden)
    }
}

/// `[points [n, 2], shifts [n, 1], labels [n]]`: the label is whether `x + 2·shift > 0.5`, so
/// neither input alone decides it.
fn points_and_shifts(n: usize, seed: u64) -> Arc<TensorDataset> {
    let u = |i: usize, j: usize| lockstep_core::rng::uniform_at(seed, i as u64, j) as f32;
    let points: Vec<f32> = (0..n)
        .flat_map(|i| [3.0 * u(i, 0) - 1.5, 3.0 * u(i, 1) - 1.5])
        .collect();
    let shifts: Vec<f32> = (0..n).map(|i| 2.0 * u(i, 2) - 1.0).collect();
    let labels: Vec<u32> = (0..n)
        .map(|i| u32::from(points[2 * i] + 2.0 * shifts[i] > 0.5))
        .collect();
    Arc::new(
        TensorDataset::new(vec![
            HostTensor::new(HostVec::F32(points), [n, 2]).unwrap(),
            HostTensor::new(HostVec::F32(shifts), [n, 1]).unwrap(),
            HostTensor::new(HostVec::U32(labels), [n]).unwrap(),
        ])
        .unwrap(),
    )
}

fn loaders() -> (DataLoader, DataLoader) {
    let config = DataLoaderConfig {
        batch_size: 32,
        ..Default::default()
    };
    let train = DataLoader::simple(points_and_shifts(1024, 1), true, 0, config.clone()).unwrap();
    let val = DataLoader::simple(points_and_shifts(512, 2), false, 0, config).unwrap();
    (train, val)
}

#[test]
fn a_model_of_two_inputs_learns_from_batches_of_three_fields() {
    let (train, val) = loaders();
    let model = TwoTowers::new(&Generator::new(0)).unwrap();
    assert_eq!(
        model.named_parameters().into_iter().map(|(n, _)| n).collect::<Vec<_>>(),
        ["point.weight", "point.bias", "shift.weight", "head.weight", "head.bias"]
    );
    let optimizer = Adam::new(model.parameters(), AdamConfig::adam().lr(2e-2)).unwrap();
    let mut setup = TrainingSetup::new(model, optimizer);
    let config = TrainerConfig {
        max_epochs: 6,
        progress: Progress::Off,
        ..Default::default()
    };
    let report = Trainer::new(config)
        .unwrap()
        .fit(&mut setup, &train, Some(&val))
        .unwrap();
    // The point alone decides about 75% of the labels: more needs the shift as well.
    let accuracy = report.last_val.expect("validated").accuracy;
    assert!(accuracy > 0.95, "validation accuracy {accuracy}");
}

#[test]
fn a_model_of_one_input_given_several_says_how_to_take_them() {
    let (train, _) = loaders();
    let model = Linear::new(2, 2, true, &Device::cpu(), &Generator::new(0)).unwrap();
    let optimizer = Adam::new(model.parameters(), AdamConfig::adam()).unwrap();
    let mut setup = TrainingSetup::new(model, optimizer);
    let config = TrainerConfig {
        progress: Progress::Off,
        ..Default::default()
    };
    let err = Trainer::new(config)
        .unwrap()
        .fit(&mut setup, &train, None)
        .unwrap_err()
        .to_string();
    for needle in ["takes one input", "gives it 2", "#[module(inputs)]"] {
        assert!(err.contains(needle), "`{needle}` not in: {err}");
    }
}
