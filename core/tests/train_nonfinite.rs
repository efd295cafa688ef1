//! A NaN in the data: by default the run stops with the step, the batch and the first
//! parameter that went non-finite named; under `OnNan::Skip` that step is skipped, counted,
//! and the weights stay finite.

use std::sync::Arc;

use lockstep_core::data::{DataLoader, DataLoaderConfig, HostTensor, TensorDataset};
use lockstep_core::nn::{Linear, Module, ModuleExt, Relu};
use lockstep_core::optim::{Sgd, SgdConfig};
use lockstep_core::train::{OnNan, Progress, Trainer, TrainerConfig, TrainingSetup};
use lockstep_core::{Device, Generator, HostVec, Result, Tensor};

#[derive(Module)]
struct Net {
    hidden: Linear,
    act: Relu,
    out: Linear,
}

impl Net {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.out.forward(&self.act.forward(&self.hidden.forward(x)?)?)
    }
}

/// 64 points of which sample 20 (the third batch of 8, in order) holds a NaN.
fn loader() -> DataLoader {
    let mut x: Vec<f32> = (0..128)
        .map(|i| lockstep_core::rng::uniform_at(3, i, 0) as f32)
        .collect();
    x[2 * 20] = f32::NAN;
    let y: Vec<u32> = (0..64).map(|i| (i % 2) as u32).collect();
    let data = TensorDataset::new(vec![
        HostTensor::new(HostVec::F32(x), [64, 2]).unwrap(),
        HostTensor::new(HostVec::U32(y), [64]).unwrap(),
    ])
    .unwrap();
    let config = DataLoaderConfig {
        batch_size: 8,
        ..Default::default()
    };
    DataLoader::simple(Arc::new(data), false, 0, config).unwrap()
}

fn setup() -> TrainingSetup {
    let (device, g) = (Device::cpu(), Generator::new(1));
    let net = Net {
        hidden: Linear::new(2, 8, true, &device, &g).unwrap(),
        act: Relu,
        out: Linear::new(8, 2, true, &device, &g).unwrap(),
    };
    let optimizer = Sgd::new(net.parameters(), SgdConfig::new(0.1)).unwrap();
    TrainingSetup::new(net, optimizer)
}

fn config(on_nan: OnNan) -> TrainerConfig {
    TrainerConfig {
        max_epochs: 2,
        log_every_n_steps: 1,
        on_nan,
        progress: Progress::Off,
        ..Default::default()
    }
}

#[test]
fn a_nan_stops_the_run_naming_the_step_the_batch_and_the_parameter() {
    let mut setup = setup();
    let err = Trainer::new(config(OnNan::Stop))
        .unwrap()
        .fit(&mut setup, &loader(), None)
        .unwrap_err()
        .to_string();
    for needle in [
        "at step 3 (epoch 0, batch 3)",
        "the first parameter no longer finite is `hidden.weight`",
        "--on-nan skip",
    ] {
        assert!(err.contains(needle), "`{needle}` not in: {err}");
    }
}

#[test]
fn under_skip_the_nan_step_is_skipped_counted_and_the_weights_stay_finite() {
    let mut setup = setup();
    let report = Trainer::new(config(OnNan::Skip))
        .unwrap()
        .fit(&mut setup, &loader(), None)
        .unwrap();
    assert_eq!(
        (report.steps, report.skipped_steps),
        (16, 2),
        "one NaN batch in each of 2 epochs"
    );
    for (name, p) in setup.model.named_parameters() {
        assert!(
            p.to_vec::<f32>().unwrap().iter().all(|v| v.is_finite()),
            "{name} is not finite"
        );
    }
}
