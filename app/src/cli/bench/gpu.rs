//! `lockstep bench gpu --device wgpu:N`: GEMM GFLOP/s at 256, 512 and 1024 with the tiled kernel
//! and the naive one (one invocation per output), and MLP training steps per second, on the GPU
//! and on the CPU backend in the same run, so every number has its neighbours; with the GPU's
//! dispatches and bind groups per MLP step, what a step costs the driver.

use anyhow::Context;
use lockstep_core::Device;

use super::gemm::{self, GemmResult};
use super::mlp;
use super::plan::MlpPlan;
use super::timing::Timing;
use crate::cli::table;

pub const SIZES: [usize; 3] = [256, 512, 1024];

/// GPU repetitions are long on software adapters (a naive 1024 product takes seconds on
/// lavapipe): fewer repetitions, still a median of at least three.
const TIMING: Timing = Timing {
    warmup: 1,
    min_reps: 3,
    max_reps: 200,
    min_seconds: 1.0,
};

pub fn run(device: &Device) -> anyhow::Result<()> {
    let cpu = Device::cpu();
    println!(
        "device: {}, {}; baseline: {}, {}",
        device,
        device.info().name,
        cpu,
        cpu.info().name
    );
    let mut rows = Vec::new();
    for n in SIZES {
        eprintln!("running gemm {n}x{n} (tiled, naive, cpu) …");
        let tiled = gemm::run(device, n, &TIMING).with_context(|| format!("tiled gemm at {n}"))?;
        let naive = gemm::run_with(device, n, &TIMING, lockstep_wgpu::matmul_naive)
            .with_context(|| format!("naive gemm at {n}"))?;
        let on_cpu = gemm::run(&cpu, n, &TIMING).with_context(|| format!("cpu gemm at {n}"))?;
        rows.push(gemm_row(n, &tiled, &naive, &on_cpu));
    }
    println!(
        "{}",
        table::render(
            &["GEMM (GFLOP/s)", "TILED", "NAIVE", "TILED/NAIVE", "CPU", "TILED/CPU"],
            &rows
        )
    );
    eprintln!("running the MLP training step on both devices …");
    let plan = MlpPlan {
        steps_per_window: 5,
        timing: TIMING,
        ..MlpPlan::default()
    };
    let gpu_mlp = mlp::run(device, &plan).context("MLP on the GPU")?;
    let cpu_mlp = mlp::run(&cpu, &plan).context("MLP on the CPU")?;
    let layers: Vec<String> = plan.layers.iter().map(|l| l.to_string()).collect();
    println!(
        "{}",
        table::render(
            &["MLP STEP", device.location(), "CPU", "GPU/CPU"],
            &[
                vec![
                    format!("{} batch {} (steps/s)", layers.join("-"), plan.batch),
                    format!("{:.1}", gpu_mlp.steps_per_s),
                    format!("{:.1}", cpu_mlp.steps_per_s),
                    format!("{:.3}", gpu_mlp.steps_per_s / cpu_mlp.steps_per_s),
                ],
                // The driver work behind each step (the CPU has none to count).
                count_row("dispatches per step", gpu_mlp.kernels_per_step),
                count_row("bind groups per step", gpu_mlp.bind_groups_per_step),
            ]
        )
    );
    Ok(())
}

/// A per-step count of the GPU's (the CPU counts none), or "-" where it is not counted.
fn count_row(label: &str, count: Option<f64>) -> Vec<String> {
    let shown = count.map_or("-".into(), |c| format!("{c:.1}"));
    vec![label.into(), shown, "-".into(), "-".into()]
}

fn gemm_row(n: usize, tiled: &GemmResult, naive: &GemmResult, cpu: &GemmResult) -> Vec<String> {
    vec![
        format!("{n}x{n}x{n}"),
        format!("{:.2}", tiled.gflops),
        format!("{:.2}", naive.gflops),
        format!("{:.1}x", tiled.gflops / naive.gflops),
        format!("{:.1}", cpu.gflops),
        format!("{:.3}", tiled.gflops / cpu.gflops),
    ]
}
