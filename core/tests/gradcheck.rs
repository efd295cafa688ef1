//! Autograd against central finite differences, in f64 on the CPU, for every differentiable case.

use lockstep_core::conformance::{self, Case, Input, Values, gradcheck, gradcheck_all};
use lockstep_core::{Device, Tensor};

#[test]
fn every_differentiable_case_matches_finite_differences() {
    let reports = gradcheck_all();
    let differentiable = conformance::all_cases()
        .iter()
        .filter(|c| c.backward && c.gradcheck)
        .count();
    assert!(differentiable > 150, "only {differentiable} differentiable cases");
    let failed: Vec<String> = reports
        .iter()
        .filter(|r| !r.passed)
        .map(|r| {
            format!(
                "{} / {}: max error {:.2e} over {} elements; {}",
                r.case, r.input, r.max_abs_err, r.elements_checked, r.detail
            )
        })
        .collect();
    let checked: usize = reports.iter().map(|r| r.elements_checked).sum();
    println!("{} inputs, {checked} elements checked", reports.len());
    assert!(
        failed.is_empty(),
        "{} of {} gradient checks failed:\n{}",
        failed.len(),
        reports.len(),
        failed.join("\n")
    );
}

#[test]
fn every_backward_op_is_gradchecked() {
    // Every op that some case differentiates appears in a case that is gradient-checked.
    let cases = conformance::all_cases();
    for case in cases.iter().filter(|c| c.backward && !c.gradcheck) {
        for op in &case.ops {
            let checked = cases.iter().any(|c| c.gradcheck && c.ops.contains(op));
            assert!(
                checked || op == "cast",
                "{op} (case {}) has no gradient-checked case",
                case.name
            );
        }
    }
}

#[test]
fn gradcheck_catches_a_wrong_gradient() {
    // d(x * stopgrad(x))/dx is x for autograd but 2x for finite differences.
    let broken = Case::new("broken", &["binary:mul"], |_, x| Ok(vec![x[0].mul(&x[0].detach())?])).input(Input::float(
        "x",
        [3, 4],
        Values::Uniform { low: 0.5, high: 1.5 },
    ));
    let reports = gradcheck(&broken).unwrap();
    assert_eq!(reports.len(), 1);
    assert!(!reports[0].passed, "{:?}", reports[0]);
    assert_eq!(reports[0].elements_checked, 12);
    // The same scalar, differentiated properly, passes.
    let fixed = Case::new("fixed", &["binary:mul"], |_, x| Ok(vec![x[0].mul(&x[0])?])).input(Input::float(
        "x",
        [3, 4],
        Values::Uniform { low: 0.5, high: 1.5 },
    ));
    assert!(gradcheck(&fixed).unwrap().iter().all(|r| r.passed));
}

/// Gradient of `f(x)` (or of `f(x, y)` for both inputs) at points where finite differences do not
/// apply: kinks and ties follow PyTorch's conventions, written out by hand here.
fn grads(xs: &[&[f64]], f: impl Fn(&[Tensor]) -> lockstep_core::Result<Tensor>) -> Vec<Vec<f64>> {
    let dev = Device::cpu();
    let leaves: Vec<Tensor> = xs
        .iter()
        .map(|x| {
            Tensor::from_vec(x.to_vec(), [x.len()], &dev)
                .unwrap()
                .requires_grad(true)
        })
        .collect();
    f(&leaves).unwrap().sum_all().unwrap().backward().unwrap();
    leaves
        .iter()
        .map(|l| l.grad().unwrap().to_vec::<f64>().unwrap())
        .collect()
}

#[test]
fn kinks_and_ties_follow_pytorch() {
    let x: &[f64] = &[-1.0, 0.0, 2.0];
    assert_eq!(grads(&[x], |t| t[0].relu()), vec![vec![0.0, 0.0, 1.0]], "relu'(0) = 0");
    assert_eq!(
        grads(&[x], |t| t[0].abs()),
        vec![vec![-1.0, 0.0, 1.0]],
        "abs'(0) = sign(0) = 0"
    );
    assert_eq!(
        grads(&[x], |t| t[0].clamp_min(0.0)),
        vec![vec![0.0, 1.0, 1.0]],
        "clamp passes the gradient at its bound"
    );
    assert_eq!(
        grads(&[x], |t| t[0].clamp_max(0.0)),
        vec![vec![1.0, 1.0, 0.0]],
        "clamp passes the gradient at its bound"
    );
    let (a, b): (&[f64], &[f64]) = (&[1.0, 2.0, 3.0], &[1.0, 3.0, 2.0]);
    assert_eq!(
        grads(&[a, b], |t| t[0].maximum(&t[1])),
        vec![vec![0.5, 0.0, 1.0], vec![0.5, 1.0, 0.0]],
        "maximum splits ties"
    );
    assert_eq!(
        grads(&[a, b], |t| t[0].minimum(&t[1])),
        vec![vec![0.5, 1.0, 0.0], vec![0.5, 0.0, 1.0]],
        "minimum splits ties"
    );
    // max(dim) and min(dim) send the gradient to the first extremal element (the returned index).
    let m: &[f64] = &[1.0, 3.0, 3.0, 2.0, 2.0, 0.0];
    assert_eq!(
        grads(&[m], |t| t[0].reshape([2, 3])?.max(1, false)),
        vec![vec![0.0, 1.0, 0.0, 1.0, 0.0, 0.0]]
    );
    assert_eq!(
        grads(&[m], |t| t[0].reshape([2, 3])?.min(0, false)),
        vec![vec![1.0, 0.0, 0.0, 0.0, 1.0, 1.0]]
    );
}
