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
    let add = |(i, &x): (usize, &T)| x + bias[(i / inner) % channels];
    let pre: Vec<T> = if src.len() < PAR_THRESHOLD {
        src.iter().enumerate().map(add).collect()
    } else {
        src.par_iter().enumerate().map(add).collect()
    };
    match act {
        Some(op) => elementwise::unary(pool, &pre, &Layout::contiguous([pre.len()]), op),
        None => pre,
    }
}
