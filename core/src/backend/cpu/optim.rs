//! Fused, in-place optimizer updates: one pass over each parameter, no temporaries.

use rayon::prelude::*;

use super::float::CpuFloat;
use crate::backend::{AdamStep, SgdStep};

const CHUNK: usize = 8192;

pub fn axpy<T: CpuFloat>(dst: &mut [T], src: &[T], alpha: f64) {
    let a = T::of(alpha);
    dst.par_chunks_mut(CHUNK).zip(src.par_chunks(CHUNK)).for_each(|(d, s)| d.iter_mut().zip(s).for_each(|(d, &s)| *d = *d + a * s));
}

pub fn sgd<T: CpuFloat>(param: &mut [T], grad: &[T], momentum_buf: Option<&mut [T]>, s: &SgdStep) {
    let (lr, wd, mom, damp) = (T::of(s.lr), T::of(s.weight_decay), T::of(s.momentum), T::of(1.0 - s.dampening));
    match momentum_buf {
        None => param.par_chunks_mut(CHUNK).zip(grad.par_chunks(CHUNK)).for_each(|(p, g)| {
            p.iter_mut().zip(g).for_each(|(p, &g)| *p = *p - lr * (g + wd * *p));
        }),
        Some(buf) => param.par_chunks_mut(CHUNK).zip(grad.par_chunks(CHUNK)).zip(buf.par_chunks_mut(CHUNK)).for_each(|((p, g), b)| {
            for ((p, &g), b) in p.iter_mut().zip(g).zip(b.iter_mut()) {
                let g = g + wd * *p;
                *b = if s.first_step { g } else { mom * *b + damp * g };
                let update = if s.nesterov { g + mom * *b } else { *b };
                *p = *p - lr * update;
            }
        }),
    }
}

pub fn adam<T: CpuFloat>(param: &mut [T], grad: &[T], m: &mut [T], v: &mut [T], s: &AdamStep) {
    let t = s.step as i32;
    let (b1, b2) = (T::of(s.beta1), T::of(s.beta2));
    let bias1 = 1.0 - s.beta1.powi(t);
    let bias2_sqrt = T::of((1.0 - s.beta2.powi(t)).sqrt());
    let step_size = T::of(s.lr / bias1);
    let (eps, wd, decay) = (T::of(s.eps), T::of(s.weight_decay), T::of(1.0 - s.lr * s.weight_decay));
    let one = T::one();
    param.par_chunks_mut(CHUNK).zip(grad.par_chunks(CHUNK)).zip(m.par_chunks_mut(CHUNK).zip(v.par_chunks_mut(CHUNK))).for_each(|((p, g), (m, v))| {
        for ((p, &g), (m, v)) in p.iter_mut().zip(g).zip(m.iter_mut().zip(v.iter_mut())) {
            let g = if s.decoupled {
                *p = *p * decay;
                g
            } else {
                g + wd * *p
            };
            *m = b1 * *m + (one - b1) * g;
            *v = b2 * *v + (one - b2) * g * g;
            let denom = v.sqrt() / bias2_sqrt + eps;
            *p = *p - step_size * *m / denom;
        }
    });
}
