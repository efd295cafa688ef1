//! The conformance suite on a second CPU device against the CPU reference, and the reference
//! itself against the plain-f64 oracles.

use lockstep_core::conformance::{self, Case, Input, Outcome, Values, format_table, run_case, run_oracles, run_suite};
use lockstep_core::{DType, Device, Tensor};

fn assert_all_pass(reports: &[conformance::CaseReport]) {
    let table = format_table(reports);
    println!("{table}");
    let failed: Vec<_> = reports
        .iter()
        .filter(|r| !r.passed())
        .map(|r| format!("{} [{}]: {:?}", r.case, r.dtype, r.outcome))
        .collect();
    assert!(
        failed.is_empty(),
        "{} of {} failed:\n{}",
        failed.len(),
        reports.len(),
        failed.join("\n")
    );
}

#[test]
fn cpu_passes_the_suite_in_every_float_dtype() {
    let device = Device::parse("cpu:1").unwrap();
    let reports = run_suite(&device, &[DType::F32, DType::F16, DType::BF16, DType::F64]);
    assert!(reports.len() > 300, "only {} reports", reports.len());
    assert_all_pass(&reports);
}

/// bf16 products take AMX tiles, the AVX512-BF16 dot products or widen to f32 by the CPU
/// (`devices --details`); every path this CPU runs must pass the suite's products.
#[test]
fn bf16_products_pass_the_suite_on_every_kernel_this_cpu_runs() {
    use lockstep_core::backend::cpu::{Bf16Products, CpuBackend};
    let paths = CpuBackend::bf16_products_available();
    for missing in [Bf16Products::Tiles, Bf16Products::DotProducts] {
        if !paths.contains(&missing) {
            eprintln!(
                "NOTE: this CPU (or OS) does not run bf16 products on {missing:?}: that path is not checked here"
            );
        }
    }
    let products: Vec<_> = conformance::all_cases()
        .into_iter()
        .filter(|c| c.ops.iter().any(|op| op.starts_with("matmul")))
        .collect();
    assert!(products.len() >= 5, "only {} cases take products", products.len());
    let mut bits = Vec::new();
    for (ordinal, &path) in (60..).zip(&paths) {
        let backend = std::sync::Arc::new(CpuBackend::new(ordinal));
        backend.set_bf16_products(path);
        let device = Device::from_backend(backend);
        let reports: Vec<_> = products
            .iter()
            .filter_map(|c| run_case(c, &device, DType::BF16))
            .collect();
        assert!(!reports.is_empty(), "{path:?}: no case ran in bf16");
        assert_all_pass(&reports);
        // A long sum, whose f32 rounding differs between the paths in some of its 65536 outputs.
        let values: Vec<f32> = (0..256 * 2048).map(|i| (i as f32 * 0.618).sin()).collect();
        let x = Tensor::from_vec(values, [256 * 2048], &device)
            .unwrap()
            .to_dtype(DType::BF16)
            .unwrap();
        let product = x
            .reshape([256, 2048])
            .unwrap()
            .matmul(&x.reshape([2048, 256]).unwrap())
            .unwrap();
        bits.push(product.to_dtype(DType::F32).unwrap().to_vec::<f32>().unwrap());
    }
    for (i, j) in (0..bits.len()).flat_map(|i| (i + 1..bits.len()).map(move |j| (i, j))) {
        let differ = bits[i]
            .iter()
            .zip(&bits[j])
            .filter(|(a, b)| a.to_bits() != b.to_bits())
            .count();
        assert!(
            differ > 0,
            "{:?} and {:?} gave the same bits: one path taken twice",
            paths[i],
            paths[j]
        );
    }
}

#[test]
fn cpu_reference_matches_the_oracles() {
    let reports = run_oracles(&Device::cpu());
    let cases = conformance::all_cases();
    assert!(
        reports.len() * 10 >= cases.len() * 9,
        "only {} of {} cases have an oracle",
        reports.len(),
        cases.len()
    );
    assert_all_pass(&reports);
}

#[test]
fn case_names_are_unique() {
    let mut names: Vec<String> = conformance::all_cases().into_iter().map(|c| c.name).collect();
    let n = names.len();
    names.sort();
    names.dedup();
    assert_eq!(names.len(), n, "duplicate case names");
}

/// A case whose result depends on the device: the runner must catch the difference, with an
/// error just above what each dtype tolerates.
fn skewed(offset: f64) -> Case {
    Case::new("skewed", &["unary:affine"], move |ctx, x| {
        let shift = if ctx.device.location() == "cpu:0" { 0.0 } else { offset };
        Ok(vec![x[0].affine(1.0, shift)?])
    })
    .input(Input::float("x", [3, 4], Values::Uniform { low: -1.0, high: 1.0 }))
}

#[test]
fn runner_detects_wrong_results() {
    let device = Device::parse("cpu:2").unwrap();
    for (dtype, bad) in [(DType::F32, 1e-4), (DType::F16, 0.05), (DType::BF16, 0.25)] {
        let report = run_case(&skewed(bad), &device, dtype).unwrap();
        assert!(
            matches!(report.outcome, Outcome::Fail(_)),
            "{dtype}: {:?}",
            report.outcome
        );
        assert!(report.max_abs_err >= bad * 0.5, "{dtype}: {}", report.max_abs_err);
        let table = format_table(&[report]);
        assert!(table.contains("FAIL") && table.contains("skewed"), "{table}");
    }
    // Rounding-sized differences pass.
    let report = run_case(&skewed(1e-7), &device, DType::F32).unwrap();
    assert_eq!(report.outcome, Outcome::Pass);
}

#[test]
fn runner_reports_errors_and_wrong_shapes() {
    let device = Device::parse("cpu:2").unwrap();
    let failing = Case::new("errs", &[], |ctx, x| {
        if ctx.device.location() == "cpu:0" {
            Ok(vec![x[0].clone()])
        } else {
            Err(lockstep_core::Error::invalid("errs", "broken kernel"))
        }
    })
    .input(Input::float("x", [2], Values::Uniform { low: 0.0, high: 1.0 }));
    let report = run_case(&failing, &device, DType::F32).unwrap();
    assert!(
        matches!(&report.outcome, Outcome::Error(m) if m.contains("broken kernel")),
        "{:?}",
        report.outcome
    );
    let reshaped = Case::new("shape", &[], |ctx, x| {
        Ok(vec![if ctx.device.location() == "cpu:0" {
            x[0].clone()
        } else {
            x[0].reshape([3, 2])?
        }])
    })
    .input(Input::float("x", [2, 3], Values::Uniform { low: 0.0, high: 1.0 }));
    let report = run_case(&reshaped, &device, DType::F32).unwrap();
    assert!(
        matches!(&report.outcome, Outcome::Fail(m) if m.contains("[3, 2]")),
        "{:?}",
        report.outcome
    );
    let panicking = Case::new("panics", &[], |ctx, x| {
        if ctx.device.location() == "cpu:0" {
            Ok(vec![x[0].clone()])
        } else {
            panic!("kernel bug")
        }
    })
    .input(Input::float("x", [2], Values::Uniform { low: 0.0, high: 1.0 }));
    let report = run_case(&panicking, &device, DType::F32).unwrap();
    assert!(
        matches!(&report.outcome, Outcome::Error(m) if m.contains("kernel bug")),
        "{:?}",
        report.outcome
    );
}
