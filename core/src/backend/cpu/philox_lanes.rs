//! The counter stream's words (`rng::stream_words`) with sixteen Philox blocks to an AVX-512
//! register: each round's 32x32 → 64-bit products on `vpmuludq`, once for the even and once for
//! the odd lanes, blended back into words, two registers' blocks in flight to hide the
//! multiplies' latency. From the portable lanes the compiler widened every word to 64 bits and
//! narrowed it back, 2.3x slower; dropout draws its mask twice (forward and backward), and the
//! fused attention a word per weight, which made Philox 4-8% of a gpt-char step.

/// `rng::stream_words`: the words of (seed, counter)'s stream for elements `first ..`, the
/// same bits on every CPU.
#[inline(always)]
pub fn stream_words(seed: u64, counter: u64, first: usize, out: &mut [u32]) {
    #[cfg(target_arch = "x86_64")]
    if super::simd::has_avx512() {
        // SAFETY: the CPU has AVX-512F.
        unsafe { avx512::stream_words(seed, counter, first, out) };
        return;
    }
    crate::rng::stream_words(seed, counter, first, out)
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use std::arch::x86_64::*;

    use crate::rng::{PHILOX_M0, PHILOX_M1, PHILOX_W0, PHILOX_W1};

    /// Philox blocks a register holds, and their words.
    const LANES: usize = 16;
    const WORDS: usize = 4 * LANES;

    /// As `super::stream_words`.
    ///
    /// # Safety
    /// The CPU must have AVX-512F.
    #[target_feature(enable = "avx512f")]
    pub unsafe fn stream_words(seed: u64, counter: u64, first: usize, out: &mut [u32]) {
        let end = first + out.len();
        // Whether the `registers` from `base` lie wholly inside `out`.
        let inside = |base: usize, registers: usize| base >= first && base + registers * WORDS <= end;
        let mut block = first / 4;
        while block * 4 < end {
            let base = block * 4;
            let start = counter.wrapping_add(block as u64);
            if inside(base, 2) {
                let [a, b] = blocks::<2>(seed, start);
                interleave(a, register_at(out, base - first));
                interleave(b, register_at(out, base - first + WORDS));
                block += 2 * LANES;
            } else if inside(base, 1) {
                interleave(blocks::<1>(seed, start)[0], register_at(out, base - first));
                block += LANES;
            } else {
                // The stream's ends: a whole register of blocks, the part inside `out` kept.
                let mut words = [0u32; WORDS];
                interleave(blocks::<1>(seed, start)[0], &mut words);
                let (from, to) = (base.max(first), (base + WORDS).min(end));
                out[from - first..to - first].copy_from_slice(&words[from - base..to - base]);
                block += LANES;
            }
        }
    }

    /// The register's worth of `out` from `at`, which the caller found inside it.
    fn register_at(out: &mut [u32], at: usize) -> &mut [u32; WORDS] {
        (&mut out[at..at + WORDS]).try_into().expect("a slice of WORDS words")
    }

    /// Philox4x32-10 for the `16 · G` consecutive counters from `start` (wrapping past 2^64 as
    /// `rng::philox4x32_lanes` does): group `g`'s word `w` of counter `start + 16g + l` in lane
    /// `l` of its register `w`.
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn blocks<const G: usize>(key: u64, start: u64) -> [[__m512i; 4]; G] {
        let lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
        let one = _mm512_set1_epi32(1);
        let mut state = [[_mm512_setzero_si512(); 4]; G];
        for (g, s) in state.iter_mut().enumerate() {
            let first = start.wrapping_add((g * LANES) as u64);
            let first_low = _mm512_set1_epi32(first as u32 as i32);
            let low = _mm512_add_epi32(first_low, lane);
            // The high word takes a carry where the low one wrapped.
            let carried = _mm512_cmplt_epu32_mask(low, first_low);
            let high = _mm512_set1_epi32((first >> 32) as u32 as i32);
            s[0] = low;
            s[1] = _mm512_mask_add_epi32(high, carried, high, one);
        }
        let (m0, m1) = (_mm512_set1_epi64(PHILOX_M0 as i64), _mm512_set1_epi64(PHILOX_M1 as i64));
        let (mut k0, mut k1) = (key as u32, (key >> 32) as u32);
        for _ in 0..10 {
            let (key0, key1) = (_mm512_set1_epi32(k0 as i32), _mm512_set1_epi32(k1 as i32));
            for s in state.iter_mut() {
                let [c0, c1, c2, c3] = *s;
                let (high0, low0) = products(c0, m0);
                let (high1, low1) = products(c2, m1);
                // 0x96: the three operands' exclusive or.
                *s = [
                    _mm512_ternarylogic_epi32::<0x96>(high1, c1, key0),
                    low1,
                    _mm512_ternarylogic_epi32::<0x96>(high0, c3, key1),
                    low0,
                ];
            }
            k0 = k0.wrapping_add(PHILOX_W0);
            k1 = k1.wrapping_add(PHILOX_W1);
        }
        state
    }

    /// Each lane's word times the multiplier `m` (in each 64-bit half): the products' high and low
    /// words, lane for lane.
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn products(words: __m512i, m: __m512i) -> (__m512i, __m512i) {
        const ODD: __mmask16 = 0xAAAA;
        let even = _mm512_mul_epu32(words, m);
        let odd = _mm512_mul_epu32(_mm512_srli_epi64::<32>(words), m);
        let high = _mm512_mask_blend_epi32(ODD, _mm512_srli_epi64::<32>(even), odd);
        let low = _mm512_mask_blend_epi32(ODD, even, _mm512_slli_epi64::<32>(odd));
        (high, low)
    }

    /// Four registers of words (`w[k]`'s lane `l`: word `k` of block `l`) in the stream's order,
    /// block by block: `out[4l + k] = w[k][l]`.
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn interleave([w0, w1, w2, w3]: [__m512i; 4], out: &mut [u32; WORDS]) {
        // Within each 128-bit quarter q, lanes 4q .. 4q+3: first the words of lanes 4q+r paired,
        // then whole blocks, block 4q+r in quarter q of register r.
        let (a, b) = (_mm512_unpacklo_epi32(w0, w1), _mm512_unpackhi_epi32(w0, w1));
        let (c, d) = (_mm512_unpacklo_epi32(w2, w3), _mm512_unpackhi_epi32(w2, w3));
        let (r0, r1) = (_mm512_unpacklo_epi64(a, c), _mm512_unpackhi_epi64(a, c));
        let (r2, r3) = (_mm512_unpacklo_epi64(b, d), _mm512_unpackhi_epi64(b, d));
        // Then the quarters gathered: output register q holds blocks 4q .. 4q+3, quarter q of
        // r0, r1, r2 and r3.
        let t0 = _mm512_shuffle_i32x4::<0b01_00_01_00>(r0, r1);
        let t1 = _mm512_shuffle_i32x4::<0b01_00_01_00>(r2, r3);
        let t2 = _mm512_shuffle_i32x4::<0b11_10_11_10>(r0, r1);
        let t3 = _mm512_shuffle_i32x4::<0b11_10_11_10>(r2, r3);
        let ordered = [
            _mm512_shuffle_i32x4::<0b10_00_10_00>(t0, t1),
            _mm512_shuffle_i32x4::<0b11_01_11_01>(t0, t1),
            _mm512_shuffle_i32x4::<0b10_00_10_00>(t2, t3),
            _mm512_shuffle_i32x4::<0b11_01_11_01>(t2, t3),
        ];
        for (q, v) in ordered.into_iter().enumerate() {
            // SAFETY: `out` holds 4 registers' worth of u32 (64), and register q is stored at
            // its 16 · q-th element; unaligned stores.
            unsafe { _mm512_storeu_si512(out.as_mut_ptr().add(q * LANES).cast(), v) };
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_streams_words_from_any_start_and_length_across_carries() {
        if !super::super::simd::has_avx512() {
            eprintln!("NOTE: no AVX-512 on this CPU: the portable stream is compared with itself");
        }
        let seed = 0x1234_5678_9abc_def0;
        for counter in [0, 7, u32::MAX as u64 - 40, u64::MAX - 70] {
            for (first, len) in [
                (0, 64),
                (0, 128),
                (0, 4096),
                (3, 1),
                (5, 130),
                (66, 64),
                (255, 257),
                (1000, 3001),
            ] {
                let mut fast = vec![0; len];
                let mut portable = vec![1; len];
                super::stream_words(seed, counter, first, &mut fast);
                crate::rng::stream_words(seed, counter, first, &mut portable);
                assert_eq!(fast, portable, "counter {counter:#x}, elements {first} + {len}");
            }
        }
    }
}
