//! The vector side of a convolution read from its images as the bf16 kernel sums: nothing is
//! unfolded (writing the columns into panels and reading them back took a fifth of a bf16
//! ResNet-18 step).
//!
//! The images are first copied with their channels interleaved in pairs: word `p` of a pair's
//! plane holds pixel `p` of channels `2cp` and `2cp + 1`, which is the kernel's k-pair for the
//! terms (`2cp`, tap) and (`2cp + 1`, tap). A tile's `NR` output pixels of one tap are then two
//! masked loads of that plane shifted by the tap (lanes whose source lies in the padding load
//! zero). A strided convolution's planes are split by phase (the rows and columns a tap reads,
//! `≡ a, b` mod the stride) at the output's size, so every tap again reads a shifted plane. The
//! sum runs over (channel pair, tap, channel of the pair), and the other side of the product is
//! put in that order (`paired_rows`). Pairing two taps of one channel instead, from the images
//! as they are, took two permutes per pair in the kernel's loop: a fifth of a 32x32 product.
//!
//! It applies where each panel of `NR` output pixels lies in one image and each of its rows
//! starts at column 0 (the output width divides `NR`, `NR` divides the output plane), and every
//! pixel a tap reads lies in its phase plane: CIFAR's 3x3 (padding 1) and 1x1 layers at 32, 16
//! and 8 pixels out, stride 1 or 2.

use std::arch::x86_64::*;

use half::bf16;

use super::unfold::Planes;
use crate::backend::Conv2dGeometry;
use crate::backend::cpu::matmul::bf16::{VectorSide, join};
use crate::backend::cpu::matmul::bf16_kernel::{NR, Panel};
use crate::backend::cpu::pool::Pool;
use crate::backend::cpu::simd::{Kernel, wide};

/// Where tap `k` of an axis reads: the phase (`k·dilation - padding` mod the stride) and the
/// shift from an output position to its source within that phase's plane.
fn reach(k: usize, stride: usize, dilation: usize, padding: usize) -> (usize, isize) {
    let offset = (k * dilation) as isize - padding as isize;
    let stride = stride as isize;
    (offset.rem_euclid(stride) as usize, offset.div_euclid(stride))
}

/// Whether every input pixel that a tap of one axis reads for an output position lies in the
/// phase plane at the shifted position (kept at the output's size).
fn axis_fits(kernel: usize, stride: usize, dilation: usize, padding: usize, size: usize, out: usize) -> bool {
    (0..kernel).all(|k| {
        let (_, shift) = reach(k, stride, dilation, padding);
        (0..out).all(|y| {
            let source = (y * stride + k * dilation) as isize - padding as isize;
            !(0..size as isize).contains(&source) || (0..out as isize).contains(&(y as isize + shift))
        })
    })
}

/// Whether a convolution of geometry `g` can have its panels read from its images.
pub fn applies(g: &Conv2dGeometry) -> bool {
    let (oh, ow) = (g.out_h(), g.out_w());
    g.c > 0
        && ow > 0
        && NR.is_multiple_of(ow)
        && (oh * ow).is_multiple_of(NR)
        && g.stride.iter().all(|&s| s > 0)
        && axis_fits(g.kh, g.stride[0], g.dilation[0], g.padding[0], g.h, oh)
        && axis_fits(g.kw, g.stride[1], g.dilation[1], g.padding[1], g.w, ow)
}

/// The phases of each axis that some tap reads, in order.
fn phases(kernel: usize, stride: usize, dilation: usize, padding: usize) -> Vec<usize> {
    let mut phases: Vec<usize> = (0..kernel).map(|k| reach(k, stride, dilation, padding).0).collect();
    phases.sort_unstable();
    phases.dedup();
    phases
}

/// The terms of a convolution's sum as the direct side reads them, worked out once per
/// geometry and kept by the caller between products.
#[derive(Default)]
pub struct Taps {
    /// Term `t`'s source from an output pixel's own position, in words of an image's copy.
    offsets: Vec<isize>,
    /// `masks[j * count + t]`: the lanes of an image's panel `j` whose source for term `t` lies
    /// inside the image (worked out here once: in the kernel's loop that arithmetic made the
    /// product slower than unfolding).
    masks: Vec<u32>,
    /// The phases (row, column) the copy keeps.
    phases: (Vec<usize>, Vec<usize>),
    /// The geometry (its image count aside) these were worked out for.
    built_for: Option<Conv2dGeometry>,
}

impl Taps {
    fn build(&mut self, g: &Conv2dGeometry) {
        let (oh, ow) = (g.out_h(), g.out_w());
        let plane = oh * ow;
        let rows = phases(g.kh, g.stride[0], g.dilation[0], g.padding[0]);
        let columns = phases(g.kw, g.stride[1], g.dilation[1], g.padding[1]);
        let planes_per_pair = rows.len() * columns.len();
        // Each tap's plane (within a pair's planes), shift and lanes, for every panel.
        let mut tap_offsets = Vec::new();
        let mut tap_masks = Vec::new();
        for ki in 0..g.kh {
            let (a, dy) = reach(ki, g.stride[0], g.dilation[0], g.padding[0]);
            for kj in 0..g.kw {
                let (b, dx) = reach(kj, g.stride[1], g.dilation[1], g.padding[1]);
                let phase = rows.binary_search(&a).unwrap() * columns.len() + columns.binary_search(&b).unwrap();
                tap_offsets.push((phase * plane) as isize + dy * ow as isize + dx);
                let inside = |pixel: usize| {
                    let (y, x) = ((pixel / ow) as isize + dy, (pixel % ow) as isize + dx);
                    (0..oh as isize).contains(&y) && (0..ow as isize).contains(&x)
                };
                tap_masks.push(
                    (0..plane / NR)
                        .map(|j| (0..NR).filter(|&l| inside(j * NR + l)).fold(0u32, |m, l| m | 1 << l))
                        .collect::<Vec<u32>>(),
                );
            }
        }
        let (pairs, kernel) = (g.c.div_ceil(2), g.kh * g.kw);
        let count = pairs * kernel;
        self.offsets.clear();
        for cp in 0..pairs {
            let first = (cp * planes_per_pair * plane) as isize;
            self.offsets.extend(tap_offsets.iter().map(|&o| first + o));
        }
        self.masks.clear();
        self.masks.resize(plane / NR * count, 0);
        for (j, masks) in self.masks.chunks_exact_mut(count).enumerate() {
            for (t, mask) in masks.iter_mut().enumerate() {
                *mask = tap_masks[t % kernel][j];
            }
        }
        self.phases = (rows, columns);
    }
}

/// Words of one image's copy: each channel pair's planes, one per phase kept.
fn image_words(g: &Conv2dGeometry) -> usize {
    let rows = phases(g.kh, g.stride[0], g.dilation[0], g.padding[0]).len();
    let columns = phases(g.kw, g.stride[1], g.dilation[1], g.padding[1]).len();
    g.c.div_ceil(2) * rows * columns * g.out_h() * g.out_w()
}

/// Words of the copy of `g.n` images (what `Direct::plan` needs of its buffer).
pub fn copy_len(g: &Conv2dGeometry) -> usize {
    g.n * image_words(g)
}

/// A sum of `channels·kernel` terms (`[channels, kernel]`) as the direct side runs it.
pub fn paired_len(channels: usize, kernel: usize) -> usize {
    channels.div_ceil(2) * 2 * kernel
}

/// `rows` (each `[channels, kernel]`, as a weight's `[o, c, kh, kw]`) in the direct side's sum
/// order: channel pairs, then taps, then the pair's two channels (an odd count's last partner
/// zero).
pub fn paired_rows(pool: &Pool, rows: &[bf16], channels: usize, kernel: usize) -> Vec<bf16> {
    let (len, paired) = (channels * kernel, paired_len(channels, kernel));
    let mut out = pool.take::<bf16>(rows.len() / len.max(1) * paired);
    for (row, dst) in rows.chunks_exact(len).zip(out.chunks_exact_mut(paired)) {
        for (cp, pair) in dst.chunks_exact_mut(2 * kernel).enumerate() {
            for (t, two) in pair.chunks_exact_mut(2).enumerate() {
                let term = |c: usize| if c < channels { row[c * kernel + t] } else { bf16::ZERO };
                two[0] = term(2 * cp);
                two[1] = term(2 * cp + 1);
            }
        }
    }
    out
}

/// A convolution's vector side over a copy of its images, panel `q` being output pixels
/// `q·NR..` of the images laid side by side.
pub struct Direct<'a> {
    words: &'a [u32],
    image: usize,
    plane: usize,
    taps: &'a Taps,
}

impl<'a> Direct<'a> {
    /// The vector side of `g`'s product over `src` (planes at `planes`): copies the images into
    /// `copy` (at least `copy_len(g)` words) with their terms laid out in `taps` (kept from the
    /// last call where it had the same geometry). Call only where `applies(g)`.
    pub fn plan(
        taps: &'a mut Taps,
        copy: &'a mut [u32],
        src: &[bf16],
        planes: Planes,
        g: &Conv2dGeometry,
    ) -> Direct<'a> {
        assert!(applies(g));
        let key = Conv2dGeometry { n: 0, ..*g };
        if taps.built_for != Some(key) {
            taps.build(g);
            taps.built_for = Some(key);
        }
        let image = image_words(g);
        let words = &mut copy[..g.n * image];
        for (i, image) in words.chunks_exact_mut(image).enumerate() {
            copy_image(&src[i * planes.image..], planes.channel, image, taps, g);
        }
        Direct {
            words,
            image,
            plane: g.out_h() * g.out_w(),
            taps,
        }
    }
}

/// One image (channels `channel` elements apart from `src`) into `dst`: for each channel pair,
/// each kept phase's plane of the output's size.
fn copy_image(src: &[bf16], channel: usize, dst: &mut [u32], taps: &Taps, g: &Conv2dGeometry) {
    let (rows, columns) = &taps.phases;
    let plane_of = |c: usize| (c < g.c).then(|| &src[c * channel..][..g.h * g.w]);
    let mut planes = dst.chunks_exact_mut(g.out_h() * g.out_w());
    for cp in 0..g.c.div_ceil(2) {
        let (even, odd) = (plane_of(2 * cp).unwrap(), plane_of(2 * cp + 1));
        for &a in rows {
            for &b in columns {
                let out = planes.next().unwrap();
                wide(JoinPlane {
                    out,
                    even,
                    odd,
                    phase: (a, b),
                    g,
                });
            }
        }
    }
}

/// One phase's plane of a channel pair: `out[y][x] = join(even[y·sh + a][x·sw + b], odd[..])`,
/// zero where the pixel lies past the image (and the odd half zero without an odd channel).
/// Run by `simd::wide`.
struct JoinPlane<'a> {
    out: &'a mut [u32],
    even: &'a [bf16],
    odd: Option<&'a [bf16]>,
    phase: (usize, usize),
    g: &'a Conv2dGeometry,
}

impl Kernel for JoinPlane<'_> {
    type Out = ();
    #[inline(always)]
    fn run(self) {
        let JoinPlane {
            out,
            even,
            odd,
            phase: (a, b),
            g,
        } = self;
        let ([sh, sw], ow) = (g.stride, g.out_w());
        if g.stride == [1, 1] && (a, b) == (0, 0) && out.len() == even.len() {
            // The plane as it is: one loop the compiler vectorises.
            match odd {
                Some(odd) => out
                    .iter_mut()
                    .zip(even.iter().zip(odd))
                    .for_each(|(w, (&e, &o))| *w = join(e, o)),
                None => out.iter_mut().zip(even).for_each(|(w, &e)| *w = join(e, bf16::ZERO)),
            }
            return;
        }
        let inside = g.w.saturating_sub(b).div_ceil(sw).min(ow);
        for (y, out) in out.chunks_exact_mut(ow).enumerate() {
            let source = y * sh + a;
            let (out, past) = out.split_at_mut(if source < g.h { inside } else { 0 });
            past.fill(0);
            let row = source * g.w + b;
            for (x, w) in out.iter_mut().enumerate() {
                let odd = odd.map_or(bf16::ZERO, |odd| odd[row + x * sw]);
                *w = join(even[row + x * sw], odd);
            }
        }
    }
}

impl VectorSide for Direct<'_> {
    type Panel<'b>
        = ImagePanel<'b>
    where
        Self: 'b;

    fn panel(&self, q: usize) -> ImagePanel<'_> {
        let per_image = self.plane / NR;
        let (image, j) = (q / per_image, q % per_image);
        let count = self.taps.offsets.len();
        ImagePanel {
            // Lanes whose source lies outside the image are masked, so this may point outside
            // the copy (never read there).
            base: self.words.as_ptr().wrapping_add(image * self.image + j * NR),
            offsets: &self.taps.offsets,
            masks: &self.taps.masks[j * count..][..count],
        }
    }
}

/// Panel `q` of a `Direct`: `NR` consecutive output pixels of one image.
pub struct ImagePanel<'a> {
    base: *const u32,
    offsets: &'a [isize],
    masks: &'a [u32],
}

impl Panel for ImagePanel<'_> {
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn pairs(&self, p: usize) -> (__m512i, __m512i) {
        // SAFETY: p is below the term count (the caller's promise). The address may lie
        // outside the copy where masked lanes start or end there; masked lanes are not read,
        // and unmasked ones lie in the term's plane of this image's copy (`Taps::build`).
        unsafe {
            let at = self.base.wrapping_offset(*self.offsets.get_unchecked(p));
            let mask = *self.masks.get_unchecked(p);
            (
                _mm512_maskz_loadu_epi32(mask as u16, at.cast()),
                _mm512_maskz_loadu_epi32((mask >> 16) as u16, at.wrapping_add(16).cast()),
            )
        }
    }
}

#[cfg(test)]
mod tests;
