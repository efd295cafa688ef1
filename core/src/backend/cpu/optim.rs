//! Fused, in-place optimizer updates: one pass over each parameter, no temporaries. The loops
//! index equal-length slices so the compiler drops bounds checks and vectorises them.

use rayon::prelude::*;

use super::float::CpuFloat;
use crate::backend::{AdamStep, SgdStep};

/// Elements per parallel task, also in the multi-tensor updates.
pub const CHUNK: usize = 16384;

// The loop closures below are `move`: captured by reference, the per-step constants are reloaded
// on every element (LLVM cannot prove the writes leave them alone) and the loops stay scalar.
// By value they vectorise: the SGD step of the 784-512-512-10 MLP went from 0.55 to 0.19 ms.

pub fn axpy<T: CpuFloat>(dst: &mut [T], src: &[T], alpha: f64) {
    let a = T::of(alpha);
    dst.par_chunks_mut(CHUNK)
        .zip(src.par_chunks(CHUNK))
        .for_each(move |(d, s)| {
            let s = &s[..d.len()];
            for i in 0..d.len() {
                d[i] = d[i] + a * s[i];
            }
        });
}

pub fn sgd<T: CpuFloat>(param: &mut [T], grad: &[T], momentum_buf: Option<&mut [T]>, s: &SgdStep) {
    let k = SgdConsts::new(s);
    match momentum_buf {
        None => param
            .par_chunks_mut(CHUNK)
            .zip(grad.par_chunks(CHUNK))
            .for_each(move |(p, g)| k.apply(p, g, None)),
        Some(buf) => param
            .par_chunks_mut(CHUNK)
            .zip(grad.par_chunks(CHUNK))
            .zip(buf.par_chunks_mut(CHUNK))
            .for_each(move |((p, g), b)| k.apply(p, g, Some(b))),
    }
}

/// One SGD update's constants in the parameter's type, so a chunk of it can run anywhere.
#[derive(Clone, Copy)]
pub struct SgdConsts<T> {
    lr: T,
    wd: T,
    mom: T,
    damp: T,
    first_step: bool,
    nesterov: bool,
}

impl<T: CpuFloat> SgdConsts<T> {
    pub fn new(s: &SgdStep) -> Self {
        SgdConsts {
            lr: T::of(s.lr),
            wd: T::of(s.weight_decay),
            mom: T::of(s.momentum),
            damp: T::of(1.0 - s.dampening),
            first_step: s.first_step,
            nesterov: s.nesterov,
        }
    }

    /// The update of one chunk (`grad` and `buf` at least as long as `param`).
    #[inline(always)]
    pub fn apply(self, p: &mut [T], g: &[T], buf: Option<&mut [T]>) {
        let SgdConsts {
            lr,
            wd,
            mom,
            damp,
            first_step,
            nesterov,
        } = self;
        let g = &g[..p.len()];
        match buf {
            None => {
                for i in 0..p.len() {
                    p[i] = p[i] - lr * (g[i] + wd * p[i]);
                }
            }
            Some(b) => {
                let b = &mut b[..p.len()];
                // With momentum 0 the first step's buffer is g; a zero buffer with (mom=0,
                // damp=1) gives the same, so the first step is `b = g` written as below.
                let (keep, take) = if first_step { (T::zero(), T::one()) } else { (mom, damp) };
                for i in 0..p.len() {
                    let d = g[i] + wd * p[i];
                    b[i] = keep * b[i] + take * d;
                    let update = if nesterov { d + mom * b[i] } else { b[i] };
                    p[i] = p[i] - lr * update;
                }
            }
        }
    }
}

pub fn adam<T: CpuFloat>(param: &mut [T], grad: &[T], m: &mut [T], v: &mut [T], s: &AdamStep) {
    let k = AdamConsts::new(s);
    param
        .par_chunks_mut(CHUNK)
        .zip(grad.par_chunks(CHUNK))
        .zip(m.par_chunks_mut(CHUNK).zip(v.par_chunks_mut(CHUNK)))
        .for_each(move |((p, g), (m, v))| k.apply(p, g, m, v));
}

/// One Adam update's constants in the parameter's type (folded in f64 first), so a chunk of it
/// can run anywhere.
#[derive(Clone, Copy)]
pub struct AdamConsts<T> {
    b1: T,
    b2: T,
    one_b1: T,
    one_b2: T,
    bias2_sqrt: T,
    step_size: T,
    eps: T,
    decay: T,
    l2: T,
}

impl<T: CpuFloat> AdamConsts<T> {
    pub fn new(s: &AdamStep) -> Self {
        let c = s.constants();
        AdamConsts {
            b1: T::of(c.beta1),
            b2: T::of(c.beta2),
            one_b1: T::of(c.one_minus_beta1),
            one_b2: T::of(c.one_minus_beta2),
            bias2_sqrt: T::of(c.bias2_sqrt),
            step_size: T::of(c.step_size),
            eps: T::of(c.eps),
            decay: T::of(c.decay),
            l2: T::of(c.l2),
        }
    }

    /// The update of one chunk (`g`, `m` and `v` at least as long as `p`).
    #[inline(always)]
    pub fn apply(self, p: &mut [T], g: &[T], m: &mut [T], v: &mut [T]) {
        let AdamConsts {
            b1,
            b2,
            one_b1,
            one_b2,
            bias2_sqrt,
            step_size,
            eps,
            decay,
            l2,
        } = self;
        let n = p.len();
        let (g, m, v) = (&g[..n], &mut m[..n], &mut v[..n]);
        for i in 0..n {
            let pi = p[i] * decay;
            let gi = g[i] + l2 * pi;
            m[i] = b1 * m[i] + one_b1 * gi;
            v[i] = b2 * v[i] + one_b2 * gi * gi;
            p[i] = pi - step_size * m[i] / (v[i].sqrt() / bias2_sqrt + eps);
        }
    }
}
