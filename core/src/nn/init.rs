//! PyTorch's default initialisation, drawn from a Lockstep `Generator`.

use crate::device::Device;
use crate::dtype::DType;
use crate::error::Result;
use crate::rng::Generator;
use crate::shape::Shape;
use crate::tensor::Tensor;

/// Uniform on ±bound, as a trainable leaf.
pub fn uniform_parameter(
    shape: impl Into<Shape>,
    bound: f64,
    generator: &Generator,
    device: &Device,
) -> Result<Tensor> {
    Ok(Tensor::rand_uniform(shape, -bound, bound, DType::F32, generator, device)?.requires_grad(true))
}

/// `kaiming_uniform_(a=sqrt(5))`, PyTorch's default for Linear and Conv weights:
/// gain = sqrt(2 / (1 + a²)) = sqrt(1/3), bound = gain * sqrt(3 / fan_in) = 1 / sqrt(fan_in).
pub fn kaiming_uniform_default(
    shape: impl Into<Shape>,
    fan_in: usize,
    generator: &Generator,
    device: &Device,
) -> Result<Tensor> {
    uniform_parameter(shape, 1.0 / (fan_in.max(1) as f64).sqrt(), generator, device)
}

/// PyTorch's default bias: uniform on ±1/sqrt(fan_in).
pub fn bias_default(len: usize, fan_in: usize, generator: &Generator, device: &Device) -> Result<Tensor> {
    uniform_parameter([len], 1.0 / (fan_in.max(1) as f64).sqrt(), generator, device)
}

/// `kaiming_normal_(mode="fan_out", nonlinearity="relu")`, torchvision's ResNet convolutions:
/// normal with std = sqrt(2 / fan_out), fan_out = out_channels · kh · kw.
pub fn kaiming_normal_fan_out(
    shape: impl Into<Shape>,
    fan_out: usize,
    generator: &Generator,
    device: &Device,
) -> Result<Tensor> {
    let std = (2.0 / fan_out.max(1) as f64).sqrt();
    Ok(Tensor::rand_normal(shape, 0.0, std, DType::F32, generator, device)?.requires_grad(true))
}
