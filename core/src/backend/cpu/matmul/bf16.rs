//! bf16 x bf16 -> bf16 products on the AVX512-BF16 kernel, f32 accumulation, one rounding.
//!
//! Each product packs one operand into the kernel's panels (the "vector" side) and reads the
//! other as rows of k-pairs (the "broadcast" side), straight from the tensor when its k axis is
//! contiguous. Which operand is which is chosen to copy the fewest elements: in a linear layer's
//! forward pass the weight is read in place and only the activations are packed.

use half::bf16;
use rayon::prelude::*;

use super::super::float::bf16_from_f32_slice;
use super::super::pool::Pool;
use super::super::simd::{Kernel, wide};
use super::bf16_kernel::{MR, NR, tile};
use crate::backend::MatmulDims;
use crate::dtype::HostVec;
use crate::shape::Layout;

/// One operand seen as `rows x k`: element (r, i) at `offset + r * row_stride + i * k_stride`.
#[derive(Clone, Copy)]
pub struct Side<'a> {
    pub data: &'a [bf16],
    pub offset: usize,
    pub rows: usize,
    pub row_stride: usize,
    pub k_stride: usize,
}

impl Side<'_> {
    fn bits(&self, r: usize, i: usize) -> u32 {
        u32::from(self.data[self.offset + r * self.row_stride + i * self.k_stride].to_bits())
    }

    /// Elements (r, 2p) and (r, 2p + 1) in one word; past the end of an odd k, zero.
    fn pair(&self, r: usize, p: usize, k: usize) -> u32 {
        let hi = if 2 * p + 1 < k { self.bits(r, 2 * p + 1) } else { 0 };
        self.bits(r, 2 * p) | hi << 16
    }

    /// Rows that can be read as u32 pairs in place: k contiguous and even.
    fn pairs_in_place(&self, k: usize) -> bool {
        self.k_stride == 1 && k.is_multiple_of(2)
    }
}

/// Where the broadcast side's rows of pairs live: in the tensor, or in a packed copy.
struct Rows {
    base: *const u32,
    /// Distance between rows, in u32 pairs when packed, in bf16 elements when in place.
    stride_bf16: usize,
    rows: usize,
    packed: Vec<u32>,
}
// SAFETY: `base` points into memory that is only read, and which outlives the `Rows` (the
// operand borrowed for the product, or `packed` itself).
unsafe impl Sync for Rows {}

impl Rows {
    fn new(pool: &Pool, side: Side, k: usize) -> Self {
        if side.pairs_in_place(k) {
            Rows {
                // SAFETY: offset lies within data (the caller validated the layout).
                base: unsafe { side.data.as_ptr().add(side.offset) }.cast(),
                stride_bf16: side.row_stride,
                rows: side.rows,
                packed: Vec::new(),
            }
        } else {
            let pairs = k.div_ceil(2);
            let mut packed = pool.take::<u32>(side.rows * pairs);
            if side.row_stride == 1 {
                // The rows are contiguous and k is strided (a transposed operand): a block of
                // rows at a time, so each k-pair reads two short runs instead of every row
                // striding through k on its own (a cache miss per element).
                const BLOCK: usize = 16;
                packed.par_chunks_mut(pairs * BLOCK).enumerate().for_each(|(b, block)| {
                    let first = side.offset + b * BLOCK;
                    wide(TransposedPairs { block, side, first, k })
                });
            } else {
                packed
                    .par_chunks_mut(pairs)
                    .enumerate()
                    .for_each(|(r, row)| row.iter_mut().enumerate().for_each(|(p, w)| *w = side.pair(r, p, k)));
            }
            Rows {
                base: packed.as_ptr(),
                stride_bf16: 2 * pairs,
                rows: side.rows,
                packed,
            }
        }
    }

    /// Pointers to the `MR` rows of strip `s`; rows past the end repeat the last (their results
    /// are discarded).
    fn strip(&self, s: usize) -> [*const u32; MR] {
        std::array::from_fn(|r| {
            let row = (s * MR + r).min(self.rows - 1);
            // SAFETY: row < rows, so the row's start lies within the operand.
            unsafe { self.base.cast::<bf16>().add(row * self.stride_bf16).cast() }
        })
    }
}

/// Rows of pairs for a block of at most 16 consecutive rows of an operand whose rows are
/// contiguous and whose k is strided: for each k-pair, two runs of the block's length are
/// joined into one word per row. Run by `simd::wide`, so the joins are done in vectors.
struct TransposedPairs<'a> {
    /// The block's rows of pairs, `pairs` words each.
    block: &'a mut [u32],
    side: Side<'a>,
    /// The block's first element of k-index 0.
    first: usize,
    k: usize,
}

impl Kernel for TransposedPairs<'_> {
    type Out = ();
    #[inline(always)]
    fn run(self) {
        let TransposedPairs { block, side, first, k } = self;
        let pairs = k.div_ceil(2);
        let n = block.len() / pairs;
        let run = |i: usize| &side.data[first + i * side.k_stride..][..n];
        let mut words = [0u32; 16];
        let words = &mut words[..n];
        for p in 0..pairs {
            let even = run(2 * p);
            if 2 * p + 1 < k {
                for ((w, &e), &o) in words.iter_mut().zip(even).zip(run(2 * p + 1)) {
                    *w = join(e, o);
                }
            } else {
                for (w, &e) in words.iter_mut().zip(even) {
                    *w = join(e, bf16::ZERO);
                }
            }
            for (c, &w) in words.iter().enumerate() {
                block[c * pairs + p] = w;
            }
        }
    }
}

/// Packs the vector side into panels of `NR` rows: `panels[q][p][c] = pair(q * NR + c, p)`,
/// rows past the end zero. The two common layouts get loops the compiler vectorises.
fn pack_panels(pool: &Pool, side: Side, k: usize) -> Vec<u32> {
    let pairs = k.div_ceil(2);
    let mut packed = pool.take::<u32>(side.rows.div_ceil(NR) * pairs * NR);
    packed.par_chunks_mut(pairs * NR).enumerate().for_each(|(q, panel)| {
        let rows = (side.rows - q * NR).min(NR);
        if rows < NR {
            panel.fill(0);
        }
        let first = side.offset + q * NR * side.row_stride;
        if side.row_stride == 1 {
            // k rows of the operand are contiguous: interleave two of them per k-pair.
            for (p, out) in panel.chunks_exact_mut(NR).enumerate() {
                let even = &side.data[first + 2 * p * side.k_stride..][..rows];
                if 2 * p + 1 < k {
                    let odd = &side.data[first + (2 * p + 1) * side.k_stride..][..rows];
                    out.iter_mut()
                        .zip(even.iter().zip(odd))
                        .for_each(|(w, (e, o))| *w = join(*e, *o));
                } else {
                    out.iter_mut().zip(even).for_each(|(w, e)| *w = join(*e, bf16::ZERO));
                }
            }
        } else if side.k_stride == 1 {
            // Each row is contiguous along k: read it as pairs.
            for c in 0..rows {
                let row = &side.data[first + c * side.row_stride..][..k];
                for (p, two) in row.chunks(2).enumerate() {
                    panel[p * NR + c] = join(two[0], two.get(1).copied().unwrap_or(bf16::ZERO));
                }
            }
        } else {
            for p in 0..pairs {
                (0..rows).for_each(|c| panel[p * NR + c] = side.pair(q * NR + c, p, k));
            }
        }
    });
    packed
}

/// Two bf16 in one word, the even k in the lower half.
#[inline(always)]
fn join(even: bf16, odd: bf16) -> u32 {
    u32::from(even.to_bits()) | u32::from(odd.to_bits()) << 16
}

/// Where a product's rows go, `row_stride` elements apart: rounded once to bf16, or kept in f32
/// (written, or added to what is there: a sum over several products rounds once at its end).
#[derive(Clone, Copy)]
pub enum Dst {
    Bf16(*mut bf16),
    F32(*mut f32),
    F32Add(*mut f32),
}

/// The output of one batch item, shared by the threads that write its disjoint tiles.
#[derive(Clone, Copy)]
struct Output {
    dst: Dst,
    row_stride: usize,
    /// Whether the vector side is the left operand, so tiles land transposed.
    transposed: bool,
}
// SAFETY: every tile writes a disjoint set of output elements (see `write`).
unsafe impl Send for Output {}
unsafe impl Sync for Output {}

impl Output {
    /// Rounds a finished tile into the output: rows `s0..`, columns `v0..`, within bounds.
    fn write(&self, tile: &[[f32; NR]; MR], s0: usize, srows: usize, v0: usize, vcols: usize) {
        for (r, row) in tile.iter().enumerate().take(srows) {
            if self.transposed {
                for (c, &x) in row.iter().enumerate().take(vcols) {
                    // SAFETY: v0 + c < m and s0 + r < n (the caller clips srows and vcols), and
                    // tiles cover disjoint (s, v) ranges, so no two threads write one element.
                    unsafe { self.put((v0 + c) * self.row_stride + s0 + r, x) };
                }
                continue;
            }
            let at = (s0 + r) * self.row_stride + v0;
            // SAFETY: as above; this row segment is vcols elements inside row s0 + r.
            unsafe {
                match self.dst {
                    Dst::Bf16(ptr) => {
                        bf16_from_f32_slice(std::slice::from_raw_parts_mut(ptr.add(at), vcols), &row[..vcols])
                    }
                    Dst::F32(ptr) => std::slice::from_raw_parts_mut(ptr.add(at), vcols).copy_from_slice(&row[..vcols]),
                    Dst::F32Add(ptr) => std::slice::from_raw_parts_mut(ptr.add(at), vcols)
                        .iter_mut()
                        .zip(&row[..vcols])
                        .for_each(|(o, x)| *o += x),
                }
            }
        }
    }

    /// Stores `x` at element `at` of the destination.
    ///
    /// # Safety
    /// `at` is within the destination, and no other thread touches that element meanwhile.
    unsafe fn put(&self, at: usize, x: f32) {
        // SAFETY: the caller's promise.
        unsafe {
            match self.dst {
                Dst::Bf16(ptr) => *ptr.add(at) = bf16::from_f32(x),
                Dst::F32(ptr) => *ptr.add(at) = x,
                Dst::F32Add(ptr) => *ptr.add(at) += x,
            }
        }
    }
}

/// `out = lhs @ rhs` for every batch item; `out` holds `batch * m * n` elements.
pub fn matmul(pool: &Pool, out: &mut [bf16], lhs: &[bf16], ll: &Layout, rhs: &[bf16], rl: &Layout, d: MatmulDims) {
    let (ls, rs) = (&ll.strides, &rl.strides);
    for b in 0..d.batch {
        let left = Side {
            data: lhs,
            offset: ll.offset + b * ls[0],
            rows: d.m,
            row_stride: ls[1],
            k_stride: ls[2],
        };
        let right = Side {
            data: rhs,
            offset: rl.offset + b * rs[0],
            rows: d.n,
            row_stride: rs[2],
            k_stride: rs[1],
        };
        let dst = &mut out[b * d.m * d.n..(b + 1) * d.m * d.n];
        // SAFETY: the caller checked `available()`; `dst` holds m x n elements, rows n apart,
        // borrowed mutably here.
        unsafe { product(pool, Dst::Bf16(dst.as_mut_ptr()), d.n, left, right, d.k) };
    }
}

/// Elements copied when `vector` is packed and `broadcast` read as rows.
fn packing_cost(vector: Side, broadcast: Side, k: usize) -> usize {
    vector.rows * k
        + if broadcast.pairs_in_place(k) {
            0
        } else {
            broadcast.rows * k
        }
}

/// `dst = left @ rightᵀ` seen as `left.rows x right.rows` over `k` (each side's rows run along
/// k), rows of `dst` `row_stride` elements apart.
///
/// # Safety
/// The CPU runs the kernel (`bf16_kernel::available()`); `k > 0`; `dst` holds `left.rows` rows
/// of `right.rows` elements at that stride, not touched by anything else meanwhile.
pub unsafe fn product(pool: &Pool, dst: Dst, row_stride: usize, left: Side, right: Side, k: usize) {
    let transposed = packing_cost(left, right, k) < packing_cost(right, left, k);
    let (vector, broadcast) = if transposed { (left, right) } else { (right, left) };
    let panels = pack_panels(pool, vector, k);
    let rows = Rows::new(pool, broadcast, k);
    let out = Output {
        dst,
        row_stride,
        transposed,
    };
    let pairs = k.div_ceil(2);
    let (strips, panel_count) = (broadcast.rows.div_ceil(MR), vector.rows.div_ceil(NR));
    // Threads split the strips when there are enough of them, otherwise the panels.
    let by_strip = strips >= 2 * rayon::current_num_threads();
    let items = if by_strip { strips } else { panel_count };
    (0..items).into_par_iter().for_each(|item| {
        let (strip_range, panel_range) = if by_strip {
            (item..item + 1, 0..panel_count)
        } else {
            (0..strips, item..item + 1)
        };
        let mut acc = [[0f32; NR]; MR];
        for s in strip_range {
            let strip = rows.strip(s);
            for q in panel_range.clone() {
                // SAFETY: `matmul` is only called when `available()` holds; each strip pointer
                // reads `pairs` u32 within its row and the panel holds `pairs * NR` u32.
                unsafe { tile(&strip, panels.as_ptr().add(q * pairs * NR), pairs, &mut acc) };
                let (s0, v0) = (s * MR, q * NR);
                out.write(&acc, s0, (broadcast.rows - s0).min(MR), v0, (vector.rows - v0).min(NR));
            }
        }
    });
    pool.recycle(HostVec::U32(panels));
    pool.recycle(HostVec::U32(rows.packed));
}
