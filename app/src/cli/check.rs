//! `lockstep check`: runs the backend conformance suite on a device from the release binary and
//! prints a report a user can paste into a bug report: the device and its driver and limits,
//! each case passed or failed with the worst error and time, and the dtypes it cannot run.

use lockstep_core::conformance::{Outcome, format_table, run_suite};
use lockstep_core::{DType, Device, Error};
pub use lockstep_flags::check::Args;

/// The dtypes the suite runs in, where the device supports them.
const DTYPES: [DType; 3] = [DType::F32, DType::F16, DType::BF16];

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
        print!("{}", super::devices::format_details(&info.details));
        let mut dtypes = Vec::new();
        for dtype in DTYPES {
            match device.backend().zeros(dtype, 1) {
                Err(e @ Error::UnsupportedDType { .. }) => println!("  skipped {dtype}: {e}"),
                _ => dtypes.push(dtype),
            }
        }
        let reports = run_suite(&device, &dtypes);
        // A case the device reports as unsupported (e.g. a cast to f16 without SHADER_F16) is
        // listed, not failed: the device said so instead of computing something wrong.
        let bad: Vec<_> = reports
            .iter()
            .filter(|r| matches!(r.outcome, Outcome::Fail(_) | Outcome::Error(_)))
            .cloned()
            .collect();
        let unsupported = reports
            .iter()
            .filter(|r| matches!(r.outcome, Outcome::Unsupported(_)))
            .count();
        if !(args.failures_only && bad.is_empty()) {
            println!("{}", format_table(if args.failures_only { &bad } else { &reports }));
        }
        let names: Vec<String> = dtypes.iter().map(|d| d.to_string()).collect();
        println!(
            "{}: {} of {} cases passed, {} failed, {unsupported} unsupported ({})",
            info.location,
            reports.len() - bad.len() - unsupported,
            reports.len(),
            bad.len(),
            names.join(", ")
        );
        failed += bad.len();
    }
    anyhow::ensure!(
        failed == 0,
        "{failed} conformance case(s) failed; the table above shows which"
    );
    Ok(())
}
