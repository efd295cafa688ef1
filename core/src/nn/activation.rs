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

/// Which GELU a model applies, by PyTorch's `approximate` argument: the exact erf form
/// (`'none'`, nanoGPT's `nn.GELU()`) or the tanh approximation (`'tanh'`, transformers' GPT-2
/// "gelu_new"). Weights trained with one give slightly different outputs under the other.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum GeluApproximate {
    /// `x * Φ(x)` with the erf ([`Tensor::gelu`], one fused op).
    #[default]
    Exact,
    /// `x/2 * (1 + tanh(sqrt(2/π) (x + 0.044715 x³)))` ([`Tensor::gelu_tanh`]).
    Tanh,
}

impl GeluApproximate {
    /// `exact` or `tanh`, as a checkpoint's hyperparameters and the serde form spell it.
    pub fn name(self) -> &'static str {
        match self {
            GeluApproximate::Exact => "exact",
            GeluApproximate::Tanh => "tanh",
        }
    }
    /// The variant `name` names, if it is one.
    pub fn from_name(name: &str) -> Option<GeluApproximate> {
        [GeluApproximate::Exact, GeluApproximate::Tanh]
            .into_iter()
            .find(|g| g.name() == name)
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
