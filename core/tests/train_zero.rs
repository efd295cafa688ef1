//! ZeRO as an option of data parallel: with the optimizer state (stage 1), and the gradients
//! too (stage 2), partitioned over 2 and 4 replicas, 50 AdamW steps with clipping end with the
//! weights plain data parallel ends with, in f32 and bf16-mixed; each replica holds only its
//! share of the state; a checkpoint holds the whole state, written while the shares are spread
//! over the replicas, and resumes on another number of replicas or on one device.

mod replica_support;
mod scratch_support;

use std::path::Path;
use std::sync::Arc;

use lockstep_core::data::{DataLoader, DataLoaderConfig};
use lockstep_core::distributed::{ZeroStage, state_bytes};
use lockstep_core::nn::ModuleExt;
use lockstep_core::optim::{Adam, AdamConfig, DecayScope, GradScaler};
use lockstep_core::train::{
    ChannelListener, Event, FitReport, GradientClip, ModelCheckpoint, Precision, ResumeSetting, Trainer, TrainerConfig,
    TrainingSetup,
};
use lockstep_core::{Device, Result};
use replica_support::{Points, SEED, points_model, setup_with, weights};
use scratch_support::Scratch;

const STEPS: u64 = 50;
const BATCH: usize = 16;

fn build(device: &Device) -> Result<TrainingSetup> {
    let mut setup = setup_with(Box::new(points_model(device)?), device);
    let adamw = AdamConfig::adamw().lr(1e-2).decay_scope(DecayScope::Weights);
    setup.optimizer = Box::new(Adam::adamw(setup.model.parameters(), adamw)?);
    Ok(setup)
}

fn config(precision: Precision, zero: Option<ZeroStage>, steps: u64) -> TrainerConfig {
    TrainerConfig {
        max_epochs: 100,
        max_steps: Some(steps),
        // Small enough that most steps clip.
        gradient_clip: Some(GradientClip::Norm(0.05)),
        precision,
        zero,
        log_every_n_steps: 10,
        // 16-mixed: a scale high enough that the first steps overflow and are skipped.
        grad_scaler: Some(GradScaler::new(2f64.powi(24), 2.0, 0.5, 2000).unwrap()),
        ..Default::default()
    }
}

fn loader() -> DataLoader {
    let config = DataLoaderConfig {
        batch_size: BATCH,
        ..Default::default()
    };
    DataLoader::simple(Arc::new(Points), true, SEED, config).unwrap()
}

fn devices(world: usize) -> Vec<Device> {
    (0..world)
        .map(|i| Device::parse(&format!("cpu:{i}")).unwrap())
        .collect()
}

/// Rank 0's setup and report after `trainer` fits on `world` devices.
fn fit_on(trainer: Trainer, world: usize, setup: Option<TrainingSetup>) -> (TrainingSetup, FitReport) {
    let devices = devices(world);
    let mut setup = setup.unwrap_or_else(|| build(&devices[0]).unwrap());
    let mut trainer = trainer.devices(devices, build);
    let report = trainer.fit(&mut setup, &loader(), None).unwrap();
    (setup, report)
}

fn run(world: usize, precision: Precision, zero: Option<ZeroStage>) -> (TrainingSetup, FitReport) {
    fit_on(Trainer::new(config(precision, zero, STEPS)).unwrap(), world, None)
}

/// Equal within `rel` relative (with a floor for values near zero).
fn assert_close(a: &[Vec<f32>], b: &[Vec<f32>], rel: f32, what: &str) {
    for (pa, pb) in a.iter().zip(b) {
        for (x, y) in pa.iter().zip(pb) {
            assert!((x - y).abs() <= rel * y.abs().max(1e-2), "{what}: {x} vs {y}");
        }
    }
}

#[test]
fn zero_1_and_2_end_with_data_parallels_weights_on_2_and_4_replicas_in_f32_bf16_and_f16_mixed() {
    for precision in [Precision::Full, Precision::MixedBf16, Precision::Mixed16] {
        for world in [2, 4] {
            let (plain, plain_report) = run(world, precision, None);
            let plain = weights(&plain);
            for stage in [ZeroStage::OptimizerState, ZeroStage::Gradients] {
                let (sharded, report) = run(world, precision, Some(stage));
                assert_eq!(report.steps, STEPS);
                let what = format!("ZeRO-{} on {world} replicas, {precision:?}", stage.number());
                // 16-mixed: the loss scaler's overflow verdict is agreed across the shards.
                assert_eq!(report.skipped_steps, plain_report.skipped_steps, "{what}");
                if precision == Precision::Mixed16 {
                    assert!(report.skipped_steps > 0, "{what}: no step overflowed, nothing agreed");
                }
                assert_close(&weights(&sharded), &plain, 1e-5, &what);
                assert_ne!(
                    weights(&sharded),
                    weights(&build(&Device::cpu()).unwrap()),
                    "{what} trained nothing"
                );
            }
        }
    }
}

#[test]
fn each_replica_holds_its_share_of_the_optimizer_state_and_rank_0_ends_with_the_whole() {
    let (plain, plain_report) = run(4, Precision::Full, None);
    let (sharded, report) = run(4, Precision::Full, Some(ZeroStage::Gradients));
    let whole = state_bytes(&plain.optimizer.state());
    assert_eq!(plain_report.optimizer_state_bytes, vec![whole; 4]);
    let shares = &report.optimizer_state_bytes;
    assert_eq!(shares.len(), 4, "{shares:?}");
    assert_eq!(
        shares.iter().sum::<u64>(),
        whole,
        "the shares partition the state: {shares:?}"
    );
    assert!(shares.iter().all(|&s| s < whole), "{shares:?} of {whole}");
    // After the run rank 0's optimizer is whole again, every moment as plain data parallel's.
    let (a, b) = (plain.optimizer.state(), sharded.optimizer.state());
    assert_eq!(a.tensors.len(), b.tensors.len());
    for (name, t) in &a.tensors {
        let other = b.tensor(name).unwrap_or_else(|| panic!("{name} missing"));
        assert_close(
            &[other.to_vec::<f32>().unwrap()],
            &[t.to_vec::<f32>().unwrap()],
            1e-4,
            name,
        );
    }
}

/// A run's final weights and its logged losses by step.
type Leg = (Vec<Vec<f32>>, Vec<(u64, f64)>);

/// Up to step `steps` on `world` replicas (ZeRO `zero`), resumed from `from` when given,
/// saving `last.safetensors` in `dir` at the end.
fn leg(world: usize, zero: Option<ZeroStage>, steps: u64, from: Option<&Path>, dir: &Path) -> Leg {
    let config = TrainerConfig {
        // Resumed on another number of replicas, which this model's steps do not depend on.
        resume_overrides: vec![ResumeSetting::WorldSize, ResumeSetting::Schedule],
        ..config(Precision::Full, zero, steps)
    };
    let mut trainer = Trainer::new(config).unwrap();
    trainer.add_callback(ModelCheckpoint::new(dir));
    let (listener, events) = ChannelListener::new(1 << 10);
    trainer.add_listener(listener);
    let device = Device::parse("cpu:0").unwrap();
    let mut setup = build(&device).unwrap();
    if let Some(path) = from {
        trainer.resume(&mut setup, path).unwrap();
    }
    let (setup, _) = if world == 1 {
        let report = trainer.fit(&mut setup, &loader(), None).unwrap();
        (setup, report)
    } else {
        fit_on(trainer, world, Some(setup))
    };
    let losses = events
        .try_iter()
        .filter_map(|r| match r.event {
            Event::Step { step, loss, .. } => Some((step, loss)),
            _ => None,
        })
        .collect();
    (weights(&setup), losses)
}

/// The losses `resumed` logged equal `uninterrupted`'s at the same steps within 1e-5
/// relative, and the weights end equal up to the replicas' summation order.
fn assert_goes_on(resumed: &Leg, uninterrupted: &Leg, what: &str) {
    assert!(!resumed.1.is_empty(), "{what}: no steps logged");
    for (step, loss) in &resumed.1 {
        let (_, expected) = uninterrupted
            .1
            .iter()
            .find(|(s, _)| s == step)
            .expect("the same steps logged");
        assert!(
            (loss - expected).abs() <= 1e-5 * expected.abs(),
            "{what}, step {step}: loss {loss} vs {expected}"
        );
    }
    assert_close(&resumed.0, &uninterrupted.0, 1e-4, what);
}

#[test]
fn a_sharded_run_resumes_on_fewer_replicas_and_a_plain_checkpoint_resumes_under_zero() {
    let dir = Scratch::new("zero-resume");
    let step = |name: &str| dir.path().join(name);
    let uninterrupted = leg(2, None, 60, None, &step("plain"));
    let last = |name: &str| step(name).join("last.safetensors");
    // 4 replicas with ZeRO-2, then 2 with ZeRO-1, then one device.
    leg(4, Some(ZeroStage::Gradients), 20, None, &step("a"));
    leg(2, Some(ZeroStage::OptimizerState), 40, Some(&last("a")), &step("b"));
    let resumed = leg(1, None, 60, Some(&last("b")), &step("c"));
    assert_goes_on(&resumed, &uninterrupted, "4 -> 2 -> 1 replicas");
    // A plain data-parallel checkpoint goes on under ZeRO-2.
    leg(2, None, 30, None, &step("d"));
    let resumed = leg(2, Some(ZeroStage::Gradients), 60, Some(&last("d")), &step("e"));
    assert_goes_on(&resumed, &uninterrupted, "DDP -> ZeRO-2");
}
