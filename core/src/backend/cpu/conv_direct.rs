//! The vector side of a stride-1 convolution that keeps its image size (3x3 with padding 1, or
//! 1x1), read straight from the images as the bf16 kernel sums: a tile's `NR` output pixels of
//! one tap are one masked load of the input plane shifted by the tap (lanes whose source lies in
//! the padding load zero), and two taps are interleaved into the kernel's k-pairs in registers.
//! Nothing is unfolded: writing the columns into panels and reading them back took a fifth of a
//! bf16 ResNet-18 step.
//!
//! It applies where each panel of `NR` output pixels lies in one image and each of its rows
//! starts at column 0 (the width divides `NR`, `NR` divides the plane): CIFAR's 32, 16 and 8.

use std::arch::x86_64::*;

use half::bf16;

use super::conv::Planes;
use super::matmul::bf16::VectorSide;
use super::matmul::bf16_kernel::{NR, Panel};
use crate::backend::Conv2dGeometry;

/// Where each term of the sum (a channel and tap) reads, and which lanes it loads for each
/// panel position in an image; kept by the caller between products.
#[derive(Default)]
pub struct Taps {
    /// From an output pixel's own position in its image to its source, in elements.
    offsets: Vec<isize>,
    /// `masks[j * count + t]`: the lanes of an image's panel `j` whose source for term `t` lies
    /// inside the image (worked out here once: in the kernel's loop that arithmetic made the
    /// product slower than unfolding).
    masks: Vec<u32>,
    /// The geometry (its image count aside) and channel stride these were worked out for:
    /// every run of a convolution has the same.
    built_for: Option<(Conv2dGeometry, usize)>,
}

impl Taps {
    /// The terms of `g` (channels `channel` elements apart).
    fn build(&mut self, g: &Conv2dGeometry, channel: usize) {
        let plane = g.h * g.w;
        let reach = |k: usize, axis: usize| (k * g.dilation[axis]) as isize - g.padding[axis] as isize;
        let (w, count) = (g.w as isize, (g.c * g.kh * g.kw).next_multiple_of(2));
        self.offsets.clear();
        self.masks.clear();
        self.masks.resize(plane / NR * count, 0);
        // Lane l's column (l % w) shifted by kj stays in the row.
        let columns: Vec<u32> = (0..g.kw)
            .map(|kj| {
                (0..NR)
                    .filter(|&lane| (0..w).contains(&((lane % g.w) as isize + reach(kj, 1))))
                    .fold(0, |mask, lane| mask | 1 << lane)
            })
            .collect();
        for c in 0..g.c {
            for ki in 0..g.kh {
                for (kj, &columns) in columns.iter().enumerate() {
                    let (t, shift) = (self.offsets.len(), reach(ki, 0) * w + reach(kj, 1));
                    self.offsets.push((c * channel) as isize + shift);
                    for (j, masks) in self.masks.chunks_exact_mut(count).enumerate() {
                        // Lane l reads plane element j·NR + shift + l: lanes lo..hi lie in the
                        // plane (the rows above and below are padding).
                        let start = (j * NR) as isize + shift;
                        let lo = (-start).clamp(0, NR as isize);
                        let hi = (plane as isize - start).clamp(lo, NR as isize);
                        masks[t] = ((1u64 << hi) - (1u64 << lo)) as u32 & columns;
                    }
                }
            }
        }
        // The padding term of an odd count keeps mask 0: it loads nothing.
        self.offsets.resize(count, 0);
    }
}

/// Whether a convolution of geometry `g` can have its panels read from its images.
pub fn applies(g: &Conv2dGeometry) -> bool {
    let plane = g.h * g.w;
    g.stride == [1, 1]
        && (g.out_h(), g.out_w()) == (g.h, g.w)
        && g.w > 0
        && NR.is_multiple_of(g.w)
        && plane.is_multiple_of(NR)
        && g.c > 0
}

/// A convolution's vector side over `src`, panel `q` being output pixels `q·NR..` of the
/// images laid side by side.
pub struct Direct<'a> {
    src: &'a [bf16],
    image: usize,
    plane: usize,
    /// The terms, then one that loads nothing where their count is odd.
    taps: &'a Taps,
}

impl<'a> Direct<'a> {
    /// The vector side of `g`'s product over `src` (planes at `planes`), its terms laid out in
    /// `taps` (kept from the last call where it had the same geometry). Call only where
    /// `applies(g)`.
    pub fn plan(taps: &'a mut Taps, src: &'a [bf16], planes: Planes, g: &Conv2dGeometry) -> Direct<'a> {
        assert!(applies(g));
        let plane = g.h * g.w;
        // The last element any unmasked lane reads.
        assert!(src.len() >= (g.n.max(1) - 1) * planes.image + (g.c - 1) * planes.channel + plane);
        let key = (Conv2dGeometry { n: 0, ..*g }, planes.channel);
        if taps.built_for != Some(key) {
            taps.build(g, planes.channel);
            taps.built_for = Some(key);
        }
        Direct {
            src,
            image: planes.image,
            plane,
            taps,
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
            // `src` (never read there).
            base: self.src.as_ptr().wrapping_add(image * self.image + j * NR),
            offsets: &self.taps.offsets,
            masks: &self.taps.masks[j * count..][..count],
        }
    }
}

/// Panel `q` of a `Direct`: `NR` consecutive output pixels of one image.
pub struct ImagePanel<'a> {
    base: *const bf16,
    offsets: &'a [isize],
    masks: &'a [u32],
}

impl ImagePanel<'_> {
    /// The `NR` source values of term `t`, zero where they lie in the padding.
    ///
    /// # Safety
    /// The CPU has AVX512F and AVX512BW; `t` is below the (even) term count.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw")]
    unsafe fn load(&self, t: usize) -> __m512i {
        // SAFETY: t is in range (the caller's promise). The address may lie outside `src` where
        // masked lanes start or end there; masked lanes are not read, and unmasked ones lie in
        // the image's plane of the term's channel, inside `src` (`Direct::plan` checked its
        // length).
        unsafe {
            let at = self.base.wrapping_offset(*self.offsets.get_unchecked(t));
            _mm512_maskz_loadu_epi16(*self.masks.get_unchecked(t), at.cast())
        }
    }
}

/// Word `c` of the pairs: bf16 `c` of the even tap (index `c`) below bf16 `c` of the odd one
/// (index `32 + c`); `INTERLEAVE[0]` for columns 0..16, `INTERLEAVE[1]` for 16..32.
static INTERLEAVE: [[u16; 32]; 2] = {
    let mut table = [[0u16; 32]; 2];
    let mut half = 0;
    while half < 2 {
        let mut c = 0;
        while c < 16 {
            table[half][2 * c] = (16 * half + c) as u16;
            table[half][2 * c + 1] = (32 + 16 * half + c) as u16;
            c += 1;
        }
        half += 1;
    }
    table
};

impl Panel for ImagePanel<'_> {
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw")]
    unsafe fn pairs(&self, p: usize) -> (__m512i, __m512i) {
        // SAFETY: p is below the pair count (the caller's promise), so both terms exist (the
        // count is padded to even); the CPU has what `load` needs.
        unsafe {
            let (even, odd) = (self.load(2 * p), self.load(2 * p + 1));
            let lo = _mm512_loadu_si512(INTERLEAVE[0].as_ptr().cast());
            let hi = _mm512_loadu_si512(INTERLEAVE[1].as_ptr().cast());
            (
                _mm512_permutex2var_epi16(even, lo, odd),
                _mm512_permutex2var_epi16(even, hi, odd),
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cpu::conv_panels::PanelScratch;
    use crate::backend::cpu::matmul::bf16_kernel;
    use crate::backend::cpu::pool::Pool;

    fn geometry(
        n: usize,
        c: usize,
        (h, w): (usize, usize),
        k: usize,
        padding: usize,
        dilation: usize,
    ) -> Conv2dGeometry {
        Conv2dGeometry {
            n,
            c,
            h,
            w,
            kh: k,
            kw: k,
            stride: [1, 1],
            padding: [padding; 2],
            dilation: [dilation; 2],
        }
    }

    /// Every pair of every panel read from the images equals the packed panels that unfolding
    /// writes, for 3x3 (padding 1, and dilation 2 with padding 2), 1x1, odd and even tap
    /// counts, widths 32, 16, 8 and 4, and planes whose channels lie apart (a `[c, n, h, w]`
    /// gradient).
    #[test]
    fn panels_read_from_the_images_equal_the_unfolded_panels() {
        if !bf16_kernel::available() {
            eprintln!("\n*** SKIPPED: this CPU has no AVX512-BF16; the direct path never runs on it ***\n");
            return;
        }
        let pool = Pool::default();
        let cases = [
            (geometry(2, 3, (8, 8), 3, 1, 1), false),
            (geometry(1, 4, (32, 32), 3, 1, 1), false),
            (geometry(3, 5, (4, 16), 3, 1, 1), true),
            (geometry(2, 3, (8, 4), 1, 0, 1), false),
            (geometry(2, 2, (16, 16), 3, 2, 2), true),
            (geometry(1, 2, (16, 16), 3, 2, 2), true),
        ];
        // One table for every case, as a task keeps it: each geometry must rebuild it.
        let mut table = Taps::default();
        for (g, channels_apart) in cases {
            assert!(applies(&g), "{g:?}");
            let plane = g.h * g.w;
            let planes = if channels_apart {
                Planes {
                    image: plane,
                    channel: g.n * plane,
                }
            } else {
                Planes::nchw(&g)
            };
            let src: Vec<bf16> = (0..g.n * g.c * plane).map(|i| bf16::from_f32(1.0 + i as f32)).collect();
            let taps = g.c * g.kh * g.kw;
            let columns = g.n * plane;
            let mut scratch = PanelScratch::take(&pool, taps, columns);
            let want = scratch.unfold_packed(&src, planes, &g).to_vec();
            let pairs = taps.div_ceil(2);
            let direct = Direct::plan(&mut table, &src, planes, &g);
            for q in 0..columns / NR {
                let panel = direct.panel(q);
                for p in 0..pairs {
                    let mut got = [0u32; NR];
                    // SAFETY: available() holds; p < pairs; `got` holds two registers.
                    unsafe {
                        let (lo, hi) = panel.pairs(p);
                        _mm512_storeu_si512(got.as_mut_ptr().cast(), lo);
                        _mm512_storeu_si512(got.as_mut_ptr().add(16).cast(), hi);
                    }
                    assert_eq!(got[..], want[(q * pairs + p) * NR..][..NR], "{g:?} panel {q} pair {p}");
                }
            }
            scratch.recycle(&pool);
        }
    }

    #[test]
    fn only_stride_one_same_size_convolutions_whose_rows_tile_a_panel_apply() {
        assert!(applies(&geometry(64, 64, (32, 32), 3, 1, 1)));
        assert!(
            !applies(&geometry(64, 512, (4, 4), 3, 1, 1)),
            "16 pixels: a panel spans two images"
        );
        assert!(
            !applies(&geometry(1, 8, (28, 28), 3, 1, 1)),
            "rows of 28 do not tile 32 lanes"
        );
        assert!(
            !applies(&geometry(1, 8, (32, 32), 3, 0, 1)),
            "no padding: the image shrinks"
        );
        let mut strided = geometry(1, 8, (32, 32), 3, 1, 1);
        strided.stride = [2, 2];
        assert!(!applies(&strided));
    }
}
