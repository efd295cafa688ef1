//! Cases for `unary`, `binary`, `compare` and `where_cond`: every op variant at contiguous,
//! transposed, narrowed, broadcast, empty and scalar shapes.

use crate::backend::{BinaryOp, CmpOp, UnaryOp};
use crate::conformance::case::{Case, Input, Values, View};
use crate::conformance::host::{self, HostTensor};
use crate::dtype::DType;
use crate::error::Result;
use crate::tensor::Tensor;

/// Input values that keep each unary op in its domain and away from its kinks.
fn unary_values(op: UnaryOp) -> Values {
    match op {
        UnaryOp::Log | UnaryOp::Sqrt | UnaryOp::Powf(_) => Values::Uniform { low: 0.5, high: 2.5 },
        UnaryOp::Recip => Values::AwayFrom {
            center: 0.0,
            lo: 0.5,
            hi: 2.0,
        },
        UnaryOp::Abs | UnaryOp::Relu => Values::AwayFrom {
            center: 0.0,
            lo: 0.05,
            hi: 2.0,
        },
        UnaryOp::ClampMin(m) | UnaryOp::ClampMax(m) => Values::AwayFrom {
            center: m,
            lo: 0.05,
            hi: 1.5,
        },
        _ => Values::Uniform { low: -3.0, high: 3.0 },
    }
}

pub fn unary_ref(op: UnaryOp) -> impl Fn(f64) -> f64 + Send + Sync + 'static {
    move |x: f64| match op {
        UnaryOp::Neg => -x,
        UnaryOp::Abs => x.abs(),
        UnaryOp::Exp => x.exp(),
        UnaryOp::Log => x.ln(),
        UnaryOp::Sqrt => x.sqrt(),
        UnaryOp::Recip => 1.0 / x,
        UnaryOp::Tanh => x.tanh(),
        UnaryOp::Sigmoid => 1.0 / (1.0 + (-x).exp()),
        UnaryOp::Relu => host::max_nan(x, 0.0),
        UnaryOp::Gelu => host::gelu(x),
        UnaryOp::GeluGrad => host::gelu_grad(x),
        UnaryOp::Powf(e) => x.powf(e),
        UnaryOp::Affine { mul, add } => x * mul + add,
        UnaryOp::ClampMin(m) => host::max_nan(x, m),
        UnaryOp::ClampMax(m) => host::min_nan(x, m),
        UnaryOp::NonFinite => f64::from(u8::from(!x.is_finite())),
    }
}

/// The layouts every elementwise op is run on: (label, input builder from values).
fn unary_shapes(values: Values) -> Vec<(&'static str, Input)> {
    let x = |shape: &[usize]| Input::float("x", shape.to_vec(), values.clone());
    vec![
        ("7x13", x(&[7, 13])),
        ("T", x(&[7, 13]).transposed()),
        (
            "narrow",
            x(&[9, 15])
                .view(View::Narrow {
                    axis: 1,
                    start: 1,
                    len: 13,
                })
                .view(View::Narrow {
                    axis: 0,
                    start: 2,
                    len: 7,
                }),
        ),
        ("bcast", x(&[1, 13]).broadcast([7, 13])),
        ("permute3", x(&[4, 2, 3]).view(View::Permute(vec![2, 0, 1]))),
        ("empty", x(&[0, 3])),
        ("scalar", x(&[])),
        ("ones", x(&[1, 1, 1])),
    ]
}

fn unary_cases() -> Vec<Case> {
    let mut cases = Vec::new();
    for op in UnaryOp::ALL {
        let name = format!("unary:{}", op.name());
        for (label, input) in unary_shapes(unary_values(op)) {
            let f = unary_ref(op);
            cases.push(
                Case::new(format!("{name}/{label}"), &[name.as_str()], move |_, x| {
                    Ok(vec![x[0].unary(op)?])
                })
                .input(input)
                .tol_scale(if matches!(op, UnaryOp::GeluGrad) { 2.0 } else { 1.0 })
                .oracle(move |x| vec![x[0].map(&f)]),
            );
        }
    }
    cases
}

fn binary_values(op: BinaryOp) -> (Values, Values) {
    match op {
        BinaryOp::Div => (
            Values::Uniform { low: -2.0, high: 2.0 },
            Values::AwayFrom {
                center: 0.0,
                lo: 0.5,
                hi: 2.0,
            },
        ),
        BinaryOp::Pow => (
            Values::Uniform { low: 0.5, high: 2.0 },
            Values::Uniform { low: -1.5, high: 1.5 },
        ),
        // The mask's input stays away from its kink, so finite differences see its flat gradient.
        BinaryOp::ReluGrad => (
            Values::Uniform { low: -2.0, high: 2.0 },
            Values::AwayFrom {
                center: 0.0,
                lo: 0.25,
                hi: 2.0,
            },
        ),
        // Two lattices a quarter step apart never tie, so the gradient is well defined.
        BinaryOp::Maximum | BinaryOp::Minimum => (
            Values::Lattice {
                step: 0.125,
                phase: 0.25,
                half_range: 12,
            },
            Values::Lattice {
                step: 0.125,
                phase: 0.75,
                half_range: 12,
            },
        ),
        _ => (
            Values::Uniform { low: -2.0, high: 2.0 },
            Values::Uniform { low: -2.0, high: 2.0 },
        ),
    }
}

pub fn binary_ref(op: BinaryOp) -> impl Fn(f64, f64) -> f64 + Send + Sync + Copy + 'static {
    move |a: f64, b: f64| match op {
        BinaryOp::Add => a + b,
        BinaryOp::Sub => a - b,
        BinaryOp::Mul => a * b,
        BinaryOp::Div => a / b,
        BinaryOp::Pow => a.powf(b),
        BinaryOp::Maximum => host::max_nan(a, b),
        BinaryOp::Minimum => host::min_nan(a, b),
        BinaryOp::ReluGrad => {
            if b > 0.0 {
                a
            } else {
                0.0
            }
        }
    }
}

/// Operand pairs: same shape, one or both broadcast, transposed, narrowed, 3-D, empty, scalar.
fn binary_shapes(va: &Values, vb: &Values) -> Vec<(&'static str, Input, Input)> {
    let a = |shape: &[usize]| Input::float("a", shape.to_vec(), va.clone());
    let b = |shape: &[usize]| Input::float("b", shape.to_vec(), vb.clone());
    vec![
        ("7x13", a(&[7, 13]), b(&[7, 13])),
        ("row", a(&[7, 13]), b(&[13])),
        ("outer", a(&[7, 1]), b(&[1, 13])),
        ("T", a(&[7, 13]).transposed(), b(&[7, 13])),
        (
            "narrow",
            a(&[]),
            b(&[5, 6]).view(View::Narrow {
                axis: 1,
                start: 2,
                len: 3,
            }),
        ),
        (
            "3d",
            a(&[2, 3, 4]),
            b(&[3, 1]).transposed().view(View::Broadcast(vec![2, 3, 4])),
        ),
        (
            "explicit_bcast",
            a(&[1, 13]).broadcast([7, 13]),
            b(&[7, 13]).transposed(),
        ),
        ("empty", a(&[0, 3]), b(&[3])),
        ("scalar", a(&[]), b(&[])),
    ]
}

fn binary_cases() -> Vec<Case> {
    let mut cases = Vec::new();
    for op in BinaryOp::ALL {
        let name = format!("binary:{}", op.name());
        let (va, vb) = binary_values(op);
        let mut shapes = binary_shapes(&va, &vb);
        if matches!(op, BinaryOp::Maximum | BinaryOp::Minimum) {
            // Equal operands on purpose: ties split the gradient evenly (as in PyTorch). Not
            // differentiable there, so compared with the reference but not gradient-checked.
            let tie = Values::Lattice {
                step: 0.25,
                phase: 0.0,
                half_range: 2,
            };
            shapes.push((
                "ties",
                Input::float("a", [7, 13], tie.clone()),
                Input::float("b", [13], tie),
            ));
        }
        for (label, a, b) in shapes {
            let f = binary_ref(op);
            let case = Case::new(format!("{name}/{label}"), &[name.as_str()], move |_, x| {
                Ok(vec![apply_binary(op, &x[0], &x[1])?])
            })
            .input(a)
            .input(b)
            .tol_scale(if op == BinaryOp::Pow { 2.0 } else { 1.0 })
            .oracle(move |x| vec![x[0].zip(&x[1], f)]);
            cases.push(if label == "ties" { case.no_gradcheck() } else { case });
        }
    }
    cases
}

/// `binary_mixed`: autocast's add or subtract of an f32 operand and one in the dtype under test,
/// read as it is (the residual stream plus a branch); the f32 operand first, or second. The
/// reference runs the same op in f64.
fn binary_mixed_cases() -> Vec<Case> {
    let mut cases = Vec::new();
    let chosen = [
        (BinaryOp::Add, true, ["7x13", "row", "3d"].as_slice()),
        (BinaryOp::Sub, false, ["row", "T"].as_slice()),
    ];
    for (op, f32_first, labels) in chosen {
        let variant = format!("binary:{}", op.name());
        let (va, vb) = binary_values(op);
        for (label, a, b) in binary_shapes(&va, &vb) {
            if !labels.contains(&label) {
                continue;
            }
            let f = binary_ref(op);
            let side = if f32_first { "f32_first" } else { "f32_second" };
            let name = format!("binary_mixed/{}_{label}_{side}", op.name());
            let case = Case::new(name, &["binary_mixed", variant.as_str()], move |ctx, x| {
                let (a, b) = if f32_first {
                    (ctx.widened(&x[0])?, x[1].clone())
                } else {
                    (x[0].clone(), ctx.widened(&x[1])?)
                };
                crate::autocast::autocast(ctx.under_test, || Ok(vec![apply_binary(op, &a, &b)?]))
            });
            cases.push(
                case.input(a)
                    .input(b)
                    .dtypes(&[DType::F16, DType::BF16])
                    .oracle(move |x| vec![x[0].zip(&x[1], f)]),
            );
        }
    }
    cases
}

/// `a op b` through the tensor method a user calls.
pub fn apply_binary(op: BinaryOp, a: &Tensor, b: &Tensor) -> Result<Tensor> {
    match op {
        BinaryOp::Add => a.add(b),
        BinaryOp::Sub => a.sub(b),
        BinaryOp::Mul => a.mul(b),
        BinaryOp::Div => a.div(b),
        BinaryOp::Pow => a.pow(b),
        BinaryOp::Maximum => a.maximum(b),
        BinaryOp::Minimum => a.minimum(b),
        BinaryOp::ReluGrad => a.relu_grad(b),
    }
}

pub fn cmp_ref(op: CmpOp) -> impl Fn(f64, f64) -> f64 + Send + Sync + Copy + 'static {
    move |a: f64, b: f64| {
        let holds = match op {
            CmpOp::Eq => a == b,
            CmpOp::Ne => a != b,
            CmpOp::Lt => a < b,
            CmpOp::Le => a <= b,
            CmpOp::Gt => a > b,
            CmpOp::Ge => a >= b,
        };
        if holds { 1.0 } else { 0.0 }
    }
}

fn compare_cases() -> Vec<Case> {
    // One lattice for both operands: many exact ties, so eq/le/ge are exercised at equality.
    let v = Values::Lattice {
        step: 0.25,
        phase: 0.0,
        half_range: 3,
    };
    let mut cases = Vec::new();
    for op in CmpOp::ALL {
        let name = format!("compare:{}", op.name());
        let shapes = [
            (
                "7x13",
                Input::float("a", [7, 13], v.clone()),
                Input::float("b", [7, 13], v.clone()),
            ),
            (
                "row",
                Input::float("a", [7, 13], v.clone()).transposed(),
                Input::float("b", [13], v.clone()),
            ),
            (
                "empty",
                Input::float("a", [0, 4], v.clone()),
                Input::float("b", [1, 4], v.clone()),
            ),
            // Compare also runs on index dtypes (the max/min backward compares U32 positions).
            ("u32", Input::indices("a", [5, 6], 4), Input::indices("b", [6], 4)),
        ];
        for (label, a, b) in shapes {
            let f = cmp_ref(op);
            cases.push(
                Case::new(format!("{name}/{label}"), &[name.as_str()], move |_, x| {
                    Ok(vec![x[0].cmp(op, &x[1])?])
                })
                .input(a.no_grad())
                .input(b.no_grad())
                .forward_only()
                .oracle(move |x| vec![x[0].zip(&x[1], f)]),
            );
        }
    }
    cases
}

fn where_cases() -> Vec<Case> {
    let u = Values::Uniform { low: -2.0, high: 2.0 };
    let oracle = |x: &[HostTensor]| {
        let dims = host::broadcast_dims(&host::broadcast_dims(&x[0].dims, &x[1].dims), &x[2].dims);
        let (c, t, f) = (
            x[0].broadcast_to(&dims),
            x[1].broadcast_to(&dims),
            x[2].broadcast_to(&dims),
        );
        vec![HostTensor::new(
            dims,
            c.values
                .iter()
                .zip(t.values.iter().zip(&f.values))
                .map(|(&c, (&t, &f))| if c != 0.0 { t } else { f })
                .collect(),
        )]
    };
    let shapes = [
        (
            "7x13",
            Input::mask("cond", [7, 13]),
            Input::float("t", [7, 13], u.clone()),
            Input::float("f", [13], u.clone()),
        ),
        (
            "contiguous",
            Input::mask("cond", [7, 13]),
            Input::float("t", [7, 13], u.clone()),
            Input::float("f", [7, 13], u.clone()),
        ),
        (
            "scalar_f",
            Input::mask("cond", [7, 13]),
            Input::float("t", [7, 13], u.clone()),
            Input::float("f", [], u.clone()),
        ),
        (
            "bcast_cond",
            Input::mask("cond", [7, 1]),
            Input::float("t", [7, 13], u.clone()).transposed(),
            Input::float("f", [], u.clone()),
        ),
        (
            "narrow",
            Input::mask("cond", [4, 6]).view(View::Narrow {
                axis: 1,
                start: 1,
                len: 4,
            }),
            Input::float("t", [4], u.clone()),
            Input::float("f", [4, 4], u.clone()),
        ),
        (
            "empty",
            Input::mask("cond", [0, 5]),
            Input::float("t", [0, 5], u.clone()),
            Input::float("f", [5], u.clone()),
        ),
    ];
    shapes
        .into_iter()
        .map(|(label, c, t, f)| {
            Case::new(format!("where_cond/{label}"), &["where_cond"], |_, x| {
                Ok(vec![x[0].where_cond(&x[1], &x[2])?])
            })
            .input(c)
            .input(t)
            .input(f)
            .oracle(oracle)
        })
        .collect()
}

pub fn cases() -> Vec<Case> {
    let mut all = unary_cases();
    all.extend(binary_cases());
    all.extend(binary_mixed_cases());
    all.extend(compare_cases());
    all.extend(where_cases());
    all
}
