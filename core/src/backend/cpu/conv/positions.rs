//! A bf16 or f32 convolution whose tiles are one output position in 32 images: every lane of a
//! tile reads the same input position for a tap, so a tap whose source lies in the padding is
//! left out of the tile's sum, not multiplied by zeros. Tiles of 32 neighbouring pixels (the
//! other paths) always hold some pixel for which a tap is real. On ResNet-18's CIFAR shapes a
//! 3x3 convolution with padding 1 has 16% of its products in the padding at 8x8 and 31% at 4x4;
//! PyTorch's oneDNN skips them as well. Input gradients of any stride run the same way, each
//! input pixel summing the output gradient's pixels whose taps read it; and weight gradients,
//! each tap of 32 input channels summed over the batch's pixels where that tap is real.
//!
//! The input is laid out for it first: positions, then channels (in bf16, channel pairs
//! interleaved: the kernel's k-pairs), then images (`[h·w, c/2, n]` words), so a tile's panel
//! for one tap and channel (pair) is 32 consecutive words and a tap's channels follow. The
//! weight is packed into strips tap by tap, so a tap's channels are one run of words.

use half::bf16;
use rayon::prelude::*;

use super::ranges::Columns;
use super::unfold::Planes;
use crate::backend::Conv2dGeometry;
use crate::backend::cpu::float::bf16_from_f32_slice;
use crate::backend::cpu::matmul::bf16::join;
use crate::backend::cpu::matmul::bf16_kernel::{self, Interleaved, MR, NR, StridedPanel};
use crate::backend::cpu::matmul::f32_kernel;
use crate::backend::cpu::pool::Pool;
use crate::dtype::Element;

/// An element type with a kernel for this path: what one word of its layouts holds, and the
/// tile that sums them.
pub trait Lanes: Element {
    /// bf16: two channels in a `u32` (the bf16 kernel's k-pairs); f32: one.
    type Word: Element;
    const PER_WORD: usize;
    /// Words (the kernel's steps) a tile sums at least, on average, for its sum to outweigh
    /// writing it a lane at a time and laying out its input (batch 64, 2 threads). bf16's 3x3
    /// stride-2 input gradients took 15% longer with 144 words a tile, 10-20% less time with
    /// 288 and 576, and a 1x1 stride-2 one (a quarter of the pixels take its one tap) 2-3x as
    /// long with 64; f32's took 10% longer with 553 and 15% less time with 968, and a 4x4
    /// layer's weight gradient (711) 20% less time.
    const MIN_WORDS: usize;
    /// Whether this CPU has the kernel.
    fn available() -> bool;
    /// Channels `first` and `first + 1` (the second ignored where a word holds one).
    fn word(first: Self, second: Self) -> Self::Word;
    /// The tile: `pieces(i)` gives piece `i`'s strip (`words · MR` words, row by row) and
    /// panel (`NR` words at each of `words` offsets `stride` apart).
    ///
    /// # Safety
    /// `available()`, the strips and panels holding what they should, and `rows <= MR`.
    unsafe fn tile(
        rows: usize,
        segments: usize,
        pieces: impl Fn(usize) -> (*const Self::Word, *const Self::Word),
        words: usize,
        stride: usize,
        out: &mut [[f32; NR]; MR],
    );
    /// A row of f32 sums as this type.
    fn round(dst: &mut [Self; NR], sums: &[f32; NR]);
}

impl Lanes for bf16 {
    type Word = u32;
    const PER_WORD: usize = 2;
    const MIN_WORDS: usize = 256;
    fn available() -> bool {
        bf16_kernel::available()
    }
    fn word(first: bf16, second: bf16) -> u32 {
        join(first, second)
    }
    unsafe fn tile(
        rows: usize,
        segments: usize,
        pieces: impl Fn(usize) -> (*const u32, *const u32),
        words: usize,
        stride: usize,
        out: &mut [[f32; NR]; MR],
    ) {
        let piece = |i| {
            let (strip, first) = pieces(i);
            (Interleaved(strip), StridedPanel { first, stride })
        };
        // SAFETY: the caller's promises, which are the kernel's.
        unsafe { bf16_kernel::tile(rows, segments, piece, words, out) }
    }
    fn round(dst: &mut [bf16; NR], sums: &[f32; NR]) {
        bf16_from_f32_slice(dst, sums)
    }
}

impl Lanes for f32 {
    type Word = f32;
    const PER_WORD: usize = 1;
    const MIN_WORDS: usize = 700;
    fn available() -> bool {
        f32_kernel::available()
    }
    fn word(first: f32, _: f32) -> f32 {
        first
    }
    unsafe fn tile(
        rows: usize,
        segments: usize,
        pieces: impl Fn(usize) -> (*const f32, *const f32),
        words: usize,
        stride: usize,
        out: &mut [[f32; NR]; MR],
    ) {
        // SAFETY: the caller's promises, which are the kernel's.
        unsafe { f32_kernel::tile(rows, segments, pieces, words, stride, out) }
    }
    fn round(dst: &mut [f32; NR], sums: &[f32; NR]) {
        *dst = *sums;
    }
}

/// Source positions each task of `by_position` lays out.
const POSITIONS_PER_TASK: usize = 8;

/// The share of the usual work (every tap of every lane) below which this path runs: it pays
/// for laying out its input and for writing its tiles a lane at a time.
const MAX_WORK: f64 = 0.9;

/// Input channels below which a tap's run of pairs is too short to be worth a piece of its own.
const MIN_CHANNELS: usize = 32;

/// `g`'s product (`weight` `[o, c, kh, kw]`) by output position into `out` (`[o, n·oh·ow]`).
/// Panics where the CPU lacks `T`'s kernel.
pub fn forward<T: Lanes>(pool: &Pool, x: &[T], weight: &[T], g: &Conv2dGeometry, o: usize, out: &mut [T]) {
    let plan = Plan::forward(g);
    let by_row = Planes {
        image: g.out_h() * g.out_w(),
        channel: g.n * g.out_h() * g.out_w(),
    };
    plan.run(pool, (x, Planes::nchw(g)), weight, o, (out, by_row));
}

/// A convolution's weight gradient, each tile one tap for 32 input channels summed over the
/// batch's real pixels: complete in one tile, no partial sums per thread to add.
pub struct WeightGradient(Plan);

impl WeightGradient {
    /// The weight gradient of `g` tap by tap.
    pub fn new(g: &Conv2dGeometry) -> WeightGradient {
        WeightGradient(Plan::weight_gradient(g))
    }

    /// `grad_w` (`[o, c, kh, kw]`) from `x` (`[n, c, h, w]`) and `grad` (`[o, n·oh·ow]`).
    pub fn run<T: Lanes>(&self, pool: &Pool, x: &[T], grad: &[T], g: &Conv2dGeometry, o: usize, grad_w: &mut [T]) {
        let taps = g.kh * g.kw;
        // Lanes are channels (a plane apart in `x`), words images (an image apart).
        let channels = Planes {
            image: g.h * g.w,
            channel: g.c * g.h * g.w,
        };
        let by_row = Planes {
            image: taps,
            channel: g.c * taps,
        };
        self.0.run(pool, (x, channels), grad, o, (grad_w, by_row));
    }
}

/// A convolution's input gradient by output position.
pub struct InputGradient(Plan);

impl InputGradient {
    /// The input gradient of `g` (`o` output channels) by output position.
    pub fn new(g: &Conv2dGeometry, o: usize) -> InputGradient {
        InputGradient(Plan::input_gradient(g, o))
    }

    /// `grad_x` (`[n, c, h, w]`) from `grad` (`[o, n·oh·ow]`) and `weight` (`[o, c, kh, kw]`).
    pub fn run<T: Lanes>(&self, pool: &Pool, grad: &[T], weight: &[T], g: &Conv2dGeometry, grad_x: &mut [T]) {
        let pixels = g.out_h() * g.out_w();
        let gradient = Planes {
            image: pixels,
            channel: g.n * pixels,
        };
        self.0
            .run(pool, (grad, gradient), weight, g.c, (grad_x, Planes::nchw(g)));
    }
}

/// A convolution's sum seen output position by output position: the taps each position takes
/// and where in the source each reads.
pub struct Plan {
    /// Every output position's real taps, `(tap, source position)`: position `p`'s are
    /// `pieces[starts[p]..starts[p + 1]]`.
    pieces: Vec<(usize, usize)>,
    starts: Vec<usize>,
    /// The lanes: images (for the weight gradient, input channels).
    images: usize,
    /// Channels of the source (for the weight gradient, images): the sum runs over them and
    /// the taps.
    channels: usize,
    /// Positions in a plane of the source.
    source_plane: usize,
    taps: usize,
    /// Whether the weight's rows are its input channels (`[channels, rows, taps]`), for the
    /// input gradient; otherwise `[rows, channels, taps]`.
    swapped: bool,
}

impl Plan {
    /// `g`'s product: each output pixel from the input pixels its taps read.
    pub fn forward(g: &Conv2dGeometry) -> Plan {
        let mut plan = Plan::empty(g.n, g.c, g.h * g.w, g.kh * g.kw, false);
        for (oy, ox) in pixels(g.out_h(), g.out_w()) {
            plan.position((0..g.kh * g.kw).filter_map(|tap| Some((tap, source(g, (oy, ox), tap)?))));
        }
        plan
    }

    /// `g`'s weight gradient (`o` output channels), the product's roles turned: each tap is a
    /// position of the plan, summed over the output pixels where it reads a real input pixel;
    /// the lanes are input channels, the words images, and the output gradient's pixels the
    /// strips' taps.
    pub fn weight_gradient(g: &Conv2dGeometry) -> Plan {
        let (oh, ow) = (g.out_h(), g.out_w());
        let mut plan = Plan::empty(g.c, g.n, g.h * g.w, oh * ow, false);
        for tap in 0..g.kh * g.kw {
            plan.position(
                pixels(oh, ow)
                    .enumerate()
                    .filter_map(|(pixel, at)| Some((pixel, source(g, at, tap)?))),
            );
        }
        plan
    }

    /// The input gradient of `g` (`o` output channels), any stride: each input pixel from the
    /// output gradient's pixels whose taps read it.
    pub fn input_gradient(g: &Conv2dGeometry, o: usize) -> Plan {
        let (oh, ow) = (g.out_h(), g.out_w());
        // The output pixel along an axis whose tap `k` reads input pixel `i`.
        let along = |i: usize, k: usize, axis: usize, size: usize| {
            let reach = (i + g.padding[axis]).checked_sub(k * g.dilation[axis])?;
            let stride = g.stride[axis];
            (reach.is_multiple_of(stride) && reach / stride < size).then_some(reach / stride)
        };
        let mut plan = Plan::empty(g.n, o, oh * ow, g.kh * g.kw, true);
        for (iy, ix) in pixels(g.h, g.w) {
            plan.position((0..g.kh * g.kw).filter_map(|tap| {
                let oy = along(iy, tap / g.kw, 0, oh)?;
                let ox = along(ix, tap % g.kw, 1, ow)?;
                Some((tap, oy * ow + ox))
            }));
        }
        plan
    }

    fn empty(images: usize, channels: usize, source_plane: usize, taps: usize, swapped: bool) -> Plan {
        Plan {
            pieces: Vec::new(),
            starts: vec![0],
            images,
            channels,
            source_plane,
            taps,
            swapped,
        }
    }

    /// Appends the next output position's pieces.
    fn position(&mut self, pieces: impl Iterator<Item = (usize, usize)>) {
        self.pieces.extend(pieces);
        self.starts.push(self.pieces.len());
    }

    fn positions(&self) -> usize {
        self.starts.len() - 1
    }

    fn of(&self, p: usize) -> &[(usize, usize)] {
        &self.pieces[self.starts[p]..self.starts[p + 1]]
    }

    /// Whether this path pays for `T`: its taps in the padding (less the lanes left empty by a
    /// batch that is not a multiple of 32 images) save at least a tenth of the products, and
    /// its tiles' sums are long enough.
    pub fn pays<T: Lanes>(&self) -> bool {
        let (positions, real) = (self.positions(), self.pieces.len());
        if self.channels < MIN_CHANNELS || self.images == 0 || positions == 0 {
            return false;
        }
        let lanes = self.images.next_multiple_of(NR) as f64 / self.images as f64;
        let work = real as f64 / (positions * self.taps) as f64 * lanes;
        work <= MAX_WORK && real * self.channels.div_ceil(T::PER_WORD) >= T::MIN_WORDS * positions
    }

    /// For each output element (row `r`, image `i`, position `p`):
    /// `dst[i * out.image + r * out.channel + p] = weight[r] · unfold(src)`, summed in f32 and
    /// rounded once. `weight` holds `rows x channels x taps` (see `swapped`), `src` the
    /// images' source planes at `planes`. Panics where the CPU lacks `T`'s kernel.
    pub fn run<T: Lanes>(
        &self,
        pool: &Pool,
        (src, planes): (&[T], Planes),
        weight: &[T],
        rows: usize,
        (dst, out): (&mut [T], Planes),
    ) {
        let (positions, images) = (self.positions(), self.images);
        if rows == 0 || images == 0 || positions == 0 {
            return;
        }
        assert!(T::available(), "the position path needs its kernel's CPU features");
        let (lanes, words) = (images.next_multiple_of(NR), self.channels.div_ceil(T::PER_WORD));
        let input = self.by_position(pool, src, planes, lanes);
        let strips = self.strips(pool, weight, rows);
        let (strip_count, blocks) = (rows.div_ceil(MR), lanes / NR);
        let last = (images - 1) * out.image + (rows - 1) * out.channel + positions - 1;
        assert!(dst.len() > last, "the output holds every element written");
        let dst = Columns(dst.as_mut_ptr());
        let strip_words = self.taps * words * MR;
        let stride = lanes;
        (0..strip_count * blocks * positions).into_par_iter().for_each(|item| {
            // The whole `Columns` (Send), not its raw pointer field (which is not).
            #[allow(clippy::redundant_locals)]
            let dst = dst;
            let (s, block, p) = (item / (blocks * positions), item / positions % blocks, item % positions);
            let pieces = self.of(p);
            // Strip s holds `taps` runs of `words * MR` words; the input, at each position,
            // `words` runs of `lanes` words.
            let piece = |i: usize| {
                let (tap, source) = pieces[i];
                (
                    strips[s * strip_words + tap * words * MR..].as_ptr(),
                    input[source * words * lanes + block * NR..].as_ptr(),
                )
            };
            let srows = (rows - s * MR).min(MR);
            let mut acc = [[0f32; NR]; MR];
            // SAFETY: the CPU has the kernel (asserted above); each piece's strip holds
            // `words` words of MR rows and its panel `words` runs of NR lanes `stride` apart
            // (the layouts above); srows <= MR.
            unsafe { T::tile(srows, pieces.len(), piece, words, stride, &mut acc) };
            let count = (images - block * NR).min(NR);
            let mut rounded = [T::from_f64(0.0); NR];
            for (r, row) in acc.iter().enumerate().take(srows) {
                T::round(&mut rounded, row);
                let first = block * NR * out.image + (s * MR + r) * out.channel + p;
                for (i, &v) in rounded.iter().enumerate().take(count) {
                    // SAFETY: at most `last` (checked above); this tile is the only one writing
                    // row s·MR + r of these images at position p.
                    unsafe { *dst.0.add(first + i * out.image) = v };
                }
            }
        });
        pool.recycle(T::Word::into_host(input));
        pool.recycle(T::Word::into_host(strips));
    }

    /// The source images as `[source plane, channels / PER_WORD, lanes]` words: channels
    /// PER_WORD·j.. of one position and image in word `(position·words + j)·lanes + image`,
    /// lanes past the images (and an odd count's last bf16 word's upper half) zero. A piece's
    /// words are one run (channel-major, each channel's panels 4 KiB apart on a 4x4 layer,
    /// left the f32 kernel at 58% of its peak).
    fn by_position<T: Lanes>(&self, pool: &Pool, src: &[T], planes: Planes, lanes: usize) -> Vec<T::Word> {
        let (plane, channels, images) = (self.source_plane, self.channels, self.images);
        let words = channels.div_ceil(T::PER_WORD);
        let mut laid = pool.take::<T::Word>(plane * words * lanes);
        laid.par_chunks_mut(POSITIONS_PER_TASK * words * lanes)
            .enumerate()
            .for_each(|(task, laid)| {
                if lanes > images {
                    laid.fill(T::Word::from_f64(0.0));
                }
                let first_position = task * POSITIONS_PER_TASK;
                let count = laid.len() / (words * lanes);
                // Each channel (pair) of the task's positions through a small transpose, so that
                // both the images' runs of positions and the runs of lanes are read and written
                // in order (either alone left the other a scatter).
                let mut block = vec![T::Word::from_f64(0.0); count * images];
                for j in 0..words {
                    let first = j * T::PER_WORD;
                    let second = T::PER_WORD == 2 && first + 1 < channels;
                    for i in 0..images {
                        let channel =
                            |c: usize| &src[i * planes.image + c * planes.channel + first_position..][..count];
                        let (even, odd) = (channel(first), second.then(|| channel(first + 1)));
                        for (position, &v) in even.iter().enumerate() {
                            let odd = odd.map_or(T::from_f64(0.0), |odd| odd[position]);
                            block[position * images + i] = T::word(v, odd);
                        }
                    }
                    for (position, run) in block.chunks_exact(images).enumerate() {
                        laid[(position * words + j) * lanes..][..images].copy_from_slice(run);
                    }
                }
            });
        laid
    }

    /// The weight as strips of `MR` rows, tap by tap, word by word: word
    /// `((strip·taps + tap)·words + j)·MR + r` holds channels PER_WORD·j.. of row strip·MR + r
    /// at that tap; rows past the end (and an odd count's missing bf16 channel) zero.
    fn strips<T: Lanes>(&self, pool: &Pool, weight: &[T], rows: usize) -> Vec<T::Word> {
        let (channels, taps) = (self.channels, self.taps);
        let words = channels.div_ceil(T::PER_WORD);
        let mut strips = pool.take::<T::Word>(rows.div_ceil(MR) * taps * words * MR);
        // Row `row`'s taps of channel `channel`: one run in either layout.
        let taps_of = |row: usize, channel: usize| {
            let first = match self.swapped {
                false => (row * channels + channel) * taps,
                true => (channel * rows + row) * taps,
            };
            &weight[first..][..taps]
        };
        let zero = T::from_f64(0.0);
        strips
            .par_chunks_mut(taps * words * MR)
            .enumerate()
            .for_each(|(s, strip)| {
                // Row by row, each channel's taps read as one run.
                for r in 0..MR {
                    let row = s * MR + r;
                    for j in 0..words {
                        let first = j * T::PER_WORD;
                        let even = (row < rows).then(|| taps_of(row, first));
                        let odd =
                            (row < rows && T::PER_WORD == 2 && first + 1 < channels).then(|| taps_of(row, first + 1));
                        for tap in 0..taps {
                            let value = |run: Option<&[T]>| run.map_or(zero, |run| run[tap]);
                            strip[(tap * words + j) * MR + r] = T::word(value(even), value(odd));
                        }
                    }
                }
            });
        strips
    }
}

/// The input position that output pixel `(oy, ox)`'s tap `tap` reads; None in the padding.
fn source(g: &Conv2dGeometry, (oy, ox): (usize, usize), tap: usize) -> Option<usize> {
    let along = |o: usize, k: usize, axis: usize, size: usize| {
        (o * g.stride[axis] + k * g.dilation[axis])
            .checked_sub(g.padding[axis])
            .filter(|&i| i < size)
    };
    let iy = along(oy, tap / g.kw, 0, g.h)?;
    let ix = along(ox, tap % g.kw, 1, g.w)?;
    Some(iy * g.w + ix)
}

/// The pixels of an `h x w` plane, row by row.
fn pixels(h: usize, w: usize) -> impl Iterator<Item = (usize, usize)> {
    (0..h).flat_map(move |y| (0..w).map(move |x| (y, x)))
}

#[cfg(test)]
mod tests;
