//! bf16 products on AMX tiles (Sapphire Rapids and later): `tdpbf16ps` multiplies a 16x32 bf16
//! tile by a 32x16 one into 16x16 f32 accumulators, 8192 multiply-adds an instruction — about
//! 1 TFLOP/s on one core of a Xeon VM, against its AVX-512 f32 FMAs' 130 GFLOP/s.
//!
//! Both operands are packed into zero-padded k-pair words (`bf16::join`: the even k in the lower
//! half), so the kernel has no edges: the left side as strips of 32 rows of `pairs` words, the
//! right as `bf16::pack_panels`' panels of 32 columns. A tile of 32x32 outputs holds four
//! accumulator tiles, loads two tiles of each side per 16 k-pairs and multiplies each pair of
//! them (all 8 tile registers). The output is written by the dot-product kernel's `Output`.

use std::arch::asm;
use std::sync::OnceLock;

use rayon::prelude::*;

use super::super::pool::Pool;
use super::super::simd::{Kernel, wide};
use super::bf16::{Dst, Output, PackedPanels, Side, VectorSide, join_k_pair, pack_panels};
use super::bf16_kernel::NR;
use crate::dtype::HostVec;

/// Rows of a strip and columns of a panel: two 16-row tiles each (the panels are the
/// dot-product kernel's, `NR` columns wide).
const SIDE: usize = 32;
const _: () = assert!(SIDE == NR);
/// k-pairs per tile load (a tile row is 64 bytes).
const PAIRS_PER_STEP: usize = 16;

/// Whether this CPU has AMX with bf16 and the OS lets this process use its tile registers
/// (Linux grants them per process on request). Decided once.
pub fn available() -> bool {
    static AVAILABLE: OnceLock<bool> = OnceLock::new();
    *AVAILABLE.get_or_init(|| cpu_has_amx_bf16() && os_grants_tiles())
}

/// CPUID leaf 7: AMX-BF16 (EDX bit 22) and AMX-TILE (bit 24); XCR0 bits 17 and 18: the OS
/// saves the tile configuration and data.
fn cpu_has_amx_bf16() -> bool {
    use std::arch::x86_64::{__cpuid, __cpuid_count};
    if __cpuid(0).eax < 7 || __cpuid(1).ecx & (1 << 27) == 0 {
        return false; // no leaf 7, or no OSXSAVE: XCR0 cannot be read
    }
    let leaf7 = __cpuid_count(7, 0);
    if leaf7.edx & (1 << 22) == 0 || leaf7.edx & (1 << 24) == 0 {
        return false;
    }
    // SAFETY: OSXSAVE is set (checked above), so XGETBV is enabled.
    let xcr0 = unsafe { xcr0() };
    xcr0 & (0b11 << 17) == 0b11 << 17
}

#[target_feature(enable = "xsave")]
fn xcr0() -> u64 {
    // SAFETY: the caller checked OSXSAVE; register 0 always exists.
    unsafe { std::arch::x86_64::_xgetbv(0) }
}

/// Linux hands tile data out per process: `arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)`
/// (5.16+); without it the first tile instruction faults.
#[cfg(target_os = "linux")]
fn os_grants_tiles() -> bool {
    const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
    const XFEATURE_XTILEDATA: libc::c_long = 18;
    // SAFETY: the request only widens the set of register state this process may use; it
    // touches no memory.
    unsafe { libc::syscall(libc::SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0 }
}

#[cfg(not(target_os = "linux"))]
fn os_grants_tiles() -> bool {
    false
}

/// Palette 1 with all eight tiles 16 rows of 64 bytes (`ldtilecfg`'s 64-byte layout).
#[repr(C, align(64))]
struct TileConfig {
    palette: u8,
    start_row: u8,
    reserved: [u8; 14],
    bytes_per_row: [u16; 16],
    rows: [u8; 16],
}

static CONFIG: TileConfig = TileConfig {
    palette: 1,
    start_row: 0,
    reserved: [0; 14],
    bytes_per_row: [64, 64, 64, 64, 64, 64, 64, 64, 0, 0, 0, 0, 0, 0, 0, 0],
    rows: [16, 16, 16, 16, 16, 16, 16, 16, 0, 0, 0, 0, 0, 0, 0, 0],
};

/// Runs `body` with the tiles configured on this thread, releasing them after (so the OS saves
/// no tile state for a thread that has finished with them).
///
/// # Safety
/// `available()` holds. `body` runs no other code that configures or releases tiles (the
/// kernel below assumes `CONFIG` for the whole of `body`).
unsafe fn with_tiles(body: impl FnOnce()) {
    // SAFETY: the caller's promise that the CPU and OS run tile instructions; CONFIG is a valid
    // palette-1 configuration, 64-byte aligned.
    unsafe { asm!("ldtilecfg [{}]", in(reg) &CONFIG, options(nostack, readonly)) };
    body();
    // SAFETY: as above.
    unsafe { asm!("tilerelease", options(nostack, nomem)) };
}

/// A 32x32 block of `out` (row-major f32, rows 128 bytes apart) = strip · panel over `steps` ×
/// 16 k-pairs: the strip's 32 rows of k-pair words `strip_stride` bytes apart, the panel's rows
/// of 32 columns' pairs 128 bytes apart.
///
/// # Safety
/// Inside `with_tiles`; the strip holds 32 rows of `steps * 16` words at that stride, the panel
/// `steps * 16` rows of 32 words, `out` 32x32 f32.
#[inline(always)]
unsafe fn block(
    strip: *const u32,
    strip_stride: usize,
    panel: *const u32,
    steps: usize,
    out: &mut [[f32; SIDE]; SIDE],
) {
    // SAFETY: the caller's promises bound every tile load and store: each step reads 64 bytes
    // of each of the strip's 32 rows and 16 rows of 128 bytes of the panel, then moves on by
    // those; the four stores write the 32 rows of 128 bytes of `out`.
    unsafe {
        asm!(
            "tilezero tmm0",
            "tilezero tmm1",
            "tilezero tmm2",
            "tilezero tmm3",
            "2:",
            "tileloadd tmm4, [{a} + {a_stride}*1]",
            "tileloadd tmm5, [{a2} + {a_stride}*1]",
            "tileloadd tmm6, [{b} + {b_stride}*1]",
            "tileloadd tmm7, [{b} + {b_stride}*1 + 64]",
            "tdpbf16ps tmm0, tmm4, tmm6",
            "tdpbf16ps tmm1, tmm4, tmm7",
            "tdpbf16ps tmm2, tmm5, tmm6",
            "tdpbf16ps tmm3, tmm5, tmm7",
            "add {a}, 64",
            "add {a2}, 64",
            "add {b}, 2048",
            "dec {steps}",
            "jnz 2b",
            "tilestored [{c} + {b_stride}*1], tmm0",
            "tilestored [{c} + {b_stride}*1 + 64], tmm1",
            "tilestored [{c2} + {b_stride}*1], tmm2",
            "tilestored [{c2} + {b_stride}*1 + 64], tmm3",
            a = inout(reg) strip => _,
            a2 = inout(reg) strip.byte_add(16 * strip_stride) => _,
            a_stride = in(reg) strip_stride,
            b = inout(reg) panel => _,
            b_stride = in(reg) SIDE * 4,
            steps = inout(reg) steps => _,
            c = in(reg) out.as_mut_ptr(),
            c2 = in(reg) out[16..].as_mut_ptr(),
            options(nostack),
        );
    }
}

/// The left side packed: strip `s` is rows `32s..32s+32`, row `r` its `pairs` k-pair words
/// (`strips[(32s + r) * pairs + p]`), rows and pairs past the operand's zero.
fn pack_strips(pool: &Pool, side: Side, k: usize, pairs: usize) -> Vec<u32> {
    let mut packed = pool.take::<u32>(side.rows.div_ceil(SIDE) * SIDE * pairs);
    packed.par_chunks_mut(SIDE * pairs).enumerate().for_each(|(s, strip)| {
        wide(PackStrip {
            strip,
            side,
            s,
            k,
            pairs,
        })
    });
    packed
}

/// Strip `s` of `pack_strips`, run by `simd::wide`.
struct PackStrip<'a> {
    strip: &'a mut [u32],
    side: Side<'a>,
    s: usize,
    k: usize,
    pairs: usize,
}

impl Kernel for PackStrip<'_> {
    type Out = ();
    #[inline(always)]
    fn run(self) {
        let PackStrip {
            strip,
            side,
            s,
            k,
            pairs,
        } = self;
        let rows = (side.rows - s * SIDE).min(SIDE);
        let filled = k.div_ceil(2);
        if rows < SIDE || 2 * pairs > k {
            strip.fill(0);
        }
        let first = side.offset + s * SIDE * side.row_stride;
        if side.k_stride == 1 {
            // Each row is contiguous along k, so its bytes are its pairs' (x86 is little-endian:
            // the even k in the lower half): a copy. (Joined pair by pair it was a tenth of
            // gpt-char's bf16-mixed step.)
            for (r, words) in strip.chunks_exact_mut(pairs).take(rows).enumerate() {
                let row = &side.data[first + r * side.row_stride..][..k];
                bytemuck::cast_slice_mut::<u32, u8>(words)[..2 * k].copy_from_slice(bytemuck::cast_slice(row));
            }
        } else if side.row_stride == 1 {
            // k rows are contiguous: join two of them per k-pair, 16 pairs at a time, then write
            // each row's 16 words (a cache line) at once. (Scattered word by word down the
            // rows, a weight gradient's packing took longer than its product.)
            let mut block = [[0u32; SIDE]; PAIRS_PER_STEP];
            for p0 in (0..filled).step_by(PAIRS_PER_STEP) {
                let n = (filled - p0).min(PAIRS_PER_STEP);
                for (j, words) in block[..n].iter_mut().enumerate() {
                    join_k_pair(&mut words[..rows], side, first, p0 + j, k);
                }
                for r in 0..rows {
                    for (j, words) in block[..n].iter().enumerate() {
                        strip[r * pairs + p0 + j] = words[r];
                    }
                }
            }
        } else {
            for r in 0..rows {
                for p in 0..filled {
                    strip[r * pairs + p] = side.pair(s * SIDE + r, p, k);
                }
            }
        }
    }
}

/// `dst = left @ rightᵀ` seen as `left.rows x right.rows` over `k` (each side's rows run along
/// k), rows of `dst` `row_stride` elements apart: `bf16::product`'s contract on tiles.
///
/// # Safety
/// `available()` holds; `k > 0`; `dst` holds `left.rows` rows of `right.rows` elements at that
/// stride, not touched by anything else meanwhile.
pub unsafe fn product(pool: &Pool, dst: Dst, row_stride: usize, left: Side, right: Side, k: usize) {
    let pairs = k.div_ceil(2).next_multiple_of(PAIRS_PER_STEP);
    let strips = pack_strips(pool, left, k, pairs);
    let panels = pack_panels(pool, right, k, pairs);
    let panel_side = PackedPanels::with_pairs(&panels, right.rows, pairs);
    let out = Output::new(dst, row_stride, false);
    let (strip_count, panel_count) = (left.rows.div_ceil(SIDE), right.rows.div_ceil(SIDE));
    let by_strip = strip_count >= 2 * rayon::current_num_threads();
    let items = if by_strip { strip_count } else { panel_count };
    let strip_stride = pairs * 4;
    (0..items).into_par_iter().for_each(|item| {
        let (strip_range, panel_range) = if by_strip {
            (item..item + 1, 0..panel_count)
        } else {
            (0..strip_count, item..item + 1)
        };
        let mut acc = [[0f32; SIDE]; SIDE];
        let tiles = || {
            for s in strip_range {
                let strip = strips[s * SIDE * pairs..].as_ptr();
                for q in panel_range.clone() {
                    // SAFETY: inside `with_tiles`; strip s holds 32 rows of `pairs` words,
                    // `strip_stride` bytes apart, and panel q `pairs` rows of 32 words; `pairs`
                    // is a multiple of 16.
                    unsafe {
                        block(
                            strip,
                            strip_stride,
                            panel_side.panel(q).0,
                            pairs / PAIRS_PER_STEP,
                            &mut acc,
                        )
                    };
                    let (s0, v0) = (s * SIDE, q * SIDE);
                    out.write(&acc, s0, (left.rows - s0).min(SIDE), v0, (right.rows - v0).min(SIDE));
                }
            }
        };
        // SAFETY: the caller's promise that tiles run here; the body runs only `block` on them.
        unsafe { with_tiles(tiles) };
    });
    pool.recycle(HostVec::U32(strips));
    pool.recycle(HostVec::U32(panels));
}
