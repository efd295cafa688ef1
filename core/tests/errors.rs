//! Errors, not panics: wrong shapes name both shapes and the op, mixed devices name both devices,
//! unsupported dtypes name the op and the dtype, and bad input of every kind returns `Err`.

use std::fmt::Debug;
use std::panic::{AssertUnwindSafe, catch_unwind};

use lockstep_core::backend::{AdamStep, Conv2dGeometry, MatmulDims, Pool2dGeometry, ReduceKind, SgdStep, UnaryOp};
use lockstep_core::{Conv2dOptions, DType, Device, Generator, HostVec, Layout, Pool2dOptions, Result, Tensor};

/// The error message of `f`, failing the test if it succeeds or panics.
fn err_of<T: Debug>(what: &str, f: impl FnOnce() -> Result<T>) -> String {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(v)) => panic!("{what}: expected an error, got {v:?}"),
        Ok(Err(e)) => e.to_string(),
        Err(p) => {
            let msg = p
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| p.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            panic!("{what}: panicked instead of returning an error: {msg}")
        }
    }
}

fn assert_mentions(msg: &str, parts: &[&str]) {
    for p in parts {
        assert!(msg.contains(p), "`{msg}` should mention `{p}`");
    }
}

fn t(dims: &[usize]) -> Tensor {
    let n: usize = dims.iter().product();
    Tensor::from_vec((0..n).map(|i| i as f32 * 0.1).collect(), dims.to_vec(), &Device::cpu()).unwrap()
}

fn on(dims: &[usize], device: &Device) -> Tensor {
    t(dims).to_device(device).unwrap()
}

#[test]
fn shape_mismatches_name_both_shapes_and_the_op() {
    let (a, b) = (t(&[2, 3]), t(&[4, 5]));
    for (op, msg) in [
        ("add", err_of("add", || a.add(&b))),
        ("sub", err_of("sub", || a.sub(&b))),
        ("mul", err_of("mul", || a.mul(&b))),
        ("div", err_of("div", || a.div(&b))),
        ("pow", err_of("pow", || a.pow(&b))),
        ("maximum", err_of("maximum", || a.maximum(&b))),
        ("minimum", err_of("minimum", || a.minimum(&b))),
        ("eq", err_of("eq", || a.eq(&b))),
        ("matmul", err_of("matmul", || a.matmul(&b))),
        ("concat", err_of("concat", || Tensor::concat(&[&a, &b], 0))),
        ("mse_loss", err_of("mse_loss", || a.mse_loss(&b))),
        ("assign", err_of("assign", || a.assign(&b))),
        ("broadcast_as", err_of("broadcast_as", || a.broadcast_as(b.shape()))),
    ] {
        assert_mentions(&msg, &[op, "[2, 3]", "[4, 5]"]);
    }
    // Batch axes that do not broadcast name the full operand shapes.
    let msg = err_of("batched matmul", || t(&[2, 2, 3]).matmul(&t(&[3, 3, 4])));
    assert_mentions(&msg, &["matmul", "[2, 2, 3]", "[3, 3, 4]"]);
    let msg = err_of("reshape", || a.reshape([4]));
    assert_mentions(&msg, &["reshape", "[2, 3]", "[4]"]);
    let mask = a.gt(&a).unwrap();
    let msg = err_of("where_cond", || mask.where_cond(&a, &b));
    assert_mentions(&msg, &["where_cond", "[2, 3]", "[4, 5]"]);
    let ids = Tensor::from_vec(vec![0u32; 6], [3, 2], &Device::cpu()).unwrap();
    let msg = err_of("gather", || a.gather(1, &ids));
    assert_mentions(&msg, &["gather", "[2, 3]", "[3, 2]"]);
    let labels = Tensor::from_vec(vec![0u32; 3], [3], &Device::cpu()).unwrap();
    let msg = err_of("cross_entropy", || a.cross_entropy(&labels));
    assert_mentions(&msg, &["cross_entropy", "[2, 3]", "[3]"]);
    let (x, w) = (t(&[1, 3, 5, 5]), t(&[2, 4, 3, 3]));
    let msg = err_of("conv2d channels", || x.conv2d(&w, None, Conv2dOptions::default()));
    assert_mentions(&msg, &["conv2d", "[1, 3, 5, 5]", "[2, 4, 3, 3]"]);
    let cols = t(&[1, 9, 5]);
    let geom = Conv2dGeometry {
        n: 1,
        c: 1,
        h: 4,
        w: 4,
        kh: 3,
        kw: 3,
        stride: [1, 1],
        padding: [0, 0],
        dilation: [1, 1],
    };
    let msg = err_of("col2im", || cols.col2im(geom));
    // The expected column shape is whatever im2col produces for this geometry.
    let expected = format!("{:?}", t(&[1, 1, 4, 4]).im2col(geom).unwrap().dims());
    assert_mentions(&msg, &["col2im", "[1, 9, 5]", &expected]);
    let backend = Device::cpu().backend().clone();
    let (src, dst) = (
        backend.zeros(DType::F32, 6).unwrap(),
        backend.zeros(DType::F32, 6).unwrap(),
    );
    let msg = err_of("copy_strided", || {
        backend.copy_strided(&src, &Layout::contiguous([2, 3]), &dst, &Layout::contiguous([3, 2]))
    });
    assert_mentions(&msg, &["copy_strided", "[2, 3]", "[3, 2]"]);
}

#[test]
fn mixed_devices_name_both_devices_and_the_op() {
    let (d0, d3) = (Device::cpu(), Device::parse("cpu:3").unwrap());
    let (a, b) = (on(&[2, 3], &d0), on(&[2, 3], &d3));
    let (m, w) = (on(&[3, 2], &d3), on(&[2, 3, 1, 1], &d3));
    let ids = Tensor::from_vec(vec![0u32, 1], [2], &d3).unwrap();
    let mask = a.gt(&a).unwrap();
    let x = on(&[1, 3, 4, 4], &d0);
    for (op, msg) in [
        ("add", err_of("add", || a.add(&b))),
        ("mul", err_of("mul", || a.mul(&b))),
        ("matmul", err_of("matmul", || a.matmul(&m))),
        ("lt", err_of("lt", || a.lt(&b))),
        ("where_cond", err_of("where_cond", || mask.where_cond(&a, &b))),
        ("concat", err_of("concat", || Tensor::concat(&[&a, &b], 0))),
        ("index_select", err_of("index_select", || a.index_select(0, &ids))),
        ("assign", err_of("assign", || a.assign(&b))),
        (
            "conv2d",
            err_of("conv2d", || x.conv2d(&w, None, Conv2dOptions::default())),
        ),
    ] {
        assert_mentions(&msg, &[op, "cpu:0", "cpu:3"]);
    }
    let labels = Tensor::from_vec(vec![0u32, 1], [2], &d3).unwrap();
    assert_mentions(
        &err_of("cross_entropy", || a.cross_entropy(&labels)),
        &["cpu:0", "cpu:3"],
    );
    // Moving is explicit and works.
    assert_eq!(a.add(&b.to_device(&d0).unwrap()).unwrap().dims(), &[2, 3]);
}

#[test]
fn unsupported_dtypes_name_the_op_and_the_dtype() {
    let dev = Device::cpu();
    let u = Tensor::from_vec(vec![1u32, 2, 3, 4], [2, 2], &dev).unwrap();
    let i = Tensor::from_vec(vec![1i64, 2, 3, 4], [2, 2], &dev).unwrap();
    for (op, msg) in [
        ("exp", err_of("exp", || u.exp())),
        ("relu", err_of("relu", || i.relu())),
        ("add", err_of("add", || u.add(&u))),
        ("matmul", err_of("matmul", || i.matmul(&i))),
        ("sum", err_of("sum", || u.sum(&[0], false))),
        ("max", err_of("max", || i.max(0, false))),
        ("argmax", err_of("argmax", || u.argmax(0, false))),
        ("softmax", err_of("softmax", || u.softmax(-1))),
        (
            "conv2d",
            err_of("conv2d", || {
                u.reshape([1, 1, 2, 2])?
                    .conv2d(&u.reshape([1, 1, 2, 2])?, None, Conv2dOptions::default())
            }),
        ),
        (
            "max_pool2d",
            err_of("max_pool2d", || {
                u.reshape([1, 1, 2, 2])?.max_pool2d(Pool2dOptions::new(2))
            }),
        ),
        (
            "rand",
            err_of("rand", || {
                Tensor::rand_uniform([3], 0.0, 1.0, DType::U32, &Generator::new(1), &dev)
            }),
        ),
        (
            "where_cond",
            err_of("where_cond", || t(&[2, 2]).where_cond(&t(&[2, 2]), &t(&[2, 2]))),
        ),
        (
            "index_select",
            err_of("index_select", || t(&[2, 2]).index_select(0, &t(&[2]))),
        ),
    ] {
        let dtype = if msg.contains("i64") {
            "i64"
        } else if msg.contains("u32") {
            "u32"
        } else {
            "f32"
        };
        assert_mentions(&msg, &[op, dtype, "not supported"]);
    }
    // Mixed float dtypes name both.
    let h = t(&[2, 2]).to_dtype(DType::F16).unwrap();
    assert_mentions(&err_of("add f32+f16", || t(&[2, 2]).add(&h)), &["add", "f32", "f16"]);
    assert_mentions(
        &err_of("matmul f32@f16", || t(&[2, 2]).matmul(&h)),
        &["matmul", "f32", "f16"],
    );
    assert_mentions(&err_of("to_vec", || h.to_vec::<f32>()), &["to_vec", "f16", "f32"]);
    // Backend methods with narrower contracts.
    let backend = dev.backend().clone();
    let half = |n| {
        backend
            .from_host(&HostVec::from_f64(DType::F16, &vec![0.5; n]))
            .unwrap()
    };
    let (p, g) = (half(4), half(4));
    let sgd = SgdStep {
        lr: 0.1,
        momentum: 0.0,
        dampening: 0.0,
        weight_decay: 0.0,
        nesterov: false,
        first_step: true,
    };
    assert_mentions(
        &err_of("sgd_step f16", || backend.sgd_step(&p, &g, None, &sgd)),
        &["sgd_step", "f16"],
    );
    let adam = AdamStep {
        lr: 0.1,
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-8,
        weight_decay: 0.0,
        decoupled: false,
        step: 1,
    };
    let (m, v) = (half(4), half(4));
    assert_mentions(
        &err_of("adam_step f16", || backend.adam_step(&p, &g, &m, &v, &adam)),
        &["adam_step", "f16"],
    );
    let ints = backend.zeros(DType::U32, 4).unwrap();
    assert_mentions(
        &err_of("axpy u32", || backend.axpy(&ints, &ints, 1.0)),
        &["axpy", "u32"],
    );
    assert_mentions(
        &err_of("unary u32", || {
            backend.unary(UnaryOp::Tanh, &ints, &Layout::contiguous([4]))
        }),
        &["tanh", "u32"],
    );
}

#[test]
fn bad_arguments_return_errors() {
    let dev = Device::cpu();
    let x = t(&[2, 3]);
    let img = t(&[1, 2, 5, 5]);
    let u32s = |v: Vec<u32>| Tensor::from_vec(v.clone(), [v.len()], &dev).unwrap();
    let i64s = |v: Vec<i64>| Tensor::from_vec(v.clone(), [v.len()], &dev).unwrap();
    // Indices out of range, including negative labels (which a saturating cast would turn into 0).
    assert_mentions(
        &err_of("index_select", || x.index_select(1, &u32s(vec![0, 3]))),
        &["index_select", "3"],
    );
    assert_mentions(
        &err_of("gather", || {
            x.gather(1, &Tensor::from_vec(vec![0u32, 1, 2, 0, 9, 1], [2, 3], &dev)?)
        }),
        &["gather", "9"],
    );
    err_of("cross_entropy, label -1", || x.cross_entropy(&i64s(vec![-1, 0])));
    err_of("cross_entropy, label 3", || x.cross_entropy(&u32s(vec![1, 3])));
    err_of("cross_entropy, huge label", || x.cross_entropy(&i64s(vec![1 << 40, 0])));
    err_of("index_select, 2-D ids", || {
        x.index_select(0, &Tensor::from_vec(vec![0u32; 4], [2, 2], &dev)?)
    });
    // Convolution and pooling geometry.
    let w = |dims: &[usize]| t(dims);
    let conv = |weight: &Tensor, opts: Conv2dOptions| img.conv2d(weight, None, opts);
    let opts = |stride, padding, dilation, groups| Conv2dOptions {
        stride,
        padding,
        dilation,
        groups,
    };
    err_of("kernel larger than input", || {
        conv(&w(&[1, 2, 6, 6]), Conv2dOptions::default())
    });
    err_of("stride 0", || conv(&w(&[1, 2, 3, 3]), opts([0, 1], [0, 0], [1, 1], 1)));
    err_of("dilation 0", || {
        conv(&w(&[1, 2, 3, 3]), opts([1, 1], [0, 0], [1, 0], 1))
    });
    err_of("dilated kernel too large", || {
        conv(&w(&[1, 2, 3, 3]), opts([1, 1], [0, 0], [3, 3], 1))
    });
    err_of("groups 0", || conv(&w(&[1, 2, 3, 3]), opts([1, 1], [0, 0], [1, 1], 0)));
    err_of("groups do not divide", || {
        conv(&w(&[3, 1, 3, 3]), opts([1, 1], [0, 0], [1, 1], 2))
    });
    err_of("weight rank 3", || conv(&w(&[1, 2, 3]), Conv2dOptions::default()));
    err_of("input rank 3", || {
        t(&[2, 5, 5]).conv2d(&w(&[1, 2, 3, 3]), None, Conv2dOptions::default())
    });
    err_of("bias shape", || {
        img.conv2d(&w(&[4, 2, 3, 3]), Some(&t(&[3])), Conv2dOptions::default())
    });
    let pool = |kernel, stride, padding| Pool2dOptions {
        kernel,
        stride,
        padding,
    };
    err_of("pool kernel 0", || img.max_pool2d(pool([0, 2], [1, 1], [0, 0])));
    err_of("pool stride 0", || img.max_pool2d(pool([2, 2], [0, 1], [0, 0])));
    err_of("pool padding > kernel/2", || {
        img.max_pool2d(pool([2, 2], [1, 1], [2, 0]))
    });
    err_of("pool kernel too large", || img.max_pool2d(pool([6, 2], [1, 1], [0, 0])));
    err_of("avg pool kernel too large", || {
        img.avg_pool2d(pool([2, 9], [1, 1], [0, 0]))
    });
    err_of("pool rank 2", || x.max_pool2d(Pool2dOptions::new(2)));
    let geom = Conv2dGeometry {
        n: 1,
        c: 1,
        h: 2,
        w: 25,
        kh: 2,
        kw: 2,
        stride: [1, 1],
        padding: [0, 0],
        dilation: [1, 1],
    };
    assert_mentions(
        &err_of("im2col geometry of another shape", || img.im2col(geom)),
        &["im2col", "[1, 2, 5, 5]", "[1, 1, 2, 25]"],
    );
    // Shapes and axes.
    err_of("reshape count", || x.reshape([7]));
    err_of("reshape infer", || x.reshape([4, usize::MAX]));
    err_of("reshape infer from zero", || x.reshape([0, usize::MAX]));
    err_of("narrow past the end", || x.narrow(1, 2, 2));
    err_of("narrow overflow", || x.narrow(0, usize::MAX, 2));
    err_of("narrow axis", || x.narrow(2, 0, 1));
    err_of("permute duplicate", || x.permute(&[0, 0]));
    err_of("permute length", || x.permute(&[0]));
    err_of("transpose axis", || x.transpose(0, 5));
    err_of("sum axis", || x.sum(&[2], false));
    err_of("sum negative axis", || x.sum(&[-3], false));
    err_of("max over an empty axis", || t(&[0, 3]).max(0, false));
    err_of("argmax over an empty axis", || t(&[3, 0]).argmax(1, false));
    err_of("softmax axis", || x.softmax(4));
    err_of("squeeze", || x.squeeze(0));
    err_of("unsqueeze", || x.unsqueeze(3));
    err_of("flatten", || x.flatten_from(2));
    err_of("t of a vector", || t(&[3]).t());
    err_of("matmul of a vector", || t(&[3]).matmul(&t(&[3, 2])));
    err_of("matmul inner", || x.matmul(&t(&[2, 3])));
    err_of("concat of nothing", || Tensor::concat(&[], 0));
    err_of("concat ranks", || Tensor::concat(&[&x, &t(&[3])], 0));
    err_of("batch_norm rank", || {
        t(&[4]).batch_norm(&t(&[4]), &t(&[4]), None, None, true, 0.1, 1e-5)
    });
    err_of("batch_norm one value per channel", || {
        t(&[1, 3]).batch_norm(&t(&[3]), &t(&[3]), None, None, true, 0.1, 1e-5)
    });
    err_of("dropout p", || x.dropout(2.0, true, &Generator::new(0)));
    err_of("dropout NaN", || x.dropout(f64::NAN, true, &Generator::new(0)));
    // Construction, reading back, autograd.
    err_of("from_vec count", || Tensor::from_vec(vec![1f32, 2.0], [3], &dev));
    err_of("arange", || Tensor::arange(3, 1, DType::F32, &dev));
    err_of("item", || x.item());
    err_of("backward of a non-scalar", || {
        x.requires_grad(true).mul_scalar(2.0)?.backward()
    });
    err_of("backward without grad", || x.sum_all()?.backward());
    let leaf = x.requires_grad(true);
    let loss = leaf.exp().unwrap().sum_all().unwrap();
    loss.backward().unwrap();
    assert_mentions(&err_of("second backward", || loss.backward()), &["backward"]);
    for name in ["gpu:0", "cpu:x", "cpu:9999", "cpu:-1"] {
        assert_mentions(&err_of(name, || Device::parse(name)), &[name]);
    }
}

#[test]
fn backend_misuse_returns_errors() {
    let b = Device::parse("cpu:4").unwrap().backend().clone();
    let f = |n: usize| b.from_host(&HostVec::F32((0..n).map(|i| i as f32).collect())).unwrap();
    let ids = |v: Vec<u32>| b.from_host(&HostVec::U32(v)).unwrap();
    let buf = f(6);
    err_of("to_host past the end", || b.to_host(&buf, &Layout::contiguous([7])));
    err_of("to_host offset", || {
        b.to_host(
            &buf,
            &Layout {
                offset: 4,
                ..Layout::contiguous([3])
            },
        )
    });
    err_of("unary past the end", || {
        b.unary(UnaryOp::Exp, &buf, &Layout::contiguous([2, 4]))
    });
    err_of("cast past the end", || {
        b.cast(&buf, &Layout::contiguous([8]), DType::F16)
    });
    err_of("copy_strided dst past the end", || {
        b.copy_strided(&buf, &Layout::contiguous([6]), &f(4), &Layout::contiguous([6]))
    });
    err_of("copy_strided dtypes", || {
        b.copy_strided(
            &buf,
            &Layout::contiguous([6]),
            &b.zeros(DType::U32, 6)?,
            &Layout::contiguous([6]),
        )
    });
    err_of("reduce unsorted axes", || {
        b.reduce(ReduceKind::Sum, &buf, &Layout::contiguous([2, 3]), &[1, 0])
    });
    err_of("reduce axis", || {
        b.reduce(ReduceKind::Max, &buf, &Layout::contiguous([2, 3]), &[2])
    });
    err_of("argmax of two axes", || {
        b.reduce(ReduceKind::ArgMax, &buf, &Layout::contiguous([2, 3]), &[0, 1])
    });
    let dims = MatmulDims {
        batch: 1,
        m: 2,
        n: 2,
        k: 3,
    };
    err_of("matmul layouts", || {
        b.matmul(
            &buf,
            &Layout::contiguous([1, 3, 2]),
            &buf,
            &Layout::contiguous([1, 3, 2]),
            dims,
        )
    });
    err_of("matmul past the end", || {
        b.matmul(
            &buf,
            &Layout::contiguous([1, 2, 3]),
            &f(4),
            &Layout::contiguous([1, 3, 2]),
            dims,
        )
    });
    err_of("softmax rows", || b.softmax_last(&buf, 4, 2));
    err_of("log_softmax rows", || b.log_softmax_last(&buf, 1, 5));
    err_of("index_select ids", || b.index_select(&buf, 2, 3, 1, &ids(vec![0, 3])));
    err_of("index_select float ids", || b.index_select(&buf, 2, 3, 1, &f(2)));
    err_of("index_add ids", || {
        b.index_add(&f(6), 3, &f(4), 2, 2, 1, &ids(vec![0, 5]))
    });
    err_of("index_add lengths", || {
        b.index_add(&f(6), 3, &f(5), 2, 2, 1, &ids(vec![0, 1]))
    });
    err_of("gather ids", || b.gather(&buf, 2, 3, 1, &ids(vec![0, 1, 7, 0]), 2));
    err_of("gather id count", || b.gather(&buf, 2, 3, 1, &ids(vec![0, 1, 2]), 2));
    err_of("scatter_add ids", || {
        b.scatter_add(&f(6), 3, &f(4), 2, 2, 1, &ids(vec![0, 1, 2, 3]))
    });
    let g = Conv2dGeometry {
        n: 1,
        c: 1,
        h: 2,
        w: 3,
        kh: 2,
        kw: 2,
        stride: [1, 1],
        padding: [0, 0],
        dilation: [1, 1],
    };
    err_of("im2col buffer", || b.im2col(&f(5), &g));
    err_of("col2im buffer", || b.col2im(&f(5), &g));
    err_of("im2col geometry", || b.im2col(&buf, &Conv2dGeometry { kh: 3, ..g }));
    let pg = Pool2dGeometry {
        n: 1,
        c: 1,
        h: 2,
        w: 3,
        kernel: [2, 2],
        stride: [1, 1],
        padding: [0, 0],
    };
    err_of("max_pool2d buffer", || b.max_pool2d(&f(5), &pg));
    err_of("max_pool2d geometry", || {
        b.max_pool2d(&buf, &Pool2dGeometry { kernel: [3, 2], ..pg })
    });
    err_of("axpy lengths", || b.axpy(&f(6), &f(5), 1.0));
    let sgd = SgdStep {
        lr: 0.1,
        momentum: 0.9,
        dampening: 0.0,
        weight_decay: 0.0,
        nesterov: false,
        first_step: false,
    };
    err_of("sgd lengths", || b.sgd_step(&f(6), &f(5), None, &sgd));
    err_of("sgd momentum length", || b.sgd_step(&f(6), &f(6), Some(&f(5)), &sgd));
    let adam = AdamStep {
        lr: 0.1,
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-8,
        weight_decay: 0.0,
        decoupled: false,
        step: 1,
    };
    err_of("adam lengths", || b.adam_step(&f(6), &f(6), &f(6), &f(5), &adam));
    let running = lockstep_core::backend::RunningStatsSpec {
        channels: 6,
        count: 4,
        momentum: 0.1,
    };
    let running_err = |rm: &_, rv: &_, mean: &_, spec| {
        b.batch_norm_running([rm, rv], [mean, &f(6)], None, spec)
            .expect("the CPU has the kernel for f32")
    };
    let (rm, rv) = (f(6), f(6));
    assert_mentions(
        &err_of("batch_norm_running aliased", || running_err(&rm, &rm, &f(6), &running)),
        &["batch_norm_running", "distinct"],
    );
    err_of("batch_norm_running lengths", || running_err(&rm, &rv, &f(5), &running));
    let single = lockstep_core::backend::RunningStatsSpec { count: 1, ..running };
    assert_mentions(
        &err_of("batch_norm_running count", || running_err(&rm, &rv, &f(6), &single)),
        &["batch_norm_running", "count of at least 2"],
    );
    err_of("where_cond float mask", || {
        b.where_cond(
            &buf,
            &Layout::contiguous([6]),
            &buf,
            &Layout::contiguous([6]),
            &buf,
            &Layout::contiguous([6]),
        )
    });
    err_of("rand integer", || {
        b.rand(
            DType::I64,
            4,
            lockstep_core::backend::Distribution::Uniform { low: 0.0, high: 1.0 },
            0,
            0,
        )
    });
}

#[test]
fn io_errors_convert_with_question_mark() {
    fn read_missing() -> lockstep_core::Result<Vec<u8>> {
        Ok(std::fs::read("/nonexistent/lockstep/file")?)
    }
    let err = read_missing().unwrap_err().to_string();
    assert!(err.contains("No such file"), "{err}");
}
