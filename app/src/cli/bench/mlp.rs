//! Full training steps of a ReLU MLP: zero_grad, forward, cross-entropy, backward, SGD step.

use lockstep_core::autocast::AutocastGuard;
use lockstep_core::models;
use lockstep_core::nn::{Module, ModuleExt};
use lockstep_core::optim::{GradScaler, Optimizer, Sgd, SgdConfig};
use lockstep_core::train::Precision;
use lockstep_core::{DType, Device, Generator, Tensor};
use serde::{Deserialize, Serialize};

use super::plan::MlpPlan;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MlpResult {
    pub batch: usize,
    pub steps_per_window: usize,
    pub windows: usize,
    pub median_window_s: f64,
    pub steps_per_s: f64,
    pub samples_per_s: f64,
    pub final_loss: f64,
    /// The process's peak resident memory at the end (both sides measure it the same way).
    #[serde(default)]
    pub peak_rss_bytes: Option<u64>,
    /// Kernels launched per training step, and vendor-library calls (cuBLAS) among the
    /// launches, where the backend counts them (CUDA).
    #[serde(default)]
    pub kernels_per_step: Option<f64>,
    #[serde(default)]
    pub library_calls_per_step: Option<f64>,
}

pub fn run(device: &Device, plan: &MlpPlan) -> anyhow::Result<MlpResult> {
    // The very model `lockstep train --model mlp` trains, so its input and output widths are fixed.
    let (inputs, classes) = (28 * 28, 10);
    let hidden = match plan.layers.as_slice() {
        [i, hidden @ .., c] if (*i, *c) == (inputs, classes) => hidden,
        _ => anyhow::bail!(
            "the benchmark MLP maps {inputs} inputs to {classes} classes, not {:?}",
            plan.layers
        ),
    };
    let generator = Generator::new(0);
    let model = models::mlp(hidden, device, &generator)?;
    let mut opt = Sgd::new(model.parameters(), SgdConfig::new(plan.lr).momentum(plan.momentum))?;
    let x = Tensor::rand_normal([plan.batch, inputs], 0.0, 1.0, DType::F32, &generator, device)?;
    let labels: Vec<u32> = (0..plan.batch)
        .map(|_| generator.next_below(classes as u64) as u32)
        .collect();
    let y = Tensor::from_vec(labels, [plan.batch], device)?;
    let precision = Precision::parse(&plan.precision)?;
    let mut scaler = (precision == Precision::Mixed16).then(GradScaler::default);
    let mut final_loss = f64::NAN;
    let counted_before = device.backend().work_counters();
    let mut windows_run = 0usize;
    let m = plan.timing.measure(|| {
        windows_run += 1;
        let mut loss = None;
        for _ in 0..plan.steps_per_window {
            opt.zero_grad();
            let l = {
                let _autocast = precision.autocast_dtype().map(AutocastGuard::new).transpose()?;
                model.forward(&x)?.cross_entropy(&y)?
            };
            match &mut scaler {
                Some(s) => {
                    s.scale_loss(&l)?.backward()?;
                    let finite = s.unscale(opt.parameters())?;
                    if finite {
                        opt.step()?;
                    }
                    s.update(finite);
                }
                None => {
                    l.backward()?;
                    opt.step()?;
                }
            }
            loss = Some(l);
        }
        // The window's one host sync, as a trainer that logs every N steps has.
        if let Some(l) = loss {
            final_loss = l.item()?;
        }
        device.synchronize()?;
        Ok(())
    })?;
    let steps_per_s = plan.steps_per_window as f64 / m.median_s;
    let counted_after = device.backend().work_counters();
    let steps_run = (windows_run * plan.steps_per_window).max(1) as f64;
    let per_step = |after: Option<u64>, before: Option<u64>| Some((after? - before?) as f64 / steps_run);
    Ok(MlpResult {
        batch: plan.batch,
        steps_per_window: plan.steps_per_window,
        windows: m.reps,
        median_window_s: m.median_s,
        steps_per_s,
        samples_per_s: steps_per_s * plan.batch as f64,
        final_loss,
        peak_rss_bytes: super::machine::peak_rss_bytes(),
        kernels_per_step: per_step(counted_after.kernels, counted_before.kernels),
        library_calls_per_step: per_step(counted_after.library_calls, counted_before.library_calls),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::bench::timing::Timing;

    #[test]
    fn a_tiny_mlp_trains_and_reports_a_rate() {
        let timing = Timing {
            warmup: 1,
            min_reps: 3,
            max_reps: 3,
            min_seconds: 0.0,
        };
        let plan = MlpPlan {
            layers: vec![784, 16, 10],
            batch: 4,
            steps_per_window: 10,
            timing,
            ..MlpPlan::default()
        };
        let r = run(&Device::cpu(), &plan).expect("mlp bench runs");
        assert_eq!(r.windows, 3);
        assert!(r.samples_per_s > 0.0);
        // 40 steps on 4 fixed samples: the loss must have fallen well below ln(10) ≈ 2.3.
        assert!(r.final_loss < 0.5, "loss {}", r.final_loss);
        assert_eq!(r.kernels_per_step, None, "the CPU counts no launches");
    }
}
