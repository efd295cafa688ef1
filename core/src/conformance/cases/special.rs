//! NaN, ±inf and overflow through every op family, forward only: the semantics PyTorch users
//! rely on (NaN propagates through relu, clamp, maximum, max reductions and pooling; the first
//! NaN is the argmax; comparisons with NaN fail but `ne`; a softmax row with a NaN or +inf, or
//! all -inf, is NaN; casts overflow to inf), pinned on every backend. GPU compilers may assume
//! finite math, so without these cases a backend could silently hide a diverged value.

use crate::backend::{BinaryOp, CmpOp, ReduceKind, UnaryOp};
use crate::conformance::case::{Case, Input, Values};
use crate::conformance::host;
use crate::dtype::DType;
use crate::tensor::Pool2dOptions;

use super::elementwise::{apply_binary, binary_ref, cmp_ref, unary_ref};

const NAN: f64 = f64::NAN;
const INF: f64 = f64::INFINITY;

fn given(name: &'static str, shape: &[usize], values: &[f64]) -> Input {
    Input::float(name, shape.to_vec(), Values::Given(values.to_vec())).no_grad()
}

fn unary_cases() -> Vec<Case> {
    // Every result stays in f16's range, so only the special values are special.
    let x = [NAN, INF, -INF, 0.0, 1.5, -2.5, 8.0];
    UnaryOp::ALL
        .into_iter()
        .map(|op| {
            let name = format!("unary:{}", op.name());
            let f = unary_ref(op);
            Case::new(format!("{name}/special"), &[name.as_str()], move |_, x| {
                Ok(vec![x[0].unary(op)?])
            })
            .input(given("x", &[7], &x))
            .forward_only()
            .oracle(move |x| vec![x[0].map(&f)])
        })
        .collect()
}

fn binary_cases() -> Vec<Case> {
    let a = [NAN, 1.0, INF, INF, -INF, 0.0, 2.0, -INF, 1.0, -1.0, 0.5];
    let b = [1.0, NAN, -INF, INF, 2.0, 0.0, INF, -INF, INF, -INF, -INF];
    BinaryOp::ALL
        .into_iter()
        .map(|op| {
            let name = format!("binary:{}", op.name());
            let f = binary_ref(op);
            Case::new(format!("{name}/special"), &[name.as_str()], move |_, x| {
                Ok(vec![apply_binary(op, &x[0], &x[1])?])
            })
            .input(given("a", &[a.len()], &a))
            .input(given("b", &[b.len()], &b))
            .forward_only()
            .oracle(move |x| vec![x[0].zip(&x[1], f)])
        })
        .collect()
}

fn compare_cases() -> Vec<Case> {
    let a = [NAN, NAN, 1.0, INF, -INF, INF, -INF];
    let b = [NAN, 1.0, NAN, INF, -INF, 1.0, 0.0];
    CmpOp::ALL
        .into_iter()
        .map(|op| {
            let name = format!("compare:{}", op.name());
            let f = cmp_ref(op);
            Case::new(format!("{name}/special"), &[name.as_str()], move |_, x| {
                Ok(vec![x[0].cmp(op, &x[1])?])
            })
            .input(given("a", &[a.len()], &a))
            .input(given("b", &[b.len()], &b))
            .forward_only()
            .oracle(move |x| vec![x[0].zip(&x[1], f)])
        })
        .collect()
}

/// Rows with NaNs (the first one must win), infinities of both signs, all -inf, and a tie;
/// then rows long enough that the kernels combine across threads, NaNs in different threads.
fn reduce_inputs() -> Vec<(&'static str, Input)> {
    #[rustfmt::skip]
    let short = [
        1.0, NAN, 3.0, NAN, 0.0, 2.0,
        INF, 1.0, -INF, 2.0, 0.0, 1.0,
        -INF, -INF, -INF, -INF, -INF, -INF,
        2.0, 5.0, 5.0, 1.0, -1.0, 0.0,
    ];
    let mut long: Vec<f64> = (0..1200).map(|i| (i % 37) as f64 * 0.25).collect();
    long[5] = NAN;
    long[300] = NAN;
    long[600 + 555] = NAN;
    long[600 + 299] = NAN;
    long[600 + 10] = INF;
    vec![
        ("6", given("x", &[4, 6], &short)),
        ("600", given("x", &[2, 600], &long)),
    ]
}

fn reduce_cases() -> Vec<Case> {
    let mut cases = Vec::new();
    for (label, input) in reduce_inputs() {
        for kind in [ReduceKind::Sum, ReduceKind::Max, ReduceKind::Min, ReduceKind::ArgMax] {
            let name = format!("reduce:{}", kind.name());
            cases.push(
                Case::new(format!("{name}/special_{label}"), &[name.as_str()], move |_, x| {
                    Ok(vec![match kind {
                        ReduceKind::Sum => x[0].sum(&[1], false)?,
                        ReduceKind::Max => x[0].max(1, false)?,
                        ReduceKind::Min => x[0].min(1, false)?,
                        ReduceKind::ArgMax => x[0].argmax(1, false)?,
                    }])
                })
                .input(input.clone())
                .forward_only()
                .tol_scale(8.0)
                .oracle(move |x| {
                    vec![match kind {
                        ReduceKind::Sum => x[0].sum(&[1], false),
                        ReduceKind::Max => x[0].reduce(&[1], false, -INF, host::max_nan),
                        ReduceKind::Min => x[0].reduce(&[1], false, INF, host::min_nan),
                        ReduceKind::ArgMax => x[0].argmax(1),
                    }]
                }),
            );
        }
    }
    cases
}

fn softmax_cases() -> Vec<Case> {
    #[rustfmt::skip]
    let x = [
        1.0, NAN, 2.0,
        INF, 1.0, 0.0,
        -INF, -INF, -INF,
        -INF, 0.0, 1.0,
        1.0, 2.0, 3.0,
    ];
    [false, true]
        .into_iter()
        .map(|log| {
            let method = if log { "log_softmax_last" } else { "softmax_last" };
            Case::new(format!("{method}/special"), &[method], move |_, x| {
                Ok(vec![if log { x[0].log_softmax(1)? } else { x[0].softmax(1)? }])
            })
            .input(given("x", &[5, 3], &x))
            .forward_only()
            .oracle(move |x| vec![host::softmax(&x[0], 1, log)])
        })
        .collect()
}

fn max_pool_case() -> Case {
    // 2x2 windows: one with a NaN after a larger number, one with +inf, one all -inf, one tie.
    #[rustfmt::skip]
    let x = [
        5.0, NAN, 1.0, INF,
        1.0, 2.0, 2.0, 0.0,
        -INF, -INF, 3.0, 3.0,
        -INF, -INF, 1.0, 3.0,
    ];
    Case::new("max_pool2d/special", &["max_pool2d"], |_, x| {
        Ok(vec![x[0].max_pool2d(Pool2dOptions::new(2))?])
    })
    .input(given("x", &[1, 1, 4, 4], &x))
    .forward_only()
    .oracle(|x| vec![host::pool2d(&x[0], [2, 2], [2, 2], [0, 0], true)])
}

fn cast_case() -> Case {
    // 1e5 and -1e6 overflow f16 to ±inf; 3e38 overflows f16 but not bf16.
    let x = [NAN, INF, -INF, 1e5, 65504.0, -1e6, 3e38, 1.5];
    Case::new("cast/special", &["cast"], |ctx, x| {
        // Back to the dtype under test on the reference too, so both round (65504 through bf16
        // is 65536, inf in f16) the same way.
        let through = |dtype: DType| x[0].to_dtype(dtype)?.to_dtype(ctx.under_test);
        Ok(vec![through(DType::F16)?, through(DType::BF16)?, through(DType::F32)?])
    })
    .input(given("x", &[x.len()], &x))
    .forward_only()
}

fn matmul_case() -> Case {
    // inf * 0 is NaN inside a dot product; a NaN poisons its row.
    let a = [INF, 0.0, 1.0, 1.0, NAN, 2.0];
    let b = [0.0, 1.0, 1.0, 1.0, 1.0, -INF];
    Case::new("matmul/special", &["matmul"], |_, x| Ok(vec![x[0].matmul(&x[1])?]))
        .input(given("a", &[2, 3], &a))
        .input(given("b", &[3, 2], &b))
        .forward_only()
        .oracle(|x| vec![host::matmul(&x[0], &x[1])])
}

pub fn cases() -> Vec<Case> {
    let mut all = unary_cases();
    all.extend(binary_cases());
    all.extend(compare_cases());
    all.extend(reduce_cases());
    all.extend(softmax_cases());
    all.push(max_pool_case());
    all.push(cast_case());
    all.push(matmul_case());
    all
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conformance::host::HostTensor;

    #[test]
    fn the_reference_rules_are_pytorchs() {
        let row = HostTensor::new([1, 4], vec![1.0, NAN, 3.0, NAN]);
        assert_eq!(row.argmax(1).values, vec![1.0]);
        assert!(row.reduce(&[1], false, -INF, host::max_nan).values[0].is_nan());
        let soft = host::softmax(&HostTensor::new([1, 2], vec![INF, 1.0]), 1, false);
        assert!(soft.values.iter().all(|v| v.is_nan()), "{:?}", soft.values);
        assert!(unary_ref(UnaryOp::Relu)(NAN).is_nan());
        assert_eq!(unary_ref(UnaryOp::NonFinite)(-INF), 1.0);
    }
}
