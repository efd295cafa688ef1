//! Causal attention in blocks (flash attention) on f32: `softmax(q·kᵀ·scale, future masked)·v`
//! for every head of a `[batch, t, 3, heads, head_dim]` projection without the `t × t` scores.
//! A forward task takes one sequence's block of `BLOCK` positions, all heads; a backward task
//! one head of a sequence. The block products run on `gemm` (one thread each), the softmax
//! online per query row (running maximum and sum in f32). Memory is a few `BLOCK × BLOCK` and
//! `BLOCK × head_dim` scratch blocks per task, and a backward task's `3 × t × head_dim`.
//! Dropout on the weights draws each weight's word of the stream by its index in `[batch, heads,
//! t, t]`, as the composed path does, so both passes drop the elements that path drops.
//!
//! Each output element is computed by one task, its sums over key (or query) blocks in block
//! order, so results do not depend on the thread count and repeat bit for bit. A task runs
//! through `simd::wide`: its softmax, dropout and output loops on the CPU's widest vectors (at
//! the baseline's four lanes, drawing the dropout stream alone was a fifth of gpt-char's
//! bf16-mixed step once its products ran on AMX tiles).

use std::sync::OnceLock;

use gemm::Parallelism;
use rayon::prelude::*;

use super::dropout::KeepMask;
use super::fast_math::exp_nonpositive;
use super::pool::Pool;
use super::reduce::lane_sum;
use super::simd::{Kernel, wide};
use crate::backend::CausalAttention;
use crate::dtype::HostVec;

/// Positions per block, for queries and keys alike: a 64 × 64 block of scores and 64-row blocks
/// of q, k, v (at head dims up to 128) stay in the L2 cache.
const BLOCK: usize = 64;

/// Whether attention fuses by default, from `LOCKSTEP_CPU_ATTENTION` (read once): `composed`
/// turns it off, `fused` or unset leaves it on.
pub fn fused_by_default() -> bool {
    static FUSED: OnceLock<bool> = OnceLock::new();
    *FUSED.get_or_init(|| match std::env::var("LOCKSTEP_CPU_ATTENTION").as_deref() {
        Ok("composed") => false,
        Ok("fused") | Err(_) => true,
        Ok(other) => {
            eprintln!("lockstep: LOCKSTEP_CPU_ATTENTION={other:?} is neither \"composed\" nor \"fused\"; ignored");
            true
        }
    })
}

/// The attention path a CPU device takes by default, as `devices --details` prints it.
pub fn plan() -> &'static str {
    if fused_by_default() {
        "fused, flash-style in blocks of 64 (LOCKSTEP_CPU_ATTENTION=composed turns it off)"
    } else {
        "composed from products and causal_softmax (LOCKSTEP_CPU_ATTENTION=composed)"
    }
}

/// A strided f32 matrix inside a slice: element `(r, c)` at `offset + r * rs + c * cs`.
#[derive(Clone, Copy)]
struct Mat<'a> {
    data: &'a [f32],
    offset: usize,
    rs: usize,
    cs: usize,
}

/// `dst (m × n, row stride n) = [dst +] lhs (m × k) · rhs (k × n)` on one thread.
fn product(dst: &mut [f32], (m, n, k): (usize, usize, usize), lhs: Mat, rhs: Mat, accumulate: bool) {
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        if !accumulate {
            dst[..m * n].fill(0.0);
        }
        return;
    }
    let last = |a: &Mat, rows: usize, cols: usize| a.offset + (rows - 1) * a.rs + (cols - 1) * a.cs;
    assert!(dst.len() >= m * n && last(&lhs, m, k) < lhs.data.len() && last(&rhs, k, n) < rhs.data.len());
    // SAFETY: the assert above bounds the largest index gemm forms from each operand's offset,
    // extent and strides (all non-negative), and `dst` is an exclusively borrowed m × n block
    // with row stride n and column stride 1, disjoint from the shared operands.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst.as_mut_ptr(),
            1,
            n as isize,
            accumulate,
            lhs.data.as_ptr().add(lhs.offset),
            lhs.cs as isize,
            lhs.rs as isize,
            rhs.data.as_ptr().add(rhs.offset),
            rhs.cs as isize,
            rhs.rs as isize,
            1.0,
            1.0,
            false,
            false,
            false,
            Parallelism::None,
        );
    }
}

/// Where things are in the buffers for one spec.
#[derive(Clone, Copy)]
struct Geometry {
    t: usize,
    heads: usize,
    d: usize,
    scale: f32,
    /// Dropout on the weights, drawn by their index in `[batch, heads, t, t]`.
    mask: Option<KeepMask>,
}

impl Geometry {
    fn of(spec: &CausalAttention) -> Geometry {
        Geometry {
            t: spec.t,
            heads: spec.heads,
            d: spec.head_dim,
            scale: spec.scale as f32,
            mask: KeepMask::of(spec.dropout),
        }
    }
    /// Dropout's factors (`1 / (1 - p)` or 0) of the first `factors.len()` keys from `first_key`
    /// for query `i` of head `h` of sequence `b`, drawn where the composed path draws the same
    /// weight's; all 1 without dropout.
    #[inline(always)]
    fn dropout_factors(&self, b: usize, h: usize, i: usize, first_key: usize, factors: &mut [f32]) {
        let Some(mask) = self.mask else {
            factors.fill(1.0);
            return;
        };
        let mut words = [0u32; BLOCK];
        let words = &mut words[..factors.len()];
        mask.words(((b * self.heads + h) * self.t + i) * self.t + first_key, words);
        for (f, &w) in factors.iter_mut().zip(words.iter()) {
            *f = mask.factor(w);
        }
    }
    /// Rows `first..` of slot `slot` (0 q, 1 k, 2 v) of head `h` of sequence `b` in `qkv`.
    fn qkv<'a>(&self, qkv: &'a [f32], b: usize, first: usize, slot: usize, h: usize) -> Mat<'a> {
        let row = 3 * self.heads * self.d;
        Mat {
            data: qkv,
            offset: (b * self.t + first) * row + (slot * self.heads + h) * self.d,
            rs: row,
            cs: 1,
        }
    }
    /// Rows `first..` of head `h` of sequence `b` in a `[batch, t, heads, d]` buffer.
    fn out<'a>(&self, y: &'a [f32], b: usize, first: usize, h: usize) -> Mat<'a> {
        let row = self.heads * self.d;
        Mat {
            data: y,
            offset: (b * self.t + first) * row + h * self.d,
            rs: row,
            cs: 1,
        }
    }
    /// Positions `first..` of block `block` (at most `BLOCK`, fewer at the sequence's end).
    fn block(&self, block: usize) -> (usize, usize) {
        let first = block * BLOCK;
        (first, BLOCK.min(self.t - first))
    }
    /// The index in `lse` `[batch, heads, t]` of query `i` of head `h` of sequence `b`.
    fn row(&self, b: usize, h: usize, i: usize) -> usize {
        (b * self.heads + h) * self.t + i
    }
}

/// A matrix's transpose as a view (no copy).
fn transposed(a: Mat) -> Mat {
    Mat {
        rs: a.cs,
        cs: a.rs,
        ..a
    }
}

/// A local row-major `rows × cols` block as a matrix.
fn local(data: &[f32], cols: usize) -> Mat<'_> {
    Mat {
        data,
        offset: 0,
        rs: cols,
        cs: 1,
    }
}

/// The forward pass: `y` `[batch, t, heads, d]` and `lse` `[batch, heads, t]`.
pub fn forward(pool: &Pool, qkv: &[f32], spec: &CausalAttention) -> (Vec<f32>, Vec<f32>) {
    let g = Geometry::of(spec);
    let width = g.heads * g.d;
    let mut y = pool.take::<f32>(spec.out_len());
    // Each task's lse in [batch, t, heads] (its rows contiguous), reordered below.
    let mut lse_by_position = pool.take::<f32>(spec.rows());
    if width == 0 || g.t == 0 {
        return (y, lse_by_position);
    }
    // Per sequence, then per block of it: a block never straddles two sequences.
    y.par_chunks_mut(g.t * width)
        .zip(lse_by_position.par_chunks_mut(g.t * g.heads))
        .enumerate()
        .for_each(|(b, (y, lse))| {
            y.par_chunks_mut(BLOCK * width)
                .zip(lse.par_chunks_mut(BLOCK * g.heads))
                .enumerate()
                .for_each(|(block, (y, lse))| {
                    wide(ForwardBlock {
                        g: &g,
                        qkv,
                        at: (b, block),
                        y,
                        lse,
                    })
                });
        });
    let mut lse = pool.take::<f32>(spec.rows());
    for b in 0..spec.batch {
        for i in 0..g.t {
            for h in 0..g.heads {
                lse[g.row(b, h, i)] = lse_by_position[(b * g.t + i) * g.heads + h];
            }
        }
    }
    pool.recycle(HostVec::F32(lse_by_position));
    (y, lse)
}

/// `forward_block`'s work, run by `simd::wide`.
struct ForwardBlock<'a> {
    g: &'a Geometry,
    qkv: &'a [f32],
    /// Sequence and block.
    at: (usize, usize),
    y: &'a mut [f32],
    lse: &'a mut [f32],
}

impl Kernel for ForwardBlock<'_> {
    type Out = ();
    #[inline(always)]
    fn run(self) {
        let (b, block) = self.at;
        forward_block(self.g, self.qkv, b, block, self.y, self.lse)
    }
}

/// Queries of block `block` of sequence `b`, every head: their rows of `y` and of `lse` (by
/// position, then head).
#[inline(always)]
fn forward_block(g: &Geometry, qkv: &[f32], b: usize, block: usize, y: &mut [f32], lse: &mut [f32]) {
    let (first, rows) = g.block(block);
    let d = g.d;
    let (mut s, mut acc) = (vec![0f32; BLOCK * BLOCK], vec![0f32; BLOCK * d]);
    let (mut max, mut sum, mut poisoned) = ([0f32; BLOCK], [0f32; BLOCK], [false; BLOCK]);
    for h in 0..g.heads {
        let q = g.qkv(qkv, b, first, 0, h);
        acc.fill(0.0);
        max.fill(f32::NEG_INFINITY);
        sum.fill(0.0);
        poisoned.fill(false);
        for key_block in 0..=block {
            let (keys_first, keys) = g.block(key_block);
            let k = g.qkv(qkv, b, keys_first, 1, h);
            product(&mut s, (rows, keys, d), q, transposed(k), false);
            for r in 0..rows {
                let row = &mut s[r * keys..(r + 1) * keys];
                let seen = (first + r + 1).saturating_sub(keys_first).min(keys);
                let correction = online_softmax_row(row, seen, g.scale, &mut max[r], &mut sum[r], &mut poisoned[r]);
                if correction != 1.0 {
                    acc[r * d..(r + 1) * d].iter_mut().for_each(|a| *a *= correction);
                }
                // The sum above took the weights whole; the values take them dropped.
                if g.mask.is_some() {
                    let mut factors = [0f32; BLOCK];
                    let factors = &mut factors[..seen];
                    g.dropout_factors(b, h, first + r, keys_first, factors);
                    row[..seen].iter_mut().zip(factors.iter()).for_each(|(x, f)| *x *= f);
                }
            }
            let v = g.qkv(qkv, b, keys_first, 2, h);
            product(&mut acc, (rows, d, keys), local(&s, keys), v, true);
        }
        for r in 0..rows {
            let out = &mut y[r * g.heads * d + h * d..][..d];
            let (l, m) = (sum[r], max[r]);
            let nan = poisoned[r] || !m.is_finite();
            for (o, &a) in out.iter_mut().zip(&acc[r * d..(r + 1) * d]) {
                *o = if nan { f32::NAN } else { a / l };
            }
            lse[r * g.heads + h] = if nan { f32::NAN } else { m + l.ln() };
        }
    }
}

/// One query row's scores against a block of keys, `seen` of them unmasked, turned in place
/// into `exp(score·scale − max)` (0 where masked) as the running `max` and `sum` take them in;
/// returns the factor the row's accumulated values must be multiplied by (the old maximum's
/// weights rescaled to the new). A NaN or +inf score poisons the row.
#[inline(always)]
fn online_softmax_row(
    row: &mut [f32],
    seen: usize,
    scale: f32,
    max: &mut f32,
    sum: &mut f32,
    poisoned: &mut bool,
) -> f32 {
    let (row_seen, row_future) = row.split_at_mut(seen);
    row_future.fill(0.0);
    // The maximum and the sum over `LANES` interleaved partials, which vectorise (one running
    // value did not); a fixed split, so the sum's order is the same on every CPU.
    let (mut lane_max, mut lane_bad) = ([f32::NEG_INFINITY; LANES], [false; LANES]);
    for_lanes(row_seen, |l, x| {
        *x *= scale;
        lane_bad[l] |= x.is_nan() || *x == f32::INFINITY;
        lane_max[l] = lane_max[l].max(*x);
    });
    *poisoned |= lane_bad.iter().any(|&b| b);
    let block_max = lane_max.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x));
    let new_max = max.max(block_max);
    if *poisoned || new_max == f32::NEG_INFINITY {
        // Nothing finite seen yet (or never will matter): the row adds nothing.
        row_seen.fill(0.0);
        return 1.0;
    }
    let correction = exp_nonpositive(*max - new_max);
    let mut lane_sum = [0.0f32; LANES];
    for_lanes(row_seen, |l, x| {
        *x = exp_nonpositive(*x - new_max);
        lane_sum[l] += *x;
    });
    *sum = *sum * correction + lane_sum.iter().sum::<f32>();
    *max = new_max;
    correction
}

/// Partials per row in `online_softmax_row`: one AVX-512 register of f32.
const LANES: usize = 16;

/// `f(i % LANES, &mut xs[i])` for every element in order, in whole groups of `LANES` the
/// compiler vectorises.
#[inline(always)]
fn for_lanes(xs: &mut [f32], mut f: impl FnMut(usize, &mut f32)) {
    let mut groups = xs.chunks_exact_mut(LANES);
    for group in &mut groups {
        for (l, x) in group.iter_mut().enumerate() {
            f(l, x);
        }
    }
    for (l, x) in groups.into_remainder().iter_mut().enumerate() {
        f(l, x);
    }
}

/// The backward pass: `dqkv` `[batch, t, 3, heads, d]` from `qkv`, `y`, `lse` and `dy`.
pub fn backward(pool: &Pool, [qkv, y, lse, dy]: [&[f32]; 4], spec: &CausalAttention) -> Vec<f32> {
    let g = Geometry::of(spec);
    let width = g.heads * g.d;
    let mut dqkv = pool.take::<f32>(spec.qkv_len());
    if width == 0 || g.t == 0 {
        return dqkv;
    }
    // D = rowsum(dy ∘ y) per (position, head): the softmax backward's dot.
    let mut dots = pool.take::<f32>(spec.rows());
    dots.par_chunks_mut(g.heads)
        .zip(dy.par_chunks(width).zip(y.par_chunks(width)))
        .for_each(|(dots, (dy, y))| {
            for (h, dot) in dots.iter_mut().enumerate() {
                let (dy, y) = (&dy[h * g.d..(h + 1) * g.d], &y[h * g.d..(h + 1) * g.d]);
                // In f64, as the composed softmax backward takes its dot; in lanes, so the
                // additions do not wait on each other.
                *dot = lane_sum(g.d, |i| dy[i] as f64 * y[i] as f64) as f32;
            }
        });
    // One task per head of a sequence, so each block of weights and of their gradients is formed
    // once and gives dq, dk and dv alike (a task per block of queries formed every block twice:
    // once for its queries' dq, once for its keys' dk and dv). dq's sums over key blocks run in
    // key order, dk's and dv's over query blocks in query order, whatever the thread count.
    dqkv.par_chunks_mut(g.t * 3 * width).enumerate().for_each(|(b, dqkv)| {
        let heads: Vec<Vec<f32>> = (0..g.heads)
            .into_par_iter()
            .map(|h| {
                // Every element is written before it is read (each sum's first product writes).
                let mut grads = pool.take::<f32>(3 * g.t * g.d);
                wide(HeadBackward {
                    g: &g,
                    inputs: [qkv, dy],
                    lse,
                    dots: &dots,
                    at: (b, h),
                    grads: &mut grads,
                });
                grads
            })
            .collect();
        wide(Interleave {
            g: &g,
            heads: &heads,
            dqkv,
        });
        heads.into_iter().for_each(|v| pool.recycle(HostVec::F32(v)));
    });
    pool.recycle(HostVec::F32(dots));
    dqkv
}

/// One sequence's heads' dq, dk and dv (each `[t, d]`, unscaled) written, dq and dk scaled, into
/// its `[t, 3, heads, d]` rows of `dqkv` in their order; run by `simd::wide`.
struct Interleave<'a> {
    g: &'a Geometry,
    heads: &'a [Vec<f32>],
    dqkv: &'a mut [f32],
}

impl Kernel for Interleave<'_> {
    type Out = ();
    #[inline(always)]
    fn run(self) {
        let Interleave { g, heads, dqkv } = self;
        let d = g.d;
        for (r, row) in dqkv.chunks_exact_mut(3 * g.heads * d).enumerate() {
            for (slot, (slot_row, scale)) in row
                .chunks_exact_mut(g.heads * d)
                .zip([g.scale, g.scale, 1.0])
                .enumerate()
            {
                for (dst, grads) in slot_row.chunks_exact_mut(d).zip(heads) {
                    let src = &grads[(slot * g.t + r) * d..][..d];
                    dst.iter_mut().zip(src).for_each(|(o, &x)| *o = x * scale);
                }
            }
        }
    }
}

/// `head_backward`'s work, run by `simd::wide`.
struct HeadBackward<'a> {
    g: &'a Geometry,
    /// `qkv` and `dy`.
    inputs: [&'a [f32]; 2],
    lse: &'a [f32],
    dots: &'a [f32],
    /// Sequence and head.
    at: (usize, usize),
    /// dq, dk and dv of the head, each `[t, d]`, unscaled.
    grads: &'a mut [f32],
}

impl Kernel for HeadBackward<'_> {
    type Out = ();
    #[inline(always)]
    fn run(self) {
        let (b, h) = self.at;
        head_backward(self.g, self.inputs, self.lse, self.dots, b, h, self.grads)
    }
}

/// Head `h` of sequence `b`: each block of keys against the blocks of queries at and after it,
/// `dv = Σ pᵀ · dy`, `dk = Σ dsᵀ · q` and `dq = Σ ds · k` (the last two still to be scaled).
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn head_backward(
    g: &Geometry,
    [qkv, dy]: [&[f32]; 2],
    lse: &[f32],
    dots: &[f32],
    b: usize,
    h: usize,
    grads: &mut [f32],
) {
    let (d, blocks) = (g.d, g.t.div_ceil(BLOCK));
    let (dq, dkv) = grads.split_at_mut(g.t * d);
    let (dk, dv) = dkv.split_at_mut(g.t * d);
    let mut p = vec![0f32; BLOCK * BLOCK];
    let mut ds = vec![0f32; BLOCK * BLOCK];
    for key_block in 0..blocks {
        let (keys_first, keys) = g.block(key_block);
        let dk = &mut dk[keys_first * d..(keys_first + keys) * d];
        let dv = &mut dv[keys_first * d..(keys_first + keys) * d];
        for query_block in key_block..blocks {
            let (first, rows) = g.block(query_block);
            let tile = Tile {
                first,
                rows,
                keys_first,
                keys,
            };
            tile.weights_and_grads(g, [qkv, dy], lse, dots, b, h, &mut p, &mut ds);
            let later = query_block > key_block;
            product(
                dv,
                (keys, d, rows),
                transposed(local(&p, keys)),
                g.out(dy, b, first, h),
                later,
            );
            product(
                dk,
                (keys, d, rows),
                transposed(local(&ds, keys)),
                g.qkv(qkv, b, first, 0, h),
                later,
            );
            product(
                &mut dq[first * d..(first + rows) * d],
                (rows, d, keys),
                local(&ds, keys),
                g.qkv(qkv, b, keys_first, 1, h),
                key_block > 0,
            );
        }
    }
}

/// One block of scores: queries `first..first + rows` against keys `keys_first..+ keys`.
struct Tile {
    first: usize,
    rows: usize,
    keys_first: usize,
    keys: usize,
}

impl Tile {
    /// The weights `p = exp(score·scale − lse)` (0 where masked) and `ds = p ∘ (dy·vᵀ − D)`,
    /// each `rows × keys`, row-major.
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    fn weights_and_grads(
        &self,
        g: &Geometry,
        [qkv, dy]: [&[f32]; 2],
        lse: &[f32],
        dots: &[f32],
        b: usize,
        h: usize,
        p: &mut [f32],
        ds: &mut [f32],
    ) {
        let (rows, keys, d) = (self.rows, self.keys, g.d);
        let q = g.qkv(qkv, b, self.first, 0, h);
        let k = g.qkv(qkv, b, self.keys_first, 1, h);
        let v = g.qkv(qkv, b, self.keys_first, 2, h);
        product(p, (rows, keys, d), q, transposed(k), false);
        product(ds, (rows, keys, d), g.out(dy, b, self.first, h), transposed(v), false);
        let mut factors = [0f32; BLOCK];
        for r in 0..rows {
            let i = self.first + r;
            let seen = (i + 1).saturating_sub(self.keys_first).min(keys);
            let (row_lse, dot) = (lse[g.row(b, h, i)], dots[(b * g.t + i) * g.heads + h]);
            let (p, ds) = (&mut p[r * keys..(r + 1) * keys], &mut ds[r * keys..(r + 1) * keys]);
            let factors = &mut factors[..seen];
            g.dropout_factors(b, h, i, self.keys_first, factors);
            // Dropped, a weight's gradient is its dropped gradient's times its factor, and it
            // reaches the values dropped: `p` leaves as the dropped weights (1: as they were).
            for ((p, ds), &f) in p[..seen].iter_mut().zip(ds[..seen].iter_mut()).zip(factors.iter()) {
                let x = *p * g.scale - row_lse;
                // Rounding may leave the row's largest score a hair above its lse.
                let weight = exp_nonpositive(if x > 0.0 { 0.0 } else { x });
                *ds = weight * (*ds * f - dot);
                *p = weight * f;
            }
            p[seen..].fill(0.0);
            ds[seen..].fill(0.0);
        }
    }
}
