//! A bf16 convolution's columns unfolded straight into the bf16 kernel's panels (its vector
//! side, `panels[q][p][c]`: output pixel `q·NR + c`, taps `2p` and `2p + 1` in one word).
//! Unfolding into plain columns first and packing those wrote and read every column twice more:
//! the two took a quarter of a bf16 ResNet-18 step. Here two taps at a time unfold into rows
//! that stay in the L1 cache, and their pairs go straight into the panels. Where the kernel can
//! read a copy of the images with their channels paired (`direct`), nothing is unfolded,
//! and the other operand's sum is put in that copy's order (`LeftRows`).

use std::borrow::Cow;

use half::bf16;

use super::direct::{Direct, Taps, copy_len, paired_len, paired_rows};
use super::unfold::{Planes, im2col_tap};
use crate::backend::Conv2dGeometry;
use crate::backend::cpu::matmul::bf16::{Dst, PackedPanels, Side, join, product_with};
use crate::backend::cpu::matmul::bf16_kernel::NR;
use crate::backend::cpu::pool::Pool;
use crate::backend::cpu::simd::{Kernel, wide};
use crate::dtype::HostVec;

/// A task's panels and the two tap rows it unfolds through, or the copy of the images and the
/// terms it reads them by; empty (`default()`) for a pass with no products.
#[derive(Default)]
pub struct PanelScratch {
    panels: Vec<u32>,
    taps: Vec<bf16>,
    copy: Vec<u32>,
    table: Taps,
    /// Whether the panels are read from the copy (`direct`), as the plan says.
    direct: bool,
}

/// A convolution's vector side, ready for the product.
pub enum Unfolded<'a> {
    Panels(PackedPanels<'a>),
    Direct(Direct<'a>),
}

impl Unfolded<'_> {
    /// `dst = left @ columns`, the columns being these `columns` rows over the sum `left` is
    /// arranged for.
    ///
    /// # Safety
    /// As for `matmul::bf16::product_with`; `left` was arranged for this unfolding's geometry.
    pub unsafe fn product(&self, pool: &Pool, dst: Dst, row_stride: usize, left: &LeftRows, columns: usize) {
        let (side, k) = (left.side(), left.k);
        // SAFETY: the caller's promises; either side holds `columns` rows over `k` (the
        // direct side's sum is paired exactly where `left`'s is).
        unsafe {
            match self {
                Unfolded::Panels(panels) => {
                    debug_assert!(!left.paired);
                    product_with(pool, dst, row_stride, side, panels, columns, k)
                }
                Unfolded::Direct(direct) => {
                    debug_assert!(left.paired);
                    product_with(pool, dst, row_stride, side, direct, columns, k)
                }
            }
        }
    }
}

impl PanelScratch {
    /// For the unfoldings of up to `g.n` images of `g`, read from a copy of the images where
    /// `direct` (which must apply to `g`), else unfolded into panels.
    pub fn take(pool: &Pool, g: &Conv2dGeometry, direct: bool) -> PanelScratch {
        let (taps, columns) = (g.c * g.kh * g.kw, g.n * g.out_h() * g.out_w());
        PanelScratch {
            panels: pool.take(if direct {
                0
            } else {
                columns.div_ceil(NR) * taps.div_ceil(2) * NR
            }),
            taps: pool.take(if direct { 0 } else { 2 * columns }),
            copy: pool.take(if direct { copy_len(g) } else { 0 }),
            table: Taps::default(),
            direct,
        }
    }

    /// The columns of `g.n` images of `src` (planes at `planes`) as the vector side of a
    /// product with `g.n·oh·ow` rows: read from a copy of the images where this scratch is
    /// `direct`, otherwise unfolded into panels.
    pub fn unfold<'a>(&'a mut self, src: &'a [bf16], planes: Planes, g: &Conv2dGeometry) -> Unfolded<'a> {
        if self.direct {
            return Unfolded::Direct(Direct::plan(&mut self.table, &mut self.copy, src, planes, g));
        }
        let taps = g.c * g.kh * g.kw;
        Unfolded::Panels(PackedPanels::new(
            self.unfold_packed(src, planes, g),
            g.n * g.out_h() * g.out_w(),
            taps,
        ))
    }

    /// The columns unfolded into the kernel's panels.
    pub fn unfold_packed(&mut self, src: &[bf16], planes: Planes, g: &Conv2dGeometry) -> &[u32] {
        let columns = g.n * g.out_h() * g.out_w();
        let taps = g.c * g.kh * g.kw;
        let pairs = taps.div_ceil(2);
        let panels = &mut self.panels[..columns.div_ceil(NR) * pairs * NR];
        let (even, odd) = self.taps[..2 * columns].split_at_mut(columns);
        for p in 0..pairs {
            im2col_tap(src, planes, even, 2 * p, g);
            if 2 * p + 1 < taps {
                im2col_tap(src, planes, odd, 2 * p + 1, g);
            } else {
                odd.fill(bf16::ZERO);
            }
            wide(JoinPair {
                panels: &mut *panels,
                even,
                odd,
                p,
                pairs,
            });
        }
        panels
    }

    pub fn recycle(self, pool: &Pool) {
        pool.recycle(HostVec::U32(self.panels));
        pool.recycle(HostVec::BF16(self.taps));
        pool.recycle(HostVec::U32(self.copy));
    }
}

/// The other operand of a convolution's products, rows over `c·kh·kw` (a weight's
/// `[rows, c, kh, kw]`), in the order the vector side sums: as given where the columns are
/// unfolded, by channel pairs where they are read from a copy of the images (`direct`).
pub struct LeftRows<'a> {
    data: Cow<'a, [bf16]>,
    k: usize,
    paired: bool,
}

impl<'a> LeftRows<'a> {
    /// `rows` arranged for the products of geometry `g`, their vector side read from a copy of
    /// the images where `direct`.
    pub fn arrange(pool: &Pool, g: &Conv2dGeometry, rows: &'a [bf16], direct: bool) -> LeftRows<'a> {
        let kernel = g.kh * g.kw;
        if direct {
            return LeftRows {
                data: Cow::Owned(paired_rows(pool, rows, g.c, kernel)),
                k: paired_len(g.c, kernel),
                paired: true,
            };
        }
        LeftRows {
            data: Cow::Borrowed(rows),
            k: g.c * kernel,
            paired: false,
        }
    }

    fn side(&self) -> Side<'_> {
        Side {
            data: &self.data,
            offset: 0,
            rows: self.data.len() / self.k.max(1),
            row_stride: self.k,
            k_stride: 1,
        }
    }

    pub fn recycle(self, pool: &Pool) {
        if let Cow::Owned(data) = self.data {
            pool.recycle(HostVec::BF16(data));
        }
    }
}

/// Pair `p` of every panel from the tap rows `even` and `odd`, pixels past the end zero. Run
/// by `simd::wide`.
struct JoinPair<'a> {
    panels: &'a mut [u32],
    even: &'a [bf16],
    odd: &'a [bf16],
    p: usize,
    pairs: usize,
}

impl Kernel for JoinPair<'_> {
    type Out = ();
    #[inline(always)]
    fn run(self) {
        let JoinPair {
            panels,
            even,
            odd,
            p,
            pairs,
        } = self;
        for (q, (even, odd)) in even.chunks(NR).zip(odd.chunks(NR)).enumerate() {
            let words = &mut panels[(q * pairs + p) * NR..][..NR];
            for c in 0..even.len() {
                words[c] = join(even[c], odd[c]);
            }
            words[even.len()..].fill(0);
        }
    }
}
