//! A bf16 convolution's columns unfolded straight into the bf16 kernel's panels (its vector
//! side, `panels[q][p][c]`: output pixel `q·NR + c`, taps `2p` and `2p + 1` in one word).
//! Unfolding into plain columns first and packing those wrote and read every column twice more:
//! the two took a quarter of a bf16 ResNet-18 step. Here two taps at a time unfold into rows
//! that stay in the L1 cache, and their pairs go straight into the panels.

use half::bf16;

use super::conv::{Planes, im2col_tap};
use super::matmul::bf16::join;
use super::matmul::bf16_kernel::NR;
use super::pool::Pool;
use super::simd::{Kernel, wide};
use crate::backend::Conv2dGeometry;
use crate::dtype::HostVec;

/// A task's panels and the two tap rows it unfolds through.
pub struct PanelScratch {
    panels: Vec<u32>,
    taps: Vec<bf16>,
}

impl PanelScratch {
    /// For unfoldings of up to `taps` taps over `columns` output pixels.
    pub fn take(pool: &Pool, taps: usize, columns: usize) -> PanelScratch {
        PanelScratch {
            panels: pool.take(columns.div_ceil(NR) * taps.div_ceil(2) * NR),
            taps: pool.take(2 * columns),
        }
    }

    /// The columns of `g.n` images of `src` (planes at `planes`) as the kernel's panels: the
    /// vector side of `product_with_panels` with `g.n·oh·ow` rows over `c·kh·kw`.
    pub fn unfold(&mut self, src: &[bf16], planes: Planes, g: &Conv2dGeometry) -> &[u32] {
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
