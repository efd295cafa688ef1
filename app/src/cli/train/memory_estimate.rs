//! `lockstep train --estimate-memory`: each rank's memory at its peak for the run the flags
//! describe, as one table, without training.

use lockstep_core::data::Dataset;
use lockstep_core::train::{MemoryEstimate, MemoryEstimateConfig, Precision, estimate_memory};
use lockstep_core::{Device, Error};
use lockstep_flags::train::Args;
use lockstep_flags::world::WorldEnv;

/// Estimates the run of `args` on batches of `train_set` and prints the table.
pub fn print(args: &Args, train_set: &dyn Dataset) -> anyhow::Result<()> {
    let world = match WorldEnv::from_env()? {
        Some(launched) => launched.world_size,
        None => args.devices.len().max(1),
    };
    let config = MemoryEstimateConfig {
        batch_per_rank: (args.batch_size / world).max(1),
        precision: Precision::parse(&args.precision)?,
        world_size: world,
        zero: args.trainer_config().zero,
        // The probe measures the model as `setup::build` makes it, checkpointed or not.
        activation_checkpointing: args.activation_checkpointing,
    };
    let build = |device: &Device| {
        super::setup::build(args, device.clone()).map_err(|e| Error::invalid("lockstep train", format!("{e:#}")))
    };
    let estimate = estimate_memory(&build, train_set, config)?;
    println!("{}", render(&estimate));
    Ok(())
}

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / f64::from(1 << 20))
}

fn on_off(on: bool) -> &'static str {
    if on { "on" } else { "off" }
}

/// The run assumed, then one row per part and a column per rank.
fn render(estimate: &MemoryEstimate) -> String {
    let c = &estimate.config;
    let zero = c.zero.map_or("off".to_string(), |z| format!("stage {}", z.number()));
    let assumed = format!(
        "Memory estimate per rank (measured on the CPU at small batches, scaled to the batch):\n\
         model {}, batch per rank {}, precision {}, world size {}, ZeRO {zero}, activation checkpointing {}",
        estimate.model,
        c.batch_per_rank,
        c.precision.name(),
        c.world_size,
        on_off(c.activation_checkpointing),
    );
    let ranks: Vec<String> = (0..estimate.ranks.len()).map(|r| format!("rank {r}")).collect();
    let mut header = vec!["part"];
    header.extend(ranks.iter().map(String::as_str));
    let parts: [(&str, fn(&lockstep_core::train::RankMemory) -> u64); 6] = [
        ("parameters", |r| r.parameters),
        ("gradients", |r| r.gradients),
        ("optimizer state", |r| r.optimizer_state),
        ("buckets", |r| r.buckets),
        ("activations", |r| r.activations),
        ("total", |r| r.total()),
    ];
    let rows: Vec<Vec<String>> = parts
        .iter()
        .map(|(name, part)| {
            let mut row = vec![name.to_string()];
            row.extend(estimate.ranks.iter().map(|r| mib(part(r))));
            row
        })
        .collect();
    format!("{assumed}\n{}", crate::cli::table::render(&header, &rows))
}
