//! Cases for `reduce`: sum over any axes (leading, trailing, middle, all, none of them
//! contiguous), max/min/argmax along one axis, on views, empty and size-1 dims.

use crate::conformance::case::{Case, Input, Values, View};
use crate::conformance::host::HostTensor;

fn sum_cases() -> Vec<Case> {
    let u = Values::Uniform { low: -2.0, high: 2.0 };
    let x = |shape: &[usize]| Input::float("x", shape.to_vec(), u.clone());
    let shapes: Vec<(&str, Input, Vec<usize>)> = vec![
        ("7x13/last", x(&[7, 13]), vec![1]),
        ("7x13/first", x(&[7, 13]), vec![0]),
        ("7x13/all", x(&[7, 13]), vec![0, 1]),
        ("T/last", x(&[7, 13]).transposed(), vec![1]),
        ("2x3x5/outer", x(&[2, 3, 5]), vec![0, 2]),
        ("2x3x5/middle", x(&[2, 3, 5]), vec![1]),
        (
            "permute3/middle",
            x(&[5, 2, 3]).view(View::Permute(vec![1, 2, 0])),
            vec![1],
        ),
        (
            "narrow/first",
            x(&[9, 6]).view(View::Narrow {
                axis: 0,
                start: 1,
                len: 7,
            }),
            vec![0],
        ),
        ("bcast/first", x(&[1, 13]).broadcast([7, 13]), vec![0]),
        ("long", x(&[3, 1000]), vec![1]),
        ("empty/reduced", x(&[0, 3]), vec![0]),
        ("empty/kept", x(&[0, 3]), vec![1]),
        ("ones", x(&[1, 5, 1]), vec![0, 2]),
        ("scalar", x(&[]), vec![]),
    ];
    shapes
        .into_iter()
        .map(|(label, input, axes)| {
            let signed: Vec<isize> = axes.iter().map(|&a| a as isize).collect();
            let n: usize = input
                .logical_shape()
                .iter()
                .enumerate()
                .filter(|(i, _)| axes.contains(i))
                .map(|(_, &d)| d)
                .product();
            Case::new(format!("reduce:sum/{label}"), &["reduce:sum"], move |_, x| {
                Ok(vec![x[0].sum(&signed, false)?])
            })
            .input(input)
            // Long sums round more: allow the error to grow like the square root of the count.
            .tol_scale((n as f64).sqrt().max(1.0) / 4.0 + 1.0)
            .oracle(move |x| vec![x[0].sum(&axes, false)])
        })
        .collect()
}

fn mean_cases() -> Vec<Case> {
    let x = Input::float("x", [4, 6, 5], Values::Uniform { low: -2.0, high: 2.0 });
    vec![
        Case::new("reduce:sum/mean", &["reduce:sum", "unary:affine"], |_, x| {
            Ok(vec![x[0].mean(&[0, -1], true)?])
        })
        .input(x)
        .oracle(|x| vec![x[0].sum(&[0, 2], true).map(|v| v / 20.0)]),
    ]
}

fn extremum_cases() -> Vec<Case> {
    // Distinct values: no ties, so the gradient (to the extremal element) is well defined.
    let d = Values::Distinct { low: -3.0, high: 3.0 };
    let x = |shape: &[usize]| Input::float("x", shape.to_vec(), d.clone());
    let shapes: Vec<(&str, Input, usize, bool)> = vec![
        ("7x13/last", x(&[7, 13]), 1, false),
        ("7x13/first", x(&[7, 13]), 0, true),
        ("T/last", x(&[7, 13]).transposed(), 1, false),
        ("2x3x5/middle", x(&[2, 3, 5]), 1, false),
        (
            "narrow",
            x(&[6, 9]).view(View::Narrow {
                axis: 1,
                start: 2,
                len: 5,
            }),
            1,
            true,
        ),
        ("size1", x(&[1, 5]), 0, false),
        ("empty/kept", x(&[0, 4]), 1, false),
    ];
    let mut cases = Vec::new();
    for (max, kind) in [(true, "max"), (false, "min")] {
        for (label, input, axis, keepdim) in shapes.clone() {
            let name = format!("reduce:{kind}");
            cases.push(
                Case::new(
                    format!("{name}/{label}"),
                    &[name.as_str(), "compare:eq", "reduce:argmax"],
                    move |_, x| {
                        let a = axis as isize;
                        Ok(vec![if max {
                            x[0].max(a, keepdim)?
                        } else {
                            x[0].min(a, keepdim)?
                        }])
                    },
                )
                .input(input)
                .oracle(move |x| {
                    let f = if max { f64::max } else { f64::min };
                    let init = if max { f64::NEG_INFINITY } else { f64::INFINITY };
                    vec![x[0].reduce(&[axis], keepdim, init, f)]
                }),
            );
        }
    }
    cases
}

fn argmax_cases() -> Vec<Case> {
    // Few distinct values: many ties, so the first-maximum rule is exercised.
    let l = Values::Lattice {
        step: 0.5,
        phase: 0.0,
        half_range: 2,
    };
    let x = |shape: &[usize]| Input::float("x", shape.to_vec(), l.clone()).no_grad();
    let shapes: Vec<(&str, Input, usize)> = vec![
        ("7x13/last", x(&[7, 13]), 1),
        ("7x13/first", x(&[7, 13]), 0),
        ("T/last", x(&[7, 13]).transposed(), 1),
        ("2x3x5/last", x(&[2, 3, 5]), 2),
        ("bcast", x(&[1, 6]).broadcast([4, 6]), 0),
        ("size1", x(&[5, 1]), 1),
        (
            "ties",
            Input::float(
                "x",
                [2, 4],
                Values::Given(vec![1.0, 3.0, 3.0, 2.0, -1.0, -1.0, -1.0, -1.0]),
            )
            .no_grad(),
            1,
        ),
    ];
    shapes
        .into_iter()
        .map(|(label, input, axis)| {
            Case::new(format!("reduce:argmax/{label}"), &["reduce:argmax"], move |_, x| {
                Ok(vec![x[0].argmax(axis as isize, false)?])
            })
            .input(input)
            .forward_only()
            .oracle(move |x: &[HostTensor]| vec![x[0].argmax(axis)])
        })
        .collect()
}

pub fn cases() -> Vec<Case> {
    let mut all = sum_cases();
    all.extend(mean_cases());
    all.extend(extremum_cases());
    all.extend(argmax_cases());
    all
}
