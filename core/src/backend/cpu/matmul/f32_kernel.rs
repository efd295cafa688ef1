//! An AVX-512 f32 micro-kernel for sums made of pieces (`conv::positions`): `MR` broadcast rows
//! by `NR` vector lanes, 24 accumulators in registers, one fused multiply-add per row and
//! register for each term. The `gemm` crate's kernels run every other f32 product.

use std::arch::x86_64::*;

use super::bf16_kernel::{MR, NR};

/// Whether this CPU runs the kernel.
pub fn available() -> bool {
    is_x86_feature_detected!("avx512f")
}

/// `out[r][c] = sum over pieces i, terms t of strip_i[t·MR + r] · panel_i[t·stride + c]` for
/// the first `rows` rows, `pieces(i)` giving piece `i`'s strip and panel, each `terms` long, on
/// the smallest of the 12-, 8- and 4-row tiles that covers `rows`; later rows of `out` are
/// left as they were.
///
/// # Safety
/// The CPU must have AVX512F; each strip must hold `terms · MR` values and each panel `NR`
/// values at each of `terms` offsets `stride` apart; `rows <= MR`.
pub unsafe fn tile(
    rows: usize,
    segments: usize,
    pieces: impl Fn(usize) -> (*const f32, *const f32),
    terms: usize,
    stride: usize,
    out: &mut [[f32; NR]; MR],
) {
    // SAFETY: the caller's promises; each tile height is at most MR and covers `rows`.
    unsafe {
        match rows {
            9.. => tile_segments::<MR>(segments, pieces, terms, stride, out),
            5..=8 => tile_segments::<8>(segments, pieces, terms, stride, out),
            _ => tile_segments::<4>(segments, pieces, terms, stride, out),
        }
    }
}

/// `tile` on a tile of `ROWS` rows.
///
/// # Safety
/// As for `tile`, with `ROWS <= MR`.
#[target_feature(enable = "avx512f")]
unsafe fn tile_segments<const ROWS: usize>(
    segments: usize,
    pieces: impl Fn(usize) -> (*const f32, *const f32),
    terms: usize,
    stride: usize,
    out: &mut [[f32; NR]; MR],
) {
    let mut acc = [[_mm512_setzero_ps(); 2]; ROWS];
    for segment in 0..segments {
        let (strip, panel) = pieces(segment);
        for t in 0..terms {
            // SAFETY: t < terms, so the panel's NR values at offset t·stride and the strip's
            // MR values at t·MR lie within what the caller guarantees.
            unsafe {
                let lanes = panel.add(t * stride);
                let (lo, hi) = (_mm512_loadu_ps(lanes), _mm512_loadu_ps(lanes.add(16)));
                for (r, acc) in acc.iter_mut().enumerate() {
                    let a = _mm512_set1_ps(*strip.add(t * MR + r));
                    acc[0] = _mm512_fmadd_ps(a, lo, acc[0]);
                    acc[1] = _mm512_fmadd_ps(a, hi, acc[1]);
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
