//! Cases for the network ops: `softmax_last`/`log_softmax_last`, `im2col`/`col2im` (alone and
//! as convolutions), `max_pool2d`, and the composite losses and normalisations built on them.

use crate::backend::{Conv2dGeometry, UnaryOp};
use crate::conformance::case::{Case, Input, Values, View};
use crate::conformance::host::{self, HostTensor};
use crate::tensor::{Conv2dOptions, Pool2dOptions};

fn u() -> Values {
    Values::Uniform { low: -2.0, high: 2.0 }
}

fn softmax_cases() -> Vec<Case> {
    let shapes: Vec<(&str, Input, usize)> = vec![
        ("7x13", Input::float("x", [7, 13], u()), 1),
        ("axis0", Input::float("x", [7, 13], u()), 0),
        ("3d_middle", Input::float("x", [2, 5, 3], u()), 1),
        ("T", Input::float("x", [7, 13], u()).transposed(), 1),
        // Large logits: exp overflows f32 unless the kernel subtracts the row maximum first.
        (
            "large",
            Input::float(
                "x",
                [4, 9],
                Values::Uniform {
                    low: -100.0,
                    high: 100.0,
                },
            ),
            1,
        ),
        ("wide", Input::float("x", [3, 1000], u()), 1),
        ("1x1", Input::float("x", [1, 1], u()), 1),
        ("empty", Input::float("x", [0, 5], u()), 1),
    ];
    let mut cases = Vec::new();
    for log in [false, true] {
        let method = if log { "log_softmax_last" } else { "softmax_last" };
        // The gradient check runs the softmax's fused backward.
        let methods: &[&str] = if log {
            &["log_softmax_last"]
        } else {
            &["softmax_last", "softmax_last_backward"]
        };
        for (label, input, axis) in shapes.clone() {
            cases.push(
                Case::new(format!("{method}/{label}"), methods, move |_, x| {
                    let a = axis as isize;
                    Ok(vec![if log { x[0].log_softmax(a)? } else { x[0].softmax(a)? }])
                })
                .input(input)
                .tol_scale(if log && label == "large" { 4.0 } else { 1.0 })
                .oracle(move |x| vec![host::softmax(&x[0], axis, log)]),
            );
        }
    }
    cases
}

fn conv_cases() -> Vec<Case> {
    struct Conv {
        label: &'static str,
        x: [usize; 4],
        w: [usize; 4],
        opts: Conv2dOptions,
        bias: bool,
    }
    let o = |stride, padding, dilation, groups| Conv2dOptions {
        stride,
        padding,
        dilation,
        groups,
    };
    let convs = [
        Conv {
            label: "3x3_pad1",
            x: [2, 3, 7, 9],
            w: [4, 3, 3, 3],
            opts: o([1, 1], [1, 1], [1, 1], 1),
            bias: true,
        },
        Conv {
            label: "stride_dilation",
            x: [1, 2, 9, 11],
            w: [3, 2, 3, 2],
            opts: o([2, 1], [0, 1], [1, 2], 1),
            bias: false,
        },
        Conv {
            label: "groups3",
            x: [2, 6, 5, 5],
            w: [6, 2, 3, 3],
            opts: o([1, 1], [1, 0], [1, 1], 3),
            bias: true,
        },
        Conv {
            label: "1x1_stride2",
            x: [1, 4, 6, 7],
            w: [5, 4, 1, 1],
            opts: o([2, 2], [0, 0], [1, 1], 1),
            bias: false,
        },
        // ResNet's stem: 7x7, stride 2, padding 3, over odd sizes.
        Conv {
            label: "7x7_stride2_stem",
            x: [2, 3, 13, 11],
            w: [5, 3, 7, 7],
            opts: o([2, 2], [3, 3], [1, 1], 1),
            bias: false,
        },
        Conv {
            label: "3x3_stride2_odd",
            x: [3, 5, 9, 7],
            w: [6, 5, 3, 3],
            opts: o([2, 2], [1, 1], [1, 1], 1),
            bias: true,
        },
        Conv {
            label: "1x1",
            x: [2, 6, 5, 3],
            w: [7, 6, 1, 1],
            opts: o([1, 1], [0, 0], [1, 1], 1),
            bias: false,
        },
        // More than one 64-row block in each product (output channels, then input channels).
        Conv {
            label: "many_channels",
            x: [1, 66, 3, 3],
            w: [65, 66, 3, 3],
            opts: o([1, 1], [1, 1], [1, 1], 1),
            bias: false,
        },
        Conv {
            label: "kernel_fills_input",
            x: [3, 1, 4, 4],
            w: [2, 1, 4, 4],
            opts: o([1, 1], [0, 0], [1, 1], 1),
            bias: true,
        },
    ];
    convs
        .into_iter()
        .map(|c| {
            let (opts, bias) = (c.opts, c.bias);
            let k = c.w[1] * c.w[2] * c.w[3];
            let mut case = Case::new(
                format!("im2col/conv2d_{}", c.label),
                // Composed from the first three, or fused where the backend has the last two.
                &[
                    "im2col",
                    "col2im",
                    "matmul",
                    "conv2d_product",
                    "conv2d_product_backward",
                    "conv2d_nchw",
                    "conv2d_nchw_backward",
                ],
                move |_, x| Ok(vec![x[0].conv2d(&x[1], if bias { Some(&x[2]) } else { None }, opts)?]),
            )
            .input(Input::float("x", c.x, u()))
            .input(Input::float("w", c.w, Values::Uniform { low: -0.5, high: 0.5 }))
            .tol_scale((k as f64).sqrt() / 2.0 + 1.0);
            if bias {
                case = case.input(Input::float("bias", [c.w[0]], u()));
            }
            case.oracle(move |x| {
                let y = host::conv2d(&x[0], &x[1], opts.stride, opts.padding, opts.dilation, opts.groups);
                vec![if bias {
                    y.zip(&x[2].reshape([x[2].len(), 1, 1]), |a, b| a + b)
                } else {
                    y
                }]
            })
        })
        .collect()
}

/// For column-matrix entry (`row`, `col`) of `[c*kh*kw, n*oh*ow]`: the image, channel and input
/// pixel it reads, None where the tap falls in the padding.
fn tap(g: &Conv2dGeometry, row: usize, col: usize) -> (usize, usize, Option<(usize, usize)>) {
    let (c, ki, kj) = (row / (g.kh * g.kw), row / g.kw % g.kh, row % g.kw);
    let plane = g.out_h() * g.out_w();
    let (b, y, x) = (col / plane, col % plane / g.out_w(), col % g.out_w());
    let iy = (y * g.stride[0] + ki * g.dilation[0]) as isize - g.padding[0] as isize;
    let ix = (x * g.stride[1] + kj * g.dilation[1]) as isize - g.padding[1] as isize;
    let inside = iy >= 0 && ix >= 0 && (iy as usize) < g.h && (ix as usize) < g.w;
    (b, c, inside.then_some((iy as usize, ix as usize)))
}

/// im2col in plain index arithmetic: `[c*kh*kw, n*oh*ow]`.
fn host_im2col(x: &HostTensor, g: &Conv2dGeometry) -> HostTensor {
    HostTensor::from_fn([g.c * g.kh * g.kw, g.n * g.out_h() * g.out_w()], |i| {
        match tap(g, i[0], i[1]) {
            (b, c, Some((iy, ix))) => x.at(&[b, c, iy, ix]),
            _ => 0.0,
        }
    })
}

/// col2im as the adjoint of im2col: every column entry added back to the pixel it came from.
fn host_col2im(cols: &HostTensor, g: &Conv2dGeometry) -> HostTensor {
    let mut out = HostTensor::new([g.n, g.c, g.h, g.w], vec![0.0; g.n * g.c * g.h * g.w]);
    for (flat, &v) in cols.values.iter().enumerate() {
        let i = host::unravel(flat, &cols.dims);
        if let (b, c, Some((iy, ix))) = tap(g, i[0], i[1]) {
            out.values[((b * g.c + c) * g.h + iy) * g.w + ix] += v;
        }
    }
    out
}

fn unfold_cases() -> Vec<Case> {
    let geoms = [
        (
            "overlap",
            Conv2dGeometry {
                n: 2,
                c: 3,
                h: 5,
                w: 6,
                kh: 3,
                kw: 2,
                stride: [1, 2],
                padding: [1, 1],
                dilation: [1, 1],
            },
        ),
        (
            "dilated",
            Conv2dGeometry {
                n: 1,
                c: 2,
                h: 7,
                w: 7,
                kh: 2,
                kw: 3,
                stride: [2, 1],
                padding: [0, 2],
                dilation: [2, 1],
            },
        ),
    ];
    let mut cases = Vec::new();
    for (label, g) in geoms {
        cases.push(
            Case::new(format!("im2col/{label}"), &["im2col", "col2im"], move |_, x| {
                Ok(vec![x[0].im2col(g)?])
            })
            .input(Input::float("x", [g.n, g.c, g.h, g.w], u()))
            .oracle(move |x| vec![host_im2col(&x[0], &g)]),
        );
        cases.push(
            Case::new(format!("col2im/{label}"), &["col2im", "im2col"], move |_, x| {
                Ok(vec![x[0].col2im(g)?])
            })
            .input(Input::float(
                "cols",
                [g.c * g.kh * g.kw, g.n * g.out_h() * g.out_w()],
                u(),
            ))
            .tol_scale(2.0)
            .oracle(move |x| vec![host_col2im(&x[0], &g)]),
        );
    }
    cases
}

fn pool_cases() -> Vec<Case> {
    let p = |kernel, stride, padding| Pool2dOptions {
        kernel,
        stride,
        padding,
    };
    let pools = [
        ("2x2", [2, 3, 7, 9], p([2, 2], [2, 2], [0, 0])),
        ("3x3_pad1", [1, 2, 7, 6], p([3, 3], [2, 2], [1, 1])),
        ("2x3_overlap", [2, 1, 5, 8], p([2, 3], [1, 2], [0, 1])),
        ("global", [2, 3, 4, 5], p([4, 5], [1, 1], [0, 0])),
    ];
    let mut cases = Vec::new();
    for (label, dims, opts) in pools {
        cases.push(
            Case::new(
                format!("max_pool2d/{label}"),
                &["max_pool2d", "max_pool2d_backward"],
                move |_, x| Ok(vec![x[0].max_pool2d(opts)?]),
            )
            // Distinct values: a unique maximum per window, so the gradient is well defined.
            .input(Input::float("x", dims, Values::Distinct { low: -3.0, high: 3.0 }))
            .oracle(move |x| vec![host::pool2d(&x[0], opts.kernel, opts.stride, opts.padding, true)]),
        );
        cases.push(
            Case::new(
                format!("im2col/avg_pool2d_{label}"),
                &["im2col", "col2im", "reduce:sum"],
                move |_, x| Ok(vec![x[0].avg_pool2d(opts)?]),
            )
            .input(Input::float("x", dims, u()))
            .oracle(move |x| vec![host::pool2d(&x[0], opts.kernel, opts.stride, opts.padding, false)]),
        );
    }
    // Adaptive average pooling's three paths: one cell (a mean), even tiles (avg_pool2d), and
    // overlapping windows of different sizes (a product with an averaging matrix).
    type Adaptive = (&'static str, [usize; 4], [usize; 2], &'static [&'static str]);
    let adaptive: [Adaptive; 4] = [
        ("1x1", [2, 3, 5, 7], [1, 1], &["reduce:sum"]),
        ("tiles", [2, 2, 6, 4], [3, 2], &["im2col", "col2im", "reduce:sum"]),
        ("overlap", [1, 3, 5, 7], [3, 4], &["matmul"]),
        ("upsample", [2, 1, 2, 3], [3, 5], &["matmul"]),
    ];
    for (label, dims, out, methods) in adaptive {
        cases.push(
            Case::new(
                format!("{}/adaptive_avg_pool2d_{label}", methods[0]),
                methods,
                move |_, x| Ok(vec![x[0].adaptive_avg_pool2d(out)?]),
            )
            .input(Input::float("x", dims, u()))
            .oracle(move |x| vec![host::adaptive_avg_pool2d(&x[0], out)]),
        );
    }
    // A strided input: the op makes it contiguous first.
    cases.push(
        Case::new(
            "max_pool2d/T",
            &["max_pool2d", "max_pool2d_backward", "copy_strided"],
            |_, x| Ok(vec![x[0].max_pool2d(Pool2dOptions::new(2))?]),
        )
        .input(Input::float("x", [1, 2, 6, 5], Values::Distinct { low: -3.0, high: 3.0 }).transposed())
        .oracle(|x| vec![host::pool2d(&x[0], [2, 2], [2, 2], [0, 0], true)]),
    );
    cases
}

fn loss_cases() -> Vec<Case> {
    vec![
        Case::new(
            "binary:sub/mse_loss",
            &["binary:sub", "binary:mul", "reduce:sum"],
            |_, x| Ok(vec![x[0].mse_loss(&x[1])?]),
        )
        .input(Input::float("pred", [7, 3], u()))
        .input(Input::float("target", [7, 3], u()).transposed())
        .oracle(|x| {
            let d = x[0].zip(&x[1], |a, b| (a - b) * (a - b));
            vec![HostTensor::new([], vec![d.values.iter().sum::<f64>() / d.len() as f64])]
        }),
        // Training mode: batch statistics (biased variance); the running statistics are updated
        // in place and compared as forward-only outputs in a separate case below. One fused op
        // each way where the backend has it (the CPU in f32), else the composed ops.
        training_batch_norm("batch_norm/training_affine", [4, 3, 5]),
        // Over a thousand values a channel: the CUDA kernels reduce a channel in several chunks.
        training_batch_norm("batch_norm/training_chunked", [6, 2, 20, 20]).no_gradcheck(),
        // Followed by a ReLU, fused where the backend can (a ResNet block's bn -> relu).
        training_batch_norm_then("batch_norm/training_relu", [4, 3, 5], true, false).no_gradcheck(),
        training_batch_norm_then("batch_norm/training_relu_chunked", [6, 2, 20, 20], true, false).no_gradcheck(),
        // A residual block's end: relu(bn(x) + shortcut), with the shortcut's gradient.
        training_batch_norm_then("batch_norm/training_add_relu", [4, 3, 2, 3], true, true).no_gradcheck(),
        Case::new(
            "binary:add/batch_norm_running_stats",
            &["binary:add", "reduce:sum", "unary:affine", "copy_strided"],
            |ctx, x| {
                let c = x[0].dims()[1];
                let rm = crate::tensor::Tensor::full([c], 0.5, ctx.dtype, ctx.device)?;
                let rv = crate::tensor::Tensor::full([c], 2.0, ctx.dtype, ctx.device)?;
                x[0].batch_norm(&rm, &rv, None, None, true, 0.25, 1e-5)?;
                Ok(vec![rm, rv])
            },
        )
        .input(Input::float("x", [4, 3, 2, 2], u()).view(View::Permute(vec![0, 1, 3, 2])))
        .forward_only()
        .oracle(|x| {
            let mean = x[0].sum(&[0, 2, 3], false).map(|v| v / 16.0);
            let var = x[0]
                .zip(&x[0].sum(&[0, 2, 3], true).map(|v| v / 16.0), |a, m| (a - m) * (a - m))
                .sum(&[0, 2, 3], false)
                .map(|v| v / 15.0);
            vec![mean.map(|m| 0.75 * 0.5 + 0.25 * m), var.map(|v| 0.75 * 2.0 + 0.25 * v)]
        }),
        // A layer's bookkeeping in one pass (`batch_norm_running`): blended statistics, and the
        // batch count carried into its high word. In f32 only: the kernels take f32 running
        // statistics, and the ops a half-precision layer composes count through f32 (exact to
        // 2^24 batches, not to this count).
        Case::new(
            "batch_norm_running",
            &[
                "batch_norm_running",
                "binary:add",
                "unary:affine",
                "copy_strided",
                "cast",
            ],
            |ctx, x| {
                use crate::dtype::HostVec;
                use crate::tensor::{Running, Tensor};
                let c = x[0].dims()[1];
                let rm = Tensor::full([c], 0.5, ctx.dtype, ctx.device)?;
                let rv = Tensor::full([c], 2.0, ctx.dtype, ctx.device)?;
                let low_word_full = HostVec::I64(vec![u32::MAX as i64]);
                let n = Tensor::from_host(low_word_full, crate::shape::Shape::scalar(), ctx.device)?;
                let running = Running {
                    mean: &rm,
                    var: &rv,
                    batches: Some(&n),
                    momentum: 0.25,
                };
                x[0].batch_norm_local(&running, None, None, 1e-5, Default::default())?;
                Ok(vec![rm, rv, n])
            },
        )
        .input(Input::float("x", [4, 3, 2, 2], u()))
        .dtypes(&[crate::dtype::DType::F32])
        .forward_only()
        .oracle(|x| {
            let mean = x[0].sum(&[0, 2, 3], false).map(|v| v / 16.0);
            let var = x[0]
                .zip(&x[0].sum(&[0, 2, 3], true).map(|v| v / 16.0), |a, m| (a - m) * (a - m))
                .sum(&[0, 2, 3], false)
                .map(|v| v / 15.0);
            vec![
                mean.map(|m| 0.75 * 0.5 + 0.25 * m),
                var.map(|v| 0.75 * 2.0 + 0.25 * v),
                HostTensor::new([], vec![u32::MAX as f64 + 1.0]),
            ]
        }),
    ]
}

/// `bias_act` directly (Linear-like and channel-like geometries, each activation kind) and
/// through `conv2d_act`; the bias-only conv cases above also run it.
fn bias_act_cases() -> Vec<Case> {
    let shapes: Vec<(&str, Input, usize, Option<UnaryOp>)> = vec![
        ("linear_relu", Input::float("x", [7, 13], u()), 1, Some(UnaryOp::Relu)),
        ("linear_gelu", Input::float("x", [6, 5], u()), 1, Some(UnaryOp::Gelu)),
        (
            "channels_gelu",
            Input::float("x", [2, 3, 4], u()),
            1,
            Some(UnaryOp::Gelu),
        ),
        ("channels_none", Input::float("x", [2, 5, 3, 4], u()), 1, None),
        (
            "channels_tanh_T",
            Input::float("x", [4, 3, 5], u()).view(View::Permute(vec![2, 1, 0])),
            1,
            Some(UnaryOp::Tanh),
        ),
        (
            "first_axis_sigmoid",
            Input::float("x", [3, 8], u()),
            0,
            Some(UnaryOp::Sigmoid),
        ),
        ("empty", Input::float("x", [0, 4], u()), 1, Some(UnaryOp::Relu)),
    ];
    let mut cases: Vec<Case> = shapes
        .into_iter()
        .map(|(label, input, axis, act)| {
            let channels = input.logical_shape()[axis];
            let ops: &'static [&'static str] = match act {
                Some(UnaryOp::Relu) => &["bias_act", "unary:relu"],
                // The gradient: `bias_act_grad` where the backend has it, else composed.
                Some(UnaryOp::Gelu) => &["bias_act", "bias_act_grad", "unary:gelu_grad"],
                _ => &["bias_act"],
            };
            Case::new(format!("bias_act/{label}"), ops, move |_, x| {
                Ok(vec![x[0].bias_act(&x[1], axis, act)?])
            })
            .input(input)
            .input(Input::float("bias", [channels], u()))
            .oracle(move |x| {
                let mut along = vec![1; x[0].dims.len()];
                along[axis] = channels;
                let pre = x[0].zip(&x[1].reshape(along), |a, b| a + b);
                vec![pre.map(move |v| host_activation(act, v))]
            })
        })
        .collect();
    let opts = Conv2dOptions {
        stride: [1, 1],
        padding: [1, 1],
        dilation: [1, 1],
        groups: 1,
    };
    cases.push(
        Case::new(
            "bias_act/conv2d_relu",
            &["bias_act", "im2col", "matmul"],
            move |_, x| Ok(vec![x[0].conv2d_act(&x[1], Some(&x[2]), opts, Some(UnaryOp::Relu))?]),
        )
        .input(Input::float("x", [2, 3, 5, 6], u()))
        .input(Input::float(
            "w",
            [4, 3, 3, 3],
            Values::Uniform { low: -0.5, high: 0.5 },
        ))
        .input(Input::float("bias", [4], u()))
        .tol_scale(3.0)
        .oracle(move |x| {
            let y = host::conv2d(&x[0], &x[1], opts.stride, opts.padding, opts.dilation, opts.groups);
            vec![y.zip(&x[2].reshape([4, 1, 1]), |a, b| (a + b).max(0.0))]
        }),
    );
    cases
}

/// The activations of the `bias_act` cases, in f64.
fn host_activation(act: Option<UnaryOp>, v: f64) -> f64 {
    match act {
        None => v,
        Some(UnaryOp::Relu) => v.max(0.0),
        Some(UnaryOp::Gelu) => host::gelu(v),
        Some(UnaryOp::Tanh) => v.tanh(),
        Some(UnaryOp::Sigmoid) => 1.0 / (1.0 + (-v).exp()),
        Some(other) => unreachable!("no bias_act case uses {other:?}"),
    }
}

pub fn cases() -> Vec<Case> {
    let mut all = softmax_cases();
    all.extend(bias_act_cases());
    all.extend(conv_cases());
    all.extend(unfold_cases());
    all.extend(pool_cases());
    all.extend(loss_cases());
    all
}

/// Training-mode batch norm with the batch's statistics (biased variance), weight and bias, on an
/// input of shape `dims` (`[N, C, …]`); the running statistics are updated in place and compared
/// in their own case. One fused op each way where the backend has it (the CPU and CUDA in f32),
/// else the composed ops.
fn training_batch_norm(name: &'static str, dims: impl Into<Vec<usize>>) -> Case {
    training_batch_norm_then(name, dims, false, false)
}

/// `training_batch_norm`, then a residual input added with `residual` and a ReLU with `relu`,
/// as a residual block ends: fused into the batch norm's pass where the backend can (wgpu),
/// else the batch norm's ops and the others'.
fn training_batch_norm_then(name: &'static str, dims: impl Into<Vec<usize>>, relu: bool, residual: bool) -> Case {
    let dims: Vec<usize> = dims.into();
    let c = dims[1];
    let count = dims.iter().product::<usize>() as f64 / c as f64;
    let reduced: Vec<usize> = (0..dims.len()).filter(|&a| a != 1).collect();
    let per_channel: Vec<usize> = dims
        .iter()
        .enumerate()
        .map(|(a, &d)| if a == 1 { d } else { 1 })
        .collect();
    let mut ops = vec![
        "batch_norm",
        "batch_norm_backward",
        "binary:div",
        "reduce:sum",
        "binary:sub",
        "unary:sqrt",
    ];
    if relu {
        ops.extend(["unary:relu", "binary:relu_grad"]);
    }
    if residual {
        ops.push("binary:add");
    }
    let case = Case::new(name, &ops, move |ctx, x| {
        let c = x[0].dims()[1];
        let rm = crate::tensor::Tensor::zeros([c], ctx.dtype, ctx.device)?;
        let rv = crate::tensor::Tensor::ones([c], ctx.dtype, ctx.device)?;
        let running = crate::tensor::Running {
            mean: &rm,
            var: &rv,
            batches: None,
            momentum: 0.1,
        };
        let then = crate::tensor::Epilogue {
            residual: x.get(3),
            relu,
        };
        Ok(vec![x[0].batch_norm_local(
            &running,
            Some(&x[1]),
            Some(&x[2]),
            1e-5,
            then,
        )?])
    })
    .input(Input::float("x", dims.clone(), u()))
    .input(Input::float("weight", [c], u()))
    .input(Input::float("bias", [c], u()));
    let case = if residual {
        case.input(Input::float("residual", dims, u()))
    } else {
        case
    };
    case.tol_scale(2.0).oracle(move |x| {
        let mean = x[0].sum(&reduced, true).map(|v| v / count);
        let centered = x[0].zip(&mean, |a, m| a - m);
        let var = centered.map(|d| d * d).sum(&reduced, true).map(|v| v / count);
        let y = centered.zip(&var, |d, v| d / (v + 1e-5).sqrt());
        let y = y
            .zip(&x[1].reshape(per_channel.clone()), |a, w| a * w)
            .zip(&x[2].reshape(per_channel.clone()), |a, b| a + b);
        let y = match x.get(3) {
            Some(r) => y.zip(r, |a, b| a + b),
            None => y,
        };
        vec![if relu { y.map(|v| v.max(0.0)) } else { y }]
    })
}
