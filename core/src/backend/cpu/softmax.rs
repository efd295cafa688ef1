//! Softmax and log-softmax over the last axis of a contiguous `[rows, cols]` tensor, and the
//! softmax's gradient.

use rayon::prelude::*;

use super::elementwise::max_nan;
use super::float::CpuFloat;
use super::pool::Pool;
use super::reduce::lane_sum;

fn rowwise<T: CpuFloat>(pool: &Pool, src: &[T], cols: usize, log: bool) -> Vec<T> {
    let mut out = pool.take::<T>(src.len());
    if cols == 0 {
        return out;
    }
    let row = |(o, x): (&mut [T], &[T])| {
        // A row whose maximum is not finite (a NaN or +inf in it, or every entry -inf) is NaN
        // throughout, as PyTorch's exp(x - max) makes it; every backend says so explicitly.
        let shift = x.iter().fold(T::neg_infinity(), |m, &v| max_nan(v, m));
        if !shift.is_finite() {
            o.iter_mut().for_each(|o| *o = T::nan());
            return;
        }
        // The exponentials first, in a loop that vectorizes, then their sum in order.
        o.iter_mut()
            .zip(x)
            .for_each(|(o, &v)| *o = (v - shift).exp_nonpositive());
        let sum: T = o.iter().copied().sum();
        if log {
            let lse = shift + sum.ln();
            o.iter_mut().zip(x).for_each(|(o, &v)| *o = v - lse);
        } else {
            o.iter_mut().for_each(|o| *o = *o / sum);
        }
    };
    if src.len() >= super::elementwise::PAR_THRESHOLD {
        out.par_chunks_mut(cols).zip(src.par_chunks(cols)).for_each(row);
    } else {
        out.chunks_mut(cols).zip(src.chunks(cols)).for_each(row);
    }
    out
}

pub fn softmax<T: CpuFloat>(pool: &Pool, src: &[T], cols: usize) -> Vec<T> {
    rowwise(pool, src, cols, false)
}

pub fn log_softmax<T: CpuFloat>(pool: &Pool, src: &[T], cols: usize) -> Vec<T> {
    rowwise(pool, src, cols, true)
}

/// `out * (grad - sum(grad * out))` per row, the row's sum in f64 (`reduce::lane_sum`'s lanes).
pub fn softmax_backward<T: CpuFloat>(pool: &Pool, grad: &[T], out: &[T], cols: usize) -> Vec<T> {
    let mut dx = pool.take::<T>(out.len());
    if cols == 0 {
        return dx;
    }
    let row = |(d, (g, y)): (&mut [T], (&[T], &[T]))| {
        let wide = |v: T| crate::dtype::Element::to_f64(v);
        let dot = lane_sum(cols, |i| wide(g[i]) * wide(y[i]));
        let dot = T::of(dot);
        d.iter_mut()
            .zip(g.iter().zip(y))
            .for_each(|(d, (&g, &y))| *d = y * (g - dot));
    };
    if out.len() >= super::elementwise::PAR_THRESHOLD {
        dx.par_chunks_mut(cols)
            .zip(grad.par_chunks(cols).zip(out.par_chunks(cols)))
            .for_each(row);
    } else {
        dx.chunks_mut(cols)
            .zip(grad.chunks(cols).zip(out.chunks(cols)))
            .for_each(row);
    }
    dx
}
