//! A bf16 convolution's columns unfolded straight into the bf16 kernels' panels (their vector
//! side, `panels[q][p][c]`: output pixel `q·NR + c`, taps `2p` and `2p + 1` in one word).
//! Unfolding into plain columns first and packing those wrote and read every column twice more:
//! the two took a quarter of a bf16 ResNet-18 step. Here two taps at a time unfold into rows
//! that stay in the L1 cache, and their pairs go straight into the panels. Where the
//! dot-product kernel can read a copy of the images with their channels paired (`direct`),
//! nothing is unfolded, and the other operand's sum is put in that copy's order (`LeftRows`).
//! For AMX tiles the panels' sums are padded with zeros to whole tile loads, and the other
//! operand is packed into the tiles' strips once.

use half::bf16;

use super::direct::{Direct, Taps, copy_len, paired_len, paired_rows};
use super::unfold::{Planes, im2col_tap};
use crate::backend::Conv2dGeometry;
use crate::backend::cpu::matmul::amx::{self, Strips};
use crate::backend::cpu::matmul::bf16::{Dst, PackedPanels, Side, join, product_with};
use crate::backend::cpu::matmul::bf16_kernel::NR;
use crate::backend::cpu::pool::Pool;
use crate::backend::cpu::simd::{Kernel, wide};
use crate::dtype::HostVec;

/// How a convolution's products meet their kernel: which kernel, and for the dot-product
/// kernel whether its vector side is read from a copy of the images (`direct`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Products {
    /// The dot-product kernel on panels unfolded from the images.
    #[default]
    Panels,
    /// The dot-product kernel reading a channel-paired copy of the images.
    Direct,
    /// AMX tiles on panels unfolded from the images, their sums padded to whole tile loads.
    Tiles,
}

/// A task's panels and the two tap rows it unfolds through, or the copy of the images and the
/// terms it reads them by; empty (`default()`) for a pass with no products.
#[derive(Default)]
pub struct PanelScratch {
    panels: Vec<u32>,
    taps: Vec<bf16>,
    copy: Vec<u32>,
    table: Taps,
    products: Products,
}

/// A convolution's vector side, ready for the product.
pub enum Unfolded<'a> {
    Panels(PackedPanels<'a>),
    Direct(Direct<'a>),
}

/// The k-pair words each panel holds for a sum of `taps` on `products`' kernel.
fn panel_pairs(taps: usize, products: Products) -> usize {
    match products {
        Products::Tiles => amx::padded_pairs(taps),
        Products::Panels | Products::Direct => taps.div_ceil(2),
    }
}

impl Unfolded<'_> {
    /// `dst = left @ columns`, the columns being these `columns` rows over the sum `left` is
    /// arranged for.
    ///
    /// # Safety
    /// As for `matmul::bf16::product_with`; `left` was arranged for this unfolding's geometry.
    pub unsafe fn product(&self, pool: &Pool, dst: Dst, row_stride: usize, left: &LeftRows, columns: usize) {
        // SAFETY: the caller's promises; either side holds `columns` rows over the sum `left`
        // was arranged for (the direct side's sum is paired exactly where `left`'s is, the
        // tiles' panels padded as its strips are).
        unsafe {
            match (self, left) {
                (Unfolded::Panels(panels), LeftRows::Rows { data, k }) => {
                    product_with(pool, dst, row_stride, rows_side(data, *k), panels, columns, *k)
                }
                (Unfolded::Direct(direct), LeftRows::Paired { data, k }) => {
                    product_with(pool, dst, row_stride, rows_side(data, *k), direct, columns, *k)
                }
                (Unfolded::Panels(panels), LeftRows::Tiles(strips)) => {
                    amx::multiply(pool, dst, row_stride, strips, panels, columns)
                }
                _ => unreachable!("the left side is arranged for the scratch's products"),
            }
        }
    }
}

impl PanelScratch {
    /// For the unfoldings of up to `g.n` images of `g` for `products` (`Direct` must apply to
    /// `g`).
    pub fn take(pool: &Pool, g: &Conv2dGeometry, products: Products) -> PanelScratch {
        let (taps, columns) = (g.c * g.kh * g.kw, g.n * g.out_h() * g.out_w());
        let direct = products == Products::Direct;
        PanelScratch {
            panels: pool.take(if direct {
                0
            } else {
                columns.div_ceil(NR) * panel_pairs(taps, products) * NR
            }),
            taps: pool.take(if direct { 0 } else { 2 * columns }),
            copy: pool.take(if direct { copy_len(g) } else { 0 }),
            table: Taps::default(),
            products,
        }
    }

    /// The columns of `g.n` images of `src` (planes at `planes`) as the vector side of a
    /// product with `g.n·oh·ow` rows: read from a copy of the images where this scratch is
    /// `direct`, otherwise unfolded into panels.
    pub fn unfold<'a>(&'a mut self, src: &'a [bf16], planes: Planes, g: &Conv2dGeometry) -> Unfolded<'a> {
        if self.products == Products::Direct {
            return Unfolded::Direct(Direct::plan(&mut self.table, &mut self.copy, src, planes, g));
        }
        let pairs = panel_pairs(g.c * g.kh * g.kw, self.products);
        Unfolded::Panels(PackedPanels::with_pairs(
            self.unfold_packed(src, planes, g),
            g.n * g.out_h() * g.out_w(),
            pairs,
        ))
    }

    /// The columns unfolded into the kernel's panels, pairs past the sum zero.
    pub fn unfold_packed(&mut self, src: &[bf16], planes: Planes, g: &Conv2dGeometry) -> &[u32] {
        let columns = g.n * g.out_h() * g.out_w();
        let taps = g.c * g.kh * g.kw;
        let (filled, pairs) = (taps.div_ceil(2), panel_pairs(taps, self.products));
        let panels = &mut self.panels[..columns.div_ceil(NR) * pairs * NR];
        if pairs > filled {
            for panel in panels.chunks_exact_mut(pairs * NR) {
                panel[filled * NR..].fill(0);
            }
        }
        let (even, odd) = self.taps[..2 * columns].split_at_mut(columns);
        for p in 0..filled {
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
/// `[rows, c, kh, kw]`), arranged for the vector side's kernel: as given where the columns are
/// unfolded for the dot-product kernel, by channel pairs where they are read from a copy of the
/// images (`direct`), packed into strips for AMX tiles.
pub enum LeftRows<'a> {
    Rows { data: &'a [bf16], k: usize },
    Paired { data: Vec<bf16>, k: usize },
    Tiles(Strips),
}

impl<'a> LeftRows<'a> {
    /// `rows` arranged for `products` of geometry `g`.
    pub fn arrange(pool: &Pool, g: &Conv2dGeometry, rows: &'a [bf16], products: Products) -> LeftRows<'a> {
        let kernel = g.kh * g.kw;
        let k = g.c * kernel;
        match products {
            Products::Panels => LeftRows::Rows { data: rows, k },
            Products::Direct => LeftRows::Paired {
                data: paired_rows(pool, rows, g.c, kernel),
                k: paired_len(g.c, kernel),
            },
            Products::Tiles => LeftRows::Tiles(Strips::pack(pool, rows_side(rows, k), k)),
        }
    }

    pub fn recycle(self, pool: &Pool) {
        match self {
            LeftRows::Rows { .. } => {}
            LeftRows::Paired { data, .. } => pool.recycle(HostVec::BF16(data)),
            LeftRows::Tiles(strips) => strips.recycle(pool),
        }
    }
}

/// `data` as rows of `k` contiguous elements.
fn rows_side(data: &[bf16], k: usize) -> Side<'_> {
    Side {
        data,
        offset: 0,
        rows: data.len() / k.max(1),
        row_stride: k,
        k_stride: 1,
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
