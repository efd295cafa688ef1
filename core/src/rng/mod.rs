//! Seeded random numbers that every backend reproduces exactly: Philox4x32-10 (Salmon et al.,
//! "Parallel random numbers: as easy as 1, 2, 3"), a counter-based generator whose output for
//! counter c depends only on (key, c), so a GPU thread computes element i without any state.

use std::sync::Mutex;

mod batch_window;
pub(crate) mod replay;

pub(crate) use batch_window::StreamPlace;
/// Data parallel's place of a replica's samples in the global batch; for tests that drive
/// replicas by hand.
#[doc(hidden)]
pub use batch_window::{BatchWindow, BatchWindowGuard};

pub(crate) const PHILOX_M0: u32 = 0xD251_1F53;
pub(crate) const PHILOX_M1: u32 = 0xCD9E_8D57;
pub(crate) const PHILOX_W0: u32 = 0x9E37_79B9;
pub(crate) const PHILOX_W1: u32 = 0xBB67_AE85;

/// Four 32-bit random words for (key, counter).
pub(crate) fn philox4x32(key: u64, counter: u64) -> [u32; 4] {
    let mut k = [key as u32, (key >> 32) as u32];
    let mut c = [counter as u32, (counter >> 32) as u32, 0, 0];
    for _ in 0..10 {
        let p0 = PHILOX_M0 as u64 * c[0] as u64;
        let p1 = PHILOX_M1 as u64 * c[2] as u64;
        c = [
            (p1 >> 32) as u32 ^ c[1] ^ k[0],
            p1 as u32,
            (p0 >> 32) as u32 ^ c[3] ^ k[1],
            p0 as u32,
        ];
        k = [k[0].wrapping_add(PHILOX_W0), k[1].wrapping_add(PHILOX_W1)];
    }
    c
}

/// `philox4x32` for the `N` consecutive counters from `first`, as four words of `N` lanes
/// (`out[w][l]` is word `w` of counter `first + l`): the same arithmetic laid out so the compiler
/// runs the lanes in SIMD registers, several times faster than `N` scalar calls.
#[inline(always)]
pub(crate) fn philox4x32_lanes<const N: usize>(key: u64, first: u64) -> [[u32; N]; 4] {
    let (mut k0, mut k1) = (key as u32, (key >> 32) as u32);
    let counters: [u64; N] = std::array::from_fn(|l| first.wrapping_add(l as u64));
    let mut c0: [u32; N] = counters.map(|c| c as u32);
    let mut c1: [u32; N] = counters.map(|c| (c >> 32) as u32);
    let (mut c2, mut c3) = ([0u32; N], [0u32; N]);
    for _ in 0..10 {
        for l in 0..N {
            let p0 = PHILOX_M0 as u64 * c0[l] as u64;
            let p1 = PHILOX_M1 as u64 * c2[l] as u64;
            let next = [
                (p1 >> 32) as u32 ^ c1[l] ^ k0,
                p1 as u32,
                (p0 >> 32) as u32 ^ c3[l] ^ k1,
                p0 as u32,
            ];
            (c0[l], c1[l], c2[l], c3[l]) = (next[0], next[1], next[2], next[3]);
        }
        k0 = k0.wrapping_add(PHILOX_W0);
        k1 = k1.wrapping_add(PHILOX_W1);
    }
    [c0, c1, c2, c3]
}

/// Philox blocks `stream_words` computes together, in SIMD lanes.
const STREAM_LANES: usize = 16;

/// Words of the uniform stream for elements `first .. first + out.len()` (element `e` is word
/// `e % 4` of block `counter + e / 4`), computed 16 blocks at a time in SIMD lanes. Kernels that
/// draw only part of a tensor's stream (dropout on the positions a causal query sees) start
/// anywhere in it.
#[inline(always)]
pub(crate) fn stream_words(seed: u64, counter: u64, first: usize, out: &mut [u32]) {
    let end = first + out.len();
    let mut block = first / 4;
    while block * 4 < end {
        let words = philox4x32_lanes::<STREAM_LANES>(seed, counter.wrapping_add(block as u64));
        let base = block * 4;
        if base >= first && base + 4 * STREAM_LANES <= end {
            // A whole group: a fixed-size transpose the compiler unrolls.
            let group = &mut out[base - first..base - first + 4 * STREAM_LANES];
            for (l, quad) in group.chunks_exact_mut(4).enumerate() {
                quad.iter_mut().zip(&words).for_each(|(o, w)| *o = w[l]);
            }
        } else {
            for e in base.max(first)..(base + 4 * STREAM_LANES).min(end) {
                let k = e - base;
                out[e - first] = words[k % 4][k / 4];
            }
        }
        block += STREAM_LANES;
    }
}

/// Dropout's test `unit_float(word) as f32 >= p as f32` in integers: kept when `word >> 8` is
/// at least this. Exact, since both sides are scaled by 2^24 (`unit_float` has 24 bits).
pub(crate) fn keep_threshold(p: f64) -> u32 {
    ((p as f32) as f64 * 16_777_216.0).ceil() as u32
}

/// A 32-bit word to a float in [0, 1) with 24 random bits (exact in f32).
pub(crate) fn unit_float(word: u32) -> f64 {
    (word >> 8) as f64 * (1.0 / 16_777_216.0)
}

/// Element `i` of the uniform stream for (seed, counter): word `i % 4` of block `counter + i / 4`.
pub fn uniform_at(seed: u64, counter: u64, i: usize) -> f64 {
    uniform_block(seed, counter, (i / 4) as u64)[i % 4]
}

/// Element `i` of the normal stream: Box–Muller on words (0,1) or (2,3) of block `counter + i / 4`.
pub fn normal_at(seed: u64, counter: u64, i: usize) -> f64 {
    normal_block(seed, counter, (i / 4) as u64)[i % 4]
}

/// Elements `4·block … 4·block + 3` of the uniform stream, from one Philox call.
pub(crate) fn uniform_block(seed: u64, counter: u64, block: u64) -> [f64; 4] {
    philox4x32(seed, counter + block).map(unit_float)
}

/// Elements `4·block … 4·block + 3` of the normal stream: Box–Muller on words (0,1) and (2,3).
pub(crate) fn normal_block(seed: u64, counter: u64, block: u64) -> [f64; 4] {
    let w = philox4x32(seed, counter + block);
    let mut out = [0.0; 4];
    for pair in [0, 2] {
        // 1 - u keeps the logarithm's argument in (0, 1].
        let u1 = 1.0 - unit_float(w[pair]);
        let u2 = unit_float(w[pair + 1]);
        let radius = (-2.0 * u1.ln()).sqrt();
        let angle = 2.0 * std::f64::consts::PI * u2;
        out[pair] = radius * angle.cos();
        out[pair + 1] = radius * angle.sin();
    }
    out
}

/// A seeded stream. Each draw of n values consumes `n.div_ceil(4)` counters, so the sequence of
/// draws, not the device, determines the values. Its state is two integers, easy to checkpoint.
#[derive(Debug)]
pub struct Generator {
    /// (seed, counter), together so that adopting another stream's state is one change.
    state: Mutex<(u64, u64)>,
}

impl Generator {
    /// A stream for `seed`, at its start (counter 0).
    pub fn new(seed: u64) -> Self {
        Generator::from_state(seed, 0)
    }
    /// A stream resumed at a saved `state()`: the next draw continues exactly where that one stopped.
    pub fn from_state(seed: u64, counter: u64) -> Self {
        Generator {
            state: Mutex::new((seed, counter)),
        }
    }
    fn lock(&self) -> std::sync::MutexGuard<'_, (u64, u64)> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
    /// The Philox key the stream draws with.
    pub fn seed(&self) -> u64 {
        self.lock().0
    }
    /// (seed, counter): restoring it with `from_state` replays the same future draws.
    pub fn state(&self) -> (u64, u64) {
        *self.lock()
    }
    /// Puts the stream at a saved `state()`, its seed included: a checkpoint's stream on resume,
    /// or rank 0's on a data-parallel replica, whatever seed the stream was made with.
    pub fn restore(&self, seed: u64, counter: u64) {
        *self.lock() = (seed, counter);
    }
    /// Reserves the counters for `len` values and returns the first (inside a checkpoint's
    /// recompute: the counter the same draw took in the first forward).
    pub fn advance(&self, len: usize) -> u64 {
        replay::draw(self, len, || {
            let mut state = self.lock();
            let start = state.1;
            state.1 += len.div_ceil(4) as u64;
            start
        })
    }
    /// A host-side uniform integer in `[0, bound)` (for shuffles), from the same stream.
    pub fn next_below(&self, bound: u64) -> u64 {
        let c = self.advance(4);
        let w = philox4x32(self.seed(), c);
        let x = ((w[0] as u64) << 32) | w[1] as u64;
        ((x as u128 * bound as u128) >> 64) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn philox_matches_the_published_known_answer() {
        // Random123's kat_vectors: philox4x32_10 with counter = key = 0.
        assert_eq!(philox4x32(0, 0), [0x6627_e8d5, 0xe169_c58d, 0xbc57_ac4c, 0x9b00_dbd8]);
    }

    #[test]
    fn stream_words_from_any_start_are_the_uniform_streams_words() {
        let (seed, counter) = (11, u32::MAX as u64 - 9);
        for (first, len) in [(0, 70), (3, 1), (5, 130), (66, 64), (255, 257)] {
            let mut out = vec![0; len];
            stream_words(seed, counter, first, &mut out);
            for (k, &w) in out.iter().enumerate() {
                let e = first + k;
                assert_eq!(w, philox4x32(seed, counter + (e / 4) as u64)[e % 4], "element {e}");
            }
        }
    }

    #[test]
    fn the_integer_keep_test_is_the_float_one() {
        for p in [0.1, 0.2, 0.25, 0.3, 0.5, 1.0 / 3.0, 0.9, 1e-7] {
            let threshold = keep_threshold(p);
            // Words on both sides of the threshold, and a spread of others.
            let near = [threshold.saturating_sub(1), threshold, threshold + 1].map(|v| v << 8);
            for word in near
                .into_iter()
                .chain((0..4096u32).map(|i| i.wrapping_mul(0x9E37_79B9)))
            {
                let by_float = unit_float(word) as f32 >= p as f32;
                assert_eq!(word >> 8 >= threshold, by_float, "p {p}, word {word:#x}");
            }
        }
    }

    #[test]
    fn lanes_give_the_scalar_words_of_consecutive_counters_across_a_32_bit_carry() {
        let first = u32::MAX as u64 - 5;
        let lanes = philox4x32_lanes::<16>(0x1234_5678_9abc_def0, first);
        let lane = |l: usize| -> [u32; 4] { std::array::from_fn(|w| lanes[w][l]) };
        for l in 0..16 {
            let scalar = philox4x32(0x1234_5678_9abc_def0, first + l as u64);
            assert_eq!(lane(l), scalar, "lane {l}");
        }
    }

    #[test]
    fn uniform_and_normal_have_the_right_moments() {
        let n = 40_000;
        let u: Vec<f64> = (0..n).map(|i| uniform_at(7, 3, i)).collect();
        let mean = u.iter().sum::<f64>() / n as f64;
        assert!((mean - 0.5).abs() < 0.01, "{mean}");
        assert!(u.iter().all(|&x| (0.0..1.0).contains(&x)));
        let z: Vec<f64> = (0..n).map(|i| normal_at(7, 3, i)).collect();
        let m = z.iter().sum::<f64>() / n as f64;
        let var = z.iter().map(|x| (x - m) * (x - m)).sum::<f64>() / n as f64;
        assert!(m.abs() < 0.02 && (var - 1.0).abs() < 0.03, "{m} {var}");
    }
}
