//! The core conformance suite on cuda:0 against the CPU reference: every op, forward and
//! backward, in f32, f16 and bf16 (kernels compute in f32, cuBLAS accumulates in f32); and the
//! fused bias and GELU gradient, and the mixed-dtype fusions, against the ops they fuse, bit for
//! bit.

mod support;

use lockstep_core::DType;
use lockstep_core::conformance::{bias_act_grad_mismatches, format_table, mixed_dtype_mismatches, run_suite};

#[test]
fn cuda_passes_the_conformance_suite() {
    let Some(device) = support::cuda_device() else { return };
    let reports = run_suite(&device, &[DType::F32, DType::F16, DType::BF16]);
    println!("{}", format_table(&reports));
    let failed: Vec<String> = reports
        .iter()
        .filter(|r| !r.passed())
        .map(|r| format!("{} [{}]: {:?}", r.case, r.dtype, r.outcome))
        .collect();
    assert!(reports.len() > 900, "only {} reports", reports.len());
    assert!(
        failed.is_empty(),
        "{} of {} failed:\n{}",
        failed.len(),
        reports.len(),
        failed.join("\n")
    );
}

#[test]
fn the_fused_bias_and_gelu_gradient_is_the_composed_ops_bit_for_bit() {
    let Some(device) = support::cuda_device() else { return };
    for dtype in [DType::F32, DType::F16, DType::BF16] {
        let mismatches = bias_act_grad_mismatches(&device, dtype).unwrap();
        assert_eq!(mismatches, Some(vec![]), "{dtype:?}");
    }
}

#[test]
fn the_mixed_dtype_fusions_are_the_casts_and_ops_they_fuse_bit_for_bit() {
    let Some(device) = support::cuda_device() else { return };
    for half in [DType::F16, DType::BF16] {
        assert_eq!(mixed_dtype_mismatches(&device, half).unwrap(), Vec::<String>::new());
    }
}
