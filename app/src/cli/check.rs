//! `lockstep check`: runs the backend conformance suite on a device from the release binary and
//! prints a table a user can paste into a bug report (device, ops passed/failed, worst error).

use clap::Parser;
use lockstep_core::conformance::{format_table, run_suite};
use lockstep_core::{DType, Device};

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

pub fn run(args: Args) -> anyhow::Result<()> {
    let devices: Vec<Device> = if args.all {
        lockstep_core::device::list_devices()
            .iter()
            .map(|d| Device::parse(&d.location))
            .collect::<Result<_, _>>()?
    } else {
        vec![Device::parse(&args.device)?]
    };
    let mut failed = 0;
    for device in devices {
        let info = device.info();
        println!("{} — {} ({})", info.location, info.name, info.api);
        let reports = run_suite(&device, &[DType::F32, DType::F16, DType::BF16]);
        let bad: Vec<_> = reports.iter().filter(|r| !r.passed()).cloned().collect();
        if !(args.failures_only && bad.is_empty()) {
            println!("{}", format_table(if args.failures_only { &bad } else { &reports }));
        }
        println!(
            "{}: {} of {} cases passed",
            info.location,
            reports.len() - bad.len(),
            reports.len()
        );
        failed += bad.len();
    }
    anyhow::ensure!(
        failed == 0,
        "{failed} conformance case(s) failed; the table above shows which"
    );
    Ok(())
}
