//! Cases for the mean cross-entropy: fused where the backend has `cross_entropy` for the dtype
//! (the CPU's f64 reference composes it from log-softmax, gather and mean), forward and backward,
//! on few and many rows, a few and a GPT's 50304 classes (rows a GPU chunks), targets at both
//! ends of a row, a row holding NaN, and 16-bit logits under autocast (read as they are, the
//! loss in f32).

use crate::conformance::case::{Case, Ctx, Input, Values};
use crate::conformance::host::{self, HostTensor};
use crate::dtype::DType;
use crate::error::Result;
use crate::tensor::Tensor;

/// Every method a cross-entropy may run through, fused or composed.
const OPS: &[&str] = &[
    "cross_entropy",
    "cross_entropy_backward",
    "log_softmax_last",
    "gather",
    "scatter_add",
    "reduce:sum",
];

fn u() -> Values {
    Values::Uniform { low: -2.0, high: 2.0 }
}

/// Labels `values` (class indices) for `[values.len()]` U32 targets.
fn labels(values: &[usize]) -> Input {
    let bound = values.iter().max().map_or(1, |m| m + 1);
    Input {
        values: Values::Given(values.iter().map(|&v| v as f64).collect()),
        ..Input::indices("labels", [values.len()], bound)
    }
}

/// `-mean(log_softmax(logits)[i, labels[i]])` in f64.
fn cross_entropy_ref(x: &[HostTensor]) -> Vec<HostTensor> {
    let logp = host::softmax(&x[0], 1, true);
    let n = x[0].dims[0];
    let total: f64 = (0..n).map(|i| logp.at(&[i, x[1].values[i] as usize])).sum();
    vec![HostTensor::new([], vec![-total / n as f64])]
}

fn forward(_: &Ctx, x: &[Tensor]) -> Result<Vec<Tensor>> {
    Ok(vec![x[0].cross_entropy(&x[1])?])
}

/// Under autocast to the dtype under test (16-bit logits read as they are, the loss in f32);
/// the f64 reference is left as it is.
fn autocast_forward(ctx: &Ctx, x: &[Tensor]) -> Result<Vec<Tensor>> {
    crate::autocast::autocast(ctx.under_test, || forward(ctx, x))
}

pub fn cases() -> Vec<Case> {
    let mut cases = vec![
        Case::new(
            "cross_entropy/labels_6x5",
            &[
                "cross_entropy",
                "log_softmax_last",
                "gather",
                "scatter_add",
                "reduce:sum",
            ],
            forward,
        )
        .input(Input::float("logits", [6, 5], u()))
        .input(Input::indices("labels", [6], 5))
        .oracle(cross_entropy_ref),
        Case::new(
            "cross_entropy/i64_labels_9x4",
            &["cross_entropy", "log_softmax_last", "gather", "cast"],
            forward,
        )
        .input(Input::float("logits", [9, 4], u()))
        .input(Input::labels_i64("labels", [9], 4))
        .oracle(cross_entropy_ref),
    ];
    for (label, dims, targets) in [
        ("edges_7x10", [7, 10], vec![0, 9, 4, 9, 0, 3, 7]),
        ("one_row_1x5", [1, 5], vec![4]),
        // Odd rows: in bf16 two rows share a storage word at every other seam.
        ("many_67x33", [67, 33], (0..67).map(|i| (i * 7) % 33).collect()),
    ] {
        cases.push(
            Case::new(format!("cross_entropy/{label}"), OPS, forward)
                .input(Input::float("logits", dims, u()))
                .input(labels(&targets))
                .oracle(cross_entropy_ref),
        );
    }
    // A GPT-2 vocabulary: each row is many chunks of a GPU's block. Too wide for the
    // finite-difference check (the small cases above take it).
    cases.push(
        Case::new("cross_entropy/gpt2_3x50304", OPS, forward)
            .input(Input::float("logits", [3, 50304], u()))
            .input(labels(&[0, 50303, 12345]))
            .no_gradcheck()
            .oracle(cross_entropy_ref),
    );
    // A NaN in row 1: its loss, so the mean, and its gradient are NaN; the other rows' gradients
    // are not.
    let mut values: Vec<f64> = (0..40).map(|i| ((i * 37 % 40) as f64 - 20.0) / 10.0).collect();
    values[13] = f64::NAN;
    cases.push(
        Case::new("cross_entropy/nan_row_4x10", OPS, forward)
            .input(Input::float("logits", [4, 10], Values::Given(values)))
            .input(labels(&[2, 0, 9, 5]))
            .no_gradcheck()
            .oracle(cross_entropy_ref),
    );
    cases.push(
        Case::new("cross_entropy/autocast_5x300", OPS, autocast_forward)
            .input(Input::float("logits", [5, 300], u()))
            .input(labels(&[0, 299, 150, 1, 298]))
            .dtypes(&[DType::F16, DType::BF16])
            .oracle(cross_entropy_ref),
    );
    cases
}
