//! bias_act: a layer's bias and activation in one pass, `act(x + bias)` per element, computed in
//! the stored type's compute type (bf16 read and written directly).

use std::marker::PhantomData;

use rayon::prelude::*;

use super::elementwise::{PAR_THRESHOLD, WithUnary, with_unary};
use super::float::CpuFloat;
use super::pool::Pool;
use super::simd::{Kernel, wide};
use super::stored::Stored;
use crate::backend::UnaryOp;

/// `act(src + bias)` with `src` seen as rows of `[channels, inner]` and `bias` per channel.
pub fn bias_act<S: Stored<T>, T: CpuFloat>(
    pool: &Pool,
    src: &[S],
    bias: &[S],
    channels: usize,
    inner: usize,
    act: Option<UnaryOp>,
) -> Vec<S> {
    let task = BiasAct {
        pool,
        src,
        bias,
        channels,
        inner,
    };
    match act {
        Some(op) => with_unary(op, task),
        None => task.apply(|x: T| x),
    }
}

struct BiasAct<'a, S> {
    pool: &'a Pool,
    src: &'a [S],
    bias: &'a [S],
    channels: usize,
    inner: usize,
}

impl<S: Stored<T>, T: CpuFloat> WithUnary<T> for BiasAct<'_, S> {
    type Out = Vec<S>;
    fn apply<F: Fn(T) -> T + Send + Sync + Copy>(self, act: F) -> Vec<S> {
        let BiasAct {
            pool,
            src,
            bias,
            channels,
            inner,
        } = self;
        // From the pool: a fresh zeroed vector per call made the kernel fault in new pages on
        // every layer of every step.
        let mut out = pool.take::<S>(src.len());
        let row = (channels * inner).max(1);
        let one_row = move |(out, x): (&mut [S], &[S])| {
            wide(Row {
                out,
                x,
                bias,
                inner,
                act,
                compute: PhantomData,
            })
        };
        if src.len() < PAR_THRESHOLD {
            out.chunks_mut(row).zip(src.chunks(row)).for_each(one_row);
        } else {
            out.par_chunks_mut(row).zip(src.par_chunks(row)).for_each(one_row);
        }
        out
    }
}

/// One `[channels, inner]` row, run by `simd::wide`: the loops index slices (no division per
/// element to find its channel), `act` held by value.
struct Row<'a, S, T, F> {
    out: &'a mut [S],
    x: &'a [S],
    bias: &'a [S],
    inner: usize,
    act: F,
    compute: PhantomData<T>,
}

impl<S: Stored<T>, T: CpuFloat, F: Fn(T) -> T> Kernel for Row<'_, S, T, F> {
    type Out = ();
    #[inline(always)]
    fn run(self) {
        let Row {
            out,
            x,
            bias,
            inner,
            act,
            ..
        } = self;
        if inner == 1 {
            let n = out.len();
            let (x, bias) = (&x[..n], &bias[..n]);
            for (i, o) in out.iter_mut().enumerate() {
                *o = S::store(act(x[i].load() + bias[i].load()));
            }
            return;
        }
        for ((out, x), &b) in out.chunks_mut(inner).zip(x.chunks(inner)).zip(bias) {
            let b = b.load();
            for (o, &x) in out.iter_mut().zip(x) {
                *o = S::store(act(x.load() + b));
            }
        }
    }
}
