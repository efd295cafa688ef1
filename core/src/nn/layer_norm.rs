//! Layer normalisation over the last axis, with PyTorch's parameters (`weight` 1, `bias` 0) and
//! default eps 1e-5.

use super::Module;
use crate::device::Device;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::tensor::Tensor;

/// Normalises over the last axis, then scales and shifts, as `torch.nn.LayerNorm(features)`.
/// A clone shares the parameters (tensors are handles).
#[derive(Module, Clone)]
pub struct LayerNorm {
    /// Per-feature scale `[features]`, initialised to 1.
    pub weight: Tensor,
    /// Per-feature shift `[features]`, initialised to 0.
    pub bias: Tensor,
    /// Added to the (biased) variance before the square root (default 1e-5).
    #[module(skip)]
    pub eps: f64,
}

impl LayerNorm {
    /// Over a last axis of `features`, with eps 1e-5.
    pub fn new(features: usize, device: &Device) -> Result<LayerNorm> {
        if features == 0 {
            return Err(Error::invalid("LayerNorm", "needs at least one feature to normalise"));
        }
        Ok(LayerNorm {
            weight: Tensor::ones([features], DType::F32, device)?.requires_grad(true),
            bias: Tensor::zeros([features], DType::F32, device)?.requires_grad(true),
            eps: 1e-5,
        })
    }
    /// `[..., features]` to the same shape, normalised over the last axis.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        x.layer_norm(Some(&self.weight), Some(&self.bias), self.eps)
    }
}
