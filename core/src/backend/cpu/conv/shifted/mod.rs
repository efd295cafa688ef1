//! Stride-1 f32 convolutions that keep their image size (3x3 with padding 1, 1x1), summed on
//! AVX2 and FMA straight from copies of their images instead of unfolded columns.
//!
//! With the output as wide as the input, output pixel `q` of tap (ki, kj) reads input element
//! `q + r·w + s` of the flat plane (`r`, `s` the tap's row and column shifts): a constant offset
//! per tap, so a tile's 16 pixels of one tap are two vector loads. Where `q + s` would cross into
//! the next or previous row, it must read padding instead: one copy of the images per column
//! shift, with the columns that shift wraps into zeroed, and zero rows around every plane, makes
//! every such read land on a zero. The copies are `kw` times the images (3x for 3x3) where
//! unfolding writes `kh·kw` times (9x) and the product's packing copies them once more.
//!
//! `product` sums the forward pass and the transposed input gradient (weight rows broadcast
//! against pixels); `weight_grad` the weight gradient (output-gradient rows against taps).

mod product;
mod weight_grad;

pub use product::{ShiftedConv, forward};
pub use weight_grad::{Scratch, WeightGradient};

use super::unfold::Planes;
use crate::backend::Conv2dGeometry;
use crate::backend::cpu::simd;

/// Floats in a cache line, and the alignment of planes and copies.
const LINE: usize = 16;
/// Lanes of a tile row: two vectors of eight.
const LANES: usize = 16;
/// Lanes a tile reads past any pixel of a plane: its pixels are read a row's lanes at a time.
const OVERRUN: usize = LANES;

/// Whether this CPU has AVX2 and FMA.
pub fn available() -> bool {
    simd::has_avx2_fma()
}

/// Whether `g` is a convolution these kernels sum: stride 1 and an output the size of its input
/// (and the CPU has the kernels: the plans below rely on it).
pub fn applies(g: &Conv2dGeometry) -> bool {
    g.stride == [1, 1] && (g.out_h(), g.out_w()) == (g.h, g.w) && g.h * g.w > 0 && g.c > 0 && available()
}

/// A tile row's two vectors into `out` (up to LANES lanes): added to it where `accumulate`,
/// else written.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn store_lanes(acc: [std::arch::x86_64::__m256; 2], out: &mut [f32], accumulate: bool) {
    use std::arch::x86_64::_mm256_storeu_ps;
    let mut values = [0f32; LANES];
    // SAFETY: `values` holds two vectors of eight.
    unsafe {
        _mm256_storeu_ps(values.as_mut_ptr(), acc[0]);
        _mm256_storeu_ps(values.as_mut_ptr().add(8), acc[1]);
    }
    let lanes = out.len();
    if accumulate {
        out.iter_mut().zip(values).for_each(|(o, v)| *o += v);
    } else {
        out.copy_from_slice(&values[..lanes]);
    }
}

/// How a run's images lie in their shifted copies, and where each term of the sum reads: image
/// i, shift j, channel ch's plane starts at `j·shift + lead[j] + ch·channel + i·image`, with
/// zeros either side as far as any tap reaches. A channel's images lie side by side, so a term's
/// pixels over a run of small images are one stream. Each shift's lead puts the reads of a
/// tile's first pixel on a cache line's start where the rows allow (widths of 16): a tile's 16
/// pixels of a tap are then one line, not parts of two.
pub struct Shifts {
    lead: Vec<usize>,
    /// Images per run, at most.
    per: usize,
    image: usize,
    shift: usize,
    /// Term t (channel, ki, kj)'s read offset from an output pixel's place in its image's copies.
    offsets: Vec<usize>,
    g: Conv2dGeometry,
}

impl Shifts {
    /// The copies' layout for `g` in runs of up to `per` images; `None` where `g` is not a
    /// convolution these kernels sum.
    pub fn plan(g: &Conv2dGeometry, per: usize) -> Option<Shifts> {
        if !applies(g) {
            return None;
        }
        let plane = g.h * g.w;
        let shift_of = |k: usize, axis: usize| (k * g.dilation[axis]) as isize - g.padding[axis] as isize;
        // Reads reach `padding` rows and columns past the plane either way (same-size output).
        let margin = g.padding[0] * g.w + g.padding[1];
        let image = (margin + plane).next_multiple_of(LINE);
        let channel = per.max(1) * image;
        let lead: Vec<usize> = (0..g.kw)
            .map(|kj| (margin as isize + shift_of(kj, 1)).rem_euclid(LINE as isize) as usize)
            .map(|misaligned| margin + (LINE - misaligned) % LINE)
            .collect();
        // The last tile of a plane reads past it: those lanes are read, not stored.
        let shift = (margin + LINE + g.c * channel + margin + OVERRUN).next_multiple_of(LINE);
        let mut offsets = Vec::with_capacity(g.c * g.kh * g.kw);
        for ch in 0..g.c {
            for ki in 0..g.kh {
                for (kj, lead) in lead.iter().enumerate() {
                    let within = shift_of(ki, 0) * g.w as isize + shift_of(kj, 1);
                    let base = kj * shift + lead + ch * channel;
                    offsets.push(base.checked_add_signed(within).expect("reads stay within the margin"));
                }
            }
        }
        Some(Shifts {
            lead,
            per: per.max(1),
            image,
            shift,
            offsets,
            g: *g,
        })
    }

    /// Scratch for the copies of a run (and a line to align them).
    pub fn scratch_len(&self) -> usize {
        self.g.kw * self.shift + LINE
    }

    /// `n` images of `src` (planes at `src_planes`) copied into `scratch`, one copy per column
    /// shift with the columns its shift wraps into zeroed and zeros between the planes: the
    /// copies, starting on a cache line.
    fn copy_images<'a>(&self, scratch: &'a mut [f32], src: &[f32], src_planes: Planes, n: usize) -> &'a [f32] {
        assert!(n <= self.per, "runs of at most {} images", self.per);
        let start = scratch.as_ptr().align_offset(LINE * 4).min(LINE);
        let copies = &mut scratch[start..][..self.g.kw * self.shift];
        let (g, plane) = (&self.g, self.g.h * self.g.w);
        for (kj, shifted) in copies.chunks_exact_mut(self.shift).enumerate() {
            let s = (kj * g.dilation[1]) as isize - g.padding[1] as isize;
            // Output column x reads column x + s; where that leaves the row the flat read
            // lands in these columns of the neighbouring row, which must read zero.
            let wrapped = if s < 0 {
                g.w.saturating_sub(s.unsigned_abs())..g.w
            } else {
                0..(s as usize).min(g.w)
            };
            let (lead, planes) = shifted.split_at_mut(self.lead[kj]);
            lead.fill(0.0);
            for (k, slot) in planes.chunks_mut(self.image).enumerate() {
                let (ch, i) = (k / self.per, k % self.per);
                if ch >= g.c || i >= n {
                    slot.fill(0.0);
                    continue;
                }
                let source = &src[i * src_planes.image + ch * src_planes.channel..][..plane];
                let (values, gap) = slot.split_at_mut(plane);
                values.copy_from_slice(source);
                gap.fill(0.0);
                for row in values.chunks_exact_mut(g.w) {
                    row[wrapped.clone()].fill(0.0);
                }
            }
        }
        copies
    }
}
