//! bf16 products on AMX tiles (Sapphire Rapids and later): `tdpbf16ps` multiplies a 16x32 bf16
//! tile by a 32x16 one into 16x16 f32 accumulators, 8192 multiply-adds an instruction — about
//! 1 TFLOP/s on one core of a Xeon VM, against its AVX-512 f32 FMAs' 130 GFLOP/s.
//!
//! Both operands are packed into zero-padded k-pair words (`bf16::join`: the even k in the lower
//! half), so the kernel has no edges: the left side as strips of 32 rows of `pairs` words, the
//! right as `bf16::pack_panels`' panels of 32 columns. A tile of 32x32 outputs holds four
//! accumulator tiles, loads two tiles of each side per 16 k-pairs and multiplies each pair of
//! them (all 8 tile registers). The output is written by the dot-product kernel's `Output`.
//! Long sums go in chunks, the blocks kept in f32 between them (`multiply`); a convolution's
//! right side can also be read in place at a shift per tap (`block_taps`, `conv::grid`).
//!
//! The accumulators are zeroed or loaded, multiplied into and stored by separate `asm!`
//! statements: the tile registers keep their values between them, as nothing the compiler
//! emits uses them (and `with_tiles` configures them once around all of it).

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
pub const SIDE: usize = 32;
const _: () = assert!(SIDE == NR);
/// k-pairs per tile load (a tile row is 64 bytes).
pub const PAIRS_PER_STEP: usize = 16;

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
/// kernels below assume `CONFIG` for the whole of `body`).
pub unsafe fn with_tiles(body: impl FnOnce()) {
    // SAFETY: the caller's promise that the CPU and OS run tile instructions; CONFIG is a valid
    // palette-1 configuration, 64-byte aligned.
    unsafe { asm!("ldtilecfg [{}]", in(reg) &CONFIG, options(nostack, readonly)) };
    body();
    // SAFETY: as above.
    unsafe { asm!("tilerelease", options(nostack, nomem)) };
}

/// A 32x32 block of f32 (row-major, rows 128 bytes apart): the four accumulator tiles.
pub type Block = [[f32; SIDE]; SIDE];

/// The accumulators set to zero.
///
/// # Safety
/// Inside `with_tiles`.
#[inline(always)]
unsafe fn accumulators_zero() {
    // SAFETY: the caller's promise: the tiles are configured.
    unsafe {
        asm!(
            "tilezero tmm0",
            "tilezero tmm1",
            "tilezero tmm2",
            "tilezero tmm3",
            options(nostack, nomem)
        )
    };
}

/// The accumulators loaded from `block`.
///
/// # Safety
/// Inside `with_tiles`.
#[inline(always)]
unsafe fn accumulators_load(block: &Block) {
    // SAFETY: the caller's promise; the four loads read the 32 rows of 128 bytes of `block`.
    unsafe {
        asm!(
            "tileloadd tmm0, [{c} + {stride}*1]",
            "tileloadd tmm1, [{c} + {stride}*1 + 64]",
            "tileloadd tmm2, [{c} + {stride}*1 + 2048]",
            "tileloadd tmm3, [{c} + {stride}*1 + 2112]",
            c = in(reg) block.as_ptr(),
            stride = in(reg) SIDE * 4,
            options(nostack, readonly),
        )
    };
}

/// The accumulators stored into `block`.
///
/// # Safety
/// Inside `with_tiles`.
#[inline(always)]
unsafe fn accumulators_store(block: &mut Block) {
    // SAFETY: the caller's promise; the four stores write the 32 rows of 128 bytes of `block`.
    unsafe {
        asm!(
            "tilestored [{c} + {stride}*1], tmm0",
            "tilestored [{c} + {stride}*1 + 64], tmm1",
            "tilestored [{c} + {stride}*1 + 2048], tmm2",
            "tilestored [{c} + {stride}*1 + 2112], tmm3",
            c = in(reg) block.as_mut_ptr(),
            stride = in(reg) SIDE * 4,
            options(nostack),
        )
    };
}

/// The accumulators += strip · B over `steps` × 16 k-pairs: the strip's 32 rows of k-pair
/// words `strip_stride` bytes apart, B's rows of 32 columns' words `b_stride` bytes apart.
///
/// # Safety
/// Inside `with_tiles`; `steps > 0`; the strip holds 32 rows of `steps * 16` words at its
/// stride, B `steps * 16` rows of 32 words (128 bytes) at its stride. Between this and the
/// accumulators' other functions nothing else runs tile instructions.
#[inline(always)]
pub unsafe fn accumulate(strip: *const u32, strip_stride: usize, b: *const u32, b_stride: usize, steps: usize) {
    debug_assert!(steps > 0);
    // SAFETY: the caller's promises bound every tile load: each step reads 64 bytes of each of
    // the strip's 32 rows and 16 rows of 128 bytes of B, then moves on by those.
    unsafe {
        asm!(
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
            "add {b}, {b_step}",
            "dec {steps}",
            "jnz 2b",
            a = inout(reg) strip => _,
            a2 = inout(reg) strip.byte_add(16 * strip_stride) => _,
            a_stride = in(reg) strip_stride,
            b = inout(reg) b => _,
            b_stride = in(reg) b_stride,
            b_step = in(reg) 16 * b_stride,
            steps = inout(reg) steps => _,
            options(nostack, readonly),
        );
    }
}

/// `out` = strip · panel over `steps` × 16 k-pairs (a panel's rows 128 bytes apart), or
/// `out` += that where `add`.
///
/// # Safety
/// As for `accumulate`, with the panel as B.
#[inline(always)]
unsafe fn block(strip: *const u32, strip_stride: usize, panel: *const u32, steps: usize, out: &mut Block, add: bool) {
    // SAFETY: the caller's promises.
    unsafe {
        if add {
            accumulators_load(out);
        } else {
            accumulators_zero();
        }
        accumulate(strip, strip_stride, panel, SIDE * 4, steps);
        accumulators_store(out);
    }
}

/// `out` = strip · B summed over taps: for each tap `t`, `steps` × 16 k-pairs of the strip
/// (which runs on through the taps) by B's rows from `b + offsets[t]` bytes, `b_stride` bytes
/// apart, 32 columns' words each. A convolution's B read in place from a copy of its images:
/// each tap a shifted view.
///
/// # Safety
/// Inside `with_tiles`; `steps > 0`; the strip holds 32 rows of `offsets.len() * steps * 16`
/// words, `strip_stride` bytes apart; for every tap, B holds `steps * 16` rows of 32 words
/// (128 bytes) from `b + offsets[t]`, `b_stride` bytes apart.
#[inline(always)]
pub unsafe fn block_taps(
    (strip, strip_stride): (*const u32, usize),
    (b, b_stride): (*const u32, usize),
    offsets: &[isize],
    steps: usize,
    out: &mut Block,
) {
    // SAFETY: the caller's promises; tap t's part of the strip starts `t * steps * 64` bytes in.
    unsafe {
        accumulators_zero();
        for (t, &offset) in offsets.iter().enumerate() {
            let strip = strip.byte_add(t * steps * 64);
            accumulate(strip, strip_stride, b.byte_offset(offset), b_stride, steps);
        }
        accumulators_store(out);
    }
}

/// The number of k-pair words each packed row holds for a sum of `k`: whole tile loads.
pub fn padded_pairs(k: usize) -> usize {
    k.div_ceil(2).next_multiple_of(PAIRS_PER_STEP)
}

/// An operand packed as the tiles' left side: strip `s` is rows `32s..32s+32`, row `r` its
/// `pairs` k-pair words (`words[(32s + r) * pairs + p]`), rows and pairs past the operand's
/// zero. Packed once, it serves every product with that left side (a convolution's weight).
pub struct Strips {
    words: Vec<u32>,
    rows: usize,
    pairs: usize,
}

impl Strips {
    /// `side`'s rows over a sum of `k`, packed.
    pub fn pack(pool: &Pool, side: Side, k: usize) -> Strips {
        let pairs = padded_pairs(k);
        let mut words = pool.take::<u32>(side.rows.div_ceil(SIDE) * SIDE * pairs);
        words.par_chunks_mut(SIDE * pairs).enumerate().for_each(|(s, strip)| {
            wide(PackStrip {
                strip,
                side,
                s,
                k,
                pairs,
            })
        });
        Strips {
            words,
            rows: side.rows,
            pairs,
        }
    }

    /// The k-pair words each row holds (`padded_pairs` of the sum).
    pub fn pairs(&self) -> usize {
        self.pairs
    }

    /// The rows packed (those of the operand, not the padding).
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Strip `s`'s first word; its rows are `pairs() * 4` bytes apart.
    pub fn strip(&self, s: usize) -> *const u32 {
        self.words[s * SIDE * self.pairs..].as_ptr()
    }

    pub fn recycle(self, pool: &Pool) {
        pool.recycle(HostVec::U32(self.words));
    }
}

/// Strip `s` of `Strips::pack`, run by `simd::wide`.
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
    let strips = Strips::pack(pool, left, k);
    let panels = pack_panels(pool, right, k, strips.pairs);
    // SAFETY: the caller's promises; the panels hold `right`'s rows over the strips' pairs.
    unsafe {
        multiply(
            pool,
            dst,
            row_stride,
            &strips,
            &PackedPanels::with_pairs(&panels, right.rows, strips.pairs),
            right.rows,
        )
    };
    strips.recycle(pool);
    pool.recycle(HostVec::U32(panels));
}

/// k-pairs summed per pass over a product's panels where its sum is longer: a strip's part
/// (32 KiB) and every panel's stay in the L2 cache while a group of strips goes over them,
/// instead of each strip streaming all the panels from L3 (a 4608-long sum: 300 KiB a panel).
const CHUNK_PAIRS: usize = 256;
/// Where the sum goes in chunks, the strips and panels one task takes: each chunk of a panel
/// serves 4 strips, each of a strip 16 panels, and the group's 64 blocks of f32 sums (256 KiB)
/// stay in the L2 cache between chunks.
const GROUP_STRIPS: usize = 4;
const GROUP_PANELS: usize = 16;

/// `dst = strips @ panelsᵀ` (`strips`' rows x `panel_rows`), rows of `dst` `row_stride` elements
/// apart. Threads take single strips (or panels, where there are few strips); a long sum goes
/// in chunks of `CHUNK_PAIRS`, threads taking groups of strips and panels whose blocks are kept
/// in f32 between the chunks.
///
/// # Safety
/// `available()` holds; `panels` hold `panel_rows` rows over the strips' `pairs()` (packed with
/// that many pairs, `PackedPanels::with_pairs`); `dst` holds the strips' rows of `panel_rows`
/// elements at that stride, not touched by anything else meanwhile.
pub unsafe fn multiply(
    pool: &Pool,
    dst: Dst,
    row_stride: usize,
    strips: &Strips,
    panels: &PackedPanels,
    panel_rows: usize,
) {
    let (rows, pairs) = (strips.rows, strips.pairs);
    if rows == 0 || panel_rows == 0 {
        return; // nothing to write (and no groups to split)
    }
    let out = Output::new(dst, row_stride, false);
    let (strip_count, panel_count) = (rows.div_ceil(SIDE), panel_rows.div_ceil(SIDE));
    let chunked = pairs > 2 * CHUNK_PAIRS;
    let by_strip = strip_count >= 2 * rayon::current_num_threads();
    let (group_strips, group_panels) = match (chunked, by_strip) {
        (true, _) => (GROUP_STRIPS, GROUP_PANELS),
        (false, true) => (1, panel_count),
        (false, false) => (strip_count, 1),
    };
    let strip_groups = strip_count.div_ceil(group_strips);
    let items = strip_groups * panel_count.div_ceil(group_panels);
    let strip_stride = pairs * 4;
    (0..items).into_par_iter().for_each(|item| {
        let (sg, pg) = (item % strip_groups, item / strip_groups);
        let strip_range = sg * group_strips..((sg + 1) * group_strips).min(strip_count);
        let panel_range = pg * group_panels..((pg + 1) * group_panels).min(panel_count);
        let write = |acc: &Block, s: usize, q: usize| {
            let (s0, v0) = (s * SIDE, q * SIDE);
            out.write(acc, s0, (rows - s0).min(SIDE), v0, (panel_rows - v0).min(SIDE));
        };
        let tiles = || {
            if !chunked {
                let mut acc = [[0f32; SIDE]; SIDE];
                for s in strip_range {
                    for q in panel_range.clone() {
                        // SAFETY: inside `with_tiles`; strip s holds 32 rows of `pairs` words,
                        // `strip_stride` bytes apart, and panel q `pairs` rows of 32 words (the
                        // caller's promise); `pairs` is a multiple of 16.
                        unsafe {
                            block(
                                strips.strip(s),
                                strip_stride,
                                panels.panel(q).0,
                                pairs / PAIRS_PER_STEP,
                                &mut acc,
                                false,
                            )
                        };
                        write(&acc, s, q);
                    }
                }
                return;
            }
            let blocks = strip_range.len() * panel_range.len();
            let mut words = pool.take::<f32>(blocks * SIDE * SIDE);
            let sums: &mut [Block] = bytemuck::cast_slice_mut(&mut words);
            for first in (0..pairs).step_by(CHUNK_PAIRS) {
                let chunk = (pairs - first).min(CHUNK_PAIRS);
                let mut sum = sums.iter_mut();
                for s in strip_range.clone() {
                    for q in panel_range.clone() {
                        // SAFETY: as above, for the chunk's pairs `first..first + chunk` of the
                        // strip's rows and of the panel (rows of 32 words from its pair
                        // `first`); `chunk` is a multiple of 16.
                        unsafe {
                            block(
                                strips.strip(s).add(first),
                                strip_stride,
                                panels.panel(q).0.add(first * SIDE),
                                chunk / PAIRS_PER_STEP,
                                sum.next().expect("a block per strip and panel"),
                                first > 0,
                            )
                        };
                    }
                }
            }
            let mut sum = sums.iter();
            for s in strip_range.clone() {
                for q in panel_range.clone() {
                    write(sum.next().expect("a block per strip and panel"), s, q);
                }
            }
            pool.recycle(HostVec::F32(words));
        };
        // SAFETY: the caller's promise that tiles run here; the body runs only the blocks on
        // them (and writes the results between blocks).
        unsafe { with_tiles(tiles) };
    });
}
