//! A pipeline whose stages are processes (threads with in-process communicators stand in for
//! them here; CI's MPI step runs the same through `lockstep launch`): each holds one stage,
//! and together they train, report and validate as the same pipeline in one process.

mod replica_support;
mod stage_processes_support;

use std::sync::Arc;

use lockstep_core::data::{DataLoader, DataLoaderConfig};
use lockstep_core::nn::{Flatten, Linear, Relu, Sequential, StagedModel};
use lockstep_core::optim::GradScaler;
use lockstep_core::train::pipeline::{Pipeline, ScheduleKind};
use lockstep_core::train::{ChannelListener, Event, FitReport, GradientClip, Precision, Trainer, TrainerConfig};
use lockstep_core::{Device, Generator, Result};
use replica_support::{Points, SEED, assert_close, config, points_model, setup_with, weights};
use stage_processes_support::cpu;

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
fn in_one_process(kind: ScheduleKind, sizes: &[usize], build: Build, trainer_config: TrainerConfig) -> Run {
    let devices: Vec<Device> = (0..sizes.len()).map(cpu).collect();
    let model = StagedModel::place(sizes, &devices, build).unwrap();
    let mut setup = setup_with(Box::new(model), &devices[0]);
    let trainer = Trainer::new(trainer_config)
        .unwrap()
        .with_strategy(Pipeline::new(kind, 4));
    let (losses, report) = fit(trainer, &mut setup).unwrap();
    Run {
        weights: weights(&setup),
        losses,
        report,
    }
}

/// Each stage in a "process" of its own; `trainer_config` for every stage.
fn in_processes(kind: ScheduleKind, sizes: &[usize], build: Build, trainer_config: TrainerConfig) -> Vec<Result<Run>> {
    let sizes = sizes.to_vec();
    stage_processes_support::in_processes(sizes.len(), move |stage, processes| {
        let model = StagedModel::place_one(&sizes, stage, &cpu(stage), build)?;
        let mut setup = setup_with(Box::new(model), &cpu(stage));
        let strategy = Pipeline::new(kind, 4).across_processes(processes);
        let trainer = Trainer::new(trainer_config.clone())?.with_strategy(strategy);
        let (losses, report) = fit(trainer, &mut setup)?;
        Ok(Run {
            weights: weights(&setup),
            losses,
            report,
        })
    })
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
        let want = in_one_process(kind, &sizes, build, config(1));
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

/// Clipping by the global gradient norm: each stage's squared norm summed over the stages'
/// processes, so every stage scales by the coefficient of the pipeline in one process.
#[test]
fn stages_in_processes_clip_by_the_norm_of_every_stage_s_gradients() {
    let clipped = TrainerConfig {
        gradient_clip: Some(GradientClip::Norm(0.1)),
        ..config(1)
    };
    let sizes = [2, 2, 2];
    let want = in_one_process(ScheduleKind::OneFOneB, &sizes, three_linears, clipped.clone());
    let unclipped = in_one_process(ScheduleKind::OneFOneB, &sizes, three_linears, config(1));
    assert!(
        want.weights != unclipped.weights,
        "the norm never reached 0.1: nothing was clipped"
    );
    let runs: Vec<Run> = in_processes(ScheduleKind::OneFOneB, &sizes, three_linears, clipped)
        .into_iter()
        .collect::<Result<_>>()
        .unwrap();
    let got: Vec<Vec<f32>> = runs.iter().flat_map(|r| r.weights.clone()).collect();
    assert_eq!(got.len(), want.weights.len());
    assert_close(&got, &want.weights);
}

/// 16-mixed: the last stage scales the loss, every stage unscales its own gradients, and the
/// stages agree on overflow (a scale high enough that the first steps overflow), so they skip
/// the steps the pipeline in one process skips and end with its weights.
#[test]
fn stages_in_processes_agree_on_f16_overflow() {
    let scaled = TrainerConfig {
        precision: Precision::Mixed16,
        grad_scaler: Some(GradScaler::new(2f64.powi(24), 2.0, 0.5, 2000).unwrap()),
        ..config(1)
    };
    let sizes = [2, 2, 2];
    let want = in_one_process(ScheduleKind::OneFOneB, &sizes, three_linears, scaled.clone());
    assert!(want.report.skipped_steps > 0, "no step overflowed: nothing to agree on");
    let runs: Vec<Run> = in_processes(ScheduleKind::OneFOneB, &sizes, three_linears, scaled)
        .into_iter()
        .collect::<Result<_>>()
        .unwrap();
    for (stage, run) in runs.iter().enumerate() {
        assert_eq!(run.report.skipped_steps, want.report.skipped_steps, "stage {stage}");
    }
    let got: Vec<Vec<f32>> = runs.iter().flat_map(|r| r.weights.clone()).collect();
    assert_close(&got, &want.weights);
}
