//! Built-in models, each one `nn::Sequential` whose parameter names are those of the same
//! PyTorch model (an `nn.Sequential`; torchvision's names for the ResNets; seq2seq: `0.` the
//! encoder, `1.` the decoder), so `--init-weights` and checkpoints move between the two.

use crate::device::Device;
use crate::error::{Error, Result};
use crate::nn::{BatchNorm2d, Conv2d, Conv2dConfig, Flatten, Linear, MaxPool2d, Relu, Sequential};
use crate::rng::Generator;

pub mod gpt;
mod gpt_generate;
mod gpt_layers;
mod gpt_weights;
pub mod resnet;
mod seq2seq;

pub use gpt::{Gpt, GptConfig, gpt};
pub use gpt_generate::Sampling;
pub use gpt_layers::{GptEmbedding, GptHead};
pub use gpt_weights::{GptLayout, GptSizes};
pub use resnet::{ResNetConfig, Stem, resnet};
pub use seq2seq::{Decoder, Encoder, seq2seq};

/// The model names `build` accepts.
pub const NAMES: [&str; 7] = [
    "mlp",
    "lenet5",
    "convnet-bn",
    "seq2seq",
    "resnet18",
    "resnet34",
    "resnet50",
];

/// What the data set feeds a model: image channels, height and width, and the classes to tell
/// apart.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Input {
    /// Channels, height and width of each image, `[c, h, w]`.
    pub image: [usize; 3],
    /// Number of classes: the width of the model's output logits.
    pub classes: usize,
}

impl Input {
    /// MNIST's 1x28x28 digits in 10 classes.
    pub const MNIST: Input = Input {
        image: [1, 28, 28],
        classes: 10,
    };
}

/// An MLP on flattened 28x28 images: 784 -> hidden… -> 10 with ReLU between layers
/// (`hidden = [512, 512]` is the default 784-512-512-10).
pub fn mlp(hidden: &[usize], device: &Device, generator: &Generator) -> Result<Sequential> {
    mlp_for(Input::MNIST, hidden, device, generator)
}

/// An MLP on flattened images of `input`: c·h·w -> hidden… -> classes.
pub fn mlp_for(input: Input, hidden: &[usize], device: &Device, generator: &Generator) -> Result<Sequential> {
    let mut model = Sequential::new().add(Flatten::new());
    let mut width = input.image.iter().product();
    for &h in hidden {
        if h == 0 {
            return Err(Error::invalid("mlp", "hidden layer widths must be at least 1"));
        }
        model = model.add(Linear::new(width, h, true, device, generator)?).add(Relu);
        width = h;
    }
    Ok(model.add(Linear::new(width, input.classes, true, device, generator)?))
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

/// A built-in model by name for MNIST; see [`build_for`].
pub fn build(name: &str, hidden: &[usize], device: &Device, generator: &Generator) -> Result<Sequential> {
    build_for(name, hidden, Input::MNIST, device, generator)
}

/// A built-in model by name for the images of `input`; `hidden` gives the mlp's widths (default
/// 512, 512) and the seq2seq GRUs' width (its first value; default 128); empty means the default.
/// The ResNets take the CIFAR stem for images up to 64 pixels, ImageNet's above.
pub fn build_for(
    name: &str,
    hidden: &[usize],
    input: Input,
    device: &Device,
    generator: &Generator,
) -> Result<Sequential> {
    build_checkpointed(name, hidden, input, false, device, generator)
}

/// [`build_for`], with every residual block checkpointed when `activation_checkpointing`
/// ([`ResNetConfig::activation_checkpointing`]); the other models have no blocks and refuse it.
pub fn build_checkpointed(
    name: &str,
    hidden: &[usize],
    input: Input,
    activation_checkpointing: bool,
    device: &Device,
    generator: &Generator,
) -> Result<Sequential> {
    if activation_checkpointing && ResNetConfig::named(name).is_none() {
        return Err(Error::invalid(
            "model",
            format!("activation checkpointing checkpoints residual blocks, which {name} has none of"),
        ));
    }
    let mnist_only = |model: &str| {
        if input == Input::MNIST {
            Ok(())
        } else {
            Err(Error::invalid(
                "model",
                format!(
                    "{model} is built for MNIST's 1x28x28 images in 10 classes, but the data set has {}x{}x{} images in {} classes; use mlp or resnet18",
                    input.image[0], input.image[1], input.image[2], input.classes
                ),
            ))
        }
    };
    match name {
        "mlp" if hidden.is_empty() => mlp_for(input, &[512, 512], device, generator),
        "mlp" => mlp_for(input, hidden, device, generator),
        "lenet5" => mnist_only(name).and_then(|_| lenet5(device, generator)),
        "convnet-bn" => mnist_only(name).and_then(|_| convnet_bn(device, generator)),
        "seq2seq" => seq2seq(hidden.first().copied().unwrap_or(seq2seq::HIDDEN), device, generator),
        other => match ResNetConfig::named(other) {
            Some(config) => {
                let stem = if input.image[1].max(input.image[2]) <= 64 {
                    Stem::Cifar
                } else {
                    Stem::ImageNet
                };
                let config = config
                    .stem(stem)
                    .in_channels(input.image[0])
                    .classes(input.classes)
                    .activation_checkpointing(activation_checkpointing);
                resnet(config, device, generator)
            }
            None => Err(Error::invalid(
                "model",
                format!("unknown model `{other}`; built-in models: {}", NAMES.join(", ")),
            )),
        },
    }
}
