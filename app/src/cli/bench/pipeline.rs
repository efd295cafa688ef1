//! `lockstep bench pipeline`: training steps of a deep MLP split over devices, naive model
//! parallel (one micro-batch: one stage works at a time) against GPipe and 1F1B with M
//! micro-batches, with the measured bubble beside the textbook (P−1)/(M+P−1).

use anyhow::Context;
use lockstep_core::nn::{Linear, ModuleExt, Relu, Sequential, StagedModel, sizes_by_parameters};
use lockstep_core::optim::{Sgd, SgdConfig};
use lockstep_core::train::pipeline::{Pipeline, ScheduleKind};
use lockstep_core::train::{Classification, MicroBatch, StepTimes, Strategy, TrainerConfig, TrainingSetup};
use lockstep_core::{DType, Device, Generator, Tensor};
use serde::Serialize;

use super::timing::{Timing, median};
use crate::cli::table;

#[derive(Clone, Debug, Serialize)]
pub struct PipelinePlan {
    pub devices: Vec<String>,
    /// Hidden layers of `width` features (each with its ReLU), then a 10-way classifier.
    pub depth: usize,
    pub width: usize,
    pub batch: usize,
    pub micro_batches: usize,
    /// Compute threads of each CPU stage.
    pub threads_per_stage: usize,
    pub timing: Timing,
}

#[derive(Clone, Debug, Serialize)]
pub struct ScheduleResult {
    pub schedule: String,
    pub micro_batches: usize,
    pub steps_per_s: f64,
    /// Median over the timed steps of 1 − Σ stage compute / (stages × step time).
    pub bubble_measured: f64,
    pub bubble_theory: f64,
}

#[derive(Clone, Debug, Serialize)]
pub struct PipelineReport {
    pub plan: PipelinePlan,
    pub stage_layers: Vec<usize>,
    pub results: Vec<ScheduleResult>,
}

fn deep_mlp(plan: &PipelinePlan, device: &Device) -> lockstep_core::Result<Sequential> {
    let init = Generator::new(0);
    let mut model = Sequential::new();
    for _ in 0..plan.depth {
        model = model
            .add(Linear::new(plan.width, plan.width, true, device, &init)?)
            .add(Relu);
    }
    Ok(model.add(Linear::new(plan.width, 10, true, device, &init)?))
}

pub fn run(plan: &PipelinePlan) -> anyhow::Result<PipelineReport> {
    let devices = plan
        .devices
        .iter()
        .map(|d| Ok(Device::parse(d)?))
        .collect::<anyhow::Result<Vec<_>>>()?;
    anyhow::ensure!(
        devices.len() >= 2,
        "bench pipeline needs at least two devices, e.g. --devices cpu:0,cpu:1"
    );
    let stage_layers = sizes_by_parameters(&deep_mlp(plan, &devices[0])?, devices.len())?;
    let runs = [
        ("naive", ScheduleKind::GPipe, 1),
        ("gpipe", ScheduleKind::GPipe, plan.micro_batches),
        ("1f1b", ScheduleKind::OneFOneB, plan.micro_batches),
    ];
    let mut results = Vec::new();
    for (name, kind, micro_batches) in runs {
        eprintln!("running {name} with {micro_batches} micro-batch(es) …");
        let result = schedule_steps(plan, &devices, &stage_layers, kind, micro_batches)
            .with_context(|| format!("{name} steps"))?;
        results.push(ScheduleResult {
            schedule: name.into(),
            ..result
        });
    }
    Ok(PipelineReport {
        plan: plan.clone(),
        stage_layers,
        results,
    })
}

fn schedule_steps(
    plan: &PipelinePlan,
    devices: &[Device],
    stage_layers: &[usize],
    kind: ScheduleKind,
    micro_batches: usize,
) -> anyhow::Result<ScheduleResult> {
    let model = StagedModel::place(stage_layers, devices, |d| deep_mlp(plan, d))?;
    let optimizer = Sgd::new(model.parameters(), SgdConfig::new(0.01).momentum(0.9))?;
    let mut setup = TrainingSetup {
        model: Box::new(model),
        optimizer: Box::new(optimizer),
        scheduler: None,
        task: Box::new(Classification),
        device: devices[0].clone(),
        generators: Vec::new(),
        model_name: "deep-mlp".into(),
        hparams: Default::default(),
    };
    let mut strategy = Pipeline::new(kind, micro_batches).with_cpu_threads_per_stage(plan.threads_per_stage);
    strategy.setup(&mut setup, &TrainerConfig::default())?;
    let data = Generator::new(1);
    let last = &devices[devices.len() - 1];
    let x = Tensor::rand_uniform([plan.batch, plan.width], -1.0, 1.0, DType::F32, &data, &devices[0])?;
    let labels: Vec<u32> = (0..plan.batch as u32).map(|i| i % 10).collect();
    let tensors = [x, Tensor::from_vec(labels, [plan.batch], last)?];
    let mut bubbles = Vec::new();
    let measured = plan.timing.measure(|| {
        let micro = MicroBatch::whole(&tensors);
        let loss = strategy.forward_backward(&setup, &micro, &mut StepTimes::default())?;
        setup.optimizer.step()?;
        setup.optimizer.zero_grad();
        loss.item()?;
        if let Some(profile) = strategy.last_profile() {
            bubbles.push(profile.bubble_fraction());
        }
        Ok(())
    })?;
    let stages = devices.len() as f64;
    Ok(ScheduleResult {
        schedule: kind.name().into(),
        micro_batches,
        steps_per_s: 1.0 / measured.median_s.max(1e-12),
        bubble_measured: median(&mut bubbles),
        bubble_theory: (stages - 1.0) / (micro_batches as f64 + stages - 1.0),
    })
}

pub fn table(report: &PipelineReport) -> String {
    let naive = report.results.first().map_or(1.0, |r| r.steps_per_s);
    let rows: Vec<Vec<String>> = report
        .results
        .iter()
        .map(|r| {
            vec![
                r.schedule.clone(),
                r.micro_batches.to_string(),
                format!("{:.3}", r.steps_per_s),
                format!("{:.2}x", r.steps_per_s / naive),
                format!("{:.1}%", 100.0 * r.bubble_measured),
                format!("{:.1}%", 100.0 * r.bubble_theory),
            ]
        })
        .collect();
    let plan = &report.plan;
    format!(
        "{} stages on {} ({:?} layers each, {} compute thread(s) per CPU stage), MLP {}x{} + classifier, batch {}\n{}",
        plan.devices.len(),
        plan.devices.join(","),
        report.stage_layers,
        plan.threads_per_stage,
        plan.depth,
        plan.width,
        plan.batch,
        table::render(
            &[
                "SCHEDULE",
                "MICRO-BATCHES",
                "STEPS/S",
                "VS NAIVE",
                "BUBBLE",
                "THEORY (P-1)/(M+P-1)"
            ],
            &rows
        )
    )
}
