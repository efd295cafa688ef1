//! Placement: `to_device` moves a module's parameters (which stay leaves) and buffers, and a
//! checkpoint written by a model split over devices resumes on one device and the other way
//! round (tensors are stored by name whatever the placement).

mod replica_support;
mod scratch_support;

use std::sync::Arc;

use lockstep_core::data::{DataLoader, DataLoaderConfig};
use lockstep_core::models;
use lockstep_core::nn::{Module, ModuleExt, StagedModel};
use lockstep_core::train::pipeline::{Pipeline, ScheduleKind};
use lockstep_core::train::{Trainer, TrainerConfig, TrainingSetup};
use lockstep_core::{DType, Device, Generator, Result, Tensor};
use replica_support::{Points, SEED, assert_close, points_model, setup_with, weights};
use scratch_support::Scratch;

fn cpu(i: usize) -> Device {
    Device::parse(&format!("cpu:{i}")).unwrap()
}

#[test]
fn to_device_moves_parameters_and_buffers_and_parameters_stay_leaves() {
    let (from, to) = (cpu(0), cpu(1));
    let mut net = models::build("convnet-bn", &[], &from, &Generator::new(0)).unwrap();
    let before: Vec<(String, Vec<f64>)> = net
        .state_dict()
        .into_iter()
        .map(|(n, t)| (n, t.to_f64_vec().unwrap()))
        .collect();
    let x = Tensor::rand_normal([2, 1, 28, 28], 0.0, 1.0, DType::F32, &Generator::new(1), &from).unwrap();
    net.set_training(false);
    let y_before = net.forward(&x).unwrap().to_vec::<f32>().unwrap();
    net.to_device(&to).unwrap();
    let after = net.state_dict();
    assert_eq!(after.len(), before.len());
    for ((name, t), (_, values)) in after.iter().zip(&before) {
        assert_eq!(t.device(), &to, "{name}");
        assert_eq!(&t.to_f64_vec().unwrap(), values, "{name}");
    }
    for (name, p) in net.named_parameters() {
        assert!(p.tracks_grad() && p.is_leaf(), "{name} is no longer a trainable leaf");
    }
    assert!(
        net.named_buffers()
            .iter()
            .any(|(n, _)| n.ends_with("num_batches_tracked"))
    );
    let y_after = net
        .forward(&x.to_device(&to).unwrap())
        .unwrap()
        .to_vec::<f32>()
        .unwrap();
    assert_eq!(y_after, y_before);
}

/// A module that holds a parameter but does not say how to move it.
struct Forgetful {
    w: Tensor,
}

impl Module for Forgetful {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        x.mul(&self.w)
    }
    fn visit_parameters(&self, prefix: &str, f: &mut dyn FnMut(String, &Tensor)) {
        f(format!("{prefix}w"), &self.w);
    }
    fn describe(&self) -> String {
        "Forgetful".into()
    }
}

#[test]
fn a_module_that_cannot_move_its_tensors_is_named() {
    let w = Tensor::ones([3], DType::F32, &cpu(0)).unwrap().requires_grad(true);
    let err = Forgetful { w }.to_device(&cpu(1)).unwrap_err().to_string();
    assert!(
        err.contains("w stayed on cpu:0") && err.contains("map_tensors"),
        "{err}"
    );
}

fn loader() -> DataLoader {
    let config = DataLoaderConfig {
        batch_size: 16,
        ..Default::default()
    };
    DataLoader::simple(Arc::new(Points), true, SEED, config).unwrap()
}

fn config(max_epochs: u64) -> TrainerConfig {
    TrainerConfig {
        max_epochs,
        ..Default::default()
    }
}

fn one_device() -> TrainingSetup {
    setup_with(Box::new(points_model(&Device::cpu()).unwrap()), &Device::cpu())
}

fn two_stages() -> TrainingSetup {
    let devices = [cpu(0), cpu(1)];
    setup_with(
        Box::new(StagedModel::place(&[2, 2], &devices, points_model).unwrap()),
        &devices[0],
    )
}

/// One epoch placed by `first`, a checkpoint, then two more resumed onto `then`.
fn resumed(
    first: fn() -> TrainingSetup,
    first_staged: bool,
    then: fn() -> TrainingSetup,
    then_staged: bool,
) -> Vec<Vec<f32>> {
    let trainer = |epochs, staged: bool| {
        let t = Trainer::new(config(epochs)).unwrap();
        if staged {
            t.with_strategy(Pipeline::new(ScheduleKind::OneFOneB, 4))
        } else {
            t
        }
    };
    let dir = Scratch::new(&format!("placement-{first_staged}"));
    let path = dir.join("after-one-epoch.safetensors");
    let mut s = first();
    let mut t = trainer(1, first_staged);
    t.fit(&mut s, &loader(), None).unwrap();
    t.save_checkpoint(&s, &path).unwrap();
    let mut s = then();
    let mut t = trainer(3, then_staged);
    t.resume(&mut s, &path).unwrap();
    t.fit(&mut s, &loader(), None).unwrap();
    weights(&s)
}

#[test]
fn a_checkpoint_resumes_onto_another_placement() {
    let mut straight = one_device();
    Trainer::new(config(3))
        .unwrap()
        .fit(&mut straight, &loader(), None)
        .unwrap();
    let want = weights(&straight);
    assert_close(&resumed(two_stages, true, one_device, false), &want);
    assert_close(&resumed(one_device, false, two_stages, true), &want);
}
