//! Built-in models, each one `nn::Sequential` whose parameter names are those of the same
//! PyTorch `nn.Sequential` (seq2seq: `0.` the encoder, `1.` the decoder) (so `--init-weights` and checkpoints move between the two).

use crate::device::Device;
use crate::error::{Error, Result};
use crate::nn::{BatchNorm2d, Conv2d, Conv2dConfig, Flatten, Linear, MaxPool2d, Relu, Sequential};
use crate::rng::Generator;

mod seq2seq;

pub use seq2seq::{Decoder, Encoder, seq2seq};

/// The model names `build` accepts.
pub const NAMES: [&str; 4] = ["mlp", "lenet5", "convnet-bn", "seq2seq"];

/// An MLP on flattened 28x28 images: 784 -> hidden… -> 10 with ReLU between layers
/// (`hidden = [512, 512]` is the default 784-512-512-10).
pub fn mlp(hidden: &[usize], device: &Device, generator: &Generator) -> Result<Sequential> {
    let mut model = Sequential::new().add(Flatten::new());
    let mut width = 28 * 28;
    for &h in hidden {
        if h == 0 {
            return Err(Error::invalid("mlp", "hidden layer widths must be at least 1"));
        }
        model = model.add(Linear::new(width, h, true, device, generator)?).add(Relu);
        width = h;
    }
    Ok(model.add(Linear::new(width, 10, true, device, generator)?))
}

/// LeNet-5 for 28x28 inputs: conv 1->6 5x5 pad 2, relu, maxpool 2, conv 6->16 5x5, relu,
/// maxpool 2, flatten, fc 400->120, relu, fc 120->84, relu, fc 84->10.
pub fn lenet5(device: &Device, generator: &Generator) -> Result<Sequential> {
    Ok(Sequential::new()
        .add(Conv2d::new(Conv2dConfig::new(1, 6, 5).padding(2), device, generator)?)
        .add(Relu)
        .add(MaxPool2d::new(2)?)
        .add(Conv2d::new(Conv2dConfig::new(6, 16, 5), device, generator)?)
        .add(Relu)
        .add(MaxPool2d::new(2)?)
        .add(Flatten::new())
        .add(Linear::new(400, 120, true, device, generator)?)
        .add(Relu)
        .add(Linear::new(120, 84, true, device, generator)?)
        .add(Relu)
        .add(Linear::new(84, 10, true, device, generator)?))
}

/// A small convnet with batch normalisation for 28x28 inputs (for SyncBatchNorm runs): conv 1->16
/// 3x3 pad 1, bn, relu, maxpool 2, conv 16->32 3x3 pad 1, bn, relu, maxpool 2, flatten,
/// fc 1568->10. The convolutions have no bias: the batch norm after each would cancel it.
pub fn convnet_bn(device: &Device, generator: &Generator) -> Result<Sequential> {
    Ok(Sequential::new()
        .add(Conv2d::new(
            Conv2dConfig::new(1, 16, 3).padding(1).bias(false),
            device,
            generator,
        )?)
        .add(BatchNorm2d::new(16, device)?)
        .add(Relu)
        .add(MaxPool2d::new(2)?)
        .add(Conv2d::new(
            Conv2dConfig::new(16, 32, 3).padding(1).bias(false),
            device,
            generator,
        )?)
        .add(BatchNorm2d::new(32, device)?)
        .add(Relu)
        .add(MaxPool2d::new(2)?)
        .add(Flatten::new())
        .add(Linear::new(32 * 7 * 7, 10, true, device, generator)?))
}

/// A built-in model by name; `hidden` gives the mlp's widths (default 512, 512) and the seq2seq
/// GRUs' width (its first value; default 128); empty means the default.
pub fn build(name: &str, hidden: &[usize], device: &Device, generator: &Generator) -> Result<Sequential> {
    match name {
        "mlp" if hidden.is_empty() => mlp(&[512, 512], device, generator),
        "mlp" => mlp(hidden, device, generator),
        "lenet5" => lenet5(device, generator),
        "convnet-bn" => convnet_bn(device, generator),
        "seq2seq" => seq2seq(hidden.first().copied().unwrap_or(seq2seq::HIDDEN), device, generator),
        other => Err(Error::invalid(
            "model",
            format!("unknown model `{other}`; built-in models: {}", NAMES.join(", ")),
        )),
    }
}
