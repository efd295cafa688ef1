//! Adam and AdamW (decoupled weight decay) with PyTorch's defaults, through the fused
//! `adam_steps` backend op (one call per device for all parameters). Each parameter keeps its own
//! moments and step count, as in PyTorch.

use super::by_device::by_device;
use super::optimizer::{DecayScope, Optimizer, OptimizerState, check_parameters};
use super::state_reader::{StateReader, group_key, param_key};
use crate::backend::{AdamOperands, AdamStep};
use crate::error::{Error, Result};
use crate::tensor::Tensor;

/// Hyper-parameters of `Adam` and AdamW, with `torch.optim.Adam`'s names: start from `adam()` or
/// `adamw()` and change them with the setters.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdamConfig {
    /// Learning rate (default 1e-3).
    pub lr: f64,
    /// Decay rates (β1, β2) of the running averages of the gradient and its square
    /// (default (0.9, 0.999)).
    pub betas: (f64, f64),
    /// Added to the denominator's square root for numerical stability (default 1e-8).
    pub eps: f64,
    /// Weight decay: an L2 term on the gradient for Adam, a direct decay for AdamW (default 0,
    /// AdamW's 1e-2).
    pub weight_decay: f64,
    /// AdamW: decay the weights directly (`p *= 1 - lr*wd`) instead of adding `wd*p` to the gradient.
    pub decoupled: bool,
    /// Which parameters `weight_decay` applies to.
    pub decay_scope: DecayScope,
}

impl Default for AdamConfig {
    fn default() -> Self {
        AdamConfig::adam()
    }
}

impl AdamConfig {
    /// `torch.optim.Adam` defaults: lr 1e-3, betas (0.9, 0.999), eps 1e-8, no weight decay.
    pub fn adam() -> Self {
        AdamConfig {
            lr: 1e-3,
            betas: (0.9, 0.999),
            eps: 1e-8,
            weight_decay: 0.0,
            decoupled: false,
            decay_scope: DecayScope::All,
        }
    }
    /// `torch.optim.AdamW` defaults: as Adam, with decoupled weight decay 1e-2.
    pub fn adamw() -> Self {
        AdamConfig {
            weight_decay: 1e-2,
            decoupled: true,
            ..AdamConfig::adam()
        }
    }
    /// Sets the learning rate (non-negative).
    pub fn lr(self, lr: f64) -> Self {
        AdamConfig { lr, ..self }
    }
    /// Sets (β1, β2), each in [0, 1).
    pub fn betas(self, beta1: f64, beta2: f64) -> Self {
        AdamConfig {
            betas: (beta1, beta2),
            ..self
        }
    }
    /// Sets the stabilising `eps` (non-negative).
    pub fn eps(self, eps: f64) -> Self {
        AdamConfig { eps, ..self }
    }
    /// Sets the weight decay (non-negative), L2 or decoupled as `decoupled` says.
    pub fn weight_decay(self, weight_decay: f64) -> Self {
        AdamConfig { weight_decay, ..self }
    }
    /// Sets which parameters weight decay applies to, e.g. `DecayScope::Weights` to spare biases
    /// and norm scales.
    pub fn decay_scope(self, decay_scope: DecayScope) -> Self {
        AdamConfig { decay_scope, ..self }
    }
    fn name(&self) -> &'static str {
        if self.decoupled { "AdamW" } else { "Adam" }
    }
    /// PyTorch's checks (written so that NaN fails them too).
    fn validate(&self) -> Result<()> {
        let (b1, b2) = self.betas;
        if !(self.lr >= 0.0 && self.eps >= 0.0 && self.weight_decay >= 0.0) {
            return Err(Error::invalid(
                self.name(),
                format!("lr, eps and weight_decay must be non-negative, got {self:?}"),
            ));
        }
        if !((0.0..1.0).contains(&b1) && (0.0..1.0).contains(&b2)) {
            return Err(Error::invalid(
                self.name(),
                format!("betas must each be in [0, 1), got ({b1}, {b2})"),
            ));
        }
        Ok(())
    }
}

/// One parameter's state, created on its first update.
#[derive(Clone)]
struct Moments {
    exp_avg: Tensor,
    exp_avg_sq: Tensor,
    step: u64,
}

/// `torch.optim.Adam` and `AdamW`: a fused in-place update of every parameter with a gradient,
/// one multi-tensor call per device, each parameter keeping its own moments and step count.
pub struct Adam {
    params: Vec<Tensor>,
    config: AdamConfig,
    state: Vec<Option<Moments>>,
}

impl Adam {
    /// Adam (AdamW when `config.decoupled`) over `params`; an error for invalid hyper-parameters,
    /// no parameters, or parameters that are views or not floating point.
    pub fn new(params: Vec<Tensor>, config: AdamConfig) -> Result<Adam> {
        config.validate()?;
        check_parameters(config.name(), &params)?;
        let state = vec![None; params.len()];
        Ok(Adam { params, config, state })
    }
    /// AdamW with `config` forced to decoupled weight decay.
    pub fn adamw(params: Vec<Tensor>, config: AdamConfig) -> Result<Adam> {
        Adam::new(
            params,
            AdamConfig {
                decoupled: true,
                ..config
            },
        )
    }
    /// The hyper-parameters now, `lr` as a scheduler last set it.
    pub fn config(&self) -> &AdamConfig {
        &self.config
    }
    /// How many updates parameter `i` has had.
    pub fn step_count(&self, i: usize) -> u64 {
        self.state.get(i).and_then(Option::as_ref).map_or(0, |m| m.step)
    }

    /// Parameter `i`'s moments and step from `r`: all three or none.
    fn read_moments(&self, r: &mut StateReader, i: usize, p: &Tensor) -> Result<Option<Moments>> {
        let exp_avg = r.tensor(&param_key(i, "exp_avg"), p)?;
        let exp_avg_sq = r.tensor(&param_key(i, "exp_avg_sq"), p)?;
        let step = r.scalar(&param_key(i, "step"));
        match (exp_avg, exp_avg_sq, step) {
            (None, None, None) => Ok(None),
            (Some(exp_avg), Some(exp_avg_sq), Some(step)) if step >= 0.0 && step.fract() == 0.0 => Ok(Some(Moments {
                exp_avg,
                exp_avg_sq,
                step: step as u64,
            })),
            _ => Err(Error::invalid(
                self.config.name(),
                format!("state for parameter {i} needs exp_avg, exp_avg_sq and a whole, non-negative step together"),
            )),
        }
    }
}

impl Optimizer for Adam {
    fn name(&self) -> &'static str {
        self.config.name()
    }
    fn step(&mut self) -> Result<()> {
        let c = self.config;
        // Each parameter with a gradient: its index, the gradient (dense: the kernel reads one
        // buffer; a user-set view is copied) and its update, counted as it is prepared.
        let mut updates = Vec::new();
        for (i, (p, slot)) in self.params.iter().zip(self.state.iter_mut()).enumerate() {
            let Some(g) = p.grad() else { continue };
            let g = g.contiguous()?;
            let m = match slot {
                Some(m) => m,
                None => slot.insert(Moments {
                    exp_avg: p.detach().zeros_like()?,
                    exp_avg_sq: p.detach().zeros_like()?,
                    step: 0,
                }),
            };
            m.step += 1;
            let step = AdamStep {
                lr: c.lr,
                beta1: c.betas.0,
                beta2: c.betas.1,
                eps: c.eps,
                weight_decay: c.decay_scope.weight_decay_for(p, c.weight_decay),
                decoupled: c.decoupled,
                step: m.step,
            };
            updates.push((i, g, step));
        }
        // One multi-tensor call per device.
        let operands = updates.iter().map(|(i, g, step)| {
            let m = self.state[*i].as_ref().expect("moments were created above");
            let p = &self.params[*i];
            (
                p.device().clone(),
                AdamOperands {
                    param: p.buffer(),
                    grad: g.buffer(),
                    exp_avg: m.exp_avg.buffer(),
                    exp_avg_sq: m.exp_avg_sq.buffer(),
                    step: *step,
                },
            )
        });
        for (device, items) in by_device(operands) {
            device.backend().adam_steps(&items)?;
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
        let mut out = OptimizerState::default();
        for (i, m) in self.state.iter().enumerate() {
            let Some(m) = m else { continue };
            out.tensors.push((param_key(i, "exp_avg"), m.exp_avg.clone()));
            out.tensors.push((param_key(i, "exp_avg_sq"), m.exp_avg_sq.clone()));
            out.scalars.push((param_key(i, "step"), m.step as f64));
        }
        let c = &self.config;
        let group = [
            ("lr", c.lr),
            ("betas.0", c.betas.0),
            ("betas.1", c.betas.1),
            ("eps", c.eps),
            ("weight_decay", c.weight_decay),
        ];
        out.scalars.extend(group.iter().map(|(n, v)| (group_key(n), *v)));
        out
    }
    fn load_state(&mut self, state: &OptimizerState) -> Result<()> {
        let mut r = StateReader::new(self.config.name(), state);
        let c = self.config;
        let config = AdamConfig {
            lr: r.group_or("lr", c.lr),
            betas: (r.group_or("betas.0", c.betas.0), r.group_or("betas.1", c.betas.1)),
            eps: r.group_or("eps", c.eps),
            weight_decay: r.group_or("weight_decay", c.weight_decay),
            decoupled: c.decoupled,
            decay_scope: c.decay_scope,
        };
        config.validate()?;
        let moments = self
            .params
            .iter()
            .enumerate()
            .map(|(i, p)| self.read_moments(&mut r, i, p))
            .collect::<Result<Vec<_>>>()?;
        r.finish()?;
        self.config = config;
        self.state = moments;
        Ok(())
    }
}
