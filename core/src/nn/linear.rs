//! Fully connected layer: `y = x @ weight^T + bias`, weight `[out, in]` as in PyTorch.

use super::init;
use super::layer_error::raised_by;
use super::module::{Module, join_name, remap, remap_opt};
use crate::backend::UnaryOp;
use crate::device::Device;
use crate::error::{Error, Result};
use crate::rng::Generator;
use crate::tensor::Tensor;

/// Fully connected layer `y = x @ weight^T + bias` over the input's last axis, as `torch.nn.Linear`.
/// A clone shares the parameters (tensors are handles), as a checkpoint's recompute needs.
#[derive(Clone)]
pub struct Linear {
    /// `[out_features, in_features]`, kaiming-uniform(a=sqrt(5)) initialised as in PyTorch.
    pub weight: Tensor,
    /// `[out_features]`, uniform on ±1/sqrt(in_features); `None` for a layer built without bias.
    pub bias: Option<Tensor>,
}

impl Linear {
    /// An `in_features` to `out_features` layer (f32), with PyTorch's default initialisation drawn from `generator`.
    pub fn new(
        in_features: usize,
        out_features: usize,
        bias: bool,
        device: &Device,
        generator: &Generator,
    ) -> Result<Linear> {
        let weight = init::kaiming_uniform_default([out_features, in_features], in_features, generator, device)?;
        let bias = if bias {
            Some(init::bias_default(out_features, in_features, generator, device)?)
        } else {
            None
        };
        Ok(Linear { weight, bias })
    }
    /// Width of the input's last axis (`weight`'s axis 1).
    pub fn in_features(&self) -> usize {
        self.weight.dims()[1]
    }
    /// Width of the output's last axis (`weight`'s axis 0).
    pub fn out_features(&self) -> usize {
        self.weight.dims()[0]
    }
}

impl Linear {
    /// `act(x @ weight^T + bias)`, bias and activation in one pass over the product.
    pub(crate) fn forward_act(&self, x: &Tensor, act: Option<UnaryOp>) -> Result<Tensor> {
        if x.rank() < 1 || x.dims()[x.rank() - 1] != self.in_features() {
            return Err(Error::shape(
                "Linear",
                x.shape(),
                self.weight.shape(),
                format!("input's last axis must be in_features={}", self.in_features()),
            ));
        }
        // The transposed weight is a view: the GEMM reads it with swapped strides, no copy.
        // Under autocast the weight is cast before the transpose: once per region (cached, as a
        // leaf) and contiguously, instead of a strided copy at every use.
        let weight = crate::autocast::lower(&self.weight)?;
        let y = x.matmul(&weight.t()?)?;
        match (&self.bias, act) {
            (Some(b), _) => y.bias_act(b, y.rank() - 1, act),
            (None, Some(op)) => y.unary(op),
            (None, None) => Ok(y),
        }
    }
}

impl Module for Linear {
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
    fn describe(&self) -> String {
        format!(
            "Linear(in_features={}, out_features={}, bias={})",
            self.in_features(),
            self.out_features(),
            if self.bias.is_some() { "True" } else { "False" }
        )
    }
}
