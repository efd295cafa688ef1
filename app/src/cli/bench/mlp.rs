//! Full training steps of a ReLU MLP: zero_grad, forward, cross-entropy, backward, SGD step.

use lockstep_core::autocast::AutocastGuard;
use lockstep_core::backend::WorkCounters;
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
    /// Kernels launched (wgpu: compute dispatches) per training step, and vendor-library calls
    /// (cuBLAS) among the launches, where the backend counts them (CUDA, wgpu).
    #[serde(default)]
    pub kernels_per_step: Option<f64>,
    #[serde(default)]
    pub library_calls_per_step: Option<f64>,
    /// Bind groups created per training step, where the backend counts them (wgpu).
    #[serde(default)]
    pub bind_groups_per_step: Option<f64>,
}

/// The device's counters at one moment: launches, and bind groups on wgpu devices.
struct Counted {
    work: WorkCounters,
    bind_groups: Option<u64>,
}

impl Counted {
    fn now(device: &Device) -> Counted {
        Counted {
            work: device.backend().work_counters(),
            bind_groups: lockstep_wgpu::backend_of(device).map(|b| b.bind_groups_created()),
        }
    }
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
    // Counted over the last window only: steady steps, as the peer's profiler counts them, without
    // the first step's one-off work (creating momentum buffers).
    let mut last_window = None;
    let m = plan.timing.measure(|| {
        last_window = Some(Counted::now(device));
        let mut loss = None;
        for _ in 0..plan.steps_per_window {
            opt.zero_grad();
            let l = {
                let _autocast = precision.autocast_dtype().map(AutocastGuard::new).transpose()?;
                // As the trainer's step: the weights' copies in one launch per device.
                lockstep_core::autocast::prefetch(opt.parameters())?;
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
    let after = Counted::now(device);
    let steps = plan.steps_per_window.max(1) as f64;
    let per_step = |count: fn(&Counted) -> Option<u64>| {
        let before = count(last_window.as_ref()?)?;
        Some((count(&after)? - before) as f64 / steps)
    };
    Ok(MlpResult {
        batch: plan.batch,
        steps_per_window: plan.steps_per_window,
        windows: m.reps,
        median_window_s: m.median_s,
        steps_per_s,
        samples_per_s: steps_per_s * plan.batch as f64,
        final_loss,
        peak_rss_bytes: super::machine::peak_rss_bytes(),
        kernels_per_step: per_step(|c| c.work.kernels),
        library_calls_per_step: per_step(|c| c.work.library_calls),
        bind_groups_per_step: per_step(|c| c.bind_groups),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::bench::timing::Timing;

    /// A 784-16-10 MLP on 4 samples, `steps` per window, 1 warm-up and 3 measured windows.
    fn tiny_plan(steps: usize) -> MlpPlan {
        let timing = Timing {
            warmup: 1,
            min_reps: 3,
            max_reps: 3,
            min_seconds: 0.0,
        };
        MlpPlan {
            layers: vec![784, 16, 10],
            batch: 4,
            steps_per_window: steps,
            timing,
            ..MlpPlan::default()
        }
    }

    #[test]
    fn a_tiny_mlp_trains_and_reports_a_rate() {
        let r = run(&Device::cpu(), &tiny_plan(10)).expect("mlp bench runs");
        assert_eq!(r.windows, 3);
        assert!(r.samples_per_s > 0.0);
        // 40 steps on 4 fixed samples: the loss must have fallen well below ln(10) ≈ 2.3.
        assert!(r.final_loss < 0.5, "loss {}", r.final_loss);
        assert_eq!(r.kernels_per_step, None, "the CPU counts no launches");
        assert_eq!(r.bind_groups_per_step, None, "the CPU has no bind groups");
    }

    #[test]
    fn on_wgpu_it_counts_dispatches_and_bind_groups_per_step() {
        lockstep_wgpu::register();
        let device = match Device::parse("wgpu:0") {
            Ok(d) => d,
            Err(e) => {
                // CI installs lavapipe and sets LOCKSTEP_EXPECT_WGPU=1: there a skip is a failure.
                assert!(
                    std::env::var("LOCKSTEP_EXPECT_WGPU").as_deref() != Ok("1"),
                    "LOCKSTEP_EXPECT_WGPU=1 but no wgpu adapter opened: {e}"
                );
                eprintln!("\n*** SKIPPED: no wgpu adapter ({e}) ***\n");
                return;
            }
        };
        let r = run(&device, &tiny_plan(2)).expect("mlp bench runs on wgpu");
        let dispatches = r.kernels_per_step.expect("wgpu counts dispatches");
        let groups = r.bind_groups_per_step.expect("wgpu counts bind groups");
        // Forward, loss, backward and two layers' updates take well over ten dispatches.
        assert!(dispatches > 10.0, "{dispatches} dispatches per step");
        // Steady steps all record the same work; a fraction means one-off work was counted.
        assert_eq!(dispatches.fract(), 0.0, "{dispatches} dispatches per step");
        // Steady steps bind the same pooled buffers: their bind groups come from the cache.
        assert!(
            groups <= 2.0,
            "{groups} new bind groups for {dispatches} dispatches per step"
        );
        assert_eq!(r.library_calls_per_step, None, "wgpu calls no vendor library");
    }
}
