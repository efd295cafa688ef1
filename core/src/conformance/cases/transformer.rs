//! Cases for the transformer's ops: layer normalisation over the last axis (the backend's fused
//! row kernels), dropout (its mask drawn from the counter stream), and, composed from other
//! ops, a masked fill and causal scaled dot-product attention.

use crate::conformance::case::{Case, Input, Values};
use crate::conformance::host::{self, HostTensor};
use crate::dtype::DType;

fn u() -> Values {
    Values::Uniform { low: -2.0, high: 2.0 }
}

/// `(x - mean) / sqrt(var + eps) * w + b` over the last axis, in f64 (an absent `w` scales by 1,
/// an absent `b` adds 0).
fn layer_norm(x: &HostTensor, w: Option<&HostTensor>, b: Option<&HostTensor>, eps: f64) -> HostTensor {
    let last = x.dims.len() - 1;
    let n = x.dims[last] as f64;
    let mean = x.sum(&[last], true).map(|v| v / n);
    let centred = x.zip(&mean, |a, m| a - m);
    let var = centred.map(|d| d * d).sum(&[last], true).map(|v| v / n);
    let mut y = centred.zip(&var, |d, v| d / (v + eps).sqrt());
    if let Some(w) = w {
        y = y.zip(w, |a, w| a * w);
    }
    if let Some(b) = b {
        y = y.zip(b, |a, b| a + b);
    }
    y
}

/// softmax(q·kᵀ/sqrt(d) with the future masked)·v, for `[batch, heads, t, d]` inputs; with
/// `dropout` (p, seed), each weight kept as `Backend::dropout` keeps it, from counter 0.
fn causal_attention(q: &HostTensor, k: &HostTensor, v: &HostTensor, dropout: Option<(f64, u64)>) -> HostTensor {
    let r = q.dims.len();
    let d = q.dims[r - 1] as f64;
    let mut perm: Vec<usize> = (0..r).collect();
    perm.swap(r - 2, r - 1);
    let scores = host::matmul(q, &k.permute(&perm));
    let masked = HostTensor::from_fn(scores.dims.clone(), |idx| {
        let (i, j) = (idx[r - 2], idx[r - 1]);
        if j > i {
            f64::NEG_INFINITY
        } else {
            scores.at(idx) / d.sqrt()
        }
    });
    let mut weights = host::softmax(&masked, r - 1, false);
    if let Some((p, seed)) = dropout {
        let kept = |i: usize| crate::rng::uniform_at(seed, 0, i) as f32 >= p as f32;
        let values = weights.values.iter().enumerate();
        weights.values = values
            .map(|(i, &w)| if kept(i) { w / (1.0 - p) } else { 0.0 })
            .collect();
    }
    host::matmul(&weights, v)
}

/// `causal_self_attention`'s oracle: each head's `causal_attention` of the slots of qkv
/// `[batch, t, 3, heads, d]`, as `[batch, t, heads, d]`; `dropout` as `causal_attention`'s.
fn causal_self_attention(qkv: &HostTensor, dropout: Option<(f64, u64)>) -> HostTensor {
    let &[b, t, _, h, d] = qkv.dims.as_slice() else {
        unreachable!("qkv is rank 5")
    };
    let slot = |s: usize| HostTensor::from_fn([b, h, t, d], |i| qkv.at(&[i[0], i[2], s, i[1], i[3]]));
    let y = causal_attention(&slot(0), &slot(1), &slot(2), dropout);
    y.permute(&[0, 2, 1, 3])
}

/// The fused attention (`Backend::causal_attention`) where a backend has it, else composed:
/// sequences of one token, of fewer and more tokens than a GPU's 64-row tiles and not a
/// multiple of them; GPT-2's 64 channels a head, and 32 and 128.
fn fused_attention_cases() -> Vec<Case> {
    let ops = &[
        "causal_attention",
        "causal_attention_backward",
        "matmul",
        "softmax_last",
        "causal_softmax",
        "causal_softmax_backward",
    ];
    // (batch, heads, t, head_dim)
    let mut shapes: Vec<[usize; 4]> = [1, 17, 64, 128, 200]
        .into_iter()
        .flat_map(|t| [[1, 1, t, 64], [2, 3, t, 64]])
        .collect();
    shapes.extend([[2, 3, 70, 32], [1, 2, 130, 128]]);
    let mut cases = Vec::new();
    for [batch, heads, t, d] in shapes {
        let label = format!("{batch}x{t}x3x{heads}x{d}");
        let case = Case::new(format!("causal_attention/qkv_{label}"), ops, |_, x| {
            Ok(vec![x[0].causal_self_attention(None)?])
        })
        .input(Input::float("qkv", [batch, t, 3, heads, d], u()))
        // The fused kernels round the weights and their gradients to the input dtype between
        // the two products of each pass, as every flash attention does.
        .tol_scale(4.0)
        .oracle(|x| vec![causal_self_attention(&x[0], None)]);
        // The composed reference is gradient-checked here once, and through causal_attention.
        cases.push(if (batch, t, d) == (1, 17, 64) {
            case
        } else {
            case.no_gradcheck()
        });
    }
    // Dropout on the weights, drawn where the composed path draws it (fused kernels that draw
    // none decline): one partial block, and blocks of 64 on either side of a partial one.
    for [batch, heads, t, d] in [[2, 3, 17, 8], [1, 2, 130, 16]] {
        let label = format!("{batch}x{t}x3x{heads}x{d}");
        cases.push(
            Case::new(format!("causal_attention/dropout_qkv_{label}"), ops, |_, x| {
                Ok(vec![
                    x[0].causal_self_attention(Some((0.3, &crate::rng::Generator::new(5))))?,
                ])
            })
            .input(Input::float("qkv", [batch, t, 3, heads, d], u()))
            .tol_scale(4.0)
            .oracle(|x| vec![causal_self_attention(&x[0], Some((0.3, 5)))])
            .no_gradcheck(),
        );
    }
    // A NaN in query 5 poisons row 5; one in key 9 the rows that see it (9 onwards), not the
    // rows before it, which never read it.
    let (t, d) = (17, 64);
    let mut values: Vec<f64> = (0..t * 3 * d).map(|i| ((i * 37) % 101) as f64 / 25.0 - 2.0).collect();
    values[(5 * 3) * d + 3] = f64::NAN;
    values[(9 * 3 + 1) * d + 7] = f64::NAN;
    cases.push(
        Case::new("causal_attention/nan_1x17x3x1x64", ops, |_, x| {
            Ok(vec![x[0].causal_self_attention(None)?])
        })
        .input(Input::float("qkv", [1, t, 3, 1, d], Values::Given(values)).no_grad())
        .forward_only(),
    );
    cases
}

/// `layer_norm_last/{label}`: `x` normalised over its last axis, with a weight and a bias where
/// asked (inputs after `x`, in that order), compared with the oracle and finite differences.
fn layer_norm_case(label: &str, input: Input, weight: bool, bias: bool) -> Case {
    let features = *input.logical_shape().last().unwrap();
    let mut case = Case::new(
        format!("layer_norm_last/{label}"),
        &["layer_norm_last", "layer_norm_last_backward"],
        move |_, x| {
            let w = weight.then(|| &x[1]);
            let b = bias.then(|| &x[x.len() - 1]);
            Ok(vec![x[0].layer_norm(w, b, 1e-5)?])
        },
    )
    .input(input);
    if weight {
        case = case.input(Input::float("weight", [features], u()));
    }
    if bias {
        case = case.input(Input::float("bias", [features], u()));
    }
    // Several roundings in the low dtypes (mean, centring, variance, scale, shift).
    case.tol_scale(4.0).oracle(move |x| {
        let w = weight.then(|| &x[1]);
        let b = bias.then(|| &x[x.len() - 1]);
        vec![layer_norm(&x[0], w, b, 1e-5)]
    })
}

/// `layer_norm_last_to/{label}`: an f32 LayerNorm's output rounded to the dtype under test (the
/// input of an autocast product), its gradient coming back in that dtype; the inputs arrive in
/// the dtype under test and are widened first. The reference normalises in f64.
fn layer_norm_to_case(label: &str, input: Input) -> Case {
    let features = *input.logical_shape().last().unwrap();
    Case::new(
        format!("layer_norm_last_to/{label}"),
        &["layer_norm_last_to", "layer_norm_last_to_backward"],
        |ctx, x| {
            let [x, w, b] = [&x[0], &x[1], &x[2]].map(|t| ctx.widened(t));
            Ok(vec![x?.layer_norm_to(Some(&w?), Some(&b?), 1e-5, ctx.dtype)?])
        },
    )
    .input(input)
    .input(Input::float("weight", [features], u()))
    .input(Input::float("bias", [features], u()))
    .dtypes(&[DType::F16, DType::BF16])
    .oracle(|x| vec![layer_norm(&x[0], Some(&x[1]), Some(&x[2]), 1e-5)])
}

/// `add_layer_norm_last_to/{label}`: the f32 residual stream plus a branch in the dtype under
/// test (read as it is, under autocast to it), and the sum's LayerNorm in that dtype: a pre-norm
/// block's residual add and the LayerNorm after it. Both the sum and the normalised sum are
/// outputs, so the sum's gradient comes from two uses. In f32 everything is f32. The reference
/// adds and normalises in f64.
fn add_layer_norm_case(label: &str, residual: Input, branch: Input) -> Case {
    let features = *residual.logical_shape().last().unwrap();
    Case::new(
        format!("add_layer_norm_last_to/{label}"),
        &["add_layer_norm_last_to", "layer_norm_last_to_backward"],
        |ctx, x| {
            let [r, w, b] = [&x[0], &x[2], &x[3]].map(|t| ctx.widened(t));
            let (r, w, b) = (r?, w?, b?);
            let half = matches!(ctx.dtype, DType::F16 | DType::BF16).then_some(ctx.dtype);
            let run = || {
                let (sum, normed) = r.add_layer_norm(&x[1], Some(&w), Some(&b), 1e-5, half)?;
                Ok(vec![sum, normed])
            };
            match half {
                Some(dtype) => crate::autocast::autocast(dtype, run),
                None => run(),
            }
        },
    )
    .input(residual)
    .input(branch)
    .input(Input::float("weight", [features], u()))
    .input(Input::float("bias", [features], u()))
    .tol_scale(4.0)
    .oracle(|x| {
        let sum = x[0].zip(&x[1], |a, b| a + b);
        let normed = layer_norm(&sum, Some(&x[2]), Some(&x[3]), 1e-5);
        vec![sum, normed]
    })
}

pub fn cases() -> Vec<Case> {
    let mut cases = Vec::new();
    let shapes: [(&str, &[usize]); 3] = [("wide", &[6, 300]), ("3d", &[2, 3, 8]), ("odd_columns", &[5, 7])];
    for (label, shape) in shapes {
        let input = |name| Input::float(name, shape.to_vec(), u());
        cases.push(add_layer_norm_case(label, input("residual"), input("branch")));
    }
    for (label, input) in [
        ("wide", Input::float("x", [6, 300], u())),
        ("many_rows", Input::float("x", [45, 300], u()).transposed()),
        // An odd row length: a bf16 word would straddle two rows (wgpu composes these).
        ("odd_columns", Input::float("x", [5, 7], u())),
    ] {
        cases.push(layer_norm_to_case(label, input));
    }
    for (label, input) in [
        ("3d", Input::float("x", [2, 3, 8], u())),
        ("T", Input::float("x", [5, 6], u()).transposed()),
        ("one_feature", Input::float("x", [4, 1], u())),
        // Rows long enough that a GPU combines each over several invocations.
        ("wide", Input::float("x", [6, 300], u())),
        // Rows enough that the weight's and bias's gradients are summed over several chunks of
        // rows on every backend (the last one partial), 300 columns not a multiple of a GPU's
        // group of invocations.
        ("many_rows", Input::float("x", [45, 300], u())),
    ] {
        cases.push(layer_norm_case(label, input, true, true));
    }
    for (label, weight, bias) in [
        ("weight_only", true, false),
        ("bias_only", false, true),
        ("plain", false, false),
    ] {
        let input = Input::float("x", [19, 37], u());
        cases.push(layer_norm_case(label, input, weight, bias));
    }
    // A fresh generator per evaluation: the gradient check sees one mask throughout. 35
    // elements leave a partial Philox block at the end.
    for (label, input) in [
        ("5x7", Input::float("x", [5, 7], u())),
        ("T", Input::float("x", [6, 5], u()).transposed()),
    ] {
        cases.push(
            Case::new(format!("dropout/{label}"), &["dropout"], |_, x| {
                Ok(vec![x[0].dropout(0.3, true, &crate::rng::Generator::new(7))?])
            })
            .input(input)
            .oracle(|x| {
                let kept = |i: usize| crate::rng::uniform_at(7, 0, i) as f32 >= 0.3f32;
                let values = x[0].values.iter().enumerate();
                let values = values.map(|(i, &v)| if kept(i) { v / 0.7 } else { 0.0 }).collect();
                vec![HostTensor::new(x[0].dims.clone(), values)]
            }),
        );
    }
    cases.push(
        Case::new("where_cond/masked_fill", &["where_cond"], |_, x| {
            Ok(vec![x[0].masked_fill(&x[1], -3.5)?])
        })
        .input(Input::float("x", [3, 4, 5], u()))
        .input(Input::mask("mask", [4, 5]))
        .oracle(|x| vec![x[0].zip(&x[1].broadcast_to(&x[0].dims), |a, m| if m != 0.0 { -3.5 } else { a })]),
    );
    // Fused where the backend has `causal_softmax` for the dtype, else composed from the rest.
    let ops = &[
        "softmax_last",
        "matmul",
        "compare:gt",
        "where_cond",
        "dropout",
        "causal_softmax",
        "causal_softmax_backward",
    ];
    for (label, dims, dropout) in [
        ("2x2x5x4", [2, 2, 5, 4], None),
        ("one_token", [1, 3, 1, 8], None),
        // Rows long enough that a GPU combines each over several invocations.
        ("long_1x2x70x4", [1, 2, 70, 4], None),
        ("dropout_2x3x9x4", [2, 3, 9, 4], Some((0.3, 5))),
    ] {
        cases.push(
            Case::new(format!("softmax_last/causal_attention_{label}"), ops, move |_, x| {
                let stream = dropout.map(|(p, seed)| (p, crate::rng::Generator::new(seed)));
                let dropout = stream.as_ref().map(|(p, g)| (*p, g));
                Ok(vec![x[0].causal_attention(&x[1], &x[2], dropout)?])
            })
            .input(Input::float("q", dims, u()))
            .input(Input::float("k", dims, u()))
            .input(Input::float("v", dims, u()))
            .tol_scale(2.0)
            .oracle(move |x| vec![causal_attention(&x[0], &x[1], &x[2], dropout)]),
        );
    }
    cases.extend(fused_attention_cases());
    cases
}
