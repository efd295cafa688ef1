//! 2-D convolution with weight `[out, in/groups, kh, kw]` and PyTorch's default initialisation.

use super::init;
use super::layer_error::raised_by;
use super::module::{Module, join_name, remap, remap_opt};
use super::spatial::{pair, per_image};
use crate::backend::UnaryOp;
use crate::device::Device;
use crate::error::{Error, Result};
use crate::rng::Generator;
use crate::tensor::{Conv2dOptions, Tensor};

/// The shape of a convolution, PyTorch's `nn.Conv2d` arguments (padding mode "zeros").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Conv2dConfig {
    /// Channels of the input (its axis 1).
    pub in_channels: usize,
    /// Channels of the output: one filter each.
    pub out_channels: usize,
    /// Kernel height and width, `[kh, kw]`.
    pub kernel_size: [usize; 2],
    /// Step between windows, `[h, w]` (default 1).
    pub stride: [usize; 2],
    /// Zeros added on each side, `[h, w]` (default 0).
    pub padding: [usize; 2],
    /// Spacing between kernel taps, `[h, w]` (default 1).
    pub dilation: [usize; 2],
    /// Channel groups convolved separately (default 1); both channel counts must divide by it.
    pub groups: usize,
    /// Whether the layer has an `[out_channels]` bias (default true).
    pub bias: bool,
}

impl Conv2dConfig {
    /// A square `kernel` with stride 1, no padding, one group and a bias (PyTorch's defaults).
    pub fn new(in_channels: usize, out_channels: usize, kernel: usize) -> Self {
        Conv2dConfig {
            in_channels,
            out_channels,
            kernel_size: [kernel; 2],
            stride: [1; 2],
            padding: [0; 2],
            dilation: [1; 2],
            groups: 1,
            bias: true,
        }
    }
    /// Sets a non-square kernel `[kh, kw]`.
    pub fn kernel_size(self, kernel_size: [usize; 2]) -> Self {
        Conv2dConfig { kernel_size, ..self }
    }
    /// Sets the same stride on both axes.
    pub fn stride(self, stride: usize) -> Self {
        Conv2dConfig {
            stride: [stride; 2],
            ..self
        }
    }
    /// Sets the same zero padding on both sides of both axes.
    pub fn padding(self, padding: usize) -> Self {
        Conv2dConfig {
            padding: [padding; 2],
            ..self
        }
    }
    /// Sets the same dilation on both axes.
    pub fn dilation(self, dilation: usize) -> Self {
        Conv2dConfig {
            dilation: [dilation; 2],
            ..self
        }
    }
    /// Sets the number of channel groups (`groups = in_channels` gives a depthwise convolution).
    pub fn groups(self, groups: usize) -> Self {
        Conv2dConfig { groups, ..self }
    }
    /// With or without the `[out_channels]` bias.
    pub fn bias(self, bias: bool) -> Self {
        Conv2dConfig { bias, ..self }
    }

    fn validate(&self) -> Result<()> {
        let c = self;
        if c.kernel_size.contains(&0) || c.stride.contains(&0) || c.dilation.contains(&0) {
            return Err(Error::invalid(
                "Conv2d",
                format!("kernel_size, stride and dilation must be at least 1, got {c:?}"),
            ));
        }
        if c.in_channels == 0
            || c.out_channels == 0
            || c.groups == 0
            || !c.in_channels.is_multiple_of(c.groups)
            || !c.out_channels.is_multiple_of(c.groups)
        {
            return Err(Error::invalid(
                "Conv2d",
                format!(
                    "in_channels ({}) and out_channels ({}) must be positive and divisible by groups ({})",
                    c.in_channels, c.out_channels, c.groups
                ),
            ));
        }
        Ok(())
    }
}

/// 2-D convolution over NCHW batches or single CHW images, as `torch.nn.Conv2d` with zero padding.
/// A clone shares the parameters (tensors are handles).
#[derive(Clone)]
pub struct Conv2d {
    /// `[out_channels, in_channels / groups, kh, kw]`, kaiming-uniform(a=sqrt(5)) initialised as in PyTorch.
    pub weight: Tensor,
    /// `[out_channels]`, uniform on ±1/sqrt(fan_in); `None` when the config has no bias.
    pub bias: Option<Tensor>,
    config: Conv2dConfig,
}

impl Conv2d {
    /// Weights kaiming-uniform(a=sqrt(5)) and bias uniform ±1/sqrt(fan_in), fan_in = in/groups*kh*kw.
    pub fn new(config: Conv2dConfig, device: &Device, generator: &Generator) -> Result<Conv2d> {
        config.validate()?;
        let [kh, kw] = config.kernel_size;
        let per_group = config.in_channels / config.groups;
        let fan_in = per_group * kh * kw;
        let weight =
            init::kaiming_uniform_default([config.out_channels, per_group, kh, kw], fan_in, generator, device)?;
        let bias = if config.bias {
            Some(init::bias_default(config.out_channels, fan_in, generator, device)?)
        } else {
            None
        };
        Ok(Conv2d { weight, bias, config })
    }
    /// The channels, kernel and hyper-parameters this layer was built with.
    pub fn config(&self) -> &Conv2dConfig {
        &self.config
    }
    fn options(&self) -> Conv2dOptions {
        let c = &self.config;
        Conv2dOptions {
            stride: c.stride,
            padding: c.padding,
            dilation: c.dilation,
            groups: c.groups,
        }
    }
}

impl Conv2d {
    /// The convolution followed by `act`, bias and activation in one pass over the GEMM output.
    fn forward_act(&self, x: &Tensor, act: Option<UnaryOp>) -> Result<Tensor> {
        per_image("Conv2d", x, |x| {
            if x.dims()[1] != self.config.in_channels {
                let hint = format!(
                    "input has {} channels, the layer expects in_channels={} (weight is [out, in/groups, kh, kw])",
                    x.dims()[1],
                    self.config.in_channels
                );
                return Err(Error::shape("Conv2d", x.shape(), self.weight.shape(), hint));
            }
            x.conv2d_act(&self.weight, self.bias.as_ref(), self.options(), act)
        })
    }
}

impl Module for Conv2d {
    fn map_tensors(&mut self, f: &mut dyn FnMut(&Tensor) -> Result<Tensor>) -> Result<()> {
        remap(&mut self.weight, f)?;
        remap_opt(&mut self.bias, f)
    }
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        raised_by(self.forward_act(x, None), &self.weight)
    }
    fn forward_activated(&self, x: &Tensor, act: UnaryOp) -> Option<Result<Tensor>> {
        Some(raised_by(self.forward_act(x, Some(act)), &self.weight))
    }
    fn visit_parameters(&self, prefix: &str, f: &mut dyn FnMut(String, &Tensor)) {
        f(join_name(prefix, "weight"), &self.weight);
        if let Some(b) = &self.bias {
            f(join_name(prefix, "bias"), b);
        }
    }
    /// As PyTorch's `extra_repr`: non-default padding, dilation, groups and bias are shown.
    fn describe(&self) -> String {
        let c = &self.config;
        let mut s = format!(
            "Conv2d({}, {}, kernel_size={}, stride={}",
            c.in_channels,
            c.out_channels,
            pair(c.kernel_size),
            pair(c.stride)
        );
        if c.padding != [0, 0] {
            s += &format!(", padding={}", pair(c.padding));
        }
        if c.dilation != [1, 1] {
            s += &format!(", dilation={}", pair(c.dilation));
        }
        if c.groups != 1 {
            s += &format!(", groups={}", c.groups);
        }
        if !c.bias {
            s += ", bias=False";
        }
        s + ")"
    }
}
