//! `lockstep check`'s flags: which devices the conformance suite runs on.

use clap::Parser;

#[derive(Parser, Debug)]
pub struct Args {
    /// Device to check (cpu, cpu:N, wgpu:N, cuda:N); see `lockstep devices`.
    #[arg(long, default_value = "cpu")]
    pub device: String,
    /// Check every device found.
    #[arg(long)]
    pub all: bool,
    /// Print only the failures and the totals.
    #[arg(long)]
    pub failures_only: bool,
}
