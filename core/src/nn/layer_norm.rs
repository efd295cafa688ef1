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
    /// `forward` for a LayerNorm whose output only feeds matrix products (a transformer
    /// block's, before its attention, its MLP or the head): under autocast the output comes in
    /// the region's dtype, the bits of `forward` then the product's cast of its input, in one
    /// pass over the activation where the backend fuses them (on a device whose fusion has
    /// checked itself: `LOCKSTEP_AUTOCAST_FUSIONS`). Elsewhere, `forward`.
    pub fn forward_for_product(&self, x: &Tensor) -> Result<Tensor> {
        match self.product_dtype(x) {
            Some(dtype) => x.layer_norm_to(Some(&self.weight), Some(&self.bias), self.eps, dtype),
            None => self.forward(x),
        }
    }

    /// `residual + branch` and `forward_for_product` of that sum, `(sum, normed)`: a pre-norm
    /// block's residual add and the LayerNorm that reads it, in one pass over the activation
    /// where the backend fuses them (`Tensor::add_layer_norm`), with the same bits.
    pub fn add_forward_for_product(&self, residual: &Tensor, branch: &Tensor) -> Result<(Tensor, Tensor)> {
        let out = self.product_dtype(residual);
        residual.add_layer_norm(branch, Some(&self.weight), Some(&self.bias), self.eps, out)
    }

    /// The dtype `forward_for_product` rounds its output to; None where it is `forward`.
    fn product_dtype(&self, x: &Tensor) -> Option<DType> {
        // Autocast lowers f32 product inputs only: an f64 LayerNorm's output stays f64.
        crate::autocast::product_input_dtype(x.device())
            .filter(|_| self.weight.dtype() == DType::F32 && x.dtype() != DType::F64)
    }
}
