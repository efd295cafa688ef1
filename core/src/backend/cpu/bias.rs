//! bias_act: a layer's bias and activation in one call. The GPU backends fuse them into one
//! pass; the reference adds the bias, then applies the activation with the unary kernel.

use rayon::prelude::*;

use super::elementwise::{self, PAR_THRESHOLD};
use super::float::CpuFloat;
use super::pool::Pool;
use crate::backend::UnaryOp;
use crate::shape::Layout;

pub fn bias_act<T: CpuFloat>(
    pool: &Pool,
    src: &[T],
    bias: &[T],
    channels: usize,
    inner: usize,
    act: Option<UnaryOp>,
) -> Vec<T> {
    // From the pool: a fresh zeroed vector per call made the kernel fault in new pages on
    // every layer of every step.
    let mut pre = pool.take::<T>(src.len());
    // Row by row ([channels, inner] each), so the loops index slices and vectorise: no
    // division per element to find its channel.
    let add_row = |(out, x): (&mut [T], &[T])| {
        if inner == 1 {
            for ((o, &x), &b) in out.iter_mut().zip(x).zip(bias) {
                *o = x + b;
            }
        } else {
            for ((out, x), &b) in out.chunks_mut(inner).zip(x.chunks(inner)).zip(bias) {
                for (o, &x) in out.iter_mut().zip(x) {
                    *o = x + b;
                }
            }
        }
    };
    let row = (channels * inner).max(1);
    if src.len() < PAR_THRESHOLD {
        pre.chunks_mut(row).zip(src.chunks(row)).for_each(add_row);
    } else {
        pre.par_chunks_mut(row).zip(src.par_chunks(row)).for_each(add_row);
    }
    match act {
        Some(op) => {
            let out = elementwise::unary(pool, &pre, &Layout::contiguous([pre.len()]), op);
            pool.recycle(T::into_host(pre));
            out
        }
        None => pre,
    }
}
