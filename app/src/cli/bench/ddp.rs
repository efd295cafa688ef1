//! Data-parallel steps of the benchmark MLP, one replica per device on its own thread, to show
//! how much of the gradient all-reduce hides behind backward: per step and rank, backward time,
//! all-reduce time (on the communication thread), the part of it that ran while backward was
//! still computing, and the wait after backward (the part not hidden).

use std::sync::Arc;
use std::time::Instant;

use anyhow::Context;
use lockstep_core::distributed::{Reducer, ReducerConfig};
use lockstep_core::models;
use lockstep_core::nn::{Module, ModuleExt};
use lockstep_core::optim::{Optimizer, Sgd, SgdConfig};
use lockstep_core::{DType, Device, Generator, Tensor};
use serde::Serialize;

use super::timing;
use crate::cli::table;

#[derive(Clone, Debug, Serialize)]
pub struct DdpPlan {
    pub devices: Vec<String>,
    pub hidden: Vec<usize>,
    /// The global batch, split evenly over the devices.
    pub batch: usize,
    pub warmup_steps: usize,
    pub steps: usize,
    pub first_bucket_bytes: usize,
    pub bucket_bytes: usize,
}

/// Medians over the timed steps of one rank, in seconds.
#[derive(Clone, Debug, Default, Serialize)]
pub struct RankResult {
    pub rank: usize,
    pub device: String,
    pub buckets: usize,
    pub step: f64,
    pub backward: f64,
    pub all_reduce: f64,
    pub hidden: f64,
    pub exposed: f64,
}

impl RankResult {
    pub fn hidden_percent(&self) -> f64 {
        100.0 * self.hidden / self.all_reduce.max(1e-12)
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct DdpReport {
    pub plan: DdpPlan,
    pub gradient_bytes: usize,
    pub ranks: Vec<RankResult>,
    pub samples_per_s: f64,
}

pub fn run(plan: &DdpPlan) -> anyhow::Result<DdpReport> {
    let devices = plan
        .devices
        .iter()
        .map(|d| Ok(Device::parse(d)?))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let world = devices.len();
    anyhow::ensure!(
        world >= 2,
        "bench ddp needs at least two devices, e.g. --devices cpu:0,cpu:1"
    );
    anyhow::ensure!(
        plan.batch.is_multiple_of(world) && plan.batch >= world,
        "--batch {} does not split evenly over {world} devices",
        plan.batch
    );
    // PyTorch's default collective timeout: 10 minutes.
    let comms = lockstep_core::device::communicator_group(&devices, std::time::Duration::from_secs(600))?;
    let threads: Vec<_> = comms
        .into_iter()
        .zip(devices)
        .map(|(comm, device)| {
            let plan = plan.clone();
            std::thread::spawn(move || replica(&plan, device, Arc::from(comm)))
        })
        .collect();
    let mut ranks = Vec::new();
    let mut gradient_bytes = 0;
    for (rank, t) in threads.into_iter().enumerate() {
        let (result, bytes) = t
            .join()
            .map_err(|_| anyhow::anyhow!("replica {rank} panicked"))?
            .with_context(|| format!("replica {rank}"))?;
        ranks.push(result);
        gradient_bytes = bytes;
    }
    let slowest = ranks.iter().map(|r| r.step).fold(0.0, f64::max);
    Ok(DdpReport {
        plan: plan.clone(),
        gradient_bytes,
        samples_per_s: plan.batch as f64 / slowest.max(1e-12),
        ranks,
    })
}

/// One rank's steps: its medians and the model's gradient bytes.
fn replica(
    plan: &DdpPlan,
    device: Device,
    comm: Arc<dyn lockstep_core::backend::Communicator>,
) -> anyhow::Result<(RankResult, usize)> {
    let rank = comm.rank();
    let generator = Generator::new(0);
    let model = models::mlp(&plan.hidden, &device, &generator)?;
    let config = ReducerConfig {
        first_bucket_bytes: plan.first_bucket_bytes,
        bucket_bytes: plan.bucket_bytes,
    };
    let reducer = Reducer::for_model(&model, comm, config)?;
    let mut opt = Sgd::new(model.parameters(), SgdConfig::new(0.01).momentum(0.9))?;
    let shard = plan.batch / plan.devices.len();
    let data = Generator::new(1 + rank as u64);
    let x = Tensor::rand_normal([shard, 28 * 28], 0.0, 1.0, DType::F32, &data, &device)?;
    let labels: Vec<u32> = (0..shard).map(|_| data.next_below(10) as u32).collect();
    let y = Tensor::from_vec(labels, [shard], &device)?;
    let mut samples: Vec<[f64; 5]> = Vec::new();
    for step in 0..plan.warmup_steps + plan.steps {
        let started = Instant::now();
        opt.zero_grad();
        let loss = model.forward(&x)?.cross_entropy(&y)?;
        let backward_started = Instant::now();
        loss.backward()?;
        // Backward's queued device work is part of backward, not of the wait.
        device.synchronize()?;
        let backward = backward_started.elapsed().as_secs_f64();
        reducer.finish()?;
        opt.step()?;
        device.synchronize()?;
        let comm = reducer.last_comm_times();
        if step >= plan.warmup_steps {
            let step_time = started.elapsed().as_secs_f64();
            samples.push([step_time, backward, comm.all_reduce, comm.hidden(), comm.exposed]);
        }
    }
    let median = |i: usize| timing::median(&mut samples.iter().map(|s| s[i]).collect::<Vec<_>>());
    let result = RankResult {
        rank,
        device: device.location().to_string(),
        buckets: reducer.buckets().len(),
        step: median(0),
        backward: median(1),
        all_reduce: median(2),
        hidden: median(3),
        exposed: median(4),
    };
    let bytes = model
        .parameters()
        .iter()
        .map(|p| p.elem_count() * p.dtype().size_in_bytes())
        .sum();
    Ok((result, bytes))
}

/// The per-rank table, in milliseconds.
pub fn table(report: &DdpReport) -> String {
    let header = [
        "rank",
        "device",
        "buckets",
        "step ms",
        "backward ms",
        "all-reduce ms",
        "hidden ms",
        "exposed ms",
        "hidden %",
    ];
    let ms = |s: f64| format!("{:.1}", s * 1e3);
    let rows: Vec<Vec<String>> = report
        .ranks
        .iter()
        .map(|r| {
            vec![
                r.rank.to_string(),
                r.device.clone(),
                r.buckets.to_string(),
                ms(r.step),
                ms(r.backward),
                ms(r.all_reduce),
                ms(r.hidden),
                ms(r.exposed),
                format!("{:.0}", r.hidden_percent()),
            ]
        })
        .collect();
    format!(
        "{}\ngradients: {:.1} MiB per replica; {:.0} samples/s over {} devices (global batch {})",
        table::render(&header, &rows),
        report.gradient_bytes as f64 / (1 << 20) as f64,
        report.samples_per_s,
        report.ranks.len(),
        report.plan.batch
    )
}
