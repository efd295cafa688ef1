//! Whole training steps on one fixed batch (zero_grad, forward and loss under the precision's
//! autocast, backward, optional clipping, optimizer step, the loss read back), timed in each
//! precision asked for: what `bench resnet` and `bench gpt` share, and what the peer repeats.

use lockstep_core::autocast::AutocastGuard;
use lockstep_core::backend::KernelTime;
use lockstep_core::optim::{Optimizer, clip_grad_norm};
use lockstep_core::train::Precision;
use lockstep_core::{Device, Tensor};
use serde::{Deserialize, Serialize};

use super::timing::Timing;

/// How `bench resnet` and `bench gpt` time their steps: two warm-up steps (the second still
/// runs first-use checks: the multi-tensor kernels' at the weights' first grouped bf16
/// copies), then at least 3 and 10 seconds' worth, at most 50.
pub const MODEL_TIMING: Timing = Timing {
    warmup: 2,
    min_reps: 3,
    max_reps: 50,
    min_seconds: 10.0,
};

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StepResult {
    pub precision: String,
    pub batch: usize,
    pub steps: usize,
    pub median_step_s: f64,
    /// Images (ResNet) or tokens (GPT) trained on per second.
    pub items_per_s: f64,
    pub final_loss: f64,
    /// The process's peak resident memory after this precision's steps (both sides measure it
    /// the same way; it only grows, so the last row is the run's peak).
    #[serde(default)]
    pub peak_rss_bytes: Option<u64>,
    /// The device allocator's peak of live bytes since it opened (GPUs; PyTorch's
    /// `max_memory_allocated`, reset before each of its variants).
    #[serde(default)]
    pub peak_device_bytes: Option<u64>,
    /// Kernels launched per timed step (GPUs; cuBLAS calls count one each, as PyTorch's
    /// profiler counts the kernels they launch).
    #[serde(default)]
    pub kernels_per_step: Option<f64>,
    /// Times the host waited for the device per timed step (GPUs): the benchmark's own read of
    /// the loss and its synchronize are two; any more are the step's own, each draining the
    /// device's queue mid-step.
    #[serde(default)]
    pub host_waits_per_step: Option<f64>,
}

/// How one model is stepped: its loss on the fixed batch, its optimizer, and the gradient norm
/// to clip to (with the parameters), if any.
pub struct Steps<'a> {
    pub loss: Box<dyn FnMut() -> lockstep_core::Result<Tensor> + 'a>,
    pub optimizer: &'a mut dyn Optimizer,
    pub clip: Option<(Vec<Tensor>, f64)>,
    pub batch: usize,
    /// Images or tokens in one step's batch.
    pub items_per_step: usize,
    /// After each precision's timing, one more step with each kernel timed alone, and its
    /// longest this many kernels printed (0: none).
    pub kernel_profile: usize,
}

/// One result per precision (`32` or `bf16-mixed`; 16-mixed would need a loss scaler).
pub fn measure(
    device: &Device,
    timing: &Timing,
    precisions: &[String],
    mut steps: Steps,
) -> anyhow::Result<Vec<StepResult>> {
    precisions
        .iter()
        .map(|name| {
            let precision = Precision::parse(name)?;
            anyhow::ensure!(
                precision != Precision::Mixed16,
                "the model benchmarks measure 32 and bf16-mixed (16-mixed needs a loss scaler)"
            );
            let mut final_loss = f64::NAN;
            let mut step = || -> lockstep_core::Result<()> {
                steps.optimizer.zero_grad();
                let loss = {
                    let _autocast = precision.autocast_dtype().map(AutocastGuard::new).transpose()?;
                    // As the trainer's step: the weights' copies in one launch per device.
                    lockstep_core::autocast::prefetch(steps.optimizer.parameters())?;
                    (steps.loss)()?
                };
                loss.backward()?;
                if let Some((params, max_norm)) = &steps.clip {
                    clip_grad_norm(params, *max_norm)?;
                }
                steps.optimizer.step()?;
                final_loss = loss.item()?;
                device.synchronize()?;
                Ok(())
            };
            // Counted over the timed steps: the warm-up's first-use checks launch and read more.
            let mut work_before = device.backend().work_counters();
            let mut stepped = 0usize;
            let m = timing.measure(|| {
                if stepped == timing.warmup {
                    work_before = device.backend().work_counters();
                }
                stepped += 1;
                Ok(step()?)
            })?;
            let work_after = device.backend().work_counters();
            let timed = stepped.saturating_sub(timing.warmup).max(1) as f64;
            let per_step = |b: Option<u64>, a: Option<u64>| b.zip(a).map(|(b, a)| (a - b) as f64 / timed);
            let launches =
                |c: lockstep_core::backend::WorkCounters| c.kernels.map(|k| k + c.library_calls.unwrap_or(0));
            let kernels_per_step = per_step(launches(work_before), launches(work_after));
            let host_waits_per_step = per_step(work_before.host_waits, work_after.host_waits);
            if steps.kernel_profile > 0 {
                device.backend().profile_kernels(true)?;
                let stepped = step();
                device.backend().profile_kernels(false)?;
                stepped?;
                let times = device.backend().kernel_times()?;
                print_kernel_profile(name, device, &times, steps.kernel_profile);
            }
            let peak_device_bytes =
                (!device.location().starts_with("cpu")).then(|| device.backend().memory_stats().peak_allocated_bytes);
            // The next precision's buffers have other dtypes: the kept ones would only add to
            // its peak (PyTorch's CPU allocator keeps nothing).
            device.empty_cache()?;
            Ok(StepResult {
                precision: name.clone(),
                batch: steps.batch,
                steps: m.reps,
                median_step_s: m.median_s,
                items_per_s: steps.items_per_step as f64 / m.median_s,
                final_loss,
                peak_rss_bytes: super::machine::peak_rss_bytes(),
                peak_device_bytes,
                kernels_per_step,
                host_waits_per_step,
            })
        })
        .collect()
}

/// The `top` longest kernels of one step, with their share of the step's kernel time.
fn print_kernel_profile(precision: &str, device: &Device, times: &[KernelTime], top: usize) {
    let total: f64 = times.iter().map(|k| k.seconds).sum();
    let launches: u64 = times.iter().map(|k| k.launches).sum();
    println!(
        "kernel profile, {precision}, one step on {} (each kernel timed alone): {launches} launches, {:.1} ms",
        device.location(),
        total * 1e3
    );
    println!("  {:>6}  {:>9}  {:>8}  kernel", "share", "ms", "launches");
    for k in times.iter().take(top) {
        let share = if total > 0.0 { 100.0 * k.seconds / total } else { 0.0 };
        println!(
            "  {share:>5.1}%  {:>9.2}  {:>8}  {}",
            k.seconds * 1e3,
            k.launches,
            k.name
        );
    }
}
