//! Stochastic gradient descent with momentum, dampening, Nesterov and weight decay (PyTorch's SGD).

use super::by_device::by_device;
use super::optimizer::{DecayScope, Optimizer, OptimizerState, check_parameters};
use super::state_reader::{StateReader, group_key, param_key};
use crate::backend::{SgdOperands, SgdStep};
use crate::error::{Error, Result};
use crate::tensor::Tensor;

/// Hyper-parameters of `Sgd`, with `torch.optim.SGD`'s names and defaults: start from
/// `SgdConfig::new(lr)` and change them with the setters.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SgdConfig {
    /// Learning rate: the factor on the (momentum-smoothed) gradient in each update; non-negative.
    pub lr: f64,
    /// Momentum factor (default 0: plain SGD, with no momentum buffers).
    pub momentum: f64,
    /// Dampening of momentum: new gradients enter the buffer times `1 - dampening` (default 0).
    pub dampening: f64,
    /// L2 penalty, added to the gradient as `weight_decay * p` (default 0).
    pub weight_decay: f64,
    /// Nesterov momentum; needs a momentum and zero dampening (default false).
    pub nesterov: bool,
    /// Which parameters `weight_decay` applies to.
    pub decay_scope: DecayScope,
}

impl SgdConfig {
    /// `lr` with PyTorch's defaults for the rest: no momentum, dampening, weight decay or Nesterov.
    pub fn new(lr: f64) -> Self {
        SgdConfig {
            lr,
            momentum: 0.0,
            dampening: 0.0,
            weight_decay: 0.0,
            nesterov: false,
            decay_scope: DecayScope::All,
        }
    }
    /// Sets the momentum factor (non-negative).
    pub fn momentum(self, momentum: f64) -> Self {
        SgdConfig { momentum, ..self }
    }
    /// Sets the L2 weight decay (non-negative).
    pub fn weight_decay(self, weight_decay: f64) -> Self {
        SgdConfig { weight_decay, ..self }
    }
    /// Turns Nesterov momentum on or off; on needs a momentum and zero dampening.
    pub fn nesterov(self, nesterov: bool) -> Self {
        SgdConfig { nesterov, ..self }
    }
    /// Sets which parameters weight decay applies to (`DecayScope::Weights` spares biases and norm
    /// scales).
    pub fn decay_scope(self, decay_scope: DecayScope) -> Self {
        SgdConfig { decay_scope, ..self }
    }
    /// Sets the momentum dampening (zero for Nesterov).
    pub fn dampening(self, dampening: f64) -> Self {
        SgdConfig { dampening, ..self }
    }
    /// PyTorch's checks (written so that NaN fails them too).
    fn validate(&self) -> Result<()> {
        let c = self;
        if !(c.lr >= 0.0 && c.momentum >= 0.0 && c.weight_decay >= 0.0 && c.dampening.is_finite()) {
            return Err(Error::invalid(
                "SGD",
                format!("lr, momentum and weight_decay must be non-negative, got {c:?}"),
            ));
        }
        if c.nesterov && (c.momentum <= 0.0 || c.dampening != 0.0) {
            return Err(Error::invalid(
                "SGD",
                "Nesterov momentum requires a momentum and zero dampening",
            ));
        }
        Ok(())
    }
}

/// `torch.optim.SGD`: a fused in-place update of every parameter with a gradient, one
/// multi-tensor call per device, with momentum buffers created on a parameter's first update.
pub struct Sgd {
    params: Vec<Tensor>,
    config: SgdConfig,
    /// Momentum buffers, created on a parameter's first update.
    momentum: Vec<Option<Tensor>>,
}

impl Sgd {
    /// SGD over `params`; an error for invalid hyper-parameters, no parameters, or parameters that
    /// are views or not floating point.
    pub fn new(params: Vec<Tensor>, config: SgdConfig) -> Result<Sgd> {
        config.validate()?;
        check_parameters("SGD", &params)?;
        let momentum = vec![None; params.len()];
        Ok(Sgd {
            params,
            config,
            momentum,
        })
    }
    /// The hyper-parameters now, `lr` as a scheduler last set it.
    pub fn config(&self) -> &SgdConfig {
        &self.config
    }
    /// The momentum buffer of parameter `i`, once it exists.
    pub fn momentum_buffer(&self, i: usize) -> Option<&Tensor> {
        self.momentum.get(i).and_then(Option::as_ref)
    }
}

impl Optimizer for Sgd {
    fn name(&self) -> &'static str {
        "SGD"
    }
    fn step(&mut self) -> Result<()> {
        let c = self.config;
        // Each parameter with a gradient: its index, the gradient (dense: the kernel reads one
        // buffer; a user-set view is copied) and its update.
        let mut updates = Vec::new();
        for (i, (p, slot)) in self.params.iter().zip(self.momentum.iter_mut()).enumerate() {
            let Some(g) = p.grad() else { continue };
            let g = g.contiguous()?;
            let first_step = c.momentum != 0.0 && slot.is_none();
            if first_step {
                *slot = Some(p.detach().zeros_like()?);
            }
            let step = SgdStep {
                lr: c.lr,
                momentum: c.momentum,
                dampening: c.dampening,
                weight_decay: c.decay_scope.weight_decay_for(p, c.weight_decay),
                nesterov: c.nesterov,
                first_step,
            };
            updates.push((i, g, step));
        }
        // One multi-tensor call per device.
        let operands = updates.iter().map(|(i, g, step)| {
            let p = &self.params[*i];
            let momentum_buf = if c.momentum != 0.0 {
                self.momentum[*i].as_ref().map(Tensor::buffer)
            } else {
                None
            };
            (
                p.device().clone(),
                SgdOperands {
                    param: p.buffer(),
                    grad: g.buffer(),
                    momentum_buf,
                    step: *step,
                },
            )
        });
        for (device, items) in by_device(operands) {
            device.backend().sgd_steps(&items)?;
        }
        Ok(())
    }
    fn parameters(&self) -> &[Tensor] {
        &self.params
    }
    fn lr(&self) -> f64 {
        self.config.lr
    }
    fn set_lr(&mut self, lr: f64) {
        self.config.lr = lr;
    }
    fn state(&self) -> OptimizerState {
        let c = &self.config;
        let tensors = self
            .momentum
            .iter()
            .enumerate()
            .filter_map(|(i, b)| Some((param_key(i, "momentum_buffer"), b.clone()?)))
            .collect();
        let group = [
            ("lr", c.lr),
            ("momentum", c.momentum),
            ("dampening", c.dampening),
            ("weight_decay", c.weight_decay),
            ("nesterov", f64::from(u8::from(c.nesterov))),
        ];
        OptimizerState {
            tensors,
            scalars: group.iter().map(|(n, v)| (group_key(n), *v)).collect(),
        }
    }
    fn load_state(&mut self, state: &OptimizerState) -> Result<()> {
        let mut r = StateReader::new("SGD", state);
        let c = self.config;
        let config = SgdConfig {
            lr: r.group_or("lr", c.lr),
            momentum: r.group_or("momentum", c.momentum),
            dampening: r.group_or("dampening", c.dampening),
            weight_decay: r.group_or("weight_decay", c.weight_decay),
            nesterov: r.group_or("nesterov", f64::from(u8::from(c.nesterov))) != 0.0,
            decay_scope: c.decay_scope,
        };
        config.validate()?;
        let momentum = self
            .params
            .iter()
            .enumerate()
            .map(|(i, p)| r.tensor(&param_key(i, "momentum_buffer"), p))
            .collect::<Result<Vec<_>>>()?;
        r.finish()?;
        self.config = config;
        self.momentum = momentum;
        Ok(())
    }
}
