//! The acceptance test: the MLP and LeNet-5 built from nn modules train on a small fixed
//! random data set (labels from a random linear teacher, so they are learnable) and the loss
//! goes down. Plus a BatchNorm/Dropout/GELU net, to train through every stateful layer.

mod nn_support;

use std::sync::Arc;

use lockstep_core::nn::{
    BatchNorm1d, BatchNorm2d, Conv2d, Conv2dConfig, Dropout, Flatten, Gelu, Linear, MaxPool2d, Module, ModuleExt,
    Sequential,
};
use lockstep_core::optim::{Adam, AdamConfig, LinearLR, LrScheduler, Optimizer, Sgd, SgdConfig, clip_grad_norm};
use lockstep_core::{DType, Device, Generator, Tensor};
use nn_support::{lenet, mlp};

/// `n` standard-normal 784-vectors and their classes under a random linear teacher.
fn teacher_data(n: usize, seed: u64) -> (Tensor, Tensor) {
    let dev = Device::cpu();
    let g = Generator::new(seed);
    let x = Tensor::rand_normal([n, 784], 0.0, 1.0, DType::F32, &g, &dev).unwrap();
    let teacher = Linear::new(784, 10, true, &dev, &g).unwrap();
    let labels = lockstep_core::no_grad(|| teacher.forward(&x).unwrap().argmax(-1, false).unwrap());
    (x, labels)
}

/// Full-batch training; returns (first loss, last loss).
fn train(
    model: &dyn Module,
    x: &Tensor,
    labels: &Tensor,
    opt: &mut dyn Optimizer,
    steps: usize,
    mut after_backward: impl FnMut(&mut dyn Optimizer),
) -> (f64, f64) {
    let mut losses = Vec::with_capacity(steps);
    for _ in 0..steps {
        opt.zero_grad();
        let loss = model.forward(x).unwrap().cross_entropy(labels).unwrap();
        loss.backward().unwrap();
        after_backward(opt);
        opt.step().unwrap();
        losses.push(loss.item().unwrap());
    }
    assert!(losses.iter().all(|l| l.is_finite()), "{losses:?}");
    (losses[0], losses[steps - 1])
}

#[test]
fn mlp_loss_goes_down_with_sgd_momentum() {
    let model = mlp(&Device::cpu(), &Generator::new(10));
    let (x, labels) = teacher_data(128, 11);
    let mut opt = Sgd::new(model.parameters(), SgdConfig::new(0.05).momentum(0.9)).unwrap();
    let (first, last) = train(&model, &x, &labels, &mut opt, 25, |_| {});
    assert!(last < 0.5 * first, "MLP loss {first} -> {last}");
}

#[test]
fn lenet_loss_goes_down_with_adam_warmup_and_clipping() {
    let model = lenet(&Device::cpu(), &Generator::new(20));
    let (x, labels) = teacher_data(64, 21);
    let images = x.reshape([64, 1, 28, 28]).unwrap();
    let mut opt = Adam::new(model.parameters(), AdamConfig::adam().lr(3e-3)).unwrap();
    let mut sched = LrScheduler::new(LinearLR::warmup(0.3, 5).unwrap(), &mut opt);
    let params = model.parameters();
    let (first, last) = train(&model, &images, &labels, &mut opt, 30, |opt| {
        clip_grad_norm(&params, 5.0).unwrap();
        sched.step(opt);
    });
    assert!(last < 0.5 * first, "LeNet loss {first} -> {last}");
}

#[test]
fn batchnorm_dropout_gelu_net_trains_and_evaluates_deterministically() {
    let (dev, g) = (Device::cpu(), Generator::new(30));
    let mut model = Sequential::new()
        .add(Conv2d::new(Conv2dConfig::new(1, 4, 3).stride(2), &dev, &g).unwrap())
        .add(BatchNorm2d::new(4, &dev).unwrap())
        .add(Gelu)
        .add(MaxPool2d::new(2).unwrap())
        .add(Flatten::new())
        .add(Linear::new(4 * 6 * 6, 32, true, &dev, &g).unwrap())
        .add(BatchNorm1d::new(32, &dev).unwrap())
        .add(Gelu)
        .add(Dropout::new(0.1, Arc::new(Generator::new(31))).unwrap())
        .add(Linear::new(32, 10, true, &dev, &g).unwrap());
    let (x, labels) = teacher_data(64, 32);
    let images = x.reshape([64, 1, 28, 28]).unwrap();
    let mut opt = Adam::new(model.parameters(), AdamConfig::adamw().lr(1e-2)).unwrap();
    let (first, last) = train(&model, &images, &labels, &mut opt, 30, |_| {});
    assert!(last < 0.6 * first, "loss {first} -> {last}");
    model.eval();
    let a = model.forward(&images).unwrap().to_vec::<f32>().unwrap();
    let b = model.forward(&images).unwrap().to_vec::<f32>().unwrap();
    assert_eq!(a, b, "eval mode must not drop or update statistics");
    let tracked = model
        .state_dict()
        .into_iter()
        .find(|(n, _)| n == "1.num_batches_tracked")
        .unwrap()
        .1;
    assert_eq!(tracked.to_vec::<i64>().unwrap(), vec![30]);
}
