//! The core conformance suite on the first wgpu adapter (lavapipe in CI) against the CPU
//! reference: every op, forward and backward, in f32 and bf16 (16-bit at rest, f32 in the
//! shaders), and in f16 where the adapter has it.

mod support;

use lockstep_core::DType;
use lockstep_core::conformance::{Outcome, format_table, run_suite};

#[test]
fn wgpu_passes_the_conformance_suite() {
    let Some(device) = support::wgpu_device() else { return };
    let mut dtypes = vec![DType::F32, DType::BF16];
    let f16 = lockstep_wgpu::adapter(0).is_some_and(|a| a.features().contains(wgpu_f16()));
    if f16 {
        dtypes.push(DType::F16);
    }
    let reports = run_suite(&device, &dtypes);
    println!("{}", format_table(&reports));
    let failed: Vec<String> = reports
        .iter()
        .filter(|r| !r.passed())
        .map(|r| format!("{} [{}]: {:?}", r.case, r.dtype, r.outcome))
        .collect();
    assert!(reports.len() > 600, "only {} reports", reports.len());
    assert!(
        reports.iter().filter(|r| r.dtype == DType::BF16).count() > 300,
        "bf16 cases ran"
    );
    assert!(
        failed.is_empty(),
        "{} of {} failed:\n{}",
        failed.len(),
        reports.len(),
        failed.join("\n")
    );
    assert!(reports.iter().all(|r| r.outcome == Outcome::Pass));
}

fn wgpu_f16() -> wgpu::Features {
    wgpu::Features::SHADER_F16
}
