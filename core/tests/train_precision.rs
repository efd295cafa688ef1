//! Mixed precision in the Trainer: an f16 overflow skips the step and halves the loss scale
//! while training goes on; with accumulation, the gradients are unscaled once, then clipped,
//! then stepped (the update computed by hand, as PyTorch's recipe gives it).

use std::sync::Arc;

use lockstep_core::data::{DataLoader, DataLoaderConfig, Dataset, HostTensor, Sample};
use lockstep_core::nn::{Linear, Module, ModuleExt};
use lockstep_core::optim::{GradScaler, Sgd, SgdConfig};
use lockstep_core::train::{
    ChannelListener, Event, GradientClip, Precision, Task, Trainer, TrainerConfig, TrainingSetup,
};
use lockstep_core::{DType, Device, HostVec, Result, Tensor};

/// Mean squared error regression: batches are `[inputs, targets]`.
struct Regression;

impl Task for Regression {
    fn loss(&self, model: &dyn Module, batch: &[Tensor]) -> Result<Tensor> {
        model.forward(&batch[0])?.mse_loss(&batch[1])
    }
    fn eval_sums(&self, model: &dyn Module, batch: &[Tensor]) -> Result<(Tensor, Tensor)> {
        let loss = self.loss(model, batch)?;
        Ok((loss.clone(), loss.affine(0.0, 0.0)?))
    }
}

/// (x, target) pairs, in order.
struct Points(Vec<([f32; 2], f32)>);

impl Dataset for Points {
    fn len(&self) -> usize {
        self.0.len()
    }
    fn get(&self, i: usize) -> Result<Sample> {
        let (x, t) = self.0[i];
        Ok(vec![
            HostTensor::new(HostVec::F32(x.to_vec()), [2])?,
            HostTensor::new(HostVec::F32(vec![t]), [1])?,
        ])
    }
}

fn loader(points: Vec<([f32; 2], f32)>, batch_size: usize) -> DataLoader {
    let config = DataLoaderConfig {
        batch_size,
        num_workers: 0,
        ..Default::default()
    };
    DataLoader::simple(Arc::new(Points(points)), false, 0, config).unwrap()
}

/// A 2 -> 1 linear model without bias, weights `w`, trained by plain SGD.
fn setup(w: [f32; 2], lr: f64) -> TrainingSetup {
    let device = Device::cpu();
    let weight = Tensor::from_vec(w.to_vec(), [1, 2], &device)
        .unwrap()
        .requires_grad(true);
    let model = Linear { weight, bias: None };
    let optimizer = Sgd::new(model.parameters(), SgdConfig::new(lr)).unwrap();
    TrainingSetup {
        model: Box::new(model),
        optimizer: Box::new(optimizer),
        scheduler: None,
        task: Box::new(Regression),
        device,
        generators: vec![],
        model_name: "linear".into(),
        hparams: Default::default(),
    }
}

fn weights(s: &TrainingSetup) -> Vec<f32> {
    s.model.parameters()[0].to_vec::<f32>().unwrap()
}

/// 12 samples near t = 0.5 x0 - 0.25 x1; sample 5 (step 6 at batch 1) has target 1e4: its
/// gradient, times the scale, overflows f16 while its loss (computed in f32) stays finite.
fn points_with_an_outlier() -> Vec<([f32; 2], f32)> {
    (0..12)
        .map(|i| {
            let x = [((i * 7) % 5) as f32 / 5.0 - 0.4, ((i * 3) % 4) as f32 / 4.0 - 0.3];
            let t = if i == 5 { 1e4 } else { 0.5 * x[0] - 0.25 * x[1] };
            (x, t)
        })
        .collect()
}

fn mixed16(max_steps: u64) -> TrainerConfig {
    TrainerConfig {
        max_epochs: 1,
        max_steps: Some(max_steps),
        log_every_n_steps: 1,
        precision: Precision::Mixed16,
        grad_scaler: Some(GradScaler::new(1024.0, 2.0, 0.5, 2000).unwrap()),
        ..Default::default()
    }
}

/// Trains `steps` steps; returns the weights and the (loss scale, skipped) of each step event.
fn run(steps: u64) -> (Vec<f32>, Vec<(f64, u64)>) {
    let mut s = setup([0.3, 0.1], 0.1);
    let (events, rx) = ChannelListener::new(1000);
    let mut trainer = Trainer::new(mixed16(steps)).unwrap();
    trainer.add_listener(events);
    trainer.fit(&mut s, &loader(points_with_an_outlier(), 1), None).unwrap();
    let log = rx
        .try_iter()
        .filter_map(|r| match r.event {
            Event::Step {
                loss_scale,
                skipped_steps,
                ..
            } => Some((loss_scale.expect("16-mixed reports its scale"), skipped_steps)),
            _ => None,
        })
        .collect();
    (weights(&s), log)
}

#[test]
fn an_f16_overflow_skips_the_step_halves_the_scale_and_training_goes_on() {
    let (before, _) = run(5);
    let (after_skip, _) = run(6);
    let (later, log) = run(12);
    assert_eq!(before, after_skip, "the overflowing step 6 changed the weights");
    assert_ne!(after_skip, later, "training stopped after the skip");
    assert!(later.iter().all(|w| w.is_finite()), "{later:?}");
    let scales: Vec<f64> = log.iter().map(|(s, _)| *s).collect();
    let skipped: Vec<u64> = log.iter().map(|(_, k)| *k).collect();
    assert_eq!(scales, [vec![1024.0; 5], vec![512.0; 7]].concat(), "{log:?}");
    assert_eq!(skipped, [vec![0; 5], vec![1; 7]].concat(), "{log:?}");
}

/// One optimizer step over two micro-batches of one sample (loss/2 each) at scale 8, clipped to
/// `max_norm`, SGD lr 0.1; returns the weights.
fn accumulated_step(max_norm: f64) -> Vec<f32> {
    let points = vec![([1.0, 2.0], 1.0), ([2.0, -1.0], 0.0)];
    let mut s = setup([0.5, -0.25], 0.1);
    let config = TrainerConfig {
        max_steps: Some(1),
        accumulate_grad_batches: 2,
        gradient_clip: Some(GradientClip::Norm(max_norm)),
        precision: Precision::Mixed16,
        grad_scaler: Some(GradScaler::new(8.0, 2.0, 0.5, 2000).unwrap()),
        ..Default::default()
    };
    Trainer::new(config)
        .unwrap()
        .fit(&mut s, &loader(points, 1), None)
        .unwrap();
    weights(&s)
}

#[test]
fn accumulation_unscales_once_then_clips_then_steps() {
    // By hand: y1 = 0.5 - 0.5 = 0, dL1/dw = 2 (0 - 1) [1, 2] = [-2, -4];
    //          y2 = 1 + 0.25 = 1.25, dL2/dw = 2 (1.25) [2, -1] = [5, -2.5];
    // the mean is [1.5, -3.25], norm sqrt(12.8125) = 3.58; clipped to max_norm; w -= 0.1 g.
    // Clipping at 0.5 must act; at 10 it must not (the scaled norm, 28.6, would be clipped:
    // that catches a missing or late unscale).
    let g = [1.5f64, -3.25];
    let norm = (g[0] * g[0] + g[1] * g[1]).sqrt();
    for max_norm in [0.5, 10.0] {
        let coef = (max_norm / (norm + 1e-6)).min(1.0);
        let expected = [0.5 - 0.1 * g[0] * coef, -0.25 - 0.1 * g[1] * coef];
        let got = accumulated_step(max_norm);
        for (e, g) in expected.iter().zip(&got) {
            assert!(
                (e - *g as f64).abs() < 1e-6,
                "clip {max_norm}: expected {expected:?}, got {got:?}"
            );
        }
    }
}

#[test]
fn precisions_have_lightnings_names() {
    assert!(Precision::parse("8-mixed").is_err());
    assert_eq!(Precision::parse("16-mixed").unwrap(), Precision::Mixed16);
    assert_eq!(
        Precision::parse("bf16-mixed").unwrap().autocast_dtype(),
        Some(DType::BF16)
    );
}

#[test]
fn step_events_say_where_the_time_went() {
    let mut s = setup([0.3, 0.1], 0.1);
    let (events, rx) = ChannelListener::new(100);
    let config = TrainerConfig {
        max_steps: Some(4),
        log_every_n_steps: 2,
        ..Default::default()
    };
    let mut trainer = Trainer::new(config).unwrap();
    trainer.add_listener(events);
    trainer.fit(&mut s, &loader(points_with_an_outlier(), 1), None).unwrap();
    let times: Vec<_> = rx
        .try_iter()
        .filter_map(|r| match r.event {
            Event::Step { times, .. } => times,
            _ => None,
        })
        .collect();
    assert_eq!(times.len(), 2, "one split per step event");
    for t in times {
        assert!(t.phases().iter().all(|(_, s)| *s >= 0.0), "{t:?}");
        assert!(t.forward > 0.0 && t.backward > 0.0 && t.optimizer > 0.0, "{t:?}");
        assert_eq!(t.communication, 0.0, "no replicas, no communication: {t:?}");
    }
}
