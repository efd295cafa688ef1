//! Fused, in-place optimizer updates: one pass over each parameter, no temporaries. The loops
//! index equal-length slices so the compiler drops bounds checks and vectorises them.

use rayon::prelude::*;

use super::float::CpuFloat;
use crate::backend::{AdamStep, SgdStep};

const CHUNK: usize = 16384;

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
    let (lr, wd, mom, damp) = (
        T::of(s.lr),
        T::of(s.weight_decay),
        T::of(s.momentum),
        T::of(1.0 - s.dampening),
    );
    let (first_step, nesterov) = (s.first_step, s.nesterov);
    match momentum_buf {
        None => param
            .par_chunks_mut(CHUNK)
            .zip(grad.par_chunks(CHUNK))
            .for_each(move |(p, g)| {
                let g = &g[..p.len()];
                for i in 0..p.len() {
                    p[i] = p[i] - lr * (g[i] + wd * p[i]);
                }
            }),
        Some(buf) => param
            .par_chunks_mut(CHUNK)
            .zip(grad.par_chunks(CHUNK))
            .zip(buf.par_chunks_mut(CHUNK))
            .for_each(move |((p, g), b)| {
                let (g, b) = (&g[..p.len()], &mut b[..p.len()]);
                // With momentum 0 the first step's buffer is g; a zero buffer with (mom=0,
                // damp=1) gives the same, so the first step is `b = g` written as below.
                let (keep, take) = if first_step { (T::zero(), T::one()) } else { (mom, damp) };
                for i in 0..p.len() {
                    let d = g[i] + wd * p[i];
                    b[i] = keep * b[i] + take * d;
                    let update = if nesterov { d + mom * b[i] } else { b[i] };
                    p[i] = p[i] - lr * update;
                }
            }),
    }
}

pub fn adam<T: CpuFloat>(param: &mut [T], grad: &[T], m: &mut [T], v: &mut [T], s: &AdamStep) {
    let t = s.step as i32;
    let (b1, b2) = (T::of(s.beta1), T::of(s.beta2));
    let (one_b1, one_b2) = (T::of(1.0 - s.beta1), T::of(1.0 - s.beta2));
    let bias2_sqrt = T::of((1.0 - s.beta2.powi(t)).sqrt());
    let step_size = T::of(s.lr / (1.0 - s.beta1.powi(t)));
    let (eps, wd) = (T::of(s.eps), T::of(s.weight_decay));
    // AdamW decays the weight itself; Adam adds the decay to the gradient (L2).
    let (decay, l2) = if s.decoupled {
        (T::of(1.0 - s.lr * s.weight_decay), T::zero())
    } else {
        (T::one(), wd)
    };
    param
        .par_chunks_mut(CHUNK)
        .zip(grad.par_chunks(CHUNK))
        .zip(m.par_chunks_mut(CHUNK).zip(v.par_chunks_mut(CHUNK)))
        .for_each(move |((p, g), (m, v))| {
            let n = p.len();
            let (g, m, v) = (&g[..n], &mut m[..n], &mut v[..n]);
            for i in 0..n {
                let pi = p[i] * decay;
                let gi = g[i] + l2 * pi;
                m[i] = b1 * m[i] + one_b1 * gi;
                v[i] = b2 * v[i] + one_b2 * gi * gi;
                p[i] = pi - step_size * m[i] / (v[i].sqrt() / bias2_sqrt + eps);
            }
        });
}
