//! Dropout with its mask drawn from the counter stream (16 Philox blocks at a time in SIMD
//! lanes, `philox_lanes`; compared as integers), since the mask is drawn again for the
//! gradient. Generic over how an element is scaled, so bf16 and f16 are read and written
//! directly instead of through f32 copies.

use rayon::prelude::*;

use super::philox_lanes::stream_words;
use super::pool::Pool;
use super::simd::{Kernel, wide};
use crate::backend::DropoutDraw;
use crate::dtype::Element;
use crate::rng::keep_threshold;

/// A dropout draw as the fused kernels apply it (attention's weights, `causal_softmax`): the
/// stream, the integer keep threshold, the kept elements' factor `1 / (1 - p)`.
#[derive(Clone, Copy)]
pub(super) struct KeepMask {
    seed: u64,
    counter: u64,
    threshold: u32,
    keep: f32,
}

impl KeepMask {
    pub fn of(draw: Option<DropoutDraw>) -> Option<KeepMask> {
        draw.map(|d| KeepMask {
            seed: d.seed,
            counter: d.counter,
            threshold: keep_threshold(d.p),
            keep: d.keep_factor(),
        })
    }

    /// The stream's words for elements `first ..` into `words`.
    #[inline(always)]
    pub fn words(&self, first: usize, words: &mut [u32]) {
        stream_words(self.seed, self.counter, first, words);
    }

    /// An element's factor from its word: `1 / (1 - p)` where kept, else 0.
    #[inline(always)]
    pub fn factor(&self, word: u32) -> f32 {
        if word >> 8 >= self.threshold { self.keep } else { 0.0 }
    }
}

/// Elements per parallel task.
const CHUNK: usize = 4096;

/// `apply(x, kept)` for every element, `kept` when the stream's uniform is at least `p`; `apply`
/// gives `x / (1 - p)` or `x * 0` (NaN stays NaN).
pub fn dropout<T: Element + Copy + Send + Sync>(
    pool: &Pool,
    src: &[T],
    p: f64,
    seed: u64,
    counter: u64,
    apply: impl Fn(T, bool) -> T + Sync + Copy,
) -> Vec<T> {
    let threshold = keep_threshold(p);
    let mut out = pool.take::<T>(src.len());
    out.par_chunks_mut(CHUNK)
        .zip(src.par_chunks(CHUNK))
        .enumerate()
        .for_each(|(c, (o, x))| {
            let mut words = [0u32; CHUNK];
            let words = &mut words[..x.len()];
            wide(Chunk(o, x, words, (seed, counter, c * CHUNK), threshold, apply));
        });
    out
}

/// One chunk: its words of the stream (from element `first` of (seed, counter)), then
/// `apply(x, kept)`; run by `simd::wide`.
// `apply` by value: its captures are then locals, where through a reference they were loaded
// again for every element (they might have aliased the output), which kept the loop scalar.
struct Chunk<'a, T, F>(&'a mut [T], &'a [T], &'a mut [u32], (u64, u64, usize), u32, F);
impl<T: Copy, F: Fn(T, bool) -> T> Kernel for Chunk<'_, T, F> {
    type Out = ();
    #[inline(always)]
    fn run(self) {
        let Chunk(o, x, words, (seed, counter, first), threshold, apply) = self;
        stream_words(seed, counter, first, words);
        let n = o.len();
        let (x, words) = (&x[..n], &words[..n]);
        for (i, o) in o.iter_mut().enumerate() {
            *o = apply(x[i], words[i] >> 8 >= threshold);
        }
    }
}
