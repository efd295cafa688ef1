//! Stride-1 convolutions on AMX tiles with nothing unfolded (an implicit GEMM). The images are
//! copied once with their channels paired (word `p` of a pair's plane holds pixel `p` of
//! channels `2cp` and `2cp + 1`: the tiles' k-pair) and zero-padded on every side, images one
//! after another ("the grid"). Output pixel (y, x) sits at grid position (y, x); tap (ky, kx)
//! reads the grid `ky·wp + kx` positions further on (times the dilation), so for 32 consecutive
//! grid positions each tap's B tiles are 16 channel pairs of the copy, loaded in place at one
//! shift. The positions in the padding (the last columns and rows of each image's grid) are
//! computed and dropped; that waste is what `MIN_SHARE` bounds. Unfolding wrote 9 words per
//! pixel and channel pair for a 3x3 convolution and read them back: about as long as the tile
//! product itself.
//!
//! The input gradient of a stride-1 convolution is a stride-1 convolution of the output
//! gradient (`transposed`), so it runs here too, its results written straight into the images.
//! The weight gradient sums, for each tap, the output gradient laid on the grid (zero in its
//! padding) times the images' grid at the tap's shift, both read in place.

use half::bf16;

use super::ranges::{Columns, image_ranges, images_per_range, products, rounded_sum_turned};
use super::transposed::Transposed;
use super::unfold::Planes;
use crate::backend::Conv2dGeometry;
use crate::backend::cpu::float::ViaF32;
use crate::backend::cpu::matmul::amx::{self, PAIRS_PER_STEP, SIDE, Strips};
use crate::backend::cpu::matmul::bf16::{Side, join};
use crate::backend::cpu::pool::Pool;
use crate::backend::cpu::simd::{Kernel, wide};
use crate::dtype::HostVec;

/// The least share of the grid's positions that are output pixels: 32x32 images padded by one
/// are 89% output, 16x16 79%, 8x8 64% and 4x4 44% (left to unfolding: with the grid a 256-channel
/// 8x8 layer's forward product took 14.3-16.1 ms against 12.9 unfolded, a 512-channel 4x4
/// layer's twice as long; session 68).
const MIN_SHARE: f64 = 0.75;

/// Grid positions one product covers at least (a run of images).
const MIN_POSITIONS: usize = 1024;

/// One image's padded grid for a stride-1 convolution.
#[derive(Clone, Copy, Debug)]
struct Grid {
    /// The image's size and its padding.
    h: usize,
    w: usize,
    padding: [usize; 2],
    /// The grid's rows and columns.
    hp: usize,
    wp: usize,
    /// The output's rows and columns, at the grid's top left.
    oh: usize,
    ow: usize,
}

impl Grid {
    /// `g`'s grid, or None where it does not run there: strided, channels not in whole tile
    /// loads of pairs, or too much of the grid padding.
    fn of(g: &Conv2dGeometry) -> Option<Grid> {
        let (hp, wp) = (g.h + 2 * g.padding[0], g.w + 2 * g.padding[1]);
        let (oh, ow) = (g.out_h(), g.out_w());
        let fits = g.stride == [1, 1]
            && g.c > 0
            && g.c.is_multiple_of(2 * PAIRS_PER_STEP)
            && g.kh * g.kw > 0
            && oh * ow > 0
            && (oh * ow) as f64 >= MIN_SHARE * (hp * wp) as f64;
        fits.then_some(Grid {
            h: g.h,
            w: g.w,
            padding: g.padding,
            hp,
            wp,
            oh,
            ow,
        })
    }

    fn positions(&self) -> usize {
        self.hp * self.wp
    }

    /// Each tap's shift from an output's grid position to the position it reads.
    fn shifts(&self, g: &Conv2dGeometry) -> Vec<usize> {
        let mut shifts = Vec::with_capacity(g.kh * g.kw);
        for ky in 0..g.kh {
            for kx in 0..g.kw {
                shifts.push(ky * g.dilation[0] * self.wp + kx * g.dilation[1]);
            }
        }
        shifts
    }

    /// Images a run covers: the fewest whose grids reach `MIN_POSITIONS`, within a thread's
    /// range of `g.n`.
    fn images_per_run(&self, g: &Conv2dGeometry) -> usize {
        MIN_POSITIONS.div_ceil(self.positions()).clamp(1, images_per_range(g.n))
    }

    /// How many positions past its own the furthest tap reads.
    fn reach(&self, g: &Conv2dGeometry) -> usize {
        (g.kh - 1) * g.dilation[0] * self.wp + (g.kw - 1) * g.dilation[1]
    }

    /// Positions of each plane of `n` images' copy: their grids in whole blocks of 32, then
    /// zeros up to the last position a tap of the last block reads.
    fn plane_words(&self, n: usize, g: &Conv2dGeometry) -> usize {
        (n * self.positions()).next_multiple_of(SIDE) + self.reach(g)
    }
}

/// Whether a convolution of geometry `g` runs on the grid.
pub fn applies(g: &Conv2dGeometry) -> bool {
    Grid::of(g).is_some()
}

/// Whether the input gradient of `g` (into `o` output channels) runs on the grid: a stride-1
/// convolution whose transposed convolution does.
pub fn applies_to_input_gradient(g: &Conv2dGeometry, o: usize) -> bool {
    super::transposed::geometry(g, o).is_some_and(|t| applies(&t))
}

/// `weight [o, c·kh·kw] @ im2col(x)` as `[o, n·oh·ow]` into `out`. Call only where
/// `applies(g)` and AMX tiles run.
pub fn forward(pool: &Pool, x: &[bf16], weight: &[bf16], g: &Conv2dGeometry, o: usize, out: &mut [bf16]) {
    let pixels = g.out_h() * g.out_w();
    let target = Target {
        at: Columns(out.as_mut_ptr()),
        row_stride: g.n * pixels,
        image_stride: pixels,
    };
    let strips = weight_strips(pool, weight, o, g.c, g.kh * g.kw);
    convolve(pool, x, Planes::nchw(g), g, &strips, target);
    strips.recycle(pool);
}

/// The input gradient `[n, c, h, w]` of `g` into `grad_x` from `grad` `[o, n·oh·ow]`, as the
/// transposed convolution. Call only where `applies_to_input_gradient(g, o)` and AMX tiles run.
pub fn input_gradient(pool: &Pool, grad: &[bf16], weight: &[bf16], g: &Conv2dGeometry, o: usize, grad_x: &mut [bf16]) {
    let t = Transposed::plan(pool, g, o, weight).expect("a stride-1 convolution");
    let image = *t.geometry();
    let pixels = image.h * image.w;
    let strips = weight_strips(pool, &t.weight, g.c, o, g.kh * g.kw);
    let target = Target {
        at: Columns(grad_x.as_mut_ptr()),
        row_stride: g.h * g.w,
        image_stride: g.c * g.h * g.w,
    };
    let planes = Planes {
        image: pixels,
        channel: g.n * pixels,
    };
    convolve(pool, grad, planes, &Conv2dGeometry { n: g.n, ..image }, &strips, target);
    strips.recycle(pool);
    t.recycle(pool);
}

/// Where a convolution's results go: output channel `r` of image `i`'s pixel `p` at
/// `r·row_stride + i·image_stride + p` elements from `at`.
#[derive(Clone, Copy)]
struct Target {
    at: Columns<bf16>,
    row_stride: usize,
    image_stride: usize,
}

impl Target {
    /// The images from `first` on (a run's, which only its task writes).
    fn images_on(self, first: usize) -> Target {
        Target {
            at: Columns(self.at.0.wrapping_add(first * self.image_stride)),
            ..self
        }
    }
}

/// `weight` (`[rows, c, kernel]`) packed into the tiles' strips with its sum in the grid's
/// order: tap by tap, channel pairs within.
fn weight_strips(pool: &Pool, weight: &[bf16], rows: usize, c: usize, kernel: usize) -> Strips {
    let k = c * kernel;
    let mut by_tap = pool.take::<bf16>(rows * k);
    for (row, dst) in weight.chunks_exact(k).zip(by_tap.chunks_exact_mut(k)) {
        for (t, taps) in dst.chunks_exact_mut(c).enumerate() {
            taps.iter_mut()
                .enumerate()
                .for_each(|(ch, d)| *d = row[ch * kernel + t]);
        }
    }
    let side = Side {
        data: &by_tap,
        offset: 0,
        rows,
        row_stride: k,
        k_stride: 1,
    };
    let strips = Strips::pack(pool, side, k);
    pool.recycle(HostVec::BF16(by_tap));
    strips
}

/// The convolution of `g.n` images of `src` (planes at `planes`) by `strips` into `target`,
/// each thread a range of images, copied a run at a time.
fn convolve(pool: &Pool, src: &[bf16], planes: Planes, g: &Conv2dGeometry, strips: &Strips, target: Target) {
    use rayon::prelude::*;
    let grid = Grid::of(g).expect("the caller checked that the grid applies");
    // In bytes of the copy (a word per position), as the tile loads take them.
    let offsets: Vec<isize> = grid.shifts(g).iter().map(|&shift| (shift * 4) as isize).collect();
    let per = grid.images_per_run(g);
    let plane_words = grid.plane_words(per, g);
    image_ranges(g.n).for_each(|images| {
        let mut copy = pool.take::<u32>(g.c / 2 * plane_words);
        for (first, run) in products(images, per, g) {
            copy_images(
                &src[first * planes.image..],
                planes,
                run.n,
                &grid,
                plane_words,
                &mut copy,
            );
            let run_target = target.images_on(first);
            // SAFETY: this process runs tiles (the caller's promise); the copy holds the run's
            // grids by channel pair at `plane_words`, zero past them up to the last read.
            unsafe { multiply(&copy, plane_words, &grid, run.n, strips, &offsets, run_target) };
        }
        pool.recycle(HostVec::U32(copy));
    });
}

/// `n` images of `src` into `copy`: for each channel pair a plane of `plane_words` words,
/// each image's grid after the last, zero in the padding and past the last grid.
fn copy_images(src: &[bf16], planes: Planes, n: usize, grid: &Grid, plane_words: usize, copy: &mut [u32]) {
    let positions = grid.positions();
    for (cp, plane) in copy.chunks_exact_mut(plane_words).enumerate() {
        for (i, image) in plane[..n * positions].chunks_exact_mut(positions).enumerate() {
            let at = |ch: usize| &src[i * planes.image + ch * planes.channel..][..grid.h * grid.w];
            wide(PadPair {
                out: image,
                even: at(2 * cp),
                odd: at(2 * cp + 1),
                grid,
            });
        }
        plane[n * positions..].fill(0);
    }
}

/// One image's grid of a channel pair: `join(even, odd)` pixel by pixel inside, zero in the
/// padding. Run by `simd::wide`.
struct PadPair<'a> {
    out: &'a mut [u32],
    even: &'a [bf16],
    odd: &'a [bf16],
    grid: &'a Grid,
}

impl Kernel for PadPair<'_> {
    type Out = ();
    #[inline(always)]
    fn run(self) {
        let PadPair { out, even, odd, grid } = self;
        let ([top, left], (h, w, wp)) = (grid.padding, (grid.h, grid.w, grid.wp));
        let (above, rest) = out.split_at_mut(top * wp);
        above.fill(0);
        let (rows, below) = rest.split_at_mut(h * wp);
        below.fill(0);
        for (y, row) in rows.chunks_exact_mut(wp).enumerate() {
            let (before, inside) = row.split_at_mut(left);
            before.fill(0);
            let (inside, after) = inside.split_at_mut(w);
            after.fill(0);
            let (even, odd) = (&even[y * w..][..w], &odd[y * w..][..w]);
            for (word, (&e, &o)) in inside.iter_mut().zip(even.iter().zip(odd)) {
                *word = join(e, o);
            }
        }
    }
}

/// A run of contiguous output pixels within a block of 32 grid positions: its first column in
/// the block, its length and its pixels' place in `Target` (image and pixel).
#[derive(Clone, Copy, Default)]
struct Segment {
    column: usize,
    len: usize,
    at: usize,
}

/// The output pixels among grid positions `first..first + 32` of `n` images, as runs within
/// an output row; returns how many of `segments` it filled.
fn segments(grid: &Grid, first: usize, n: usize, image_stride: usize, segments: &mut [Segment; SIDE]) -> usize {
    let mut count = 0;
    let end = (first + SIDE).min(n * grid.positions());
    let mut f = first;
    while f < end {
        let (image, within) = (f / grid.positions(), f % grid.positions());
        let (y, x) = (within / grid.wp, within % grid.wp);
        // The rest of this grid row, within the block.
        let row_end = (f + grid.wp - x).min(end);
        if y < grid.oh && x < grid.ow {
            let len = (grid.ow - x).min(row_end - f);
            segments[count] = Segment {
                column: f - first,
                len,
                at: image * image_stride + y * grid.ow + x,
            };
            count += 1;
        }
        f = row_end;
    }
    count
}

/// Every block of the run's `n` images (32 grid positions by 32 of the strips' rows) summed
/// over the taps and written to `target`.
///
/// # Safety
/// AMX tiles run in this process; `copy` holds the run's grids by channel pair, planes
/// `plane_words` apart, zero from the last grid to the end of each plane; the strips hold the
/// weight in the grid's order over `offsets.len()` taps of the copy's channel pairs; `target`
/// takes the strips' rows of the run's images, touched by nothing else meanwhile.
unsafe fn multiply(
    copy: &[u32],
    plane_words: usize,
    grid: &Grid,
    n: usize,
    strips: &Strips,
    offsets: &[isize],
    target: Target,
) {
    let steps = strips.pairs() / offsets.len() / PAIRS_PER_STEP;
    let (rows, blocks) = (strips.rows(), (n * grid.positions()).div_ceil(SIDE));
    let mut acc = [[0f32; SIDE]; SIDE];
    let mut runs = [Segment::default(); SIDE];
    // Strip by strip: its 32 rows of the weight stay in the L1 cache, and the blocks' writes
    // go along the same 32 rows of the output (a page each) instead of jumping between strips.
    let body = || {
        for s in 0..rows.div_ceil(SIDE) {
            for block in 0..blocks {
                let count = segments(grid, block * SIDE, n, target.image_stride, &mut runs);
                if count == 0 {
                    continue; // all padding
                }
                // SAFETY: inside `with_tiles`; strip s holds 32 rows of `pairs` words, the taps'
                // sums one after another; from the block's first position each tap's shift
                // reads `steps * 16` channel pairs' planes, 32 words each, inside the copy
                // (its planes run past the last block by the furthest shift).
                unsafe {
                    amx::block_taps(
                        (strips.strip(s), strips.pairs() * 4),
                        (copy[block * SIDE..].as_ptr(), plane_words * 4),
                        offsets,
                        steps,
                        &mut acc,
                    )
                };
                let first_row = s * SIDE;
                wide(WriteBlock {
                    acc: &acc,
                    rows: first_row..(first_row + SIDE).min(rows),
                    segments: &runs[..count],
                    target,
                });
            }
        }
    };
    // SAFETY: the caller's promise that tiles run here; the body runs only `block_taps` on them.
    unsafe { amx::with_tiles(body) };
}

/// A block's output pixels rounded into the target. Run by `simd::wide`.
struct WriteBlock<'a> {
    acc: &'a [[f32; SIDE]; SIDE],
    rows: std::ops::Range<usize>,
    segments: &'a [Segment],
    target: Target,
}

impl Kernel for WriteBlock<'_> {
    type Out = ();
    #[inline(always)]
    fn run(self) {
        let WriteBlock {
            acc,
            rows,
            segments,
            target,
        } = self;
        for (r, sums) in rows.zip(acc) {
            for segment in segments {
                // SAFETY: the row and the segment's pixels lie inside the target (the caller
                // of `multiply` gave it the run's images), which no other task writes.
                let out = unsafe {
                    std::slice::from_raw_parts_mut(target.at.0.add(r * target.row_stride + segment.at), segment.len)
                };
                // The rounding written out here, not called: a call kept it at the baseline's
                // vector width, outside the widest copy of this loop.
                for (o, &v) in out.iter_mut().zip(&sums[segment.column..][..segment.len]) {
                    *o = <bf16 as ViaF32>::from_f32(v);
                }
            }
        }
    }
}

/// The weight gradient `[o, c·kh·kw]` of `g` into `grad_w`, from `x` and the output gradient
/// `grad` (`[o, n·oh·ow]`): for each tap, `x @ gradᵀ` over the grid's positions, each channel's
/// padded grid read in place as the left side from the tap's shift, the output gradient laid
/// on the grid (zero where the grid is padding) and turned into pairs of positions as the
/// right side, once for every tap. Each thread sums its range of images in f32, and the
/// ranges' sums are added in order (deterministic) and rounded once. Call only where
/// `applies(g)` and AMX tiles run.
pub fn weight_gradient(pool: &Pool, x: &[bf16], grad: &[bf16], g: &Conv2dGeometry, o: usize, grad_w: &mut [bf16]) {
    use rayon::prelude::*;
    let grid = Grid::of(g).expect("the caller checked that the grid applies");
    let (kernel, c) = (g.kh * g.kw, g.c);
    let per = grid.images_per_run(g);
    let partials: Vec<Vec<f32>> = image_ranges(g.n)
        .map(|images| {
            let mut scratch = WeightScratch::take(pool, &grid, g, o, per);
            let mut partial = pool.take::<f32>(kernel * c * o);
            partial.fill(0.0);
            for (first, run) in products(images, per, g) {
                scratch.fill(x, grad, g, first, run.n);
                // SAFETY: this process runs tiles (the caller's promise); the scratch holds the
                // run's images and gradient as `accumulate` reads them.
                unsafe { scratch.accumulate(g, &mut partial) };
            }
            scratch.recycle(pool);
            partial
        })
        .collect();
    // The sums are `[c, kernel, o]`: turned, the weight's `[o, c, kernel]`.
    rounded_sum_turned(pool, partials, c * kernel, o, grad_w);
}

/// A thread's copies for the weight gradient of a run of images: each channel's padded grid
/// (`planes`, `plane_len` apart: the grids one after another, then zeros as far as the furthest
/// tap reads), the output gradient on the grid (`grad`, `len` positions a row, zero where the
/// grid is padding), and that gradient by pairs of positions with its channels innermost
/// (`pairs[p][r]` joins positions `2p` and `2p + 1` of row `r`; `width` words a pair, zero
/// past `o`).
struct WeightScratch {
    planes: Vec<bf16>,
    plane_len: usize,
    grad: Vec<bf16>,
    len: usize,
    pairs: Vec<u32>,
    width: usize,
    grid: Grid,
    o: usize,
}

/// Words turned at a time (a cache line of them).
const TURN: usize = 16;

impl WeightScratch {
    fn take(pool: &Pool, grid: &Grid, g: &Conv2dGeometry, o: usize, per: usize) -> WeightScratch {
        let len = (per * grid.positions()).next_multiple_of(SIDE);
        let (plane_len, width) = (grid.plane_words(per, g), o.next_multiple_of(SIDE));
        let mut pairs = pool.take::<u32>(len / 2 * width);
        // The rows past `o` are read into junk columns of the tiles and never written back.
        if width > o {
            pairs.fill(0);
        }
        WeightScratch {
            planes: pool.take(g.c * plane_len),
            plane_len,
            grad: pool.take(o * len),
            len,
            pairs,
            width,
            grid: *grid,
            o,
        }
    }

    /// Lays out the `n` images from `first`.
    fn fill(&mut self, x: &[bf16], grad: &[bf16], g: &Conv2dGeometry, first: usize, n: usize) {
        let grid = self.grid;
        let (pixels, positions) = (grid.oh * grid.ow, grid.positions());
        let width = g.n * pixels;
        for (r, row) in self.grad.chunks_exact_mut(self.len).enumerate() {
            row.fill(bf16::ZERO);
            for i in 0..n {
                let src = &grad[r * width + (first + i) * pixels..][..pixels];
                for (y, pixels) in src.chunks_exact(grid.ow).enumerate() {
                    row[i * positions + y * grid.wp..][..grid.ow].copy_from_slice(pixels);
                }
            }
        }
        let image = g.c * g.h * g.w;
        for (ch, plane) in self.planes.chunks_exact_mut(self.plane_len).enumerate() {
            plane.fill(bf16::ZERO);
            for i in 0..n {
                let src = &x[(first + i) * image + ch * g.h * g.w..][..g.h * g.w];
                let at = i * positions + grid.padding[0] * grid.wp + grid.padding[1];
                for (y, pixels) in src.chunks_exact(g.w).enumerate() {
                    plane[at + y * grid.wp..][..g.w].copy_from_slice(pixels);
                }
            }
        }
        wide(TurnPairs {
            grad: bytemuck::cast_slice(&self.grad),
            rows: self.o,
            pairs: &mut self.pairs,
            width: self.width,
        });
    }

    /// `partial[c][t][r] += Σ x[c][f + shift(t)] · grad[r][f]` over the run's grid positions.
    ///
    /// # Safety
    /// AMX tiles run in this process; `fill` laid out the run.
    unsafe fn accumulate(&self, g: &Conv2dGeometry, partial: &mut [f32]) {
        let (c, o) = (g.c, self.o);
        let shifts = self.grid.shifts(g);
        let kernel = shifts.len();
        let mut acc = [[0f32; SIDE]; SIDE];
        let body = || {
            for (t, &shift) in shifts.iter().enumerate() {
                for s in 0..c / SIDE {
                    let strip = self.planes[s * SIDE * self.plane_len + shift..].as_ptr();
                    for q in 0..self.width / SIDE {
                        // SAFETY: inside `with_tiles`; the strip is 32 channels' grids from the
                        // tap's shift, `len` (a multiple of 32) elements each inside their
                        // planes (which run past `len` by the furthest shift); B is `len / 2`
                        // rows of pairs, 32 of `width` words each from row 32q.
                        unsafe {
                            amx::block_taps(
                                (strip.cast(), self.plane_len * 2),
                                (self.pairs[q * SIDE..].as_ptr(), self.width * 4),
                                &[0],
                                self.len / 2 / PAIRS_PER_STEP,
                                &mut acc,
                            )
                        };
                        let columns = (o - q * SIDE).min(SIDE);
                        for (r, sums) in acc.iter().enumerate() {
                            let at = ((s * SIDE + r) * kernel + t) * o + q * SIDE;
                            partial[at..at + columns]
                                .iter_mut()
                                .zip(sums)
                                .for_each(|(p, v)| *p += v);
                        }
                    }
                }
            }
        };
        // SAFETY: the caller's promise that tiles run here; the body runs only `block_taps` on them.
        unsafe { amx::with_tiles(body) };
    }

    fn recycle(self, pool: &Pool) {
        pool.recycle(HostVec::BF16(self.planes));
        pool.recycle(HostVec::BF16(self.grad));
        pool.recycle(HostVec::U32(self.pairs));
    }
}

/// `pairs[p][r] = grad[r][p]` for the first `rows` rows of `grad` (rows of words: pairs of
/// positions), 16 by 16 words so both sides move a cache line at a time. Run by `simd::wide`.
struct TurnPairs<'a> {
    grad: &'a [u32],
    rows: usize,
    pairs: &'a mut [u32],
    width: usize,
}

impl Kernel for TurnPairs<'_> {
    type Out = ();
    #[inline(always)]
    fn run(self) {
        let TurnPairs {
            grad,
            rows,
            pairs,
            width,
        } = self;
        let row_len = grad.len() / rows.max(1);
        for p0 in (0..row_len).step_by(TURN) {
            let ps = (row_len - p0).min(TURN);
            for r0 in (0..rows).step_by(TURN) {
                let rs = (rows - r0).min(TURN);
                let mut block = [[0u32; TURN]; TURN];
                for (r, words) in block.iter_mut().enumerate().take(rs) {
                    words[..ps].copy_from_slice(&grad[(r0 + r) * row_len + p0..][..ps]);
                }
                for p in 0..ps {
                    let out = &mut pairs[(p0 + p) * width + r0..][..rs];
                    for (r, word) in out.iter_mut().enumerate() {
                        *word = block[r][p];
                    }
                }
            }
        }
    }
}
