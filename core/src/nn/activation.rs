//! Parameter-free activation modules.

use super::module::Module;
use crate::backend::UnaryOp;
use crate::error::Result;
use crate::tensor::Tensor;

/// `max(x, 0)` elementwise, as `torch.nn.ReLU`; inside a `Sequential` it is fused into a preceding Linear or Conv2d.
#[derive(Clone, Copy, Debug, Default)]
pub struct Relu;

impl Module for Relu {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        x.relu()
    }
    fn describe(&self) -> String {
        "ReLU()".into()
    }
    fn activation(&self) -> Option<UnaryOp> {
        Some(UnaryOp::Relu)
    }
}

/// GELU with the exact erf form, PyTorch's `nn.GELU(approximate='none')`.
#[derive(Clone, Copy, Debug, Default)]
pub struct Gelu;

impl Module for Gelu {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        x.gelu()
    }
    fn describe(&self) -> String {
        "GELU(approximate='none')".into()
    }
    fn activation(&self) -> Option<UnaryOp> {
        Some(UnaryOp::Gelu)
    }
}
