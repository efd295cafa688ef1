//! bias_act: a layer's bias and activation in one pass, `act(x + bias)` per element, computed in
//! the stored type's compute type (bf16 read and written directly); and its input's gradient
//! `grad ∘ act'(x + bias)` in one pass too.

use std::marker::PhantomData;

use rayon::prelude::*;

use super::elementwise::{PAR_THRESHOLD, WithUnary, with_unary};
use super::float::CpuFloat;
use super::pool::Pool;
use super::simd::{Kernel, wide};
use super::stored::Stored;
use crate::backend::UnaryOp;
use crate::dtype::Element;

/// `act(src + bias)` with `src` seen as rows of `[channels, inner]` and `bias` per channel.
pub fn bias_act<S: Stored<T>, T: CpuFloat>(
    pool: &Pool,
    src: &[S],
    bias: &[S],
    channels: usize,
    inner: usize,
    act: Option<UnaryOp>,
) -> Vec<S> {
    let task = BiasRows {
        pool,
        src,
        grad: None,
        bias,
        channels,
        inner,
    };
    match act {
        Some(op) => with_unary(op, task),
        None => task.apply(|x: T| x),
    }
}

/// `bias_act` (`grad` None: `f` is the activation) or `bias_act_grad` (`f` the derivative).
struct BiasRows<'a, S> {
    pool: &'a Pool,
    src: &'a [S],
    grad: Option<&'a [S]>,
    bias: &'a [S],
    channels: usize,
    inner: usize,
}

impl<S: Stored<T>, T: CpuFloat> WithUnary<T> for BiasRows<'_, S> {
    type Out = Vec<S>;
    fn apply<F: Fn(T) -> T + Send + Sync + Copy>(self, f: F) -> Vec<S> {
        let BiasRows {
            pool,
            src,
            grad,
            bias,
            channels,
            inner,
        } = self;
        by_rows(pool, src.len(), channels * inner, move |out, at| {
            let x = &src[at..];
            match grad {
                // The forward pass reads no gradient: `x` stands in for it, unread.
                None => wide(Row::new(out, [x, x], bias, inner, Forward(f))),
                Some(grad) => wide(Row::new(out, [x, &grad[at..]], bias, inner, Backward(f))),
            }
        })
    }
}

/// What a row computes per element from its input `x`, its channel's bias `b` and its gradient
/// `g`. A trait with an always-inlined method, not a closure: a closure around the activation
/// was called out of line (compiled for the baseline, one element a call) for bf16.
trait PerElement<S, T> {
    fn at(&self, x: S, b: T, g: S) -> S;
}

/// `act(x + b)`.
struct Forward<F>(F);

impl<S: Stored<T>, T: CpuFloat, F: Fn(T) -> T> PerElement<S, T> for Forward<F> {
    #[inline(always)]
    fn at(&self, x: S, b: T, _: S) -> S {
        S::store((self.0)(x.load() + b))
    }
}

/// `g * derivative(x + b)`, with the composed ops' roundings: the sum, the derivative and the
/// product each rounded to `S`.
struct Backward<F>(F);

impl<S: Stored<T>, T: CpuFloat, F: Fn(T) -> T> PerElement<S, T> for Backward<F> {
    #[inline(always)]
    fn at(&self, x: S, b: T, g: S) -> S {
        let pre = S::store(x.load() + b).load();
        S::store(g.load() * S::store((self.0)(pre)).load())
    }
}

/// A vector of `len` elements from the pool (a fresh zeroed vector per call made the kernel
/// fault in new pages on every layer of every step), filled by `fill(row, first element's
/// index)` in rows of `row` elements, on rayon's threads when it is long.
fn by_rows<S: Element>(pool: &Pool, len: usize, row: usize, fill: impl Fn(&mut [S], usize) + Send + Sync) -> Vec<S> {
    let mut out = pool.take::<S>(len);
    let row = row.max(1);
    let one_row = |(i, out): (usize, &mut [S])| fill(out, i * row);
    if len < PAR_THRESHOLD {
        out.chunks_mut(row).enumerate().for_each(one_row);
    } else {
        out.par_chunks_mut(row).enumerate().for_each(one_row);
    }
    out
}

/// One `[channels, inner]` row, run by `simd::wide`: `out = element.at(x, bias, g)` per element,
/// the loops indexing slices (no division per element to find its channel), `element` held by
/// value.
struct Row<'a, S, T, E> {
    out: &'a mut [S],
    x: &'a [S],
    g: &'a [S],
    bias: &'a [S],
    inner: usize,
    element: E,
    compute: PhantomData<T>,
}

impl<'a, S, T, E> Row<'a, S, T, E> {
    fn new(out: &'a mut [S], [x, g]: [&'a [S]; 2], bias: &'a [S], inner: usize, element: E) -> Self {
        Row {
            out,
            x,
            g,
            bias,
            inner,
            element,
            compute: PhantomData,
        }
    }
}

impl<S: Stored<T>, T: CpuFloat, E: PerElement<S, T>> Kernel for Row<'_, S, T, E> {
    type Out = ();
    #[inline(always)]
    fn run(self) {
        let Row {
            out,
            x,
            g,
            bias,
            inner,
            element,
            ..
        } = self;
        if inner == 1 {
            let n = out.len();
            let (x, g, bias) = (&x[..n], &g[..n], &bias[..n]);
            for (i, o) in out.iter_mut().enumerate() {
                *o = element.at(x[i], bias[i].load(), g[i]);
            }
            return;
        }
        for (((out, x), g), &b) in out
            .chunks_mut(inner)
            .zip(x.chunks(inner))
            .zip(g.chunks(inner))
            .zip(bias)
        {
            let b = b.load();
            for ((o, &x), &g) in out.iter_mut().zip(x).zip(g) {
                *o = element.at(x, b, g);
            }
        }
    }
}

/// `grad ∘ derivative(src + bias)` (the gradient of `bias_act`'s input for an activation whose
/// derivative is the unary op `derivative` of its input), `src` and `grad` seen as rows of
/// `[channels, inner]`. Each step is rounded to `S` where the composed ops (add, `derivative`,
/// multiply) round it, so the result is theirs bit for bit, without their two intermediate
/// tensors and three passes.
pub fn bias_act_grad<S: Stored<T>, T: CpuFloat>(
    pool: &Pool,
    grad: &[S],
    src: &[S],
    bias: &[S],
    (channels, inner): (usize, usize),
    derivative: UnaryOp,
) -> Vec<S> {
    with_unary(
        derivative,
        BiasRows {
            pool,
            src,
            grad: Some(grad),
            bias,
            channels,
            inner,
        },
    )
}
