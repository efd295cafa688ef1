//! Max and average pooling layers (no parameters).

use super::module::Module;
use super::spatial::{pair_or_int, per_image};
use crate::error::{Error, Result};
use crate::tensor::{Pool2dOptions, Tensor};

/// Rejects a zero kernel or stride, and padding over half the kernel (PyTorch's rule), up front.
fn checked(layer: &'static str, options: Pool2dOptions) -> Result<Pool2dOptions> {
    if options.kernel.contains(&0) || options.stride.contains(&0) {
        return Err(Error::invalid(
            layer,
            format!("kernel and stride must be at least 1, got {options:?}"),
        ));
    }
    if options.padding[0] * 2 > options.kernel[0] || options.padding[1] * 2 > options.kernel[1] {
        return Err(Error::invalid(
            layer,
            format!("padding must be at most half the kernel size, got {options:?}"),
        ));
    }
    Ok(options)
}

/// `MaxPool2d(kernel_size)`: stride equal to the kernel, no padding, dilation 1.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MaxPool2d {
    options: Pool2dOptions,
}

impl MaxPool2d {
    /// A square `kernel` window with stride `kernel` and no padding, as `torch.nn.MaxPool2d(kernel)`.
    pub fn new(kernel: usize) -> Result<Self> {
        MaxPool2d::with_options(Pool2dOptions::new(kernel))
    }
    /// Explicit kernel, stride and `-inf` padding; errors on a zero kernel or stride, or padding over half the kernel.
    pub fn with_options(options: Pool2dOptions) -> Result<Self> {
        Ok(MaxPool2d {
            options: checked("MaxPool2d", options)?,
        })
    }
    /// The kernel, stride and padding in use.
    pub fn options(&self) -> Pool2dOptions {
        self.options
    }
}

impl Module for MaxPool2d {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        per_image("MaxPool2d", x, |x| x.max_pool2d(self.options))
    }
    fn describe(&self) -> String {
        let o = &self.options;
        format!(
            "MaxPool2d(kernel_size={}, stride={}, padding={}, dilation=1, ceil_mode=False)",
            pair_or_int(o.kernel),
            pair_or_int(o.stride),
            pair_or_int(o.padding)
        )
    }
}

/// `AvgPool2d(kernel_size)`: stride equal to the kernel; padding counts as zeros in the average.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AvgPool2d {
    options: Pool2dOptions,
}

impl AvgPool2d {
    /// A square `kernel` window with stride `kernel` and no padding, as `torch.nn.AvgPool2d(kernel)`.
    pub fn new(kernel: usize) -> Result<Self> {
        AvgPool2d::with_options(Pool2dOptions::new(kernel))
    }
    /// Explicit kernel, stride and zero padding; errors on a zero kernel or stride, or padding over half the kernel.
    pub fn with_options(options: Pool2dOptions) -> Result<Self> {
        Ok(AvgPool2d {
            options: checked("AvgPool2d", options)?,
        })
    }
    /// The kernel, stride and padding in use.
    pub fn options(&self) -> Pool2dOptions {
        self.options
    }
}

impl Module for AvgPool2d {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        per_image("AvgPool2d", x, |x| x.avg_pool2d(self.options))
    }
    fn describe(&self) -> String {
        let o = &self.options;
        format!(
            "AvgPool2d(kernel_size={}, stride={}, padding={})",
            pair_or_int(o.kernel),
            pair_or_int(o.stride),
            pair_or_int(o.padding)
        )
    }
}

/// `AdaptiveAvgPool2d(output_size)`: averages each plane to `output_size` whatever the input's
/// size (ResNet's `avgpool`, `(1, 1)`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AdaptiveAvgPool2d {
    output: [usize; 2],
}

impl AdaptiveAvgPool2d {
    /// Averages each plane down to `output` `[h, w]` (both at least 1), as `torch.nn.AdaptiveAvgPool2d((h, w))`.
    pub fn new(output: [usize; 2]) -> Result<Self> {
        if output.contains(&0) {
            return Err(Error::invalid(
                "AdaptiveAvgPool2d",
                format!("output size must be at least 1, got {output:?}"),
            ));
        }
        Ok(AdaptiveAvgPool2d { output })
    }
    /// The `[h, w]` each plane is averaged down to.
    pub fn output_size(&self) -> [usize; 2] {
        self.output
    }
}

impl Module for AdaptiveAvgPool2d {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        per_image("AdaptiveAvgPool2d", x, |x| x.adaptive_avg_pool2d(self.output))
    }
    fn describe(&self) -> String {
        format!(
            "AdaptiveAvgPool2d(output_size=({}, {}))",
            self.output[0], self.output[1]
        )
    }
}
