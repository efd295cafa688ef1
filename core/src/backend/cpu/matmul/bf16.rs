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
use super::bf16_kernel::{Interleaved, MR, NR, Packed, Panel, RowPointers, Strip, tile};
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
    pub(super) fn pair(&self, r: usize, p: usize, k: usize) -> u32 {
        let hi = if 2 * p + 1 < k { self.bits(r, 2 * p + 1) } else { 0 };
        self.bits(r, 2 * p) | hi << 16
    }

    /// Rows that can be read as u32 pairs in place: k contiguous and even.
    fn pairs_in_place(&self, k: usize) -> bool {
        self.k_stride == 1 && k.is_multiple_of(2)
    }
}

/// Where the broadcast side's rows of pairs live: in the tensor, or packed strip by strip.
enum Rows {
    /// Row `r` at `base + r * stride_bf16` bf16 elements, its pairs contiguous.
    InPlace {
        base: *const u32,
        stride_bf16: usize,
        rows: usize,
    },
    /// Strip `s`'s `MR` rows interleaved pair by pair, `pairs * MR` words per strip.
    Strips { packed: Vec<u32>, pairs: usize },
}
// SAFETY: `base` points into memory that is only read, and which outlives the `Rows` (the
// operand borrowed for the product).
unsafe impl Sync for Rows {}

impl Rows {
    fn new(pool: &Pool, side: Side, k: usize) -> Self {
        if side.pairs_in_place(k) {
            return Rows::InPlace {
                // SAFETY: offset lies within data (the caller validated the layout).
                base: unsafe { side.data.as_ptr().add(side.offset) }.cast(),
                stride_bf16: side.row_stride,
                rows: side.rows,
            };
        }
        let pairs = k.div_ceil(2);
        let mut packed = pool.take::<u32>(side.rows.div_ceil(MR) * pairs * MR);
        packed
            .par_chunks_mut(pairs * MR * STRIPS_PER_PACK)
            .enumerate()
            .for_each(|(b, strips)| {
                let first_row = b * MR * STRIPS_PER_PACK;
                wide(PackStrips {
                    strips,
                    side,
                    first_row,
                    k,
                })
            });
        Rows::Strips { packed, pairs }
    }

    /// Runs every tile of `items` (see `Tiles`) with this side's strips.
    fn run<V: VectorSide>(&self, tiles: &Tiles<V>) {
        match self {
            &Rows::InPlace {
                base,
                stride_bf16,
                rows,
            } => {
                // As an address, which threads may share (`Rows` is Sync, a raw pointer is not).
                let base = base as usize;
                tiles.run(move |s| {
                    RowPointers(std::array::from_fn(|r| {
                        let row = (s * MR + r).min(rows - 1);
                        // SAFETY: row < rows, so the row's start lies within the operand.
                        unsafe { (base as *const bf16).add(row * stride_bf16).cast() }
                    }))
                })
            }
            Rows::Strips { packed, pairs } => {
                // SAFETY: strip s < strips starts within `packed`, which holds whole strips.
                tiles.run(|s| Interleaved(unsafe { packed.as_ptr().add(s * pairs * MR) }))
            }
        }
    }
}

/// Strips packed together: 48 rows, three vectors of bf16 read from each k row at a time.
const STRIPS_PER_PACK: usize = 4;

/// Up to `STRIPS_PER_PACK` consecutive strips of the broadcast side packed:
/// `strip[p * MR + r] = pair(row r of the strip, p)`, rows past the end zero. Run by
/// `simd::wide`. Where the rows are contiguous (k strided: a transposed operand, or activations
/// as the k side of a weight gradient), each k-pair reads two runs of all the strips' rows and
/// writes `MR` words into each strip.
struct PackStrips<'a> {
    strips: &'a mut [u32],
    side: Side<'a>,
    first_row: usize,
    k: usize,
}

impl Kernel for PackStrips<'_> {
    type Out = ();
    #[inline(always)]
    fn run(self) {
        let PackStrips {
            strips,
            side,
            first_row,
            k,
        } = self;
        let pairs = k.div_ceil(2);
        let n = (side.rows - first_row).min(MR * STRIPS_PER_PACK);
        if side.row_stride != 1 {
            for (s, strip) in strips.chunks_exact_mut(pairs * MR).enumerate() {
                for (p, words) in strip.chunks_exact_mut(MR).enumerate() {
                    for (r, w) in words.iter_mut().enumerate() {
                        let row = s * MR + r;
                        *w = if row < n { side.pair(first_row + row, p, k) } else { 0 };
                    }
                }
            }
            return;
        }
        let first = side.offset + first_row;
        let mut joined = [0u32; MR * STRIPS_PER_PACK];
        for p in 0..pairs {
            join_k_pair(&mut joined[..n], side, first, p, k);
            // Rows past `n` stay zero in `joined`.
            for (strip, rows) in strips.chunks_exact_mut(pairs * MR).zip(joined.chunks_exact(MR)) {
                strip[p * MR..][..MR].copy_from_slice(rows);
            }
        }
    }
}

/// The vector side of a product, panel by panel: packed (`PackedPanels`), or read from the
/// images of a convolution as the kernel goes (`conv::direct`).
pub trait VectorSide: Sync {
    type Panel<'a>: Panel
    where
        Self: 'a;
    /// Panel `q`: the side's rows `q·NR..` over the whole sum, rows past the end zero.
    fn panel(&self, q: usize) -> Self::Panel<'_>;
}

/// Panels laid out as `pack_panels` lays them out (`panels[q][p][c]`).
pub struct PackedPanels<'a> {
    words: &'a [u32],
    pairs: usize,
}

impl<'a> PackedPanels<'a> {
    /// The panels of `rows` rows over `k` in `words`.
    pub fn new(words: &'a [u32], rows: usize, k: usize) -> Self {
        Self::with_pairs(words, rows, k.div_ceil(2))
    }

    /// The panels of `rows` rows of `pairs` k-pairs each (padded past the sum's end).
    pub fn with_pairs(words: &'a [u32], rows: usize, pairs: usize) -> Self {
        assert!(words.len() >= rows.div_ceil(NR) * pairs * NR);
        PackedPanels { words, pairs }
    }
}

impl VectorSide for PackedPanels<'_> {
    type Panel<'b>
        = Packed
    where
        Self: 'b;
    fn panel(&self, q: usize) -> Packed {
        Packed(self.words[q * self.pairs * NR..][..self.pairs * NR].as_ptr())
    }
}

/// Packs the vector side into panels of `NR` rows and `pairs` k-pairs (at least
/// `k.div_ceil(2)`): `panels[q][p][c] = pair(q * NR + c, p)`, rows and pairs past the end zero.
pub(super) fn pack_panels(pool: &Pool, side: Side, k: usize, pairs: usize) -> Vec<u32> {
    let mut packed = pool.take::<u32>(side.rows.div_ceil(NR) * pairs * NR);
    packed
        .par_chunks_mut(pairs * NR)
        .enumerate()
        .for_each(|(q, panel)| wide(PackPanel { panel, side, q, k }));
    packed
}

/// Panel `q` of `pack_panels`, run by `simd::wide`; the two common layouts get loops the
/// compiler vectorises.
struct PackPanel<'a> {
    panel: &'a mut [u32],
    side: Side<'a>,
    q: usize,
    k: usize,
}

impl Kernel for PackPanel<'_> {
    type Out = ();
    #[inline(always)]
    fn run(self) {
        let PackPanel { panel, side, q, k } = self;
        let rows = (side.rows - q * NR).min(NR);
        if rows < NR || panel.len() > k.div_ceil(2) * NR {
            panel.fill(0);
        }
        let first = side.offset + q * NR * side.row_stride;
        if side.row_stride == 1 {
            // k rows of the operand are contiguous: interleave two of them per k-pair.
            for (p, out) in panel.chunks_exact_mut(NR).take(k.div_ceil(2)).enumerate() {
                join_k_pair(&mut out[..rows], side, first, p, k);
            }
        } else if side.k_stride == 1 {
            // Each row is contiguous along k, so its bytes are its pairs' (x86 is little-endian:
            // the even k in the lower half), scattered down the panel's column.
            for c in 0..rows {
                let row: &[u8] = bytemuck::cast_slice(&side.data[first + c * side.row_stride..][..k]);
                let mut words = row.chunks_exact(4);
                for (p, w) in (&mut words).enumerate() {
                    panel[p * NR + c] = u32::from_le_bytes([w[0], w[1], w[2], w[3]]);
                }
                if let &[lo, hi] = words.remainder() {
                    panel[k / 2 * NR + c] = u32::from_le_bytes([lo, hi, 0, 0]);
                }
            }
        } else {
            for p in 0..k.div_ceil(2) {
                for c in 0..rows {
                    panel[p * NR + c] = side.pair(q * NR + c, p, k);
                }
            }
        }
    }
}

/// `words[r] = pair(row r, p)` for consecutive rows from element `first` of a side whose rows
/// are contiguous (k strided): two runs of k rows `2p` and `2p + 1` joined, the odd one zero
/// past the end of an odd k.
#[inline(always)]
pub(super) fn join_k_pair(words: &mut [u32], side: Side, first: usize, p: usize, k: usize) {
    let n = words.len();
    let even = &side.data[first + 2 * p * side.k_stride..][..n];
    if 2 * p + 1 < k {
        let odd = &side.data[first + (2 * p + 1) * side.k_stride..][..n];
        for (r, w) in words.iter_mut().enumerate() {
            *w = join(even[r], odd[r]);
        }
    } else {
        for (r, w) in words.iter_mut().enumerate() {
            *w = join(even[r], bf16::ZERO);
        }
    }
}

/// Two bf16 in one word, the even k in the lower half.
#[inline(always)]
pub(in super::super) fn join(even: bf16, odd: bf16) -> u32 {
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
pub(super) struct Output {
    dst: Dst,
    row_stride: usize,
    /// Whether the vector side is the left operand, so tiles land transposed.
    transposed: bool,
}
// SAFETY: every tile writes a disjoint set of output elements (see `write`).
unsafe impl Send for Output {}
unsafe impl Sync for Output {}

/// `Output::write`'s work, run by `simd::wide`: the rounding and adding loops vectorised (at
/// the baseline's four lanes they were a twentieth of a convolution's product).
struct WriteTile<'a> {
    out: &'a Output,
    tile: &'a [[f32; NR]],
    at: (usize, usize),
    size: (usize, usize),
}

impl Kernel for WriteTile<'_> {
    type Out = ();
    #[inline(always)]
    fn run(self) {
        let WriteTile {
            out,
            tile,
            at: (s0, v0),
            size: (srows, vcols),
        } = self;
        out.write_tile(tile, s0, srows, v0, vcols)
    }
}

impl Output {
    /// Where `product`'s tiles go; `transposed`: the vector side is the left operand.
    pub(super) fn new(dst: Dst, row_stride: usize, transposed: bool) -> Output {
        Output {
            dst,
            row_stride,
            transposed,
        }
    }

    /// Rounds a finished tile (at least `srows` rows) into the output: rows `s0..`, columns
    /// `v0..`, within bounds.
    pub(super) fn write(&self, tile: &[[f32; NR]], s0: usize, srows: usize, v0: usize, vcols: usize) {
        wide(WriteTile {
            out: self,
            tile,
            at: (s0, v0),
            size: (srows, vcols),
        })
    }

    #[inline(always)]
    fn write_tile(&self, tile: &[[f32; NR]], s0: usize, srows: usize, v0: usize, vcols: usize) {
        if self.transposed {
            // Column c of the tile is a run of `srows` contiguous output elements: one cache
            // line or two each, where writing row by row touched a line per element.
            for c in 0..vcols {
                let at = (v0 + c) * self.row_stride + s0;
                for (r, row) in tile.iter().enumerate().take(srows) {
                    // SAFETY: v0 + c < m and s0 + r < n (the caller clips srows and vcols), and
                    // tiles cover disjoint (s, v) ranges, so no two threads write one element.
                    unsafe { self.put(at + r, row[c]) };
                }
            }
            return;
        }
        for (r, row) in tile.iter().enumerate().take(srows) {
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
    #[inline(always)]
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

/// A kernel's `dst = left @ rightᵀ` (`product`'s contract).
pub type Product = unsafe fn(&Pool, Dst, usize, Side, Side, usize);

/// `out = lhs @ rhs` for every batch item on `product` (this kernel's, or the AMX tiles');
/// `out` holds `batch * m * n` elements.
///
/// # Safety
/// The CPU runs `product`'s kernel; `d.k > 0`; the layouts fit their operands.
pub unsafe fn matmul(
    product: Product,
    pool: &Pool,
    out: &mut [bf16],
    (lhs, ll): (&[bf16], &Layout),
    (rhs, rl): (&[bf16], &Layout),
    d: MatmulDims,
) {
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
        // SAFETY: the caller's promises; `dst` holds m x n elements, rows n apart, borrowed
        // mutably here.
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
    let panels = pack_panels(pool, vector, k, k.div_ceil(2));
    let out = Output::new(dst, row_stride, transposed);
    // SAFETY: the caller's promises; `panels` holds `vector`'s rows packed over k.
    unsafe {
        multiply(
            pool,
            out,
            broadcast,
            &PackedPanels::new(&panels, vector.rows, k),
            vector.rows,
            k,
        )
    };
    pool.recycle(HostVec::U32(panels));
}

/// `dst = left @ vectorᵀ` (`left.rows x vector_rows` over `k`) where the vector side arrives
/// ready (`vectors`): a convolution's input unfolded straight into panels, or read from its
/// images as the kernel goes.
///
/// # Safety
/// As for `product`; each of `vectors`' `vector_rows.div_ceil(NR)` panels holds `k.div_ceil(2)`
/// pairs.
pub unsafe fn product_with<V: VectorSide>(
    pool: &Pool,
    dst: Dst,
    row_stride: usize,
    left: Side,
    vectors: &V,
    vector_rows: usize,
    k: usize,
) {
    let out = Output::new(dst, row_stride, false);
    // SAFETY: the caller's promises.
    unsafe { multiply(pool, out, left, vectors, vector_rows, k) };
}

/// Every tile of `broadcast`'s rows by the vector side's panels into `out`.
///
/// # Safety
/// As for `product`, with `vectors` holding the vector side's `vector_rows` rows.
unsafe fn multiply<V: VectorSide>(
    pool: &Pool,
    out: Output,
    broadcast: Side,
    vectors: &V,
    vector_rows: usize,
    k: usize,
) {
    let rows = Rows::new(pool, broadcast, k);
    let pairs = k.div_ceil(2);
    let (strips, panel_count) = (broadcast.rows.div_ceil(MR), vector_rows.div_ceil(NR));
    rows.run(&Tiles {
        vectors,
        pairs,
        strips,
        panel_count,
        broadcast_rows: broadcast.rows,
        vector_rows,
        out,
    });
    if let Rows::Strips { packed, .. } = rows {
        pool.recycle(HostVec::U32(packed));
    }
}

/// Every tile of one product: strips of the broadcast side by panels of the vector side.
struct Tiles<'a, V> {
    vectors: &'a V,
    pairs: usize,
    strips: usize,
    panel_count: usize,
    broadcast_rows: usize,
    vector_rows: usize,
    out: Output,
}

impl<V: VectorSide> Tiles<'_, V> {
    /// Computes and writes every tile, strip `s` read through `strip(s)`. Threads split the
    /// strips when there are enough of them, otherwise the panels.
    fn run<S: Strip>(&self, strip: impl Fn(usize) -> S + Sync) {
        let Tiles {
            vectors,
            pairs,
            strips,
            panel_count,
            broadcast_rows,
            vector_rows,
            out,
        } = *self;
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
                let rows = strip(s);
                for q in panel_range.clone() {
                    let (s0, v0) = (s * MR, q * NR);
                    let srows = (broadcast_rows - s0).min(MR);
                    let panel = vectors.panel(q);
                    // SAFETY: `product` runs only where `available()` holds; the strip holds
                    // `pairs` pairs per row and each panel `pairs` per column (the callers'
                    // promise); srows <= MR.
                    unsafe { tile(srows, 1, |_| (&rows, &panel), pairs, &mut acc) };
                    out.write(&acc, s0, srows, v0, (vector_rows - v0).min(NR));
                }
            }
        });
    }
}
