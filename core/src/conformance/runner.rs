//! Runs cases on a device and on the CPU reference in f64, compares, and reports.

use std::fmt::Write as _;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::time::{Duration, Instant};

use super::case::{Case, Ctx, Kind, View, output_weights};
use super::host::HostTensor;
use super::tolerance::Tolerance;
use crate::autograd::NoGradGuard;
use crate::device::Device;
use crate::dtype::{DType, HostVec};
use crate::error::{Error, Result};
use crate::shape::Shape;
use crate::tensor::Tensor;

/// How far `evaluate` goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Pass {
    /// Forward only, without recording the graph.
    Forward,
    /// Forward, recording the graph (so outputs say whether they are differentiable).
    Record,
    /// Forward and backward.
    Backward,
}

/// One named result of an evaluation: a forward output (`out`, `out1`, …) or an input gradient
/// (`grad:x`), read back as f64.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Observed {
    /// `out` (or `out0`, `out1`, … for several outputs), or `grad:<input>` for a gradient.
    pub name: String,
    /// The dtype the result was computed in (F64 for the reference).
    pub dtype: DType,
    /// The result's shape.
    pub dims: Vec<usize>,
    /// None: no gradient reached this input.
    pub values: Option<Vec<f64>>,
    /// A forward output that depends differentiably on the inputs (part of `sum(out * w)`).
    pub differentiable: bool,
}

/// What happened to one case in one dtype.
#[derive(Clone, Debug, PartialEq)]
pub enum Outcome {
    /// Every result within tolerance.
    Pass,
    /// Results differ beyond tolerance (or in shape); the string says where.
    Fail(String),
    /// The device returned an error, or panicked.
    Error(String),
    /// The device reported the dtype as unsupported for an op of the case.
    Unsupported(String),
}

/// The outcome of one case in one dtype on one device: one row of the table `format_table` prints.
#[derive(Clone, Debug)]
pub struct CaseReport {
    /// The device checked, e.g. `wgpu:0`.
    pub device: String,
    /// The case's name.
    pub case: String,
    /// Backend methods the case exercises (`unary:gelu`, …).
    pub ops: Vec<String>,
    /// The dtype the case ran in on the device.
    pub dtype: DType,
    /// Input shapes as the forward pass saw them, e.g. `x:13x7(T) y:13`.
    pub shapes: String,
    /// Pass, failure, error or unsupported dtype.
    pub outcome: Outcome,
    /// Largest |device - reference| over every compared value.
    pub max_abs_err: f64,
    /// Largest |device - reference| / |reference| over values whose reference exceeds the atol.
    pub max_rel_err: f64,
    /// Largest error as a fraction of the error allowed there (above 1 fails).
    pub tol_used: f64,
    /// Device time of the forward and backward passes, including reading the results back.
    pub time: Duration,
}

impl CaseReport {
    /// True when the outcome is [`Outcome::Pass`].
    pub fn passed(&self) -> bool {
        self.outcome == Outcome::Pass
    }
}

/// Builds the inputs on `device`, runs the forward pass and, for `Pass::Backward`, the backward
/// pass of `sum(out * w)` over the differentiable outputs, and reads everything back.
pub(crate) fn evaluate(
    case: &Case,
    device: &Device,
    dtype: DType,
    under_test: DType,
    base: &[HostTensor],
    pass: Pass,
) -> Result<Vec<Observed>> {
    let _no_grad = (pass == Pass::Forward).then(NoGradGuard::new);
    let grads = pass != Pass::Forward;
    let seed = case.seed();
    let mut leaves = Vec::with_capacity(case.inputs.len());
    let mut views = Vec::with_capacity(case.inputs.len());
    for (input, host) in case.inputs.iter().zip(base) {
        let data = match input.kind {
            Kind::Float => HostVec::from_f64(dtype, &host.values),
            Kind::U32 => HostVec::from_f64(DType::U32, &host.values),
            Kind::I64 => HostVec::from_f64(DType::I64, &host.values),
        };
        let mut t = Tensor::from_host(data, host.dims.clone(), device)?;
        if grads && case.backward && input.grad && input.kind == Kind::Float {
            t = t.requires_grad(true);
        }
        leaves.push(t.clone());
        for v in &input.views {
            t = match v {
                View::Permute(p) => t.permute(p)?,
                View::Narrow { axis, start, len } => t.narrow(*axis as isize, *start, *len)?,
                View::Broadcast(to) => t.broadcast_as(&Shape::new(to.clone()))?,
            };
        }
        views.push(t);
    }
    let ctx = Ctx {
        device,
        dtype,
        under_test,
        seed,
    };
    let outputs = (case.forward)(&ctx, &views)?;
    let mut observed = Vec::new();
    let single = outputs.len() == 1;
    for (i, out) in outputs.iter().enumerate() {
        let name = if single { "out".to_string() } else { format!("out{i}") };
        let differentiable = case.backward && out.tracks_grad() && out.dtype().is_float();
        observed.push(Observed {
            name,
            dtype: out.dtype(),
            dims: out.dims().to_vec(),
            values: Some(out.to_f64_vec()?),
            differentiable,
        });
    }
    if pass == Pass::Backward && case.backward {
        let mut loss: Option<Tensor> = None;
        for (i, out) in outputs
            .iter()
            .enumerate()
            .filter(|(_, o)| o.tracks_grad() && o.dtype().is_float())
        {
            let w = output_weights(seed, i, out.elem_count(), out.dtype());
            let w = Tensor::from_host(HostVec::from_f64(out.dtype(), &w), out.shape().clone(), device)?;
            let part = out.mul(&w)?.sum_all()?.to_dtype(dtype)?;
            loss = Some(match loss {
                Some(l) => l.add(&part)?,
                None => part,
            });
        }
        if let Some(loss) = loss {
            loss.backward()?;
        }
        for (input, leaf) in case.inputs.iter().zip(&leaves) {
            if input.grad && input.kind == Kind::Float {
                let g = leaf.grad();
                let values = g.as_ref().map(|g| g.to_f64_vec()).transpose()?;
                let dims = g.as_ref().map_or_else(|| leaf.dims().to_vec(), |g| g.dims().to_vec());
                observed.push(Observed {
                    name: format!("grad:{}", input.name),
                    dtype: g.map_or(leaf.dtype(), |g| g.dtype()),
                    dims,
                    values,
                    differentiable: false,
                });
            }
        }
    }
    Ok(observed)
}

/// The worst errors of a comparison, and the first failure found.
#[derive(Clone, Debug, Default)]
pub(crate) struct Comparison {
    /// Largest |device - reference| over the finite errors.
    pub max_abs_err: f64,
    /// Largest |device - reference| / |reference| over references above the tolerance's `atol`.
    pub max_rel_err: f64,
    /// Largest error as a fraction of the error allowed there (above 1 fails).
    pub tol_used: f64,
    /// The first mismatch found (value, shape or missing gradient); `None` when everything matched.
    pub failure: Option<String>,
}

/// Compares device results with reference results; integer results must match exactly, float
/// results within the tolerance of the device result's dtype, times `scale`.
pub(crate) fn compare(device: &[Observed], reference: &[Observed], scale: f64) -> Comparison {
    let mut c = Comparison::default();
    if device.len() != reference.len() {
        c.failure = Some(format!(
            "{} results, the reference has {}",
            device.len(),
            reference.len()
        ));
        return c;
    }
    for (d, r) in device.iter().zip(reference) {
        if d.name != r.name || d.dims != r.dims {
            c.failure.get_or_insert(format!(
                "{} has shape {:?}, the reference {} has {:?}",
                d.name, d.dims, r.name, r.dims
            ));
            continue;
        }
        let (dv, rv) = match (&d.values, &r.values) {
            (Some(dv), Some(rv)) => (dv, rv),
            (None, None) => continue,
            (None, Some(_)) => {
                c.failure
                    .get_or_insert(format!("{}: no gradient reached the input", d.name));
                continue;
            }
            (Some(_), None) => {
                c.failure
                    .get_or_insert(format!("{}: a gradient the reference does not have", d.name));
                continue;
            }
        };
        let tol = if d.dtype.is_float() {
            Tolerance::for_dtype(d.dtype).scaled(scale)
        } else {
            Tolerance::EXACT
        };
        for (i, (&x, &y)) in dv.iter().zip(rv).enumerate() {
            let err = (x - y).abs();
            if err.is_finite() {
                c.max_abs_err = c.max_abs_err.max(err);
                if y.abs() > tol.atol {
                    c.max_rel_err = c.max_rel_err.max(err / y.abs());
                }
                let bound = tol.bound(y);
                c.tol_used = c.tol_used.max(if bound > 0.0 {
                    err / bound
                } else if err > 0.0 {
                    f64::INFINITY
                } else {
                    0.0
                });
            }
            if !tol.accepts(x, y) {
                let at = super::host::unravel(i, &d.dims);
                c.failure.get_or_insert(format!(
                    "{}{at:?}: device {x:.7e}, reference {y:.7e} (allowed ±{:.1e})",
                    d.name,
                    tol.bound(y)
                ));
            }
        }
    }
    c
}

fn panic_message(p: Box<dyn std::any::Any + Send>) -> String {
    p.downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".into())
}

/// Runs `f`, turning a panic into an error (a backend that panics fails its case, not the run).
fn guarded<T>(f: impl FnOnce() -> Result<T>) -> std::result::Result<T, Outcome> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e @ Error::UnsupportedDType { .. })) => Err(Outcome::Unsupported(e.to_string())),
        Ok(Err(e)) => Err(Outcome::Error(e.to_string())),
        Err(p) => Err(Outcome::Error(format!("panicked: {}", panic_message(p)))),
    }
}

/// Runs one case in `dtype` on `device` and against the CPU reference in f64. None when the
/// case does not apply to `dtype`.
pub fn run_case(case: &Case, device: &Device, dtype: DType) -> Option<CaseReport> {
    if !case.runs_in(dtype) {
        return None;
    }
    let mut report = CaseReport {
        device: device.location().to_string(),
        case: case.name.clone(),
        ops: case.ops.clone(),
        dtype,
        shapes: case.shapes_label(),
        outcome: Outcome::Pass,
        max_abs_err: 0.0,
        max_rel_err: 0.0,
        tol_used: 0.0,
        time: Duration::ZERO,
    };
    let base = case.host_inputs(dtype);
    let reference = match guarded(|| evaluate(case, &Device::cpu(), DType::F64, dtype, &base, Pass::Backward)) {
        Ok(r) => r,
        Err(outcome) => {
            report.outcome = Outcome::Error(format!(
                "the CPU reference failed (a bug in the suite or the reference): {outcome:?}"
            ));
            return Some(report);
        }
    };
    let start = Instant::now();
    let result = guarded(|| {
        let r = evaluate(case, device, dtype, dtype, &base, Pass::Backward)?;
        device.synchronize()?;
        Ok(r)
    });
    report.time = start.elapsed();
    match result {
        Ok(observed) => {
            let c = compare(&observed, &reference, case.tol_scale);
            report.max_abs_err = c.max_abs_err;
            report.max_rel_err = c.max_rel_err;
            report.tol_used = c.tol_used;
            if let Some(f) = c.failure {
                report.outcome = Outcome::Fail(f);
            }
        }
        Err(outcome) => report.outcome = outcome,
    }
    Some(report)
}

/// Runs every case on `device` in each of `dtypes` against the CPU reference in f64.
pub fn run_suite(device: &Device, dtypes: &[DType]) -> Vec<CaseReport> {
    let cases = super::all_cases();
    dtypes
        .iter()
        .flat_map(|&dtype| cases.iter().filter_map(move |case| run_case(case, device, dtype)))
        .collect()
}

/// Checks `device` in f64 against the plain-f64 oracles of the cases that have one (forward
/// values only). On the CPU this checks the reference itself.
pub fn run_oracles(device: &Device) -> Vec<CaseReport> {
    let mut reports = Vec::new();
    for case in super::all_cases() {
        let Some(oracle) = &case.oracle else { continue };
        if !case.runs_in(DType::F64) {
            continue;
        }
        let base = case.host_inputs(DType::F64);
        let start = Instant::now();
        let result = guarded(|| evaluate(&case, device, DType::F64, DType::F64, &base, Pass::Forward));
        let mut report = CaseReport {
            device: device.location().to_string(),
            case: format!("{} (oracle)", case.name),
            ops: case.ops.clone(),
            dtype: DType::F64,
            shapes: case.shapes_label(),
            outcome: Outcome::Pass,
            max_abs_err: 0.0,
            max_rel_err: 0.0,
            tol_used: 0.0,
            time: start.elapsed(),
        };
        match result {
            Ok(observed) => {
                let Ok(expected) = catch_unwind(AssertUnwindSafe(|| oracle(&logical_inputs(&case, &base)))) else {
                    report.outcome = Outcome::Error("the oracle panicked (a bug in the case)".into());
                    reports.push(report);
                    continue;
                };
                let expected: Vec<Observed> = expected
                    .into_iter()
                    .zip(&observed)
                    .map(|(h, o)| Observed {
                        name: o.name.clone(),
                        dtype: o.dtype,
                        dims: h.dims,
                        values: Some(h.values),
                        differentiable: false,
                    })
                    .collect();
                let c = compare(&observed, &expected, case.tol_scale);
                report.max_abs_err = c.max_abs_err;
                report.max_rel_err = c.max_rel_err;
                report.tol_used = c.tol_used;
                if expected.len() != observed.len() {
                    report.outcome = Outcome::Fail(format!(
                        "the oracle gives {} outputs, the device {}",
                        expected.len(),
                        observed.len()
                    ));
                } else if let Some(f) = c.failure {
                    report.outcome = Outcome::Fail(f);
                }
            }
            Err(outcome) => report.outcome = outcome,
        }
        reports.push(report);
    }
    reports
}

/// The inputs as the forward pass sees them (views applied), on the host.
pub(crate) fn logical_inputs(case: &Case, base: &[HostTensor]) -> Vec<HostTensor> {
    case.inputs
        .iter()
        .zip(base)
        .map(|(input, host)| {
            input.views.iter().fold(host.clone(), |t, v| match v {
                View::Permute(p) => t.permute(p),
                View::Narrow { axis, start, len } => t.narrow(*axis, *start, *len),
                View::Broadcast(to) => t.broadcast_to(to),
            })
        })
        .collect()
}

fn fmt_err(x: f64) -> String {
    if x == 0.0 { "0".into() } else { format!("{x:.1e}") }
}

/// A plain-text table of reports, one line per case and dtype, failures first, then a summary:
/// made to be pasted into a bug report.
pub fn format_table(reports: &[CaseReport]) -> String {
    let mut rows: Vec<[String; 8]> = Vec::with_capacity(reports.len());
    let mut order: Vec<&CaseReport> = reports.iter().collect();
    order.sort_by_key(|r| r.passed());
    for r in &order {
        let status = match &r.outcome {
            Outcome::Pass => "ok",
            Outcome::Fail(_) => "FAIL",
            Outcome::Error(_) => "ERROR",
            Outcome::Unsupported(_) => "unsupported",
        };
        rows.push([
            status.into(),
            r.case.clone(),
            r.dtype.to_string(),
            r.shapes.clone(),
            fmt_err(r.max_abs_err),
            fmt_err(r.max_rel_err),
            format!("{:.0}%", r.tol_used * 100.0),
            format!("{:.2}ms", r.time.as_secs_f64() * 1e3),
        ]);
    }
    let header = [
        "status",
        "case",
        "dtype",
        "inputs",
        "max abs err",
        "max rel err",
        "tol used",
        "time",
    ];
    let widths: Vec<usize> = (0..8)
        .map(|c| {
            rows.iter()
                .map(|r| r[c].chars().count())
                .chain([header[c].len()])
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    let devices: Vec<&str> = {
        let mut d: Vec<&str> = reports.iter().map(|r| r.device.as_str()).collect();
        d.dedup();
        d
    };
    let _ = writeln!(
        out,
        "lockstep conformance: device {} against the CPU reference in f64",
        devices.join(", ")
    );
    let line = |cells: &[String]| {
        cells
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect::<Vec<_>>()
            .join("  ")
            .trim_end()
            .to_string()
    };
    let _ = writeln!(out, "{}", line(&header.map(String::from)));
    for (row, r) in rows.iter().zip(&order) {
        let _ = writeln!(out, "{}", line(row));
        match &r.outcome {
            Outcome::Fail(m) | Outcome::Error(m) | Outcome::Unsupported(m) => {
                let _ = writeln!(out, "    ops {}: {m}", r.ops.join(", "));
            }
            Outcome::Pass => {}
        }
    }
    let count = |f: fn(&Outcome) -> bool| reports.iter().filter(|r| f(&r.outcome)).count();
    let _ = writeln!(
        out,
        "{} passed, {} failed, {} errors, {} unsupported, of {}",
        count(|o| matches!(o, Outcome::Pass)),
        count(|o| matches!(o, Outcome::Fail(_))),
        count(|o| matches!(o, Outcome::Error(_))),
        count(|o| matches!(o, Outcome::Unsupported(_))),
        reports.len()
    );
    out
}
