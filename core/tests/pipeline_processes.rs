//! A pipeline whose stages are processes (threads with in-process communicators stand in for
//! them here; CI's MPI step runs the same through `lockstep launch`): each holds one stage,
//! and together they train, report and validate as the same pipeline in one process.

mod replica_support;

use std::sync::Arc;

use lockstep_core::backend::{Communicator, LocalCommunicator};
use lockstep_core::data::{DataLoader, DataLoaderConfig};
use lockstep_core::nn::{Flatten, Linear, Relu, Sequential, StagedModel};
use lockstep_core::train::pipeline::{Pipeline, ProcessStages, ScheduleKind};
use lockstep_core::train::{ChannelListener, Event, FitReport, GradientClip, Trainer, TrainerConfig};
use lockstep_core::{Device, Generator, Result};
use replica_support::{Points, SEED, assert_close, config, points_model, setup_with, weights};

fn cpu(i: usize) -> Device {
    Device::parse(&format!("cpu:{i}")).unwrap()
}

fn loader() -> DataLoader {
    let loader_config = DataLoaderConfig {
        batch_size: 16,
        ..Default::default()
    };
    DataLoader::simple(Arc::new(Points), true, SEED, loader_config).unwrap()
}

type Build = fn(&Device) -> Result<Sequential>;

/// Three linear layers, for three stages that each have parameters to train.
fn three_linears(device: &Device) -> Result<Sequential> {
    let init = Generator::new(2);
    Ok(Sequential::new()
        .add(Flatten::new())
        .add(Linear::new(8, 16, true, device, &init)?)
        .add(Relu)
        .add(Linear::new(16, 16, true, device, &init)?)
        .add(Relu)
        .add(Linear::new(16, 3, true, device, &init)?))
}

/// What a run leaves: every weight (stage after stage), the losses rank 0 logged, and its report.
struct Run {
    weights: Vec<Vec<f32>>,
    losses: Vec<f64>,
    report: FitReport,
}

fn fit(trainer: Trainer, setup: &mut lockstep_core::train::TrainingSetup) -> Result<(Vec<f64>, FitReport)> {
    let mut trainer = trainer;
    let (listener, events) = ChannelListener::new(1 << 12);
    trainer.add_listener(listener);
    let report = trainer.fit(setup, &loader(), Some(&loader()))?;
    drop(trainer);
    let losses = events
        .iter()
        .filter_map(|r| match r.event {
            Event::Step { loss, .. } => Some(loss),
            _ => None,
        })
        .collect();
    Ok((losses, report))
}

/// The stages as threads of one process (the reference).
fn in_one_process(kind: ScheduleKind, sizes: &[usize], build: Build) -> Run {
    let devices: Vec<Device> = (0..sizes.len()).map(cpu).collect();
    let model = StagedModel::place(sizes, &devices, build).unwrap();
    let mut setup = setup_with(Box::new(model), &devices[0]);
    let trainer = Trainer::new(config(1)).unwrap().with_strategy(Pipeline::new(kind, 4));
    let (losses, report) = fit(trainer, &mut setup).unwrap();
    Run {
        weights: weights(&setup),
        losses,
        report,
    }
}

/// `LocalCommunicator` groups over one device per stage: the world, then two per boundary.
fn stage_comms(stages: usize) -> Vec<Vec<LocalCommunicator>> {
    let mut per_stage: Vec<Vec<LocalCommunicator>> = (0..stages).map(|_| Vec::new()).collect();
    for _ in 0..1 + 2 * (stages - 1) {
        let group = LocalCommunicator::group((0..stages).map(|s| cpu(s).backend().clone()).collect());
        for (stage, comm) in group.into_iter().enumerate() {
            per_stage[stage].push(comm);
        }
    }
    per_stage
}

/// Each stage in a "process" of its own; `trainer_config` for every stage.
fn in_processes(kind: ScheduleKind, sizes: &[usize], build: Build, trainer_config: TrainerConfig) -> Vec<Result<Run>> {
    let sizes = sizes.to_vec();
    let threads: Vec<_> = stage_comms(sizes.len())
        .into_iter()
        .enumerate()
        .map(|(stage, comms)| {
            let (sizes, trainer_config) = (sizes.clone(), trainer_config.clone());
            std::thread::spawn(move || -> Result<Run> {
                let mut comms = comms.into_iter().map(|c| Box::new(c) as Box<dyn Communicator>);
                let world: Arc<dyn Communicator> = Arc::from(comms.next().unwrap());
                let processes = ProcessStages::new(world, || Ok(comms.next().unwrap()))?;
                let model = StagedModel::place_one(&sizes, stage, &cpu(stage), build)?;
                let mut setup = setup_with(Box::new(model), &cpu(stage));
                let strategy = Pipeline::new(kind, 4).across_processes(processes);
                let trainer = Trainer::new(trainer_config)?.with_strategy(strategy);
                let (losses, report) = fit(trainer, &mut setup)?;
                Ok(Run {
                    weights: weights(&setup),
                    losses,
                    report,
                })
            })
        })
        .collect();
    threads.into_iter().map(|t| t.join().unwrap()).collect()
}

#[test]
fn stages_in_processes_train_validate_and_report_as_in_one_process() {
    let two: Build = points_model;
    for (kind, sizes, build) in [
        (ScheduleKind::GPipe, vec![2, 2], two),
        (ScheduleKind::OneFOneB, vec![2, 2], two),
        // The middle stage has a neighbour on each side.
        (ScheduleKind::OneFOneB, vec![2, 2, 2], three_linears),
    ] {
        let label = format!("{} {sizes:?}", kind.name());
        let want = in_one_process(kind, &sizes, build);
        let runs: Vec<Run> = in_processes(kind, &sizes, build, config(1))
            .into_iter()
            .collect::<Result<_>>()
            .unwrap_or_else(|e| panic!("{label}: {e}"));
        let got: Vec<Vec<f32>> = runs.iter().flat_map(|r| r.weights.clone()).collect();
        assert_eq!(got.len(), want.weights.len(), "{label}: every stage's parameters, once");
        assert_close(&got, &want.weights);
        // Every stage reports the last stage's losses and the same validation.
        assert!(!want.losses.is_empty(), "{label}: no step events");
        for (stage, run) in runs.iter().enumerate() {
            assert_eq!(run.losses.len(), want.losses.len(), "{label}: stage {stage}'s steps");
            for (a, b) in run.losses.iter().zip(&want.losses) {
                assert!(
                    (a - b).abs() <= 1e-6 * b.abs().max(1.0),
                    "{label}: stage {stage}: loss {a} vs {b}"
                );
            }
            let (val, want_val) = (
                run.report.last_val.clone().unwrap(),
                want.report.last_val.clone().unwrap(),
            );
            assert!(
                (val.loss - want_val.loss).abs() <= 1e-5 * want_val.loss.abs(),
                "{label}: {val:?} vs {want_val:?}"
            );
            assert_eq!(val.accuracy, want_val.accuracy, "{label}");
        }
    }
}

#[test]
fn what_stages_in_processes_cannot_do_yet_is_refused_before_training() {
    let clipped = TrainerConfig {
        gradient_clip: Some(GradientClip::Norm(1.0)),
        ..config(1)
    };
    for result in in_processes(ScheduleKind::GPipe, &[2, 2], points_model, clipped) {
        let err = result
            .err()
            .expect("clipping by norm across processes is refused")
            .to_string();
        assert!(err.contains("clipping by the total gradient norm"), "{err}");
    }
}
