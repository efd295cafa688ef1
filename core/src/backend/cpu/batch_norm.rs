//! Batch normalisation in training, in two passes each way: per-channel sums, then one element
//! pass. Both go over blocks of whole rows (a row: one image's values of one channel), the blocks
//! split across threads, so the small rows of deep layers (16 values at 4x4) cost a task's
//! overhead once per block rather than once per row. The input and its gradient may be
//! channel-major (a convolution's product as it comes): rows are found where each tensor keeps
//! them, so nothing is gathered first. Sums accumulate in f64 lanes; the element ops are in f32.
//! The input, output and their gradients are f32, or bf16/f16 read and written directly
//! (autocast's batch norm: f32 weight, bias and statistics, the result rounded once).

use rayon::prelude::*;

use super::elementwise::PAR_THRESHOLD;
use super::float::ViaF32;
use super::pool::Pool;
use super::reduce::pairwise_total;
use super::simd::{Kernel, wide};
use crate::backend::BatchNormSpec;

/// Values per block: whole rows, as many as fit. The sums are added block by block in order,
/// so they do not depend on the number of threads.
const BLOCK: usize = 1 << 14;

/// `(y, [mean, var])`: `y = (x - mean) / sqrt(var + eps) * weight + bias` with the biased variance.
pub fn forward<E: ViaF32>(
    pool: &Pool,
    x: &[E],
    weight: &[f32],
    bias: &[f32],
    spec: &BatchNormSpec,
) -> (Vec<E>, [Vec<f32>; 2]) {
    let count = (spec.outer * spec.inner) as f64;
    let input = Order::input(spec);
    // One pass for both statistics: the sums of `x - s` and its square, `s` one of the channel's
    // own values, so the variance's subtraction does not cancel where the mean is large beside
    // the spread (as Σx² - (Σx)²/n would).
    let shift: Vec<f32> = (0..spec.channels)
        .map(|c| x.get(input.row(0, c) * spec.inner).map_or(0.0, |v| v.to_f32()))
        .collect();
    let sums = channel_sums(spec, x, (x, input), |c| {
        let s = shift[c];
        move |v: f32, _: f32| {
            let d = (v - s) as f64;
            [d, d * d]
        }
    });
    let (mean, var): (Vec<f32>, Vec<f32>) = sums
        .iter()
        .zip(&shift)
        .map(|(&[d, dd], &s)| {
            let mean_d = d / count;
            (
                (s as f64 + mean_d) as f32,
                (dd / count - mean_d * mean_d).max(0.0) as f32,
            )
        })
        .unzip();
    let denom: Vec<f32> = var.iter().map(|&v| (v + spec.eps as f32).sqrt()).collect();
    let mut y = pool.take::<E>(x.len());
    by_blocks(spec, Order::output(spec), input, &mut y, |rows, _, o| {
        wide(Normalize {
            rows,
            o,
            x,
            mean: &mean,
            denom: &denom,
            weight,
            bias,
        })
    });
    (y, [mean, var])
}

/// `(dx, [dweight, dbias])` for output gradient `g`, with `x̂ = (x - mean) / sqrt(var + eps)`:
/// `dbias = Σ g`, `dweight = Σ g·x̂`, `dx = weight / sqrt(var + eps) · (g - (dbias + x̂·dweight) / n)`
/// over the `n` values of each channel; `dx` laid out as `x`.
pub fn backward<E: ViaF32>(
    pool: &Pool,
    g: &[E],
    x: &[E],
    weight: &[f32],
    [mean, var]: [&[f32]; 2],
    spec: &BatchNormSpec,
) -> (Vec<E>, [Vec<f32>; 2]) {
    let denom: Vec<f32> = var.iter().map(|&v| (v + spec.eps as f32).sqrt()).collect();
    // Σ g and Σ g·(x - mean): dweight is the second over the channel's denominator.
    let sums = channel_sums(spec, x, (g, Order::output(spec)), |c| {
        let m = mean[c];
        move |x: f32, g: f32| [g as f64, (g * (x - m)) as f64]
    });
    let (dbias, dweight): (Vec<f64>, Vec<f64>) =
        sums.iter().zip(&denom).map(|(&[g, gx], &d)| (g, gx / d as f64)).unzip();
    let count = (spec.outer * spec.inner) as f64;
    let (mean_g, mean_gx): (Vec<f32>, Vec<f32>) = dbias
        .iter()
        .zip(&dweight)
        .map(|(g, gx)| ((g / count) as f32, (gx / count) as f32))
        .unzip();
    let scale: Vec<f32> = weight.iter().zip(&denom).map(|(w, d)| w / d).collect();
    let mut dx = pool.take::<E>(x.len());
    by_blocks(spec, Order::input(spec), Order::output(spec), &mut dx, |rows, at, o| {
        wide(InputGradient {
            rows,
            o,
            g,
            x: &x[at..],
            mean,
            denom: &denom,
            scale: &scale,
            mean_g: &mean_g,
            mean_gx: &mean_gx,
        })
    });
    (
        dx,
        [dweight, dbias].map(|sums| sums.iter().map(|&s| s as f32).collect()),
    )
}

/// How a tensor orders its rows: image-major (`[outer, channels, inner]`) or channel-major.
#[derive(Clone, Copy)]
struct Order {
    channel_major: bool,
    outer: usize,
    channels: usize,
}

impl Order {
    /// The input's (and its gradient's) order.
    fn input(spec: &BatchNormSpec) -> Order {
        Order {
            channel_major: spec.channel_major,
            outer: spec.outer,
            channels: spec.channels,
        }
    }
    /// The output's (and its gradient's) order: image-major.
    fn output(spec: &BatchNormSpec) -> Order {
        Order {
            channel_major: false,
            ..Order::input(spec)
        }
    }
    /// The index of row `(image, channel)`.
    #[inline(always)]
    fn row(self, image: usize, channel: usize) -> usize {
        match self.channel_major {
            true => channel * self.outer + image,
            false => image * self.channels + channel,
        }
    }
    /// `(image, channel)` of row `row`.
    #[inline(always)]
    fn image_and_channel(self, row: usize) -> (usize, usize) {
        match self.channel_major {
            true => (row % self.outer, row / self.outer),
            false => (row / self.channels, row % self.channels),
        }
    }
}

/// A block of rows: its first row in the order it is walked in, and where the same rows lie in
/// a second tensor's order.
#[derive(Clone, Copy)]
struct Rows {
    first: usize,
    walked: Order,
    other: Order,
    inner: usize,
}

impl Rows {
    /// `(channel, start, other_start)` of each row of a block of `len` values: `start` within
    /// the block, `other_start` within the whole of the second tensor.
    #[inline(always)]
    fn each(self, len: usize) -> impl Iterator<Item = (usize, usize, usize)> {
        (0..len / self.inner).map(move |r| {
            let (image, channel) = self.walked.image_and_channel(self.first + r);
            (channel, r * self.inner, self.other.row(image, channel) * self.inner)
        })
    }
}

/// The rows per block and the values they hold.
fn block_shape(spec: &BatchNormSpec) -> (usize, usize) {
    let inner = spec.inner.max(1);
    let rows = (BLOCK / inner).max(1);
    (rows, rows * inner)
}

/// Per channel, the two sums of `term(channel)(a, b)` over the channel's values of `a` (in the
/// input's order, walked in blocks) and `b` (in `b_order`), accumulated in f64 lanes.
fn channel_sums<E: ViaF32, T>(
    spec: &BatchNormSpec,
    a: &[E],
    (b, b_order): (&[E], Order),
    term: impl Fn(usize) -> T + Sync,
) -> Vec<[f64; 2]>
where
    T: Fn(f32, f32) -> [f64; 2] + Copy,
{
    let mut total = vec![[0.0; 2]; spec.channels];
    if spec.inner == 0 {
        return total;
    }
    let (rows, block) = block_shape(spec);
    let partial = |(i, a): (usize, &[E])| {
        let rows = Rows {
            first: i * rows,
            walked: Order::input(spec),
            other: b_order,
            inner: spec.inner,
        };
        wide(BlockSums {
            rows,
            a,
            b,
            term: &term,
        })
    };
    let partials: Vec<Vec<[f64; 2]>> = if a.len() >= PAR_THRESHOLD {
        a.par_chunks(block).enumerate().map(partial).collect()
    } else {
        a.chunks(block).enumerate().map(partial).collect()
    };
    for partial in partials {
        for (t, p) in total.iter_mut().zip(partial) {
            t[0] += p[0];
            t[1] += p[1];
        }
    }
    total
}

/// One block's per-channel sums (channels it does not reach stay zero); run by `simd::wide`.
struct BlockSums<'a, E, R> {
    rows: Rows,
    /// The block.
    a: &'a [E],
    /// The whole second tensor.
    b: &'a [E],
    term: &'a R,
}
impl<E: ViaF32, R: Fn(usize) -> T, T: Fn(f32, f32) -> [f64; 2] + Copy> Kernel for BlockSums<'_, E, R> {
    type Out = Vec<[f64; 2]>;
    #[inline(always)]
    fn run(self) -> Vec<[f64; 2]> {
        let BlockSums { rows, a, b, term } = self;
        let mut sums = vec![[0.0; 2]; rows.walked.channels];
        let n = rows.inner;
        for (c, at, b_at) in rows.each(a.len()) {
            let (a, b, term) = (&a[at..at + n], &b[b_at..b_at + n], term(c));
            // One sum at a time: a loop with one accumulator vectorizes, one with two did not.
            sums[c][0] += lane_sum(a, b, |a, b| term(a, b)[0]);
            sums[c][1] += lane_sum(a, b, |a, b| term(a, b)[1]);
        }
        sums
    }
}

/// Σ `term(a[i], b[i])` over two runs of one length, in f64 lanes added pairwise at the end.
#[inline(always)]
fn lane_sum<E: ViaF32>(a: &[E], b: &[E], term: impl Fn(f32, f32) -> f64) -> f64 {
    const LANES: usize = 16;
    let mut lanes = [0.0; LANES];
    let (chunks_a, chunks_b) = (a.chunks_exact(LANES), b.chunks_exact(LANES));
    let (rest_a, rest_b) = (chunks_a.remainder(), chunks_b.remainder());
    for (a, b) in chunks_a.zip(chunks_b) {
        for ((lane, a), b) in lanes.iter_mut().zip(a).zip(b) {
            *lane += term(a.to_f32(), b.to_f32());
        }
    }
    for ((lane, a), b) in lanes.iter_mut().zip(rest_a).zip(rest_b) {
        *lane += term(a.to_f32(), b.to_f32());
    }
    pairwise_total(&mut lanes)
}

/// `f(rows, at, out_block)` over `out` (laid out in `walked` order) in blocks of whole rows,
/// `at` the block's offset, `rows` also placing them in `other` order; blocks split across
/// threads for large outputs.
fn by_blocks<E: Send>(
    spec: &BatchNormSpec,
    walked: Order,
    other: Order,
    out: &mut [E],
    f: impl Fn(Rows, usize, &mut [E]) + Sync + Send,
) {
    let (rows, block) = block_shape(spec);
    let run = |(i, o): (usize, &mut [E])| {
        let first = i * rows;
        let rows = Rows {
            first,
            walked,
            other,
            inner: spec.inner.max(1),
        };
        f(rows, first * spec.inner, o)
    };
    if out.len() >= PAR_THRESHOLD {
        out.par_chunks_mut(block).enumerate().for_each(run);
    } else {
        out.chunks_mut(block).enumerate().for_each(run);
    }
}

/// `y = (x - mean) / denom * weight + bias` over a block's rows; run by `simd::wide`.
struct Normalize<'a, E> {
    rows: Rows,
    o: &'a mut [E],
    /// The whole input.
    x: &'a [E],
    mean: &'a [f32],
    denom: &'a [f32],
    weight: &'a [f32],
    bias: &'a [f32],
}
impl<E: ViaF32> Kernel for Normalize<'_, E> {
    type Out = ();
    #[inline(always)]
    fn run(self) {
        let Normalize {
            rows,
            o,
            x,
            mean,
            denom,
            weight,
            bias,
        } = self;
        let n = rows.inner;
        for (c, at, x_at) in rows.each(o.len()) {
            let (o, x) = (&mut o[at..at + n], &x[x_at..x_at + n]);
            let (mean, denom, weight, bias) = (mean[c], denom[c], weight[c], bias[c]);
            for (o, x) in o.iter_mut().zip(x) {
                *o = E::from_f32((x.to_f32() - mean) / denom * weight + bias);
            }
        }
    }
}

/// `dx = scale · (g - mean_g - x̂ · mean_gx)` over a block's rows; run by `simd::wide`.
struct InputGradient<'a, E> {
    rows: Rows,
    o: &'a mut [E],
    /// The whole output gradient.
    g: &'a [E],
    /// The input from the block's start.
    x: &'a [E],
    mean: &'a [f32],
    denom: &'a [f32],
    scale: &'a [f32],
    mean_g: &'a [f32],
    mean_gx: &'a [f32],
}
impl<E: ViaF32> Kernel for InputGradient<'_, E> {
    type Out = ();
    #[inline(always)]
    fn run(self) {
        let InputGradient {
            rows,
            o,
            g,
            x,
            mean,
            denom,
            scale,
            mean_g,
            mean_gx,
        } = self;
        let n = rows.inner;
        for (c, at, g_at) in rows.each(o.len()) {
            let (o, g, x) = (&mut o[at..at + n], &g[g_at..g_at + n], &x[at..at + n]);
            let (mean, denom, scale, mean_g, mean_gx) = (mean[c], denom[c], scale[c], mean_g[c], mean_gx[c]);
            for ((o, g), x) in o.iter_mut().zip(g).zip(x) {
                let x_hat = (x.to_f32() - mean) / denom;
                *o = E::from_f32(scale * (g.to_f32() - mean_g - x_hat * mean_gx));
            }
        }
    }
}

#[cfg(test)]
mod tests;
