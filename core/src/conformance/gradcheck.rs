//! Gradient checks: for every differentiable case, the autograd gradient of `sum(out * w)` in f64
//! on the CPU against central finite differences of the same scalar.

use super::case::{Case, Kind, output_weights};
use super::runner::{Pass, evaluate};
use crate::device::Device;
use crate::dtype::DType;
use crate::error::Result;

/// Step of the central difference, relative to max(1, |x|): the truncation error is O(h^2)
/// ≈ 1e-12 and the round-off O(eps/h) ≈ 1e-10, both far below the tolerance.
const STEP: f64 = 1e-6;
/// |numeric - analytic| must stay below ATOL + RTOL * |analytic|.
pub const ATOL: f64 = 1e-6;
pub const RTOL: f64 = 1e-5;
/// Inputs with more elements are checked on an evenly spread subset, to bound the run time.
const MAX_ELEMENTS: usize = 400;

/// The finite-difference check of one input of one case.
#[derive(Clone, Debug)]
pub struct GradcheckReport {
    /// Name of the case checked.
    pub case: String,
    /// Name of the input whose gradient was checked (`-` when the case failed to run).
    pub input: String,
    /// How many elements were perturbed (an evenly spread subset of at most about 400).
    pub elements_checked: usize,
    /// Largest |finite difference - autograd| over the checked elements (NaN when the case failed to run).
    pub max_abs_err: f64,
    /// True when every checked element was within tolerance.
    pub passed: bool,
    /// The worst element, or the error that stopped the check.
    pub detail: String,
}

/// `sum(out * w)` over the differentiable outputs of a forward pass in f64 (the scalar whose
/// gradient `evaluate` back-propagates).
fn objective(case: &Case, device: &Device, inputs: &[super::host::HostTensor]) -> Result<f64> {
    let seed = case.seed();
    let observed = evaluate(case, device, DType::F64, DType::F64, inputs, Pass::Record)?;
    let mut total = 0.0;
    for (i, o) in observed.iter().enumerate() {
        if !o.differentiable {
            continue;
        }
        let values = o.values.as_deref().unwrap_or(&[]);
        let w = output_weights(seed, i, values.len(), o.dtype);
        total += values.iter().zip(&w).map(|(v, w)| v * w).sum::<f64>();
    }
    Ok(total)
}

/// Checks every differentiable input of `case`.
pub fn gradcheck(case: &Case) -> Result<Vec<GradcheckReport>> {
    let device = Device::cpu();
    let base = case.host_inputs(DType::F64);
    let analytic = evaluate(case, &device, DType::F64, DType::F64, &base, Pass::Backward)?;
    let mut reports = Vec::new();
    for (k, input) in case.inputs.iter().enumerate() {
        if !input.grad || input.kind != Kind::Float {
            continue;
        }
        let name = format!("grad:{}", input.name);
        let mut report = GradcheckReport {
            case: case.name.clone(),
            input: input.name.into(),
            elements_checked: 0,
            max_abs_err: 0.0,
            passed: true,
            detail: String::new(),
        };
        let Some(grad) = analytic.iter().find(|o| o.name == name).and_then(|o| o.values.clone()) else {
            report.passed = false;
            report.detail = "no gradient reached the input".into();
            reports.push(report);
            continue;
        };
        let n = base[k].values.len();
        let stride = n.div_ceil(MAX_ELEMENTS).max(1);
        let mut worst = 0.0f64;
        for j in (0..n).step_by(stride) {
            let x = base[k].values[j];
            let h = STEP * x.abs().max(1.0);
            let mut perturbed = base.clone();
            perturbed[k].values[j] = x + h;
            let plus = objective(case, &device, &perturbed)?;
            perturbed[k].values[j] = x - h;
            let minus = objective(case, &device, &perturbed)?;
            let numeric = (plus - minus) / (2.0 * h);
            let err = (numeric - grad[j]).abs();
            report.elements_checked += 1;
            report.max_abs_err = report.max_abs_err.max(err);
            // NaN counts as a failure and as the worst element.
            let ratio = err / (ATOL + RTOL * grad[j].abs());
            let ratio = if ratio.is_nan() { f64::INFINITY } else { ratio };
            if ratio > 1.0 {
                report.passed = false;
            }
            if ratio > worst || report.detail.is_empty() {
                worst = ratio;
                report.detail = format!("element {j}: finite difference {numeric:.9e}, autograd {:.9e}", grad[j]);
            }
        }
        reports.push(report);
    }
    Ok(reports)
}

/// Gradient checks of every case that has them.
pub fn gradcheck_all() -> Vec<GradcheckReport> {
    let mut reports = Vec::new();
    for case in super::all_cases()
        .iter()
        .filter(|c| c.gradcheck && c.backward && c.runs_in(DType::F64))
    {
        match gradcheck(case) {
            Ok(r) => reports.extend(r),
            Err(e) => reports.push(GradcheckReport {
                case: case.name.clone(),
                input: "-".into(),
                elements_checked: 0,
                max_abs_err: f64::NAN,
                passed: false,
                detail: format!("error: {e}"),
            }),
        }
    }
    reports
}
