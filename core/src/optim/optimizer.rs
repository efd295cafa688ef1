//! The optimizer contract, and the state an optimizer exports for checkpoints.

use crate::error::{Error, Result};
use crate::tensor::Tensor;

/// An optimizer's state as named tensors and scalars, with PyTorch's `state_dict` names:
/// per-parameter state under `state.{i}.…` (`state.0.momentum_buffer`, `state.0.exp_avg`,
/// `state.0.exp_avg_sq`, `state.0.step`) and hyper-parameters under `param_groups.0.…`
/// (`param_groups.0.lr`). A parameter that has not been updated yet has no `state.{i}` entries.
#[derive(Clone, Debug, Default)]
pub struct OptimizerState {
    /// Per-parameter tensors. They share storage with the optimizer, which updates them in place:
    /// serialise them before the next step if a snapshot is needed.
    pub tensors: Vec<(String, Tensor)>,
    /// Step counts and hyper-parameters (booleans as 0 or 1).
    pub scalars: Vec<(String, f64)>,
}

impl OptimizerState {
    /// The tensor named `name`, e.g. `state.0.exp_avg`, if present.
    pub fn tensor(&self, name: &str) -> Option<&Tensor> {
        self.tensors.iter().find(|(n, _)| n == name).map(|(_, t)| t)
    }
    /// The scalar named `name`, e.g. `param_groups.0.lr`, if present.
    pub fn scalar(&self, name: &str) -> Option<f64> {
        self.scalars.iter().find(|(n, _)| n == name).map(|(_, v)| *v)
    }
}

/// Which parameters weight decay applies to. PyTorch users get "weights only" with a second
/// parameter group whose `weight_decay` is 0; the ResNet and GPT recipes do exactly that for
/// biases and normalisation scales, i.e. every tensor of rank below 2.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum DecayScope {
    /// Every parameter (one parameter group, PyTorch's default).
    #[default]
    All,
    /// Matrices and kernels only (rank ≥ 2): not biases, not BatchNorm or LayerNorm scales.
    Weights,
}

impl DecayScope {
    /// The weight decay parameter `p` gets.
    pub fn weight_decay_for(self, p: &Tensor, weight_decay: f64) -> f64 {
        match self {
            DecayScope::Weights if p.rank() < 2 => 0.0,
            _ => weight_decay,
        }
    }
}

/// A `torch.optim.Optimizer` with one parameter group: updates a fixed list of parameters from
/// their gradients, in place.
pub trait Optimizer: Send {
    /// PyTorch's class name (`SGD`, `Adam`, `AdamW`), e.g. for the `lr-Adam` metric key.
    fn name(&self) -> &'static str;
    /// Applies one update to every parameter that has a gradient. The update writes the
    /// parameters' storage in place through the backend, outside autograd, so no `no_grad` is
    /// needed around it (it is needed around updates written by hand with tensor ops, and
    /// around evaluation, where it saves the graph's memory).
    fn step(&mut self) -> Result<()>;
    /// The parameters this optimizer updates, in order.
    fn parameters(&self) -> &[Tensor];
    /// The learning rate the next `step` uses (PyTorch's `param_groups[0]["lr"]`).
    fn lr(&self) -> f64;
    /// Sets the learning rate, as a scheduler does between steps.
    fn set_lr(&mut self, lr: f64);
    /// Forgets every parameter's gradient (PyTorch's `zero_grad(set_to_none=True)`).
    fn zero_grad(&self) {
        zero_grad(self.parameters());
    }
    /// The per-parameter state and hyper-parameters, for a checkpoint.
    fn state(&self) -> OptimizerState;
    /// As `state`, for optimizers whose state must be gathered (ZeRO's, from other processes):
    /// an error where it cannot be, so no checkpoint is written with part of it.
    fn try_state(&self) -> Result<OptimizerState> {
        Ok(self.state())
    }
    /// Restores what `state` exported (hyper-parameters included, as PyTorch does). Tensors are
    /// copied onto each parameter's device and dtype. Nothing changes unless all of it is valid.
    fn load_state(&mut self, state: &OptimizerState) -> Result<()>;
}

/// A boxed optimizer is an optimizer (the Trainer's setup holds one so).
impl Optimizer for Box<dyn Optimizer> {
    fn name(&self) -> &'static str {
        self.as_ref().name()
    }
    fn step(&mut self) -> Result<()> {
        self.as_mut().step()
    }
    fn parameters(&self) -> &[Tensor] {
        self.as_ref().parameters()
    }
    fn lr(&self) -> f64 {
        self.as_ref().lr()
    }
    fn set_lr(&mut self, lr: f64) {
        self.as_mut().set_lr(lr)
    }
    fn zero_grad(&self) {
        self.as_ref().zero_grad()
    }
    fn state(&self) -> OptimizerState {
        self.as_ref().state()
    }
    fn try_state(&self) -> Result<OptimizerState> {
        self.as_ref().try_state()
    }
    fn load_state(&mut self, state: &OptimizerState) -> Result<()> {
        self.as_mut().load_state(state)
    }
}

/// Forgets the gradients of `params`.
pub fn zero_grad(params: &[Tensor]) {
    params.iter().for_each(Tensor::zero_grad);
}

/// The fused update kernels write whole buffers in place: each parameter must be a float tensor
/// that owns its storage densely (not a view into a larger buffer).
pub(super) fn check_parameters(op: &'static str, params: &[Tensor]) -> Result<()> {
    // PyTorch refuses too: an optimizer over nothing trains nothing, silently.
    if params.is_empty() {
        return Err(Error::invalid(
            op,
            "got an empty parameter list: the model shows no parameters (a hand-written Module must visit them in visit_parameters; #[derive(Module)] does)",
        ));
    }
    for (i, p) in params.iter().enumerate() {
        if !p.dtype().is_float() {
            return Err(Error::invalid(
                op,
                format!(
                    "parameter {i} has dtype {}; parameters must be floating point",
                    p.dtype()
                ),
            ));
        }
        let dense = p.is_contiguous() && p.layout().offset == 0 && p.buffer().len() == p.elem_count();
        if !dense {
            return Err(Error::invalid(
                op,
                format!(
                    "parameter {i} (shape {}) is a view into a larger buffer; optimizers update whole buffers, so pass tensors that own their storage",
                    p.shape()
                ),
            ));
        }
    }
    Ok(())
}
