//! Pipeline parallelism on CPU virtual devices: GPipe and 1F1B over P stages and M
//! micro-batches give the gradients of the whole model on one device, and a pipelined `fit`
//! trains as one device does, alone or as replicas of a hybrid data × pipeline run.

mod replica_support;

use std::sync::Arc;

use lockstep_core::backend::LocalCommunicator;
use lockstep_core::data::{DataLoader, DataLoaderConfig, DistributedSampler};
use lockstep_core::distributed::{Reducer, ReducerConfig};
use lockstep_core::models;
use lockstep_core::nn::{ModuleExt, Sequential, StagedModel};
use lockstep_core::train::pipeline::{Pipeline, ScheduleKind};
use lockstep_core::train::{
    ChannelListener, Classification, Event, Hybrid, MicroBatch, StepTimes, Strategy, Task, Trainer, TrainerConfig,
    TrainingSetup,
};
use lockstep_core::{Device, Generator, Result, Tensor};
use replica_support::{Points, SEED, assert_close, config, points_model, setup_with, single_device, weights};

const BATCH: usize = 16;

fn cpu(i: usize) -> Device {
    Device::parse(&format!("cpu:{i}")).unwrap()
}

/// `layers` split into `stages` nearly equal runs, the first ones one longer.
fn even_sizes(layers: usize, stages: usize) -> Vec<usize> {
    (0..stages)
        .map(|i| layers / stages + usize::from(i < layers % stages))
        .collect()
}

/// MNIST-shaped inputs and labels (values fixed by the sample index).
fn batch() -> (Tensor, Tensor) {
    let x: Vec<f32> = (0..BATCH * 784)
        .map(|i| lockstep_core::rng::uniform_at(3, i as u64, 0) as f32)
        .collect();
    let y: Vec<u32> = (0..BATCH as u32).map(|i| (i * 7) % 10).collect();
    let cpu0 = Device::cpu();
    (
        Tensor::from_vec(x, [BATCH, 1, 28, 28], &cpu0).unwrap(),
        Tensor::from_vec(y, [BATCH], &cpu0).unwrap(),
    )
}

type Grads = Vec<(String, Vec<f32>)>;

fn grads_of(model: &dyn lockstep_core::nn::Module) -> Grads {
    model
        .named_parameters()
        .into_iter()
        .map(|(name, p)| {
            (
                name,
                p.grad()
                    .expect("every parameter has a gradient")
                    .to_vec::<f32>()
                    .unwrap(),
            )
        })
        .collect()
}

/// The loss and gradients of the whole batch on one device.
fn on_one_device(build: &dyn Fn(&Device) -> Result<Sequential>) -> (f64, Grads) {
    let model = build(&Device::cpu()).unwrap();
    let (x, y) = batch();
    let loss = Classification.loss(&model, &[x, y]).unwrap();
    loss.backward().unwrap();
    (loss.item().unwrap(), grads_of(&model))
}

/// The same, pipelined over `stages` CPU devices with `micro_batches` micro-batches.
fn pipelined(
    build: &dyn Fn(&Device) -> Result<Sequential>,
    kind: ScheduleKind,
    stages: usize,
    micro_batches: usize,
) -> (f64, Grads) {
    let layers = build(&Device::cpu()).unwrap().len();
    let devices: Vec<Device> = (0..stages).map(cpu).collect();
    let model = StagedModel::place(&even_sizes(layers, stages), &devices, build).unwrap();
    let mut setup = setup_with(Box::new(model), &devices[0]);
    let mut strategy = Pipeline::new(kind, micro_batches);
    strategy.setup(&mut setup, &TrainerConfig::default()).unwrap();
    let (x, y) = batch();
    let tensors = [x, y.to_device(&devices[stages - 1]).unwrap()];
    let loss = forward_backward(&mut strategy, &setup, &tensors).unwrap();
    (loss.item().unwrap(), grads_of(setup.model.as_ref()))
}

/// One full-precision micro-batch of weight 1 through `strategy`.
fn forward_backward(strategy: &mut Pipeline, setup: &TrainingSetup, tensors: &[Tensor]) -> Result<Tensor> {
    let micro = MicroBatch::whole(tensors);
    strategy.forward_backward(setup, &micro, &mut StepTimes::default())
}

/// Same names, and each gradient within 1e-5 of the largest element of the reference's.
fn assert_same_gradients(label: &str, got: &Grads, want: &Grads) {
    assert_eq!(
        got.iter().map(|(n, _)| n).collect::<Vec<_>>(),
        want.iter().map(|(n, _)| n).collect::<Vec<_>>(),
        "{label}: names"
    );
    for ((name, g), (_, w)) in got.iter().zip(want) {
        let scale = w.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-12);
        let worst = g.iter().zip(w).fold(0f32, |m, (a, b)| m.max((a - b).abs()));
        assert!(
            worst <= 1e-5 * scale,
            "{label}: {name} differs by {worst} (largest {scale})"
        );
    }
}

fn check_every_schedule(model: &str, build: &dyn Fn(&Device) -> Result<Sequential>) {
    let (want_loss, want) = on_one_device(build);
    for kind in [ScheduleKind::GPipe, ScheduleKind::OneFOneB] {
        for stages in [2, 4] {
            for micro_batches in [1, 2, 4, 8] {
                let label = format!("{model} {} P={stages} M={micro_batches}", kind.name());
                let (loss, got) = pipelined(build, kind, stages, micro_batches);
                assert!(
                    (loss - want_loss).abs() <= 1e-5 * want_loss.abs(),
                    "{label}: loss {loss} vs {want_loss}"
                );
                assert_same_gradients(&label, &got, &want);
            }
        }
    }
}

#[test]
fn an_mlp_pipelined_has_the_gradients_of_one_device() {
    check_every_schedule("mlp", &|d| models::mlp(&[32, 32, 32], d, &Generator::new(4)));
}

#[test]
fn lenet5_pipelined_has_the_gradients_of_one_device() {
    check_every_schedule("lenet5", &|d| models::lenet5(d, &Generator::new(5)));
}

#[test]
fn a_pipelined_fit_trains_as_one_device_does() {
    let want = single_device(16, 1);
    for kind in [ScheduleKind::GPipe, ScheduleKind::OneFOneB] {
        let devices = [cpu(0), cpu(1)];
        let model = StagedModel::place(&[2, 2], &devices, points_model).unwrap();
        let mut s = setup_with(Box::new(model), &devices[0]);
        let loader = DataLoader::simple(
            Arc::new(Points),
            true,
            SEED,
            DataLoaderConfig {
                batch_size: 16,
                ..Default::default()
            },
        )
        .unwrap();
        let mut trainer = Trainer::new(config(1)).unwrap().with_strategy(Pipeline::new(kind, 4));
        let (listener, events) = ChannelListener::new(1 << 12);
        trainer.add_listener(listener);
        let report = trainer.fit(&mut s, &loader, Some(&loader)).unwrap();
        drop(trainer);
        assert!(
            report.last_val.is_some(),
            "validation runs the stages one after another"
        );
        assert_close(&weights(&s), &want);
        // Each logged step reports every stage's compute and waiting, for its device's row.
        let mut steps = 0;
        for record in events.iter() {
            if let Event::Step { rank_times, .. } = record.event {
                assert_eq!(rank_times.len(), 2, "one entry per stage");
                for t in &rank_times {
                    assert!(t.forward > 0.0 && t.backward > 0.0 && t.waiting > 0.0, "{t:?}");
                }
                steps += 1;
            }
        }
        assert!(steps > 0, "no step events");
    }
}

/// Replica `rank`'s shard of the points (world 2), in batches of `batch`.
fn shard(rank: usize, batch: usize) -> DataLoader {
    let sampler = Arc::new(DistributedSampler::new(replica_support::LEN, 2, rank, true, SEED, false).unwrap());
    let loader_config = DataLoaderConfig {
        batch_size: batch,
        ..Default::default()
    };
    DataLoader::new(Arc::new(Points), sampler, loader_config).unwrap()
}

#[test]
fn two_stages_by_two_replicas_train_as_one_device_with_the_global_batch() {
    let want = single_device(16, 1);
    // Replica r's stages on cpu:2r and cpu:2r+1; stage s's group joins cpu:s and cpu:2+s.
    let mut per_replica: Vec<Vec<LocalCommunicator>> = vec![Vec::new(), Vec::new()];
    for stage in 0..2 {
        let group = LocalCommunicator::group(vec![cpu(stage).backend().clone(), cpu(2 + stage).backend().clone()]);
        for (replica, comm) in group.into_iter().enumerate() {
            per_replica[replica].push(comm);
        }
    }
    let threads: Vec<_> = per_replica
        .into_iter()
        .enumerate()
        .map(|(replica, comms)| {
            std::thread::spawn(move || {
                let devices = [cpu(2 * replica), cpu(2 * replica + 1)];
                let model = StagedModel::place(&[2, 2], &devices, points_model).unwrap();
                let reducers = model
                    .stages()
                    .iter()
                    .zip(comms)
                    .map(|(stage, comm)| Reducer::new(&stage.parameters(), Arc::new(comm), ReducerConfig::default()))
                    .collect::<Result<Vec<_>>>()
                    .unwrap();
                let mut s = setup_with(Box::new(model), &devices[0]);
                let strategy = Hybrid::new(Pipeline::new(ScheduleKind::OneFOneB, 4), reducers);
                Trainer::new(config(1))
                    .unwrap()
                    .with_strategy(strategy)
                    .fit(&mut s, &shard(replica, 8), None)
                    .unwrap();
                weights(&s)
            })
        })
        .collect();
    for t in threads {
        assert_close(&t.join().unwrap(), &want);
    }
}

#[test]
fn a_pipeline_says_what_it_needs() {
    // A plain Sequential is not split into stages.
    let mut plain = setup_with(Box::new(points_model(&Device::cpu()).unwrap()), &Device::cpu());
    let loader = DataLoader::simple(Arc::new(Points), false, SEED, DataLoaderConfig::default()).unwrap();
    let err = Trainer::new(config(1))
        .unwrap()
        .with_strategy(Pipeline::new(ScheduleKind::OneFOneB, 2))
        .fit(&mut plain, &loader, None)
        .unwrap_err()
        .to_string();
    assert!(err.contains("StagedModel::place"), "{err}");

    // More micro-batches than samples.
    let (_, y) = batch();
    let devices = [cpu(0), cpu(1)];
    let model = StagedModel::place(&[2, 2], &devices, points_model).unwrap();
    let mut setup = setup_with(Box::new(model), &devices[0]);
    let mut strategy = Pipeline::new(ScheduleKind::GPipe, 4);
    strategy.setup(&mut setup, &TrainerConfig::default()).unwrap();
    let x = Tensor::zeros([2, 8], lockstep_core::DType::F32, &devices[0]).unwrap();
    let tensors = [x, y.narrow(0, 0, 2).unwrap().to_device(&devices[1]).unwrap()];
    let err = forward_backward(&mut strategy, &setup, &tensors)
        .unwrap_err()
        .to_string();
    assert!(err.contains("2 samples cannot make 4 micro-batches"), "{err}");

    // A stage whose tensors are elsewhere.
    let on_cpu1 = points_model(&devices[1]).unwrap().split(&[2, 2]).unwrap();
    let err = StagedModel::new(on_cpu1.into_iter().zip(devices.clone()).collect())
        .err()
        .unwrap()
        .to_string();
    assert!(
        err.contains("stage 0 is placed on cpu:0 but its tensor 1.weight is on cpu:1"),
        "{err}"
    );
}

#[test]
fn two_stages_on_one_device_keep_a_row_each() {
    let devices = [cpu(5), cpu(5)];
    let model = StagedModel::place(&[2, 2], &devices, points_model).unwrap();
    let mut s = setup_with(Box::new(model), &devices[0]);
    let config = lockstep_core::train::TrainerConfig {
        max_steps: Some(2),
        log_every_n_steps: 1,
        ..config(1)
    };
    let mut trainer = Trainer::new(config)
        .unwrap()
        .with_strategy(Pipeline::new(ScheduleKind::GPipe, 2));
    let (listener, events) = ChannelListener::new(1 << 10);
    trainer.add_listener(listener);
    trainer.fit(&mut s, &shard(0, 8), None).unwrap();
    drop(trainer);
    let names = ["cpu:5 (stage 0)", "cpu:5 (stage 1)"].map(String::from).to_vec();
    let (mut started, mut rows) = (None, Vec::new());
    for record in events.iter() {
        match record.event {
            Event::RunStart { run } => started = Some(run.devices),
            Event::Device(stats) => rows.push(stats.device),
            _ => {}
        }
    }
    assert_eq!(started, Some(names.clone()));
    assert_eq!(&rows[..2], names.as_slice());
}
