//! Cases for the in-place optimizer updates `axpy`, `sgd_step` and `adam_step` (f32 parameters),
//! with oracles that spell out PyTorch's update rules in f64.

use crate::backend::{AdamStep, SgdStep};
use crate::conformance::case::{Case, Input, Values};
use crate::conformance::host::HostTensor;
use crate::dtype::DType;

pub(super) fn u() -> Values {
    Values::Uniform { low: -2.0, high: 2.0 }
}

/// Optimizer steps are documented for f32 state; f64 is the reference.
pub(super) const DTYPES: &[DType] = &[DType::F32, DType::F64];

/// PyTorch's SGD: `g = grad + wd*p`; `buf = g` on the first step else
/// `buf = momentum*buf + (1-dampening)*g`; `g = nesterov ? g + momentum*buf : buf`; `p -= lr*g`.
pub(super) fn sgd_ref(p: &HostTensor, g: &HostTensor, buf: Option<&HostTensor>, s: SgdStep) -> Vec<HostTensor> {
    let mut p = p.clone();
    let mut buf = buf.cloned();
    for i in 0..p.len() {
        let mut d = g.values[i] + s.weight_decay * p.values[i];
        if let Some(b) = buf.as_mut() {
            b.values[i] = if s.first_step {
                d
            } else {
                s.momentum * b.values[i] + (1.0 - s.dampening) * d
            };
            d = if s.nesterov {
                d + s.momentum * b.values[i]
            } else {
                b.values[i]
            };
        }
        p.values[i] -= s.lr * d;
    }
    let mut out = vec![p];
    out.extend(buf);
    out
}

/// PyTorch's Adam/AdamW (step counted from 1): L2 decay adds `wd*p` to the gradient, decoupled
/// decay multiplies `p` by `1 - lr*wd`; `m = b1*m + (1-b1)*g`; `v = b2*v + (1-b2)*g^2`;
/// `p -= lr/(1-b1^t) * m / (sqrt(v)/sqrt(1-b2^t) + eps)`.
pub(super) fn adam_ref(x: &[HostTensor], s: AdamStep) -> Vec<HostTensor> {
    let (mut p, g, mut m, mut v) = (x[0].clone(), &x[1], x[2].clone(), x[3].clone());
    let t = s.step as i32;
    for i in 0..p.len() {
        let mut grad = g.values[i];
        if s.decoupled {
            p.values[i] *= 1.0 - s.lr * s.weight_decay;
        } else {
            grad += s.weight_decay * p.values[i];
        }
        m.values[i] = s.beta1 * m.values[i] + (1.0 - s.beta1) * grad;
        v.values[i] = s.beta2 * v.values[i] + (1.0 - s.beta2) * grad * grad;
        let m_hat = m.values[i] / (1.0 - s.beta1.powi(t));
        let denom = v.values[i].sqrt() / (1.0 - s.beta2.powi(t)).sqrt() + s.eps;
        p.values[i] -= s.lr * m_hat / denom;
    }
    vec![p, m, v]
}

fn sgd_cases() -> Vec<Case> {
    let step = |lr, momentum, dampening, weight_decay, nesterov, first_step| SgdStep {
        lr,
        momentum,
        dampening,
        weight_decay,
        nesterov,
        first_step,
    };
    let steps = [
        ("plain", step(0.1, 0.0, 0.0, 0.01, false, true), false),
        ("momentum_first", step(0.05, 0.9, 0.0, 0.0, false, true), true),
        ("momentum_dampening", step(0.05, 0.9, 0.3, 0.02, false, false), true),
        ("nesterov", step(0.2, 0.8, 0.0, 0.01, true, false), true),
    ];
    steps
        .into_iter()
        .map(|(label, s, momentum)| {
            let mut case = Case::new(format!("sgd_step/{label}"), &["sgd_step"], move |ctx, x| {
                let buf = momentum.then(|| x[2].buffer());
                ctx.device.backend().sgd_step(x[0].buffer(), x[1].buffer(), buf, &s)?;
                Ok(x.iter()
                    .enumerate()
                    .filter(|&(i, _)| i != 1)
                    .map(|(_, t)| t.clone())
                    .collect())
            })
            .input(Input::float("param", [7, 13], u()))
            .input(Input::float("grad", [7, 13], u()));
            if momentum {
                case = case.input(Input::float("momentum_buf", [7, 13], u()));
            }
            case.forward_only()
                .dtypes(DTYPES)
                .oracle(move |x| sgd_ref(&x[0], &x[1], x.get(2), s))
        })
        .collect()
}

fn adam_cases() -> Vec<Case> {
    let step = |lr, weight_decay, decoupled, t| AdamStep {
        lr,
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-8,
        weight_decay,
        decoupled,
        step: t,
    };
    let steps = [
        ("first", step(1e-2, 0.0, false, 1), true),
        ("l2_step7", step(1e-2, 0.05, false, 7), false),
        ("adamw_step3", step(3e-3, 0.1, true, 3), false),
    ];
    steps
        .into_iter()
        .map(|(label, s, zero_state)| {
            // The first step starts from zero moments, later ones from some history.
            let (m, v) = if zero_state {
                (Values::Given(vec![0.0; 91]), Values::Given(vec![0.0; 91]))
            } else {
                (
                    Values::Uniform { low: -0.5, high: 0.5 },
                    Values::Uniform { low: 0.01, high: 1.0 },
                )
            };
            Case::new(format!("adam_step/{label}"), &["adam_step"], move |ctx, x| {
                ctx.device
                    .backend()
                    .adam_step(x[0].buffer(), x[1].buffer(), x[2].buffer(), x[3].buffer(), &s)?;
                Ok(vec![x[0].clone(), x[2].clone(), x[3].clone()])
            })
            .input(Input::float("param", [7, 13], u()))
            .input(Input::float("grad", [7, 13], u()))
            .input(Input::float("exp_avg", [7, 13], m))
            .input(Input::float("exp_avg_sq", [7, 13], v))
            .forward_only()
            .dtypes(DTYPES)
            .oracle(move |x| adam_ref(x, s))
        })
        .collect()
}

fn axpy_case() -> Case {
    Case::new("axpy", &["axpy"], |ctx, x| {
        ctx.device.backend().axpy(x[0].buffer(), x[1].buffer(), -0.75)?;
        Ok(vec![x[0].clone()])
    })
    .input(Input::float("dst", [7, 13], u()))
    .input(Input::float("src", [7, 13], u()))
    .forward_only()
    .dtypes(DTYPES)
    .oracle(|x| vec![x[0].zip(&x[1], |d, s| d - 0.75 * s)])
}

pub fn cases() -> Vec<Case> {
    let mut all = sgd_cases();
    all.extend(adam_cases());
    all.push(axpy_case());
    all
}
