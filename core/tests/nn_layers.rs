//! Layer outputs against PyTorch on fixed inputs, layer errors, and initialisation bounds.
//! Reference values: scripts/reference_values.py (sections named at each constant block).

mod nn_support;

use std::sync::Arc;

use lockstep_core::nn::{
    AvgPool2d, BatchNorm1d, BatchNorm2d, Conv2d, Conv2dConfig, Dropout, Flatten, Gelu, Linear, MaxPool2d, Module,
    ModuleExt,
};
use lockstep_core::{Device, Generator, Pool2dOptions, Tensor};
use nn_support::{assert_close, pat, values};

/// PyTorch's values, as scripts/reference_values.py prints them (kept on one line each).
#[rustfmt::skip]
mod pytorch {
    // Section `conv`: F.conv2d(pat([2,3,5,5],5), pat([4,3,3,3],7)/2, pat([4],3), stride=2, padding=1)
    // and F.conv2d(pat([1,4,6,6],3), pat([6,2,2,2],5), None, dilation=2, groups=2).
    pub const CONV_S2_P1: [f32; 72] = [-0.625, -2.0625, -2.390625, -0.484375, -1.671875, -1.6328125, -0.9140625, -0.9296875, -2.140625, -0.46875, -1.234375, -1.015625, 0.1484375, -0.6015625, 0.03125, -0.5078125, -0.921875, -1.046875, -0.7109375, -0.40625, -0.703125, 0.3828125, -0.1953125, 0.5, 0.03125, -0.1171875, -0.3515625, 0.5078125, 1.6171875, 0.0078125, -0.046875, 0.609375, 0.8359375, -0.4921875, 0.0234375, 0.4765625, -0.6953125, -1.796875, -2.3203125, -0.9375, -2.09375, -1.875, -0.9609375, -0.9609375, -1.3828125, -0.484375, -1.3515625, -1.15625, -0.6875, -1.265625, -0.59375, -0.3671875, -0.8046875, -0.5, -0.671875, -0.640625, -0.65625, -1.1015625, -1.1015625, -0.2421875, -0.0390625, -0.1171875, -0.015625, 0.46875, 1.0, -0.0234375, 0.2109375, 1.5859375, -0.2890625, -0.5078125, -0.09375, 0.3359375];
    pub const CONV_G2_D2: [f32; 96] = [0.40625, 1.84375, 1.421875, -2.1875, 0.265625, 1.703125, 1.28125, -2.328125, 0.125, 1.5625, 1.140625, -0.34375, 1.84375, 1.421875, -2.1875, -0.484375, -0.34375, 0.15625, -1.203125, 1.6875, -0.265625, 0.234375, -1.125, 1.765625, -0.1875, -1.28125, -1.046875, 0.78125, 0.15625, -1.203125, 1.6875, 0.859375, -0.03125, -1.265625, 0.15625, -0.28125, 0.0, -1.234375, 0.1875, -0.25, 0.03125, 0.125, 0.21875, 0.046875, -1.265625, 0.15625, -0.28125, 0.078125, -0.703125, -1.546875, 0.265625, 1.8125, -0.71875, -1.5625, 0.25, 1.53125, -0.734375, 0.28125, 1.828125, 1.515625, -1.546875, 0.265625, 1.8125, 1.5, -0.953125, 0.984375, 1.0625, 0.875, -1.015625, 0.921875, 1.0, -1.046875, -1.078125, 1.125, 0.9375, -1.109375, 0.984375, 1.0625, 0.875, -1.171875, -0.140625, 0.859375, 0.0, -1.125, 0.015625, 1.015625, 0.15625, 0.09375, 0.171875, -0.15625, -1.28125, 0.25, 0.859375, 0.0, -1.125, 0.40625];
    // Section `pool`: F.max_pool2d(x, 3, stride=2, padding=1), F.avg_pool2d(x, 2) and
    // F.avg_pool2d(x, 3, stride=2, padding=1) of x = pat([1,2,5,5],7).
    pub const MAXPOOL_K3_S2_P1: [f32; 18] = [0.0, 0.875, 0.5, 0.25, 1.0, 0.75, 0.375, 0.375, 0.875, 0.625, 0.625, 1.0, 0.875, 0.875, 0.5, 1.0, 1.0, 0.625];
    pub const AVGPOOL_K2: [f32; 8] = [-0.5, 0.1875, -0.25, -0.09375, 0.125, -0.25, 0.375, 0.0];
    pub const AVGPOOL_K3_S2_P1: [f32; 18] = [-0.22222222, 0.06944445, 0.0, -0.20833333, 0.055555556, 0.125, -0.055555556, -0.15277778, 0.16666667, 0.055555556, 0.013888889, 0.041666668, 0.20833333, 0.20833333, -0.16666667, 0.22222222, 0.2638889, -0.027777778];
    // Section `batchnorm`: nn.BatchNorm2d(3) on pat([4,3,2,2],5) then pat([4,3,2,2],11)*2 in
    // training, then eval on the first; nn.BatchNorm1d(3) once on pat([5,3],7).
    pub const BN2D_TRAIN_Y1: [f32; 48] = [-1.6438262, -0.6475679, 0.34869042, 1.3449488, -0.8527905, 0.21319762, 1.2791858, -1.2791858, -0.5988761, 0.42048746, 1.439851, -1.0066215, 0.14943875, 1.1456971, -1.245323, -0.24906458, 1.0659881, -1.4923834, -0.42639524, 0.6395929, 1.2359784, -1.2104943, -0.19113067, 0.8282329, -1.4445746, -0.44831625, 0.5479421, 1.5442004, -0.6395929, 0.42639524, 1.4923834, -1.0659881, -0.39500338, 0.6243602, -1.8221123, -0.8027488, 0.34869042, 1.3449488, -1.0460713, -0.049812917, 1.2791858, -1.2791858, -0.21319762, 0.8527905, 1.439851, -1.0066215, 0.012742043, 1.0321056];
    pub const BN2D_RUNNING_MEAN: [f32; 3] = [0.0121875005, -0.0175, 0.015234374];
    pub const BN2D_RUNNING_VAR: [f32; 3] = [1.0101771, 1.0000833, 1.0062702];
    pub const BN2D_EVAL_Y: [f32; 48] = [-1.0070709, -0.38523027, 0.23661035, 0.85845095, -0.6074717, 0.017499184, 0.64247006, -0.85746, -0.2644054, 0.3586412, 0.9816878, -0.5136241, 0.11224223, 0.7340829, -0.75833464, -0.13649401, 0.5174759, -0.9824542, -0.35748333, 0.26748753, 0.8570785, -0.63823336, -0.015186761, 0.60785985, -0.88270277, -0.26086214, 0.36097848, 0.9828191, -0.48247752, 0.14249335, 0.7674642, -0.73246586, -0.13979608, 0.48325053, -1.0120614, -0.38901472, 0.23661035, 0.85845095, -0.6339665, -0.012125893, 0.64247006, -0.85746, -0.23248917, 0.3924817, 0.9816878, -0.5136241, 0.109422565, 0.73246914];
    pub const BN1D_TRAIN_Y: [f32; 15] = [-1.4141995, -0.2699484, 1.1469092, -0.70709974, 0.6298796, -1.5155587, 0.0, 1.5297076, -0.69633776, 0.70709974, -1.3947333, 0.12288313, 1.4141995, -0.49490538, 0.94210404];
    pub const BN1D_RUNNING_VAR: [f32; 3] = [0.9625, 0.93859375, 0.94656247];
    // Section `gelu`: nn.GELU()(pat([9],5)).
    pub const GELU_Y: [f32; 9] = [-0.15865526, -0.13268633, 0.14967658, 0.7080614, -0.16624095, 0.0, 0.45875907, -0.16693859, -0.10032342];
}
use pytorch::*;

const TOL: f32 = 1e-5;

fn state(items: &[(&str, Tensor)]) -> Vec<(String, Tensor)> {
    items.iter().map(|(n, t)| (n.to_string(), t.clone())).collect()
}

#[test]
fn conv2d_matches_pytorch_with_stride_padding_dilation_and_groups() {
    let (dev, g) = (Device::cpu(), Generator::new(0));
    let conv = Conv2d::new(Conv2dConfig::new(3, 4, 3).stride(2).padding(1), &dev, &g).unwrap();
    conv.load_state_dict(&state(&[
        ("weight", pat(&[4, 3, 3, 3], 7).mul_scalar(0.5).unwrap()),
        ("bias", pat(&[4], 3)),
    ]))
    .unwrap();
    let x = pat(&[2, 3, 5, 5], 5);
    let y = conv.forward(&x).unwrap();
    assert_eq!(y.dims(), &[2, 4, 3, 3]);
    assert_close("conv stride 2 pad 1", &values(&y), &CONV_S2_P1, TOL);
    // An unbatched [C, H, W] image gives the first image's output, as in PyTorch.
    let single = conv.forward(&x.narrow(0, 0, 1).unwrap().squeeze(0).unwrap()).unwrap();
    assert_eq!(single.dims(), &[4, 3, 3]);
    assert_close("conv unbatched", &values(&single), &CONV_S2_P1[..36], TOL);

    let grouped = Conv2d::new(Conv2dConfig::new(4, 6, 2).dilation(2).groups(2).bias(false), &dev, &g).unwrap();
    assert_eq!(grouped.weight.dims(), &[6, 2, 2, 2]);
    grouped
        .load_state_dict(&state(&[("weight", pat(&[6, 2, 2, 2], 5))]))
        .unwrap();
    let y = grouped.forward(&pat(&[1, 4, 6, 6], 3)).unwrap();
    assert_eq!(y.dims(), &[1, 6, 4, 4]);
    assert_close("conv groups 2 dilation 2", &values(&y), &CONV_G2_D2, TOL);
    assert_eq!(
        grouped.describe(),
        "Conv2d(4, 6, kernel_size=(2, 2), stride=(1, 1), dilation=(2, 2), groups=2, bias=False)"
    );
}

#[test]
fn pooling_matches_pytorch() {
    let x = pat(&[1, 2, 5, 5], 7);
    let max = MaxPool2d::with_options(Pool2dOptions {
        kernel: [3, 3],
        stride: [2, 2],
        padding: [1, 1],
    })
    .unwrap();
    assert_close("max_pool2d", &values(&max.forward(&x).unwrap()), &MAXPOOL_K3_S2_P1, TOL);
    let avg = AvgPool2d::new(2).unwrap();
    assert_close("avg_pool2d k2", &values(&avg.forward(&x).unwrap()), &AVGPOOL_K2, TOL);
    let avg = AvgPool2d::with_options(Pool2dOptions {
        kernel: [3, 3],
        stride: [2, 2],
        padding: [1, 1],
    })
    .unwrap();
    assert_close(
        "avg_pool2d k3 s2 p1",
        &values(&avg.forward(&x).unwrap()),
        &AVGPOOL_K3_S2_P1,
        TOL,
    );
    assert_eq!(
        MaxPool2d::new(2).unwrap().describe(),
        "MaxPool2d(kernel_size=2, stride=2, padding=0, dilation=1, ceil_mode=False)"
    );
    assert_eq!(avg.describe(), "AvgPool2d(kernel_size=3, stride=2, padding=1)");
}

#[test]
fn batchnorm_uses_batch_stats_in_training_and_running_stats_in_eval() {
    let dev = Device::cpu();
    let mut bn = BatchNorm2d::new(3, &dev).unwrap();
    let x1 = pat(&[4, 3, 2, 2], 5);
    let y1 = bn.forward(&x1).unwrap();
    assert_close("bn2d train", &values(&y1), &BN2D_TRAIN_Y1, TOL);
    bn.forward(&pat(&[4, 3, 2, 2], 11).mul_scalar(2.0).unwrap()).unwrap();
    assert_close("bn2d running_mean", &values(&bn.running_mean), &BN2D_RUNNING_MEAN, TOL);
    assert_close(
        "bn2d running_var (unbiased)",
        &values(&bn.running_var),
        &BN2D_RUNNING_VAR,
        TOL,
    );
    assert_eq!(bn.num_batches_tracked.dims(), &[] as &[usize]);
    assert_eq!(bn.num_batches_tracked.to_vec::<i64>().unwrap(), vec![2]);
    bn.eval();
    assert_close("bn2d eval", &values(&bn.forward(&x1).unwrap()), &BN2D_EVAL_Y, TOL);
    // Evaluation leaves the statistics alone.
    assert_eq!(bn.num_batches_tracked.to_vec::<i64>().unwrap(), vec![2]);
    assert_close(
        "bn2d running_mean after eval",
        &values(&bn.running_mean),
        &BN2D_RUNNING_MEAN,
        TOL,
    );
    assert_eq!(
        bn.describe(),
        "BatchNorm2d(3, eps=1e-05, momentum=0.1, affine=True, track_running_stats=True)"
    );

    let bn1 = BatchNorm1d::new(3, &dev).unwrap();
    assert_close(
        "bn1d train",
        &values(&bn1.forward(&pat(&[5, 3], 7)).unwrap()),
        &BN1D_TRAIN_Y,
        TOL,
    );
    assert_close("bn1d running_var", &values(&bn1.running_var), &BN1D_RUNNING_VAR, TOL);
}

#[test]
fn gelu_and_flatten_match_pytorch() {
    assert_close("gelu", &values(&Gelu.forward(&pat(&[9], 5)).unwrap()), &GELU_Y, TOL);
    let x = pat(&[2, 3, 4, 5], 3);
    assert_eq!(Flatten::new().forward(&x).unwrap().dims(), &[2, 60]);
    assert_eq!(Flatten::with_dims(1, 2).forward(&x).unwrap().dims(), &[2, 12, 5]);
    assert_eq!(Flatten::with_dims(0, -1).forward(&x).unwrap().dims(), &[120]);
    assert!(Flatten::with_dims(2, 1).forward(&x).is_err());
    assert!(Flatten::new().forward(&pat(&[4], 3)).is_err());
}

#[test]
fn gelu_tanh_is_the_tanh_approximation_with_its_derivative() {
    let dev = Device::cpu();
    let xs = [-4.0, -1.5, -0.3, 0.0, 0.2, 1.0, 2.5, 6.0];
    let x = Tensor::from_host(lockstep_core::HostVec::F64(xs.to_vec()), [xs.len()], &dev)
        .unwrap()
        .requires_grad(true);
    let y = x.gelu_tanh().unwrap();
    y.sum(&[0], false).unwrap().backward().unwrap();
    let (y, dy) = (y.to_vec::<f64>().unwrap(), x.grad().unwrap().to_vec::<f64>().unwrap());
    let k = (2.0 / std::f64::consts::PI).sqrt();
    let f = |x: f64| 0.5 * x * (1.0 + (k * (x + 0.044715 * x * x * x)).tanh());
    for (i, &x) in xs.iter().enumerate() {
        let h = 1e-6;
        let slope = (f(x + h) - f(x - h)) / (2.0 * h);
        assert!((y[i] - f(x)).abs() < 1e-12, "gelu_tanh({x}) = {} not {}", y[i], f(x));
        assert!((dy[i] - slope).abs() < 1e-7, "d gelu_tanh({x}) = {} not {slope}", dy[i]);
    }
    // Nor is it the exact GELU: near x = 2.5 they differ by ~2e-4.
    let exact = x.detach().gelu().unwrap().to_vec::<f64>().unwrap();
    assert!(
        (exact[6] - y[6]).abs() > 1e-4,
        "{} against the exact {}",
        y[6],
        exact[6]
    );
}

#[test]
fn dropout_drops_with_probability_p_scales_the_rest_and_replays_from_generator_state() {
    let dev = Device::cpu();
    let x = Tensor::ones([20_000], lockstep_core::DType::F32, &dev).unwrap();
    let generator = Arc::new(Generator::new(42));
    let mut drop = Dropout::new(0.25, generator.clone()).unwrap();
    let saved = generator.state();
    let y = values(&drop.forward(&x).unwrap());
    let zeros = y.iter().filter(|&&v| v == 0.0).count() as f64 / y.len() as f64;
    assert!((zeros - 0.25).abs() < 0.02, "dropped fraction {zeros}");
    assert!(y.iter().all(|&v| v == 0.0 || (v - 1.0 / 0.75).abs() < 1e-6));
    // A generator restored from the saved state draws the same mask.
    let replay = Dropout::new(0.25, Arc::new(Generator::from_state(saved.0, saved.1))).unwrap();
    assert_eq!(values(&replay.forward(&x).unwrap()), y);
    drop.eval();
    assert_eq!(values(&drop.forward(&x).unwrap()), values(&x));
    assert_eq!(drop.describe(), "Dropout(p=0.25, inplace=False)");
    assert!(Dropout::new(1.5, generator.clone()).is_err());
    assert!(Dropout::new(-0.1, generator).is_err());
}

#[test]
fn wrong_input_shapes_name_the_layer_and_both_shapes() {
    let (dev, g) = (Device::cpu(), Generator::new(1));
    let conv = Conv2d::new(Conv2dConfig::new(3, 4, 3), &dev, &g).unwrap();
    let msg = conv.forward(&pat(&[2, 5, 8, 8], 3)).unwrap_err().to_string();
    assert!(
        msg.contains("Conv2d") && msg.contains("[2, 5, 8, 8]") && msg.contains("[4, 3, 3, 3]"),
        "{msg}"
    );
    let msg = conv.forward(&pat(&[8, 8], 3)).unwrap_err().to_string();
    assert!(msg.contains("Conv2d") && msg.contains("[8, 8]"), "{msg}");
    let msg = Linear::new(10, 4, true, &dev, &g)
        .unwrap()
        .forward(&pat(&[2, 7], 3))
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains("Linear") && msg.contains("[2, 7]") && msg.contains("[4, 10]"),
        "{msg}"
    );
    let msg = BatchNorm2d::new(3, &dev)
        .unwrap()
        .forward(&pat(&[2, 4, 3, 3], 3))
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains("BatchNorm2d") && msg.contains("[2, 4, 3, 3]") && msg.contains("[3]"),
        "{msg}"
    );
    let msg = BatchNorm1d::new(3, &dev)
        .unwrap()
        .forward(&pat(&[2, 3, 3, 3], 3))
        .unwrap_err()
        .to_string();
    assert!(msg.contains("BatchNorm1d") && msg.contains("[2, 3, 3, 3]"), "{msg}");
    let msg = MaxPool2d::new(2)
        .unwrap()
        .forward(&pat(&[4, 4], 3))
        .unwrap_err()
        .to_string();
    assert!(msg.contains("MaxPool2d") && msg.contains("[4, 4]"), "{msg}");
}

#[test]
fn bad_hyper_parameters_are_errors() {
    let (dev, g) = (Device::cpu(), Generator::new(1));
    assert!(Conv2d::new(Conv2dConfig::new(3, 4, 0), &dev, &g).is_err());
    assert!(Conv2d::new(Conv2dConfig::new(3, 4, 3).stride(0), &dev, &g).is_err());
    assert!(Conv2d::new(Conv2dConfig::new(3, 4, 3).groups(2), &dev, &g).is_err());
    assert!(MaxPool2d::new(0).is_err());
    assert!(
        AvgPool2d::with_options(Pool2dOptions {
            kernel: [2, 2],
            stride: [2, 2],
            padding: [2, 2]
        })
        .is_err()
    );
    assert!(BatchNorm2d::new(0, &dev).is_err());
    assert!(BatchNorm2d::new(3, &dev).unwrap().momentum(1.5).is_err());
    assert!(BatchNorm1d::new(3, &dev).unwrap().eps(0.0).is_err());
}

/// PyTorch's default init: weights and biases uniform on ±1/sqrt(fan_in).
#[test]
fn default_initialisation_is_uniform_within_one_over_sqrt_fan_in() {
    let (dev, g) = (Device::cpu(), Generator::new(7));
    let check = |what: &str, t: &Tensor, fan_in: usize| {
        let bound = 1.0 / (fan_in as f32).sqrt();
        let v = values(t);
        let max = v.iter().fold(0f32, |m, x| m.max(x.abs()));
        let mean = v.iter().sum::<f32>() / v.len() as f32;
        assert!(max <= bound, "{what}: max |x| {max}, bound {bound}");
        // Only large tensors have a near-certain spread (16 biases may all fall short of the edge).
        if v.len() >= 1000 {
            assert!(
                max > 0.99 * bound && mean.abs() < 0.05 * bound,
                "{what}: max |x| {max}, mean {mean}, bound {bound}"
            );
        }
        assert!(t.tracks_grad(), "{what} must be a trainable leaf");
    };
    let fc = Linear::new(784, 512, true, &dev, &g).unwrap();
    check("Linear weight", &fc.weight, 784);
    check("Linear bias", fc.bias.as_ref().unwrap(), 784);
    let conv = Conv2d::new(Conv2dConfig::new(6, 16, 5), &dev, &g).unwrap();
    check("Conv2d weight", &conv.weight, 150);
    check("Conv2d bias", conv.bias.as_ref().unwrap(), 150);
}

#[test]
fn batchnorm_training_in_f32_is_one_fused_op_each_way_agreeing_with_the_composed_ops() {
    use lockstep_core::DType;
    let dev = Device::cpu();
    // f32 takes the CPU's fused op; f64 (which it does not fuse) the composed reductions and
    // element ops. Same values, so the two must agree to f32 precision, forward and backward.
    let run = |dtype: DType| {
        let mut bn = BatchNorm2d::new(3, &dev).unwrap();
        let gamma = Tensor::from_slice(&[0.5f32, -1.5, 2.0], [3], &dev).unwrap();
        bn.weight = Some(gamma.to_dtype(dtype).unwrap().requires_grad(true));
        bn.bias = Some(bn.bias.as_ref().unwrap().to_dtype(dtype).unwrap().requires_grad(true));
        bn.running_mean = bn.running_mean.to_dtype(dtype).unwrap();
        bn.running_var = bn.running_var.to_dtype(dtype).unwrap();
        let x = pat(&[4, 3, 5, 7], 3).to_dtype(dtype).unwrap().requires_grad(true);
        let y = bn.forward(&x).unwrap();
        let fused = format!("{y:?}").contains("grad_fn=batch_norm");
        // A loss whose gradient differs per element.
        let weights = pat(&[4, 3, 5, 7], 9).to_dtype(dtype).unwrap();
        y.mul(&weights).unwrap().sum_all().unwrap().backward().unwrap();
        let as_f64 = |t: &Tensor| t.to_dtype(DType::F64).unwrap().to_vec::<f64>().unwrap();
        let grads = [&x, bn.weight.as_ref().unwrap(), bn.bias.as_ref().unwrap()].map(|t| as_f64(&t.grad().unwrap()));
        (fused, as_f64(&y), grads, as_f64(&bn.running_var))
    };
    let (fused, y, grads, running_var) = run(DType::F32);
    let (composed, y64, grads64, running_var64) = run(DType::F64);
    assert!(fused && !composed, "f32 fused: {fused}, f64 fused: {composed}");
    let close = |what: &str, a: &[f64], b: &[f64]| {
        let worst = a
            .iter()
            .zip(b)
            .map(|(x, y)| (x - y).abs() / (1.0 + y.abs()))
            .fold(0.0, f64::max);
        assert!(worst < 2e-5, "{what}: worst difference {worst:e}");
    };
    close("output", &y, &y64);
    close("running_var", &running_var, &running_var64);
    for (name, (g, g64)) in ["x", "weight", "bias"].iter().zip(grads.iter().zip(&grads64)) {
        close(name, g, g64);
    }
}
