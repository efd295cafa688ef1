//! `lockstep schedule`'s flags: the pipeline to simulate.

use lockstep_core::train::pipeline::ScheduleKind;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Pipeline stages (P).
    #[arg(long, default_value_t = 4)]
    pub stages: usize,
    /// Micro-batches per optimizer step (M).
    #[arg(long, default_value_t = 8)]
    pub micro_batches: usize,
    /// gpipe (all forwards, then all backwards) or 1f1b (one forward, one backward).
    #[arg(long, default_value = "1f1b")]
    pub schedule: ScheduleKind,
    /// A backward's cost in forwards (about 2 for matmul-heavy layers).
    #[arg(long, default_value_t = 2)]
    pub backward_cost: u32,
}

/// The most stages and micro-batches simulated: the timeline printed is a column per pass.
pub const MOST_DRAWN: usize = 1024;

impl Args {
    pub fn validate(&self) -> anyhow::Result<()> {
        use crate::bounds::within;
        within("--stages", self.stages, 1..=MOST_DRAWN)?;
        within("--micro-batches", self.micro_batches, 1..=MOST_DRAWN)?;
        within("--backward-cost", self.backward_cost, 1..=16)?;
        Ok(())
    }
}
