//! A bf16 convolution whose tiles are one output position in 32 images: every lane of a tile
//! reads the same input position for a tap, so a tap whose source lies in the padding is left
//! out of the tile's sum, not multiplied by zeros. Tiles of 32 neighbouring pixels (the other
//! paths) always hold some pixel for which a tap is real. On ResNet-18's CIFAR shapes a 3x3
//! convolution with padding 1 has 16% of its products in the padding at 8x8 and 31% at 4x4;
//! PyTorch's oneDNN skips them as well.
//!
//! The input is laid out for it first: channel pairs interleaved (the kernel's k-pairs), then
//! positions, then images (`[c/2, h·w, n]` words), so a tile's panel for one tap and channel
//! pair is 32 consecutive words. The weight is packed into strips tap by tap, so a tap's
//! channels are one run of pairs.

use half::bf16;
use rayon::prelude::*;

use super::conv::Planes;
use super::conv_fused::Columns;
use super::float::bf16_from_f32_slice;
use super::matmul::bf16::join;
use super::matmul::bf16_kernel::{Interleaved, MR, NR, StridedPanel, tile_segments};
use super::pool::Pool;
use crate::backend::Conv2dGeometry;
use crate::dtype::HostVec;

/// The share of the usual work (every tap of every lane) below which this path runs: it pays
/// for laying out its input and for writing its tiles a lane at a time.
const MAX_WORK: f64 = 0.9;

/// Input channels below which a tap's run of pairs is too short to be worth a piece of its own.
const MIN_CHANNELS: usize = 32;

/// k-pairs a tile sums at least, on average, for its sum to outweigh writing it a lane at a
/// time. A 1x1 stride-2 convolution's input gradient (a quarter of its pixels take one tap)
/// took 2-3x as long here; a 3x3 stride-2 one 15% longer with 64 input channels (144 pairs a
/// tile), 10-20% less time with 128 and 256 (288 and 576).
const MIN_PAIRS: usize = 256;

/// A convolution's sum seen output position by output position: the taps each position takes
/// and where in the source each reads.
pub struct Plan {
    /// Every output position's real taps, `(tap, source position)`: position `p`'s are
    /// `pieces[starts[p]..starts[p + 1]]`.
    pieces: Vec<(usize, usize)>,
    starts: Vec<usize>,
    images: usize,
    /// Channels of the source: the sum runs over them and the taps.
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
        let along = |o: usize, k: usize, axis: usize, size: usize| {
            (o * g.stride[axis] + k * g.dilation[axis])
                .checked_sub(g.padding[axis])
                .filter(|&i| i < size)
        };
        let mut plan = Plan::empty(g.n, g.c, g.h * g.w, g.kh * g.kw, false);
        for (oy, ox) in pixels(g.out_h(), g.out_w()) {
            plan.position((0..g.kh * g.kw).filter_map(|tap| {
                let iy = along(oy, tap / g.kw, 0, g.h)?;
                let ix = along(ox, tap % g.kw, 1, g.w)?;
                Some((tap, iy * g.w + ix))
            }));
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

    /// Whether this path pays: its taps in the padding (less the lanes left empty by a batch
    /// that is not a multiple of 32 images) save at least a tenth of the products.
    pub fn pays(&self) -> bool {
        let (positions, real) = (self.positions(), self.pieces.len());
        if self.channels < MIN_CHANNELS || self.images == 0 || positions == 0 {
            return false;
        }
        let lanes = self.images.next_multiple_of(NR) as f64 / self.images as f64;
        let work = real as f64 / (positions * self.taps) as f64 * lanes;
        work <= MAX_WORK && real * self.channels.div_ceil(2) >= MIN_PAIRS * positions
    }

    /// For each output element (row `r`, image `i`, position `p`):
    /// `dst[i * out.image + r * out.channel + p] = weight[r] · unfold(src)`, summed in f32 and
    /// rounded once. `weight` holds `rows x channels x taps` (see `swapped`), `src` the
    /// images' source planes at `planes`. Call only where `bf16_kernel::available()`.
    pub fn run(
        &self,
        pool: &Pool,
        (src, planes): (&[bf16], Planes),
        weight: &[bf16],
        rows: usize,
        (dst, out): (&mut [bf16], Planes),
    ) {
        let (positions, images) = (self.positions(), self.images);
        let (lanes, channel_pairs) = (images.next_multiple_of(NR), self.channels.div_ceil(2));
        let input = self.by_position(pool, src, planes, lanes);
        let strips = self.strips(pool, weight, rows);
        let (strip_count, blocks) = (rows.div_ceil(MR), lanes / NR);
        let last = (images - 1) * out.image + (rows - 1) * out.channel + positions - 1;
        assert!(dst.len() > last, "the output holds every element written");
        let dst = Columns(dst.as_mut_ptr());
        let strip_words = self.taps * channel_pairs * MR;
        (0..strip_count * blocks * positions).into_par_iter().for_each(|item| {
            // The whole `Columns` (Send), not its raw pointer field (which is not).
            #[allow(clippy::redundant_locals)]
            let dst = dst;
            let (s, block, p) = (item / (blocks * positions), item / positions % blocks, item % positions);
            let pieces = self.of(p);
            let piece = |i: usize| {
                let (tap, source) = pieces[i];
                (
                    // Strip s holds `taps` runs of `channel_pairs * MR` words; the input,
                    // `channel_pairs` runs of `source_plane·lanes` words.
                    Interleaved(strips[s * strip_words + tap * channel_pairs * MR..].as_ptr()),
                    StridedPanel {
                        first: input[source * lanes + block * NR..].as_ptr(),
                        stride: self.source_plane * lanes,
                    },
                )
            };
            let srows = (rows - s * MR).min(MR);
            let mut acc = [[0f32; NR]; MR];
            // SAFETY: the caller's promise that the CPU has the kernel; each piece's strip holds
            // `channel_pairs` pairs of MR rows and its panel `channel_pairs` pairs of NR lanes
            // (the layouts above); each tile size is at most MR rows and covers `srows`.
            unsafe {
                match srows {
                    9.. => tile_segments::<_, _, MR>(pieces.len(), piece, channel_pairs, &mut acc),
                    5..=8 => tile_segments::<_, _, 8>(pieces.len(), piece, channel_pairs, &mut acc),
                    _ => tile_segments::<_, _, 4>(pieces.len(), piece, channel_pairs, &mut acc),
                }
            }
            let count = (images - block * NR).min(NR);
            let mut rounded = [bf16::ZERO; NR];
            for (r, row) in acc.iter().enumerate().take(srows) {
                bf16_from_f32_slice(&mut rounded, row);
                let first = block * NR * out.image + (s * MR + r) * out.channel + p;
                for (i, &v) in rounded.iter().enumerate().take(count) {
                    // SAFETY: at most `last` (checked above); this tile is the only one writing
                    // row s·MR + r of these images at position p.
                    unsafe { *dst.0.add(first + i * out.image) = v };
                }
            }
        });
        pool.recycle(HostVec::U32(input));
        pool.recycle(HostVec::U32(strips));
    }

    /// The source images as `[channels/2, source plane, lanes]` words: channels 2j and 2j + 1
    /// of one position and image in word `(j·plane + position)·lanes + image`, lanes past the
    /// images (and an odd count's last channel pair's upper half) zero.
    fn by_position(&self, pool: &Pool, src: &[bf16], planes: Planes, lanes: usize) -> Vec<u32> {
        let (plane, channels, images) = (self.source_plane, self.channels, self.images);
        let mut words = pool.take::<u32>(channels.div_ceil(2) * plane * lanes);
        words.par_chunks_mut(plane * lanes).enumerate().for_each(|(j, pair)| {
            if lanes > images {
                pair.fill(0);
            }
            for i in 0..images {
                let channel = |c: usize| (c < channels).then(|| &src[i * planes.image + c * planes.channel..][..plane]);
                let (even, odd) = (channel(2 * j).expect("pair j has its even channel"), channel(2 * j + 1));
                for (position, &e) in even.iter().enumerate() {
                    pair[position * lanes + i] = join(e, odd.map_or(bf16::ZERO, |odd| odd[position]));
                }
            }
        });
        words
    }

    /// The weight as strips of `MR` rows, tap by tap, channel pair by channel pair: word
    /// `((strip·taps + tap)·channels/2 + j)·MR + r` holds channels 2j and 2j + 1 of row
    /// strip·MR + r at that tap; rows past the end (and an odd count's missing channel) zero.
    fn strips(&self, pool: &Pool, weight: &[bf16], rows: usize) -> Vec<u32> {
        let (channels, taps) = (self.channels, self.taps);
        let channel_pairs = channels.div_ceil(2);
        let mut words = pool.take::<u32>(rows.div_ceil(MR) * taps * channel_pairs * MR);
        let at = |row: usize, channel: usize, tap: usize| match (row < rows && channel < channels, self.swapped) {
            (false, _) => bf16::ZERO,
            (true, false) => weight[(row * channels + channel) * taps + tap],
            (true, true) => weight[(channel * rows + row) * taps + tap],
        };
        words
            .par_chunks_mut(taps * channel_pairs * MR)
            .enumerate()
            .for_each(|(s, strip)| {
                for (k, pair_rows) in strip.chunks_exact_mut(MR).enumerate() {
                    let (tap, j) = (k / channel_pairs, k % channel_pairs);
                    for (r, word) in pair_rows.iter_mut().enumerate() {
                        let row = s * MR + r;
                        *word = join(at(row, 2 * j, tap), at(row, 2 * j + 1, tap));
                    }
                }
            });
        words
    }
}

/// The pixels of an `h x w` plane, row by row.
fn pixels(h: usize, w: usize) -> impl Iterator<Item = (usize, usize)> {
    (0..h).flat_map(move |y| (0..w).map(move |x| (y, x)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cpu::conv::{col2im, im2col};
    use crate::backend::cpu::matmul::bf16_kernel;

    const fn geometry(n: usize, c: usize, size: usize, k: usize, stride: usize, padding: usize) -> Conv2dGeometry {
        Conv2dGeometry {
            n,
            c,
            h: size,
            w: size,
            kh: k,
            kw: k,
            stride: [stride; 2],
            padding: [padding; 2],
            dilation: [1, 1],
        }
    }

    /// Values exact in bf16 whose products and sums stay exact in f32, varied by index.
    fn values(len: usize, seed: usize) -> Vec<bf16> {
        (0..len)
            .map(|i| bf16::from_f32(((i * 7 + seed * 13) % 17) as f32 / 4.0 - 2.0))
            .collect()
    }

    /// Each output (`[rows, n, positions]`, f64) against what `plan` writes at both output
    /// layouts, `[rows, n·positions]` and NCHW.
    fn check(plan: &Plan, src: &[bf16], planes: Planes, weight: &[bf16], rows: usize, want: &[f64], what: &str) {
        let pool = Pool::default();
        let (n, positions) = (plan.images, plan.positions());
        let width = n * positions;
        let by_row = Planes {
            image: positions,
            channel: width,
        };
        let nchw = Planes {
            image: rows * positions,
            channel: positions,
        };
        for out in [by_row, nchw] {
            let mut dst = vec![bf16::from_f32(99.0); rows * width];
            plan.run(&pool, (src, planes), weight, rows, (&mut dst, out));
            for r in 0..rows {
                for i in 0..n {
                    for p in 0..positions {
                        let got = dst[i * out.image + r * out.channel + p].to_f64();
                        let exact = want[r * width + i * positions + p];
                        assert!(
                            (got - exact).abs() <= exact.abs() * 2f64.powi(-8),
                            "{what} rows {rows} image stride {}: row {r} image {i} position {p}: {got} vs {exact}",
                            out.image
                        );
                    }
                }
            }
        }
    }

    fn wide(v: &[bf16]) -> Vec<f64> {
        v.iter().map(|v| v.to_f64()).collect()
    }

    /// `a [m, k] @ b [k, n]` in f64.
    fn matmul(
        a: &dyn Fn(usize, usize) -> f64,
        b: &dyn Fn(usize, usize) -> f64,
        (m, k, n): (usize, usize, usize),
    ) -> Vec<f64> {
        (0..m * n)
            .map(|e| (0..k).map(|t| a(e / n, t) * b(t, e % n)).sum())
            .collect()
    }

    /// Convolutions and input gradients whose batches leave lanes empty, with odd channel and
    /// row counts, strides 1 and 2, 1x1 and 3x3 kernels, and paddings that leave some
    /// positions no real tap: every output against the f64 loops over `im2col` / `col2im`.
    const CASES: [(Conv2dGeometry, usize); 6] = [
        (geometry(64, 32, 4, 3, 1, 1), 16),
        (geometry(37, 33, 4, 3, 1, 1), 13),
        (geometry(33, 34, 8, 3, 2, 1), 29),
        (geometry(5, 6, 3, 3, 1, 2), 7),
        (geometry(40, 8, 2, 1, 1, 0), 12),
        (geometry(9, 4, 6, 1, 2, 0), 5),
    ];

    #[test]
    fn tiles_of_one_position_in_many_images_match_plain_loops() {
        if !bf16_kernel::available() {
            eprintln!("\n*** SKIPPED: this CPU has no AVX512-BF16; this path never runs on it ***\n");
            return;
        }
        for (g, rows) in CASES {
            let src = values(g.n * g.c * g.h * g.w, 1);
            let weight = values(rows * g.c * g.kh * g.kw, 2);
            let cols = im2col(&Pool::default(), &wide(&src), &g);
            let (taps, width) = (g.c * g.kh * g.kw, g.n * g.out_h() * g.out_w());
            let want = matmul(
                &|r, t| weight[r * taps + t].to_f64(),
                &|t, col| cols[t * width + col],
                (rows, taps, width),
            );
            check(
                &Plan::forward(&g),
                &src,
                Planes::nchw(&g),
                &weight,
                rows,
                &want,
                &format!("forward {g:?}"),
            );
        }
    }

    #[test]
    fn input_gradients_of_one_position_in_many_images_match_plain_loops() {
        if !bf16_kernel::available() {
            eprintln!("\n*** SKIPPED: this CPU has no AVX512-BF16; this path never runs on it ***\n");
            return;
        }
        // `g` has `o` output channels; the gradient `[o, n·oh·ow]` is the source, `g.c` rows.
        for (g, o) in CASES {
            let (taps, width) = (g.c * g.kh * g.kw, g.n * g.out_h() * g.out_w());
            let grad = values(o * width, 3);
            let weight = values(o * taps, 4);
            let cols = matmul(
                &|t, r| weight[r * taps + t].to_f64(),
                &|r, col| grad[r * width + col].to_f64(),
                (taps, o, width),
            );
            let images = col2im(&Pool::default(), &cols, &g);
            // NCHW -> [c, n·h·w], the layout `check` compares.
            let plane = g.h * g.w;
            let want: Vec<f64> = (0..g.c * g.n * plane)
                .map(|e| {
                    let (c, i, p) = (e / (g.n * plane), e / plane % g.n, e % plane);
                    images[(i * g.c + c) * plane + p]
                })
                .collect();
            let gradient = Planes {
                image: g.out_h() * g.out_w(),
                channel: width,
            };
            let plan = Plan::input_gradient(&g, o);
            check(
                &plan,
                &grad,
                gradient,
                &weight,
                g.c,
                &want,
                &format!("input gradient {g:?}"),
            );
        }
    }

    #[test]
    fn only_convolutions_with_enough_taps_in_the_padding_pay() {
        let pays = |g| Plan::forward(&g).pays();
        assert!(
            pays(geometry(64, 512, 4, 3, 1, 1)),
            "4x4: 31% of the taps in the padding"
        );
        assert!(pays(geometry(64, 256, 8, 3, 1, 1)), "8x8: 16%");
        assert!(!pays(geometry(64, 64, 32, 3, 1, 1)), "32x32: 4%");
        assert!(!pays(geometry(64, 256, 8, 1, 1, 0)), "1x1: none");
        assert!(!pays(geometry(40, 512, 4, 3, 1, 1)), "24 of 64 lanes empty");
        assert!(!pays(geometry(64, 3, 4, 3, 1, 1)), "three channels: pieces too short");
        let gradient_pays = |g, o| Plan::input_gradient(&g, o).pays();
        assert!(
            gradient_pays(geometry(64, 128, 16, 3, 2, 1), 256),
            "stride 2: three in four taps read no pixel"
        );
        assert!(!gradient_pays(geometry(64, 64, 16, 3, 1, 1), 64), "16x16: 8%");
    }
}
