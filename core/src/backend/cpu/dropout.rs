//! Dropout with its mask drawn from the counter stream: Philox blocks computed 16 at a time
//! (64 elements) in SIMD lanes, since the mask is drawn again for the gradient.

use rayon::prelude::*;

use super::float::CpuFloat;
use super::pool::Pool;
use crate::rng::{philox4x32_lanes, unit_float};

/// Philox blocks per lane group.
const LANES: usize = 16;

/// `x / (1 - p)` where the stream's uniform is at least `p`, else `x * 0` (NaN stays NaN).
pub fn dropout<T: CpuFloat>(pool: &Pool, src: &[T], p: f64, seed: u64, counter: u64) -> Vec<T> {
    const CHUNK: usize = 4096; // a multiple of 4 * LANES: chunks start on group boundaries
    let (scale, threshold) = (T::of(1.0 / (1.0 - p)), p as f32);
    let mut out = pool.take::<T>(src.len());
    out.par_chunks_mut(CHUNK)
        .zip(src.par_chunks(CHUNK))
        .enumerate()
        .for_each(|(c, (o, x))| {
            let first = counter.wrapping_add((c * CHUNK / 4) as u64);
            for (g, (o, x)) in o.chunks_mut(4 * LANES).zip(x.chunks(4 * LANES)).enumerate() {
                let words = philox4x32_lanes::<LANES>(seed, first.wrapping_add((g * LANES) as u64));
                for (j, (o, &x)) in o.iter_mut().zip(x).enumerate() {
                    let kept = unit_float(words[j % 4][j / 4]) as f32 >= threshold;
                    *o = x * if kept { scale } else { T::zero() };
                }
            }
        });
    out
}
