//! A pipeline across vendors' devices: stage 0 on wgpu, stage 1 on the CPU, micro-batches on
//! the 1F1B schedule, gives the gradients of the whole model on the CPU.

mod support;

use lockstep_core::nn::{Flatten, Linear, Module, ModuleExt, Relu, Sequential, StagedModel};
use lockstep_core::optim::{Sgd, SgdConfig};
use lockstep_core::train::pipeline::{Pipeline, ScheduleKind};
use lockstep_core::train::{Classification, MicroBatch, StepTimes, Strategy, Task, TrainerConfig, TrainingSetup};
use lockstep_core::{DType, Device, Generator, Result, Tensor};

fn model(device: &Device) -> Result<Sequential> {
    let init = Generator::new(5);
    Ok(Sequential::new()
        .add(Flatten::new())
        .add(Linear::new(12, 16, true, device, &init)?)
        .add(Relu)
        .add(Linear::new(16, 4, true, device, &init)?))
}

fn grads(m: &dyn Module) -> Vec<Vec<f32>> {
    m.parameters()
        .iter()
        .map(|p| p.grad().unwrap().to_vec::<f32>().unwrap())
        .collect()
}

#[test]
fn a_wgpu_stage_and_a_cpu_stage_give_the_cpu_gradients() {
    let Some(wgpu) = support::wgpu_device() else { return };
    let cpu = Device::cpu();
    let g = Generator::new(6);
    let x = Tensor::rand_normal([8, 12], 0.0, 1.0, DType::F32, &g, &cpu).unwrap();
    let y = Tensor::from_vec((0..8u32).map(|i| i % 4).collect(), [8], &cpu).unwrap();

    let whole = model(&cpu).unwrap();
    Classification
        .loss(&whole, &[x.clone(), y.clone()])
        .unwrap()
        .backward()
        .unwrap();

    let staged = StagedModel::place(&[2, 2], &[wgpu.clone(), cpu.clone()], model).unwrap();
    let optimizer = Sgd::new(staged.parameters(), SgdConfig::new(0.1)).unwrap();
    let mut setup = TrainingSetup {
        model: Box::new(staged),
        optimizer: Box::new(optimizer),
        scheduler: None,
        task: Box::new(Classification),
        device: wgpu.clone(),
        generators: Vec::new(),
        model_name: "two-vendors".into(),
        hparams: Default::default(),
    };
    let mut strategy = Pipeline::new(ScheduleKind::OneFOneB, 4);
    strategy.setup(&mut setup, &TrainerConfig::default()).unwrap();
    let tensors = [x.to_device(&wgpu).unwrap(), y];
    let micro = MicroBatch::whole(&tensors);
    strategy
        .forward_backward(&setup, &micro, &mut StepTimes::default())
        .unwrap();
    for (i, (a, b)) in grads(setup.model.as_ref()).iter().zip(grads(&whole)).enumerate() {
        for (p, q) in a.iter().zip(&b) {
            assert!(
                (p - q).abs() <= 1e-5 * (1.0 + q.abs()),
                "parameter {i}: pipelined {p}, cpu {q}"
            );
        }
    }
}
