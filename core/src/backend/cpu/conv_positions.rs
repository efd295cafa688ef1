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

/// Whether `g` runs here: its taps in the padding (less the lanes left empty by a batch that is
/// not a multiple of 32 images) save at least a tenth of the products.
pub fn pays(g: &Conv2dGeometry) -> bool {
    if g.c < MIN_CHANNELS || g.n == 0 {
        return false;
    }
    let positions = g.out_h() * g.out_w() * g.kh * g.kw;
    let lanes = g.n.next_multiple_of(NR) as f64 / g.n as f64;
    positions > 0 && real_taps(g) as f64 / positions as f64 * lanes <= MAX_WORK
}

/// `(output position, tap)` pairs whose source lies inside the image.
fn real_taps(g: &Conv2dGeometry) -> usize {
    (0..g.out_h() * g.out_w()).map(|p| sources(g, p).count()).sum()
}

/// The taps of output position `p` whose source lies inside the image, with that source's
/// position.
fn sources(g: &Conv2dGeometry, p: usize) -> impl Iterator<Item = (usize, usize)> + '_ {
    let (oy, ox) = (p / g.out_w(), p % g.out_w());
    let along = |o: usize, k: usize, axis: usize, size: usize| {
        (o * g.stride[axis] + k * g.dilation[axis])
            .checked_sub(g.padding[axis])
            .filter(|&i| i < size)
    };
    (0..g.kh * g.kw).filter_map(move |tap| {
        let iy = along(oy, tap / g.kw, 0, g.h)?;
        let ix = along(ox, tap % g.kw, 1, g.w)?;
        Some((tap, iy * g.w + ix))
    })
}

/// Every output position's real taps, `(tap, source position)`, position by position.
struct Sources {
    pieces: Vec<(usize, usize)>,
    /// Position `p`'s pieces are `pieces[starts[p]..starts[p + 1]]`.
    starts: Vec<usize>,
}

impl Sources {
    fn new(g: &Conv2dGeometry) -> Sources {
        let mut starts = vec![0];
        let mut pieces = Vec::new();
        for p in 0..g.out_h() * g.out_w() {
            pieces.extend(sources(g, p));
            starts.push(pieces.len());
        }
        Sources { pieces, starts }
    }

    fn of(&self, p: usize) -> &[(usize, usize)] {
        &self.pieces[self.starts[p]..self.starts[p + 1]]
    }
}

/// For each output element (row `r` of `weight`, image `i`, position `p`):
/// `dst[i * out.image + r * out.channel + p] = weight[r] · unfold(src)`, summed in f32 and
/// rounded once. `weight` is `[rows, c, kh, kw]`, `src` holds `g.n` images of `g.c` planes at
/// `planes`. Call only where `bf16_kernel::available()`.
#[allow(clippy::too_many_arguments)]
pub fn convolve(
    pool: &Pool,
    src: &[bf16],
    planes: Planes,
    weight: &[bf16],
    rows: usize,
    g: &Conv2dGeometry,
    dst: &mut [bf16],
    out: Planes,
) {
    let (positions, taps) = (g.out_h() * g.out_w(), g.kh * g.kw);
    let (lanes, channel_pairs) = (g.n.next_multiple_of(NR), g.c.div_ceil(2));
    let input = by_position(pool, src, planes, g, lanes);
    let strips = strips(pool, weight, rows, g.c, taps);
    let sources = Sources::new(g);
    let (strip_count, blocks) = (rows.div_ceil(MR), lanes / NR);
    let last = (g.n - 1) * out.image + (rows - 1) * out.channel + positions - 1;
    assert!(dst.len() > last, "the output holds every element written");
    let dst = Columns(dst.as_mut_ptr());
    let strip_words = taps * channel_pairs * MR;
    (0..strip_count * blocks * positions).into_par_iter().for_each(|item| {
        // The whole `Columns` (Send), not its raw pointer field (which is not).
        #[allow(clippy::redundant_locals)]
        let dst = dst;
        let (s, block, p) = (item / (blocks * positions), item / positions % blocks, item % positions);
        let pieces = sources.of(p);
        let piece = |i: usize| {
            let (tap, source) = pieces[i];
            (
                // Strip s holds `taps` runs of `channel_pairs * MR` words; the input,
                // `channel_pairs` runs of `h·w·lanes` words.
                Interleaved(strips[s * strip_words + tap * channel_pairs * MR..].as_ptr()),
                StridedPanel {
                    first: input[source * lanes + block * NR..].as_ptr(),
                    stride: g.h * g.w * lanes,
                },
            )
        };
        let srows = (rows - s * MR).min(MR);
        let mut acc = [[0f32; NR]; MR];
        // SAFETY: the caller's promise that the CPU has the kernel; each piece's strip holds
        // `channel_pairs` pairs of MR rows and its panel `channel_pairs` pairs of NR lanes (the
        // layouts above); each tile size is at most MR rows and covers `srows`.
        unsafe {
            match srows {
                9.. => tile_segments::<_, _, MR>(pieces.len(), piece, channel_pairs, &mut acc),
                5..=8 => tile_segments::<_, _, 8>(pieces.len(), piece, channel_pairs, &mut acc),
                _ => tile_segments::<_, _, 4>(pieces.len(), piece, channel_pairs, &mut acc),
            }
        }
        let images = (g.n - block * NR).min(NR);
        let mut rounded = [bf16::ZERO; NR];
        for (r, row) in acc.iter().enumerate().take(srows) {
            bf16_from_f32_slice(&mut rounded, row);
            let first = block * NR * out.image + (s * MR + r) * out.channel + p;
            for (i, &v) in rounded.iter().enumerate().take(images) {
                // SAFETY: at most `last` (checked above); this tile is the only one writing
                // row s·MR + r of these images at position p.
                unsafe { *dst.0.add(first + i * out.image) = v };
            }
        }
    });
    pool.recycle(HostVec::U32(input));
    pool.recycle(HostVec::U32(strips));
}

/// `src`'s images as `[c/2, h·w, lanes]` words: channels 2j and 2j + 1 of one position and image
/// in word `(j·h·w + position)·lanes + image`, lanes past the images (and an odd count's last
/// channel pair's upper half) zero.
fn by_position(pool: &Pool, src: &[bf16], planes: Planes, g: &Conv2dGeometry, lanes: usize) -> Vec<u32> {
    let plane = g.h * g.w;
    let mut words = pool.take::<u32>(g.c.div_ceil(2) * plane * lanes);
    words.par_chunks_mut(plane * lanes).enumerate().for_each(|(j, pair)| {
        if lanes > g.n {
            pair.fill(0);
        }
        for i in 0..g.n {
            let even = &src[i * planes.image + 2 * j * planes.channel..][..plane];
            let odd = (2 * j + 1 < g.c).then(|| &src[i * planes.image + (2 * j + 1) * planes.channel..][..plane]);
            for (position, &e) in even.iter().enumerate() {
                pair[position * lanes + i] = join(e, odd.map_or(bf16::ZERO, |odd| odd[position]));
            }
        }
    });
    words
}

/// `weight` (`[rows, c, taps]`) as strips of `MR` rows, tap by tap, channel pair by channel
/// pair: word `((strip·taps + tap)·c/2 + j)·MR + r` holds channels 2j and 2j + 1 of row
/// strip·MR + r at that tap; rows past the end (and an odd count's missing channel) zero.
fn strips(pool: &Pool, weight: &[bf16], rows: usize, c: usize, taps: usize) -> Vec<u32> {
    let channel_pairs = c.div_ceil(2);
    let mut words = pool.take::<u32>(rows.div_ceil(MR) * taps * channel_pairs * MR);
    let at = |row: usize, channel: usize, tap: usize| {
        if row < rows && channel < c {
            weight[(row * c + channel) * taps + tap]
        } else {
            bf16::ZERO
        }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cpu::conv::im2col;
    use crate::backend::cpu::matmul::bf16_kernel;

    fn geometry(n: usize, c: usize, size: usize, k: usize, stride: usize, padding: usize) -> Conv2dGeometry {
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

    /// `weight @ im2col(src)` in f64, as `[rows, n·positions]`.
    fn reference(src: &[bf16], weight: &[bf16], rows: usize, g: &Conv2dGeometry) -> Vec<f64> {
        let wide: Vec<f64> = src.iter().map(|v| v.to_f64()).collect();
        let cols = im2col(&Pool::default(), &wide, g);
        let (k, width) = (g.c * g.kh * g.kw, g.n * g.out_h() * g.out_w());
        (0..rows * width)
            .map(|e| {
                let (r, col) = (e / width, e % width);
                (0..k).map(|t| weight[r * k + t].to_f64() * cols[t * width + col]).sum()
            })
            .collect()
    }

    /// Every output against the f64 loops, written at the output planes asked for (`[o, n·p]`
    /// and NCHW), over batches that leave lanes empty, odd channel and row counts, strides and
    /// paddings that leave no tap real for some positions.
    #[test]
    fn tiles_of_one_position_in_many_images_match_plain_loops() {
        if !bf16_kernel::available() {
            eprintln!("\n*** SKIPPED: this CPU has no AVX512-BF16; this path never runs on it ***\n");
            return;
        }
        let pool = Pool::default();
        let cases = [
            (geometry(64, 32, 4, 3, 1, 1), 16),
            (geometry(37, 33, 4, 3, 1, 1), 13),
            (geometry(33, 34, 8, 3, 2, 1), 29),
            (geometry(5, 6, 3, 3, 1, 2), 7),
            (geometry(40, 8, 2, 1, 1, 0), 12),
        ];
        for (g, rows) in cases {
            let src = values(g.n * g.c * g.h * g.w, 1);
            let weight = values(rows * g.c * g.kh * g.kw, 2);
            let want = reference(&src, &weight, rows, &g);
            let positions = g.out_h() * g.out_w();
            let width = g.n * positions;
            for nchw in [false, true] {
                let out = if nchw {
                    Planes {
                        image: rows * positions,
                        channel: positions,
                    }
                } else {
                    Planes {
                        image: positions,
                        channel: width,
                    }
                };
                let mut dst = vec![bf16::from_f32(99.0); rows * width];
                convolve(&pool, &src, Planes::nchw(&g), &weight, rows, &g, &mut dst, out);
                for r in 0..rows {
                    for i in 0..g.n {
                        for p in 0..positions {
                            let got = dst[i * out.image + r * out.channel + p].to_f64();
                            let exact = want[r * width + i * positions + p];
                            assert!(
                                (got - exact).abs() <= exact.abs() * 2f64.powi(-8),
                                "{g:?} rows {rows} nchw {nchw}: row {r} image {i} position {p}: {got} vs {exact}"
                            );
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn only_convolutions_with_enough_taps_in_the_padding_pay() {
        assert!(
            pays(&geometry(64, 512, 4, 3, 1, 1)),
            "4x4: 31% of the taps in the padding"
        );
        assert!(pays(&geometry(64, 256, 8, 3, 1, 1)), "8x8: 16%");
        assert!(!pays(&geometry(64, 64, 32, 3, 1, 1)), "32x32: 4%");
        assert!(!pays(&geometry(64, 256, 8, 1, 1, 0)), "1x1: none");
        assert!(!pays(&geometry(40, 512, 4, 3, 1, 1)), "24 of 64 lanes empty");
        assert!(!pays(&geometry(64, 3, 4, 3, 1, 1)), "three channels: pieces too short");
    }
}
