//! Layer normalisation over the last axis of a contiguous `[rows, cols]` tensor, forward and
//! backward, each one pass per row with the row's statistics accumulated in f64.

use rayon::prelude::*;

use super::float::CpuFloat;
use super::pool::Pool;

fn wide<T: CpuFloat>(v: T) -> f64 {
    crate::dtype::Element::to_f64(v)
}

/// The row's mean and `1 / sqrt(var + eps)` (biased variance), in f64.
fn statistics<T: CpuFloat>(x: &[T], eps: f64) -> (f64, f64) {
    let n = x.len() as f64;
    let mean = x.iter().map(|v| wide(*v)).sum::<f64>() / n;
    let var = x.iter().map(|v| (wide(*v) - mean).powi(2)).sum::<f64>() / n;
    (mean, 1.0 / (var + eps).sqrt())
}

/// Runs `row(out_row, input rows…)` over every row, in parallel when the tensor is large.
fn by_rows<T: CpuFloat>(out: &mut [T], inputs: [&[T]; 2], cols: usize, row: impl Fn(&mut [T], &[T], &[T]) + Sync) {
    let [a, b] = inputs;
    if out.len() >= super::elementwise::PAR_THRESHOLD {
        out.par_chunks_mut(cols)
            .zip(a.par_chunks(cols).zip(b.par_chunks(cols)))
            .for_each(|(o, (a, b))| row(o, a, b));
    } else {
        out.chunks_mut(cols)
            .zip(a.chunks(cols).zip(b.chunks(cols)))
            .for_each(|(o, (a, b))| row(o, a, b));
    }
}

pub fn forward<T: CpuFloat>(pool: &Pool, src: &[T], cols: usize, eps: f64) -> Vec<T> {
    let mut out = pool.take::<T>(src.len());
    if cols == 0 {
        return out;
    }
    by_rows(&mut out, [src, src], cols, |o, x, _| {
        let (mean, r) = statistics(x, eps);
        o.iter_mut().zip(x).for_each(|(o, v)| *o = T::of((wide(*v) - mean) * r));
    });
    out
}

pub fn backward<T: CpuFloat>(pool: &Pool, grad: &[T], src: &[T], cols: usize, eps: f64) -> Vec<T> {
    let mut out = pool.take::<T>(src.len());
    if cols == 0 {
        return out;
    }
    by_rows(&mut out, [grad, src], cols, |o, g, x| {
        let (mean, r) = statistics(x, eps);
        let n = cols as f64;
        let normed = |v: T| (wide(v) - mean) * r;
        let g_mean = g.iter().map(|g| wide(*g)).sum::<f64>() / n;
        let gn_mean = g.iter().zip(x).map(|(g, &v)| wide(*g) * normed(v)).sum::<f64>() / n;
        o.iter_mut()
            .zip(g.iter().zip(x))
            .for_each(|(o, (g, &v))| *o = T::of(r * (wide(*g) - g_mean - normed(v) * gn_mean)));
    });
    out
}
