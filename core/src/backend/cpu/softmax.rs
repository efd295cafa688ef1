//! Softmax and log-softmax over the last axis of a contiguous `[rows, cols]` tensor.

use rayon::prelude::*;

use super::elementwise::max_nan;
use super::float::CpuFloat;
use super::pool::Pool;

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
        let sum: T = x.iter().map(|&v| (v - shift).exp()).sum();
        if log {
            let lse = shift + sum.ln();
            o.iter_mut().zip(x).for_each(|(o, &v)| *o = v - lse);
        } else {
            o.iter_mut().zip(x).for_each(|(o, &v)| *o = (v - shift).exp() / sum);
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
