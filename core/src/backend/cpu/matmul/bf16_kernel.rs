//! The AVX512-BF16 micro-kernel: `vdpbf16ps` multiplies 16 pairs of bf16 and adds both products
//! to 16 f32 accumulators, so one instruction does 32 multiply-adds, twice an f32 FMA's.
//!
//! A tile is `MR` broadcast rows by `NR` vector columns, all `MR * NR / 16` accumulators in
//! registers for the whole sum. Operands arrive as bf16 pairs along k packed in a `u32` (the
//! lower half is the even k): the vector side as panels of `NR` pairs per k-pair (`Panel`:
//! packed, or loaded from an image as the sum goes), the broadcast side as rows of pairs read in
//! place or as packed strips (`Strip`).

use std::arch::x86_64::*;

/// Vector columns per tile: two registers of 16 lanes.
pub const NR: usize = 32;
/// Broadcast rows per tile: 12 x 2 accumulators leave registers for the operands.
pub const MR: usize = 12;

/// Whether this CPU runs the kernel (checked once per product; the check is cached by std).
pub fn available() -> bool {
    is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("avx512bw")
        && is_x86_feature_detected!("avx512bf16")
}

/// Where a tile's `MR` broadcast rows of k-pairs are read from.
pub trait Strip {
    /// Pair `p` of row `r` (`r < MR`), as the kernel broadcasts it.
    ///
    /// # Safety
    /// `p` is below the pair count the strip was made for.
    unsafe fn pair(&self, r: usize, p: usize) -> i32;
}

impl<S: Strip> Strip for &S {
    #[inline(always)]
    unsafe fn pair(&self, r: usize, p: usize) -> i32 {
        // SAFETY: the caller's promise, passed on.
        unsafe { (**self).pair(r, p) }
    }
}

/// Rows read in place: row `r`'s pairs run from its own pointer.
pub struct RowPointers(pub [*const u32; MR]);
impl Strip for RowPointers {
    #[inline(always)]
    unsafe fn pair(&self, r: usize, p: usize) -> i32 {
        // SAFETY: the caller's promise; each row holds its pairs (unaligned reads).
        unsafe { self.0[r].add(p).read_unaligned() as i32 }
    }
}

/// A packed strip: the `MR` rows' pairs for one k-pair side by side, `strip[p * MR + r]`, so
/// the kernel reads one stream.
pub struct Interleaved(pub *const u32);
impl Strip for Interleaved {
    #[inline(always)]
    unsafe fn pair(&self, r: usize, p: usize) -> i32 {
        // SAFETY: the caller's promise; the packed strip holds `pairs * MR` words.
        unsafe { self.0.add(p * MR + r).read() as i32 }
    }
}

/// Where a tile's `NR` vector columns of k-pairs are read from.
pub trait Panel {
    /// Pair `p` of columns `0..16` and `16..32`, as the kernel multiplies them.
    ///
    /// # Safety
    /// The CPU has what `available()` checks; `p` is below the pair count the panel was made for.
    unsafe fn pairs(&self, p: usize) -> (__m512i, __m512i);
}

impl<P: Panel> Panel for &P {
    #[inline(always)]
    unsafe fn pairs(&self, p: usize) -> (__m512i, __m512i) {
        // SAFETY: the caller's promise, passed on.
        unsafe { (**self).pairs(p) }
    }
}

/// A panel whose pairs lie `stride` words apart: `panel[p * stride + c]`, pair `p` of column
/// `c` (a convolution's input interleaved channel pair by channel pair, `conv::positions`).
pub struct StridedPanel {
    pub first: *const u32,
    pub stride: usize,
}
impl Panel for StridedPanel {
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn pairs(&self, p: usize) -> (__m512i, __m512i) {
        // SAFETY: the caller's promise; each of the `pairs` pairs holds NR words.
        unsafe {
            let at = self.first.add(p * self.stride);
            (_mm512_loadu_si512(at.cast()), _mm512_loadu_si512(at.add(16).cast()))
        }
    }
}

/// A packed panel: `panel[p * NR + c]`, pair `p` of column `c`.
pub struct Packed(pub *const u32);
impl Panel for Packed {
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn pairs(&self, p: usize) -> (__m512i, __m512i) {
        // SAFETY: the caller's promise; the panel holds `pairs * NR` words.
        unsafe {
            (
                _mm512_loadu_si512(self.0.add(p * NR).cast()),
                _mm512_loadu_si512(self.0.add(p * NR + 16).cast()),
            )
        }
    }
}

/// `out[r][c] = sum over pieces i, pairs p of pair_i(r, p) . panel_i[p][c]` for the first
/// `rows` rows, `pieces(i)` giving piece `i`'s strip and panel (a convolution's tile skips the
/// taps that read only padding; a plain product is one piece). It runs on the smallest of the
/// 12-, 8- and 4-row tiles that covers `rows` (a 64-row side in strips of 12 spent a ninth of
/// its multiply-adds on rows past the end); later rows of `out` are left as they were.
///
/// # Safety
/// The CPU must have what `available()` checks; each piece's strip and panel must hold `pairs`
/// pairs for each of their rows and columns; `rows <= MR`.
pub unsafe fn tile<S: Strip, P: Panel>(
    rows: usize,
    segments: usize,
    pieces: impl Fn(usize) -> (S, P),
    pairs: usize,
    out: &mut [[f32; NR]; MR],
) {
    // SAFETY: the caller's promises; each tile height is at most MR and covers `rows`.
    unsafe {
        match rows {
            9.. => tile_segments::<_, _, MR>(segments, pieces, pairs, out),
            5..=8 => tile_segments::<_, _, 8>(segments, pieces, pairs, out),
            _ => tile_segments::<_, _, 4>(segments, pieces, pairs, out),
        }
    }
}

/// `tile` on a tile of `ROWS` rows, all pieces into the same accumulators.
///
/// # Safety
/// As for `tile`, with `ROWS <= MR`.
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
unsafe fn tile_segments<S: Strip, P: Panel, const ROWS: usize>(
    segments: usize,
    pieces: impl Fn(usize) -> (S, P),
    pairs: usize,
    out: &mut [[f32; NR]; MR],
) {
    let mut acc = [[_mm512_setzero_ps(); 2]; ROWS];
    for segment in 0..segments {
        let (strip, panel) = pieces(segment);
        for p in 0..pairs {
            // SAFETY: p < pairs, so the panel's two registers for pair p and each row's pair p
            // are within the extents the caller guarantees.
            unsafe {
                let (lo, hi) = panel.pairs(p);
                let (lo, hi) = (as_pairs(lo), as_pairs(hi));
                for (r, acc) in acc.iter_mut().enumerate() {
                    let a = as_pairs(_mm512_set1_epi32(strip.pair(r, p)));
                    acc[0] = _mm512_dpbf16_ps(acc[0], a, lo);
                    acc[1] = _mm512_dpbf16_ps(acc[1], a, hi);
                }
            }
        }
    }
    for r in 0..ROWS {
        // SAFETY: each row of `out` holds NR = 32 f32, two registers' worth.
        unsafe {
            _mm512_storeu_ps(out[r].as_mut_ptr(), acc[r][0]);
            _mm512_storeu_ps(out[r].as_mut_ptr().add(16), acc[r][1]);
        }
    }
}

/// The same 512 bits seen as 32 bf16 (std has no cast intrinsic for `__m512bh`).
#[target_feature(enable = "avx512f,avx512bf16")]
fn as_pairs(x: __m512i) -> __m512bh {
    // SAFETY: both are plain 64-byte vectors with no invalid bit patterns.
    unsafe { std::mem::transmute::<__m512i, __m512bh>(x) }
}
