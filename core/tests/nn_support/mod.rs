//! Helpers shared by the nn_* and optim_* tests.
#![allow(dead_code)]

use lockstep_core::nn::{Conv2d, Conv2dConfig, Flatten, Linear, MaxPool2d, Relu, Sequential};
use lockstep_core::{Device, Generator, Tensor};

/// Element i is `((i*k) % 17 - 8) / 8`: the `pat` of scripts/reference_values.py, exact in f32.
pub fn pat_vec(n: usize, k: usize) -> Vec<f32> {
    (0..n).map(|i| (((i * k) % 17) as f32 - 8.0) / 8.0).collect()
}

pub fn pat(shape: &[usize], k: usize) -> Tensor {
    Tensor::from_vec(pat_vec(shape.iter().product(), k), shape.to_vec(), &Device::cpu()).unwrap()
}

/// Asserts `|a - e| <= tol * max(1, |e|)` element by element, naming the first failure.
pub fn assert_close(what: &str, actual: &[f32], expected: &[f32], tol: f32) {
    assert_eq!(actual.len(), expected.len(), "{what}: length");
    for (i, (a, e)) in actual.iter().zip(expected).enumerate() {
        assert!(
            (a - e).abs() <= tol * e.abs().max(1.0),
            "{what}[{i}]: got {a}, PyTorch {e}\n  all: {actual:?}"
        );
    }
}

pub fn values(t: &Tensor) -> Vec<f32> {
    t.to_vec::<f32>().unwrap()
}

/// The project's MLP: 784-512-512-10 with ReLU, one Sequential.
pub fn mlp(dev: &Device, g: &Generator) -> Sequential {
    Sequential::new()
        .add(Linear::new(784, 512, true, dev, g).unwrap())
        .add(Relu)
        .add(Linear::new(512, 512, true, dev, g).unwrap())
        .add(Relu)
        .add(Linear::new(512, 10, true, dev, g).unwrap())
}

/// The project's LeNet-5 for 28x28 inputs, one Sequential.
pub fn lenet(dev: &Device, g: &Generator) -> Sequential {
    Sequential::new()
        .add(Conv2d::new(Conv2dConfig::new(1, 6, 5).padding(2), dev, g).unwrap())
        .add(Relu)
        .add(MaxPool2d::new(2).unwrap())
        .add(Conv2d::new(Conv2dConfig::new(6, 16, 5), dev, g).unwrap())
        .add(Relu)
        .add(MaxPool2d::new(2).unwrap())
        .add(Flatten::new())
        .add(Linear::new(400, 120, true, dev, g).unwrap())
        .add(Relu)
        .add(Linear::new(120, 84, true, dev, g).unwrap())
        .add(Relu)
        .add(Linear::new(84, 10, true, dev, g).unwrap())
}
