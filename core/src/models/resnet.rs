//! torchvision's ResNets (`resnet18`, `resnet34`, `resnet50`) from one builder, with its parameter
//! names (`conv1.weight`, `layer2.0.downsample.0.weight`, `fc.bias`, …) so state dicts move both
//! ways, and two stems: ImageNet's (7x7 stride 2, then a 3x3 max-pool) and the CIFAR one (3x3
//! stride 1, no max-pool) that small images need.
//!
//! The model is a named `Sequential` (its forward is a chain), so it also splits into pipeline
//! stages; the residual blocks are modules of their own.

use crate::backend::Conv2dGeometry;
use crate::device::Device;
use crate::error::{Error, Result};
use crate::nn::{
    AdaptiveAvgPool2d, BatchNorm2d, Checkpointed, Conv2d, Conv2dConfig, Flatten, Linear, MaxPool2d, Module, Relu,
    Sequential, init,
};
use crate::rng::Generator;
use crate::tensor::{Pool2dOptions, Tensor};

/// The first layers, which set how far the image shrinks before the residual stages.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stem {
    /// 7x7 convolution with stride 2 and padding 3, then a 3x3 max-pool with stride 2 (224px images).
    ImageNet,
    /// 3x3 convolution with stride 1 and padding 1, no max-pool (32px images: CIFAR, MNIST).
    Cifar,
}

/// The residual block of every stage.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Block {
    /// Two 3x3 convolutions (ResNet-18/34); widens nothing.
    Basic,
    /// 1x1, 3x3 (with the stride, torchvision's "v1.5"), 1x1 widening 4x (ResNet-50 and deeper).
    Bottleneck,
}

impl Block {
    fn expansion(self) -> usize {
        match self {
            Block::Basic => 1,
            Block::Bottleneck => 4,
        }
    }
}

/// A ResNet's shape: its block, the blocks per stage, the stem, input channels and classes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ResNetConfig {
    /// Residual block type: `Basic` for ResNet-18/34, `Bottleneck` for ResNet-50.
    pub block: Block,
    /// Blocks in each of the four stages `layer1`..`layer4` (e.g. `[2, 2, 2, 2]` for ResNet-18).
    pub layers: [usize; 4],
    /// The first layers: ImageNet's for large images, CIFAR's for small ones.
    pub stem: Stem,
    /// Channels of the input images (3 for RGB, 1 for MNIST).
    pub in_channels: usize,
    /// Outputs of the final `fc` layer.
    pub classes: usize,
    /// Whether each residual block is checkpointed ([`crate::nn::checkpoint()`]): its activations
    /// recomputed in backward instead of kept.
    pub activation_checkpointing: bool,
}

/// The names `ResNetConfig::named` knows.
pub const NAMES: [&str; 3] = ["resnet18", "resnet34", "resnet50"];

impl ResNetConfig {
    /// torchvision's `resnet18`/`resnet34`/`resnet50` (ImageNet stem, 3 channels, 1000 classes).
    pub fn named(name: &str) -> Option<ResNetConfig> {
        let (block, layers) = match name {
            "resnet18" => (Block::Basic, [2, 2, 2, 2]),
            "resnet34" => (Block::Basic, [3, 4, 6, 3]),
            "resnet50" => (Block::Bottleneck, [3, 4, 6, 3]),
            _ => return None,
        };
        Some(ResNetConfig {
            block,
            layers,
            stem: Stem::ImageNet,
            in_channels: 3,
            classes: 1000,
            activation_checkpointing: false,
        })
    }
    /// Swaps the stem, e.g. to [`Stem::Cifar`] for 32px images.
    pub fn stem(self, stem: Stem) -> Self {
        ResNetConfig { stem, ..self }
    }
    /// Sets the input image channels (`conv1`'s input).
    pub fn in_channels(self, in_channels: usize) -> Self {
        ResNetConfig { in_channels, ..self }
    }
    /// Sets the number of classes (`fc`'s outputs).
    pub fn classes(self, classes: usize) -> Self {
        ResNetConfig { classes, ..self }
    }
    /// Checkpoints every residual block (or none).
    pub fn activation_checkpointing(self, activation_checkpointing: bool) -> Self {
        ResNetConfig {
            activation_checkpointing,
            ..self
        }
    }
}

/// One of a ResNet's convolutions: square kernels, padded by half the kernel, no bias.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct ConvSpec {
    inputs: usize,
    outputs: usize,
    kernel: usize,
    stride: usize,
}

/// `(inputs, outputs, kernel, stride)` as a `ConvSpec`.
const fn spec(inputs: usize, outputs: usize, kernel: usize, stride: usize) -> ConvSpec {
    ConvSpec {
        inputs,
        outputs,
        kernel,
        stride,
    }
}

impl ConvSpec {
    /// Its geometry over `n` images of `h x w` pixels.
    fn geometry(self, n: usize, [h, w]: [usize; 2]) -> Conv2dGeometry {
        Conv2dGeometry {
            n,
            c: self.inputs,
            h,
            w,
            kh: self.kernel,
            kw: self.kernel,
            stride: [self.stride; 2],
            padding: [self.kernel / 2; 2],
            dilation: [1, 1],
        }
    }
}

/// The stem's convolution.
fn stem_conv(config: &ResNetConfig) -> ConvSpec {
    match config.stem {
        Stem::ImageNet => spec(config.in_channels, 64, 7, 2),
        Stem::Cifar => spec(config.in_channels, 64, 3, 1),
    }
}

/// ImageNet's max-pool after the stem.
const STEM_POOL: Pool2dOptions = Pool2dOptions {
    kernel: [3, 3],
    stride: [2, 2],
    padding: [1, 1],
};

/// One residual block's shape: its kind, the channels it takes, its width and its stride.
#[derive(Clone, Copy, Debug)]
struct BlockSpec {
    kind: Block,
    inplanes: usize,
    planes: usize,
    stride: usize,
}

impl BlockSpec {
    /// Its convolutions in order (`conv1`, `conv2`, and a bottleneck's `conv3`).
    fn convs(&self) -> Vec<ConvSpec> {
        let (inplanes, planes, stride) = (self.inplanes, self.planes, self.stride);
        match self.kind {
            Block::Basic => vec![spec(inplanes, planes, 3, stride), spec(planes, planes, 3, 1)],
            Block::Bottleneck => vec![
                spec(inplanes, planes, 1, 1),
                spec(planes, planes, 3, stride),
                spec(planes, self.outplanes(), 1, 1),
            ],
        }
    }

    fn outplanes(&self) -> usize {
        self.planes * self.kind.expansion()
    }

    /// The shortcut's 1x1 projection, where the stride or the width changes.
    fn downsample(&self) -> Option<ConvSpec> {
        (self.stride != 1 || self.inplanes != self.outplanes())
            .then(|| spec(self.inplanes, self.outplanes(), 1, self.stride))
    }
}

/// The blocks of each stage `layer1`..`layer4`.
fn stages(config: &ResNetConfig) -> Vec<Vec<BlockSpec>> {
    let mut inplanes = 64;
    let mut stages = Vec::new();
    for (stage, &blocks) in config.layers.iter().enumerate() {
        let planes = 64 << stage;
        let mut specs = Vec::new();
        for b in 0..blocks {
            let stride = if stage > 0 && b == 0 { 2 } else { 1 };
            let block = BlockSpec {
                kind: config.block,
                inplanes,
                planes,
                stride,
            };
            inplanes = block.outplanes();
            specs.push(block);
        }
        stages.push(specs);
    }
    stages
}

/// One convolution of a ResNet over a batch: its parameter's name (`layer2.0.conv1`), its
/// geometry and its output channels.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConvLayer {
    /// The module's name, as in the state dict (`conv1`, `layer2.0.downsample.0`).
    pub name: String,
    /// The convolution over the batch's images as they reach it.
    pub geometry: Conv2dGeometry,
    /// Output channels.
    pub out_channels: usize,
}

/// The convolutions [`resnet`] builds for `config`, in order, over `batch` images of `image`
/// (`[height, width]`) pixels: for reports of how a backend computes each (`lockstep check`).
pub fn conv_layers(config: ResNetConfig, batch: usize, image: [usize; 2]) -> Vec<ConvLayer> {
    let mut layers = Vec::new();
    let mut push = |name: String, conv: ConvSpec, size: [usize; 2]| {
        let geometry = conv.geometry(batch, size);
        layers.push(ConvLayer {
            name,
            geometry,
            out_channels: conv.outputs,
        });
        [geometry.out_h(), geometry.out_w()]
    };
    let mut size = push("conv1".into(), stem_conv(&config), image);
    if config.stem == Stem::ImageNet {
        let [h, w] = size;
        let pooled =
            |x: usize| (x + 2 * STEM_POOL.padding[0]).saturating_sub(STEM_POOL.kernel[0]) / STEM_POOL.stride[0] + 1;
        size = [pooled(h), pooled(w)];
    }
    for (stage, blocks) in stages(&config).iter().enumerate() {
        for (b, block) in blocks.iter().enumerate() {
            let prefix = format!("layer{}.{b}", stage + 1);
            let input = size;
            for (i, conv) in block.convs().into_iter().enumerate() {
                size = push(format!("{prefix}.conv{}", i + 1), conv, size);
            }
            if let Some(conv) = block.downsample() {
                push(format!("{prefix}.downsample.0"), conv, input);
            }
        }
    }
    layers
}

/// A convolution without bias (a batch norm follows each), initialised as torchvision does:
/// kaiming-normal over fan-out for ReLU.
fn conv(
    ConvSpec {
        inputs,
        outputs,
        kernel,
        stride,
    }: ConvSpec,
    device: &Device,
    generator: &Generator,
) -> Result<Conv2d> {
    let config = Conv2dConfig::new(inputs, outputs, kernel)
        .stride(stride)
        .padding(kernel / 2)
        .bias(false);
    let mut layer = Conv2d::new(config, device, generator)?;
    layer.weight = init::kaiming_normal_fan_out(
        layer.weight.dims().to_vec(),
        outputs * kernel * kernel,
        generator,
        device,
    )?;
    Ok(layer)
}

/// Builds the ResNet `config` describes.
pub fn resnet(config: ResNetConfig, device: &Device, generator: &Generator) -> Result<Sequential> {
    if config.in_channels == 0 || config.classes == 0 || config.layers.contains(&0) {
        return Err(Error::invalid(
            "resnet",
            format!("input channels, classes and blocks per stage must be at least 1, got {config:?}"),
        ));
    }
    let mut model = Sequential::new()
        .add_named("conv1", conv(stem_conv(&config), device, generator)?)
        .add_named("bn1", BatchNorm2d::new(64, device)?)
        .add_named("relu", Relu);
    if config.stem == Stem::ImageNet {
        model = model.add_named("maxpool", MaxPool2d::with_options(STEM_POOL)?);
    }
    let mut inplanes = 64;
    for (stage, blocks) in stages(&config).iter().enumerate() {
        let mut layer = Sequential::new();
        for spec in blocks {
            layer.push(block(spec, device, generator)?.checkpointed(config.activation_checkpointing));
            inplanes = spec.outplanes();
        }
        model = model.add_named(format!("layer{}", stage + 1), layer);
    }
    Ok(model
        .add_named("avgpool", AdaptiveAvgPool2d::new([1, 1])?)
        .add_named("flatten", Flatten::new())
        .add_named("fc", Linear::new(inplanes, config.classes, true, device, generator)?))
}

/// A residual block of either kind.
enum AnyBlock {
    Basic(BasicBlock),
    Bottleneck(Bottleneck),
}

impl AnyBlock {
    /// The block as a layer, checkpointed or not.
    fn checkpointed(self, enabled: bool) -> Box<dyn Module> {
        fn boxed<M: Module + Clone + 'static>(block: M, enabled: bool) -> Box<dyn Module> {
            match enabled {
                true => Box::new(Checkpointed::new(block, true)),
                false => Box::new(block),
            }
        }
        match self {
            AnyBlock::Basic(b) => boxed(b, enabled),
            AnyBlock::Bottleneck(b) => boxed(b, enabled),
        }
    }
}

/// One residual block, with a 1x1 projection on the shortcut where the stride or the width
/// changes.
fn block(spec: &BlockSpec, device: &Device, generator: &Generator) -> Result<AnyBlock> {
    let (planes, outplanes) = (spec.planes, spec.outplanes());
    let downsample = match spec.downsample() {
        Some(projection) => Some(Downsample {
            conv: conv(projection, device, generator)?,
            bn: BatchNorm2d::new(outplanes, device)?,
        }),
        None => None,
    };
    let mut convs = spec.convs().into_iter().map(|c| conv(c, device, generator));
    let mut next = || convs.next().expect("a block's convolutions");
    Ok(match spec.kind {
        Block::Basic => AnyBlock::Basic(BasicBlock {
            conv1: next()?,
            bn1: BatchNorm2d::new(planes, device)?,
            conv2: next()?,
            bn2: BatchNorm2d::new(planes, device)?,
            downsample,
        }),
        Block::Bottleneck => AnyBlock::Bottleneck(Bottleneck {
            conv1: next()?,
            bn1: BatchNorm2d::new(planes, device)?,
            conv2: next()?,
            bn2: BatchNorm2d::new(planes, device)?,
            conv3: next()?,
            bn3: BatchNorm2d::new(outplanes, device)?,
            downsample,
        }),
    })
}

/// The shortcut's projection where the stride or the width changes: a 1x1 strided convolution
/// and a batch norm (torchvision's `downsample`, a `Sequential`, whose names and printing it keeps).
#[derive(Module, Clone)]
#[module(kind = "Sequential")]
pub struct Downsample {
    /// 1x1 convolution carrying the block's stride and width.
    #[module(rename = "0")]
    pub conv: Conv2d,
    /// Batch norm of the projection.
    #[module(rename = "1")]
    pub bn: BatchNorm2d,
}

impl Downsample {
    /// NCHW to the block's output shape.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.bn.forward(&self.conv.forward(x)?)
    }
}

/// The shortcut: the input itself, or its projection.
fn shortcut(downsample: &Option<Downsample>, x: &Tensor) -> Result<Tensor> {
    match downsample {
        Some(projection) => projection.forward(x),
        None => Ok(x.clone()),
    }
}

/// relu(bn2(conv2(relu(bn1(conv1(x))))) + shortcut(x)).
#[derive(Module, Clone)]
pub struct BasicBlock {
    /// 3x3 convolution carrying the block's stride.
    pub conv1: Conv2d,
    /// Batch norm of `conv1`'s output, followed by ReLU.
    pub bn1: BatchNorm2d,
    /// 3x3 convolution with stride 1.
    pub conv2: Conv2d,
    /// Batch norm of `conv2`'s output, before the residual addition.
    pub bn2: BatchNorm2d,
    /// Projection of the shortcut (1x1 strided convolution, batch norm) when the stride or width changes;
    /// `None` for the identity.
    pub downsample: Option<Downsample>,
}

impl BasicBlock {
    /// NCHW to NCHW with `planes` channels and the spatial size divided by the block's stride.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let h = self.bn1.forward_relu(&self.conv1.forward(x)?)?;
        let h = self.conv2.forward(&h)?;
        self.bn2.forward_add_relu(&h, &shortcut(&self.downsample, x)?)
    }
}

/// relu(bn3(conv3(relu(bn2(conv2(relu(bn1(conv1(x)))))))) + shortcut(x)).
#[derive(Module, Clone)]
pub struct Bottleneck {
    /// 1x1 convolution narrowing to `planes` channels.
    pub conv1: Conv2d,
    /// Batch norm of `conv1`'s output, followed by ReLU.
    pub bn1: BatchNorm2d,
    /// 3x3 convolution carrying the block's stride (torchvision's v1.5).
    pub conv2: Conv2d,
    /// Batch norm of `conv2`'s output, followed by ReLU.
    pub bn2: BatchNorm2d,
    /// 1x1 convolution widening to `4 * planes` channels.
    pub conv3: Conv2d,
    /// Batch norm of `conv3`'s output, before the residual addition.
    pub bn3: BatchNorm2d,
    /// Projection of the shortcut to `4 * planes` channels (1x1 convolution, batch norm) when the stride or width
    /// changes; `None` for the identity.
    pub downsample: Option<Downsample>,
}

impl Bottleneck {
    /// NCHW to NCHW with `4 * planes` channels and the spatial size divided by the block's stride.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let h = self.bn1.forward_relu(&self.conv1.forward(x)?)?;
        let h = self.bn2.forward_relu(&self.conv2.forward(&h)?)?;
        let h = self.conv3.forward(&h)?;
        self.bn3.forward_add_relu(&h, &shortcut(&self.downsample, x)?)
    }
}
