//! Batch normalisation in training, in two passes each way: per-channel statistics (threads
//! take channels), then one element pass over rows (threads take rows). Sums accumulate in f64
//! as `reduce` does; the element ops are the composed path's, in its order, in f32. The input,
//! output and their gradients are f32, or bf16/f16 read and written directly (autocast's batch
//! norm: f32 weight, bias and statistics, the result rounded once).

use rayon::prelude::*;

use super::elementwise::PAR_THRESHOLD;
use super::float::ViaF32;
use super::pool::Pool;
use super::reduce::LaneSums;
use super::simd::{Kernel, wide};
use crate::backend::BatchNormSpec;

/// `(y, [mean, var])`: `y = (x - mean) / sqrt(var + eps) * weight + bias` with the biased variance.
pub fn forward<E: ViaF32>(
    pool: &Pool,
    x: &[E],
    weight: &[f32],
    bias: &[f32],
    spec: &BatchNormSpec,
) -> (Vec<E>, [Vec<f32>; 2]) {
    let count = (spec.outer * spec.inner) as f64;
    let mean = per_channel(spec, |c| sum_runs(x, spec, c, |v| v as f64) / count);
    let mean: Vec<f32> = mean.iter().map(|&m| m as f32).collect();
    let var = per_channel(spec, |c| {
        let m = mean[c];
        sum_runs(x, spec, c, |v| {
            let d = v - m;
            (d * d) as f64
        }) / count
    });
    let var: Vec<f32> = var.iter().map(|&v| v as f32).collect();
    let denom: Vec<f32> = var.iter().map(|&v| (v + spec.eps as f32).sqrt()).collect();
    let mut y = pool.take::<E>(x.len());
    by_rows(spec, &mut y, x, None, |c, o, x, _| {
        wide(Normalize {
            o,
            x,
            mean: mean[c],
            denom: denom[c],
            weight: weight[c],
            bias: bias[c],
        })
    });
    (y, [mean, var])
}

/// `(dx, [dweight, dbias])` for output gradient `g`, with `x̂ = (x - mean) / sqrt(var + eps)`:
/// `dbias = Σ g`, `dweight = Σ g·x̂`, `dx = weight / sqrt(var + eps) · (g - (dbias + x̂·dweight) / n)`
/// over the `n` values of each channel.
pub fn backward<E: ViaF32>(
    pool: &Pool,
    g: &[E],
    x: &[E],
    weight: &[f32],
    [mean, var]: [&[f32]; 2],
    spec: &BatchNormSpec,
) -> (Vec<E>, [Vec<f32>; 2]) {
    let denom: Vec<f32> = var.iter().map(|&v| (v + spec.eps as f32).sqrt()).collect();
    let dbias = per_channel(spec, |c| sum_runs(g, spec, c, |v| v as f64));
    let dweight = per_channel(spec, |c| {
        let (m, d) = (mean[c], denom[c]);
        sum_pairs(g, x, spec, c, |g, x| (g * ((x - m) / d)) as f64)
    });
    let count = (spec.outer * spec.inner) as f64;
    let mut dx = pool.take::<E>(x.len());
    by_rows(spec, &mut dx, g, Some(x), |c, o, g, x| {
        wide(InputGradient {
            o,
            g,
            x: x.unwrap_or_default(),
            mean: mean[c],
            denom: denom[c],
            scale: weight[c] / denom[c],
            mean_g: (dbias[c] / count) as f32,
            mean_gx: (dweight[c] / count) as f32,
        })
    });
    let dweight: Vec<f32> = dweight.iter().map(|&v| v as f32).collect();
    let dbias: Vec<f32> = dbias.iter().map(|&v| v as f32).collect();
    (dx, [dweight, dbias])
}

/// `f(channel)` for every channel, channels split across threads for large inputs.
fn per_channel(spec: &BatchNormSpec, f: impl Fn(usize) -> f64 + Sync + Send) -> Vec<f64> {
    if spec.outer * spec.channels * spec.inner >= PAR_THRESHOLD {
        (0..spec.channels).into_par_iter().map(f).collect()
    } else {
        (0..spec.channels).map(f).collect()
    }
}

/// Σ `term(v)` over channel `c`'s values, in f64 lanes (`LaneSums`).
fn sum_runs<E: ViaF32>(x: &[E], spec: &BatchNormSpec, c: usize, term: impl Fn(f32) -> f64 + Copy) -> f64 {
    sum_pairs(x, x, spec, c, move |v, _| term(v))
}

/// Σ `term(a, b)` over channel `c`'s values of two tensors of one shape, its runs (one per
/// batch item) summed into one set of lanes.
fn sum_pairs<E: ViaF32>(
    a: &[E],
    b: &[E],
    spec: &BatchNormSpec,
    c: usize,
    term: impl Fn(f32, f32) -> f64 + Copy,
) -> f64 {
    wide(PairSum { a, b, spec, c, term })
}

/// Σ `term(a[i], b[i])` over one channel's runs; run by `simd::wide`.
struct PairSum<'a, E, F> {
    a: &'a [E],
    b: &'a [E],
    spec: &'a BatchNormSpec,
    c: usize,
    term: F,
}
impl<E: ViaF32, F: Fn(f32, f32) -> f64> Kernel for PairSum<'_, E, F> {
    type Out = f64;
    #[inline(always)]
    fn run(self) -> f64 {
        let PairSum { a, b, spec, c, term } = self;
        let (row, inner) = (spec.channels * spec.inner, spec.inner);
        let mut sums = LaneSums::default();
        for n in 0..spec.outer {
            let at = n * row + c * inner;
            let (a, b) = (&a[at..at + inner], &b[at..at + inner]);
            sums.add_run(inner, |i| term(a[i].to_f32(), b[i].to_f32()));
        }
        sums.total()
    }
}

/// `f(channel, out_row, a_row, b_row)` over the `[channels, inner]`-sized rows' `inner` runs,
/// rows split across threads for large inputs.
fn by_rows<'a, E: ViaF32>(
    spec: &BatchNormSpec,
    out: &mut [E],
    a: &'a [E],
    b: Option<&'a [E]>,
    f: impl Fn(usize, &mut [E], &'a [E], Option<&'a [E]>) + Sync + Send,
) {
    let inner = spec.inner.max(1);
    let channels = spec.channels;
    let run = |(i, o): (usize, &mut [E])| {
        let at = i * inner;
        f(i % channels, o, &a[at..at + inner], b.map(|b| &b[at..at + inner]))
    };
    if out.len() >= PAR_THRESHOLD {
        out.par_chunks_mut(inner).enumerate().for_each(run);
    } else {
        out.chunks_mut(inner).enumerate().for_each(run);
    }
}

/// One run of `y = (x - mean) / denom * weight + bias`; run by `simd::wide`.
struct Normalize<'a, E> {
    o: &'a mut [E],
    x: &'a [E],
    mean: f32,
    denom: f32,
    weight: f32,
    bias: f32,
}
impl<E: ViaF32> Kernel for Normalize<'_, E> {
    type Out = ();
    #[inline(always)]
    fn run(self) {
        let Normalize {
            o,
            x,
            mean,
            denom,
            weight,
            bias,
        } = self;
        let x = &x[..o.len()];
        for (i, o) in o.iter_mut().enumerate() {
            *o = E::from_f32((x[i].to_f32() - mean) / denom * weight + bias);
        }
    }
}

/// One run of `dx = scale · (g - mean_g - x̂ · mean_gx)`; run by `simd::wide`.
struct InputGradient<'a, E> {
    o: &'a mut [E],
    g: &'a [E],
    x: &'a [E],
    mean: f32,
    denom: f32,
    scale: f32,
    mean_g: f32,
    mean_gx: f32,
}
impl<E: ViaF32> Kernel for InputGradient<'_, E> {
    type Out = ();
    #[inline(always)]
    fn run(self) {
        let InputGradient {
            o,
            g,
            x,
            mean,
            denom,
            scale,
            mean_g,
            mean_gx,
        } = self;
        let n = o.len();
        let (g, x) = (&g[..n], &x[..n]);
        for (i, o) in o.iter_mut().enumerate() {
            let x_hat = (x[i].to_f32() - mean) / denom;
            *o = E::from_f32(scale * (g[i].to_f32() - mean_g - x_hat * mean_gx));
        }
    }
}
