use super::*;
use crate::backend::cpu::conv::unfold::im2col_tap;
use crate::backend::cpu::matmul::bf16_kernel;

fn geometry(
    n: usize,
    c: usize,
    (h, w): (usize, usize),
    k: usize,
    stride: usize,
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
        stride: [stride; 2],
        padding: [padding; 2],
        dilation: [dilation; 2],
    }
}

/// Every pair of every panel read from the copy equals the unfolded columns of the terms
/// (`2cp`, tap) and (`2cp + 1`, tap), for 3x3 (padding 1, and dilation 2 with padding 2), 1x1,
/// stride 1 and 2, odd and even channel counts, widths 32, 16, 8 and 4 out, and planes whose
/// channels lie apart (a `[c, n, h, w]` gradient).
#[test]
fn panels_read_from_the_copy_are_the_unfolded_columns_paired_by_channel() {
    if !bf16_kernel::available() {
        eprintln!("\n*** SKIPPED: this CPU has no AVX512-BF16; the direct path never runs on it ***\n");
        return;
    }
    let cases = [
        (geometry(2, 3, (8, 8), 3, 1, 1, 1), false),
        (geometry(1, 4, (32, 32), 3, 1, 1, 1), false),
        (geometry(3, 5, (4, 16), 3, 1, 1, 1), true),
        (geometry(2, 3, (8, 4), 1, 1, 0, 1), false),
        (geometry(2, 2, (16, 16), 3, 1, 2, 2), true),
        (geometry(1, 2, (16, 16), 3, 1, 2, 2), true),
        (geometry(2, 5, (16, 16), 3, 2, 1, 1), false),
        (geometry(2, 4, (15, 16), 3, 2, 1, 1), true),
        (geometry(3, 3, (16, 16), 1, 2, 0, 1), false),
    ];
    // One table for every case, as a task keeps it: each geometry must rebuild it.
    let mut table = Taps::default();
    for (g, channels_apart) in cases {
        assert!(applies(&g), "{g:?}");
        let (plane, columns) = (g.h * g.w, g.n * g.out_h() * g.out_w());
        let planes = if channels_apart {
            Planes {
                image: plane,
                channel: g.n * plane,
            }
        } else {
            Planes::nchw(&g)
        };
        let src: Vec<bf16> = (0..g.n * g.c * plane).map(|i| bf16::from_f32(1.0 + i as f32)).collect();
        let kernel = g.kh * g.kw;
        let unfolded: Vec<Vec<bf16>> = (0..g.c * kernel)
            .map(|r| {
                let mut row = vec![bf16::ZERO; columns];
                im2col_tap(&src, planes, &mut row, r, &g);
                row
            })
            .collect();
        let mut copy = vec![u32::MAX; copy_len(&g)];
        let direct = Direct::plan(&mut table, &mut copy, &src, planes, &g);
        for q in 0..columns / NR {
            let panel = direct.panel(q);
            for p in 0..g.c.div_ceil(2) * kernel {
                let (cp, tap) = (p / kernel, p % kernel);
                let term = |c: usize, col: usize| {
                    if c < g.c {
                        unfolded[c * kernel + tap][col]
                    } else {
                        bf16::ZERO
                    }
                };
                let want: Vec<u32> = (0..NR)
                    .map(|l| join(term(2 * cp, q * NR + l), term(2 * cp + 1, q * NR + l)))
                    .collect();
                let mut got = [0u32; NR];
                // SAFETY: available() holds; p is below the term count; `got` holds two registers.
                unsafe {
                    let (lo, hi) = panel.pairs(p);
                    _mm512_storeu_si512(got.as_mut_ptr().cast(), lo);
                    _mm512_storeu_si512(got.as_mut_ptr().add(16).cast(), hi);
                }
                assert_eq!(got[..], want[..], "{g:?} panel {q} pair {p}");
            }
        }
    }
}

#[test]
fn paired_rows_put_each_tap_of_a_channel_pair_side_by_side() {
    let pool = Pool::default();
    // Two rows of 3 channels x 2 taps: value 100·row + 10·channel + tap.
    let rows: Vec<bf16> = (0..2)
        .flat_map(|r| (0..3).flat_map(move |c| (0..2).map(move |t| bf16::from_f32((100 * r + 10 * c + t) as f32))))
        .collect();
    let paired: Vec<f32> = paired_rows(&pool, &rows, 3, 2).iter().map(|v| v.to_f32()).collect();
    assert_eq!(paired_len(3, 2), 8);
    assert_eq!(
        paired,
        [
            0., 10., 1., 11., 20., 0., 21., 0., 100., 110., 101., 111., 120., 0., 121., 0.
        ]
    );
}

#[test]
fn only_convolutions_whose_output_rows_tile_a_panel_and_whose_taps_stay_in_their_planes_apply() {
    assert!(applies(&geometry(64, 64, (32, 32), 3, 1, 1, 1)));
    assert!(applies(&geometry(64, 64, (32, 32), 3, 2, 1, 1)), "16x16 out");
    assert!(applies(&geometry(64, 128, (16, 16), 1, 2, 0, 1)), "8x8 out");
    assert!(
        !applies(&geometry(64, 512, (4, 4), 3, 1, 1, 1)),
        "16 pixels: a panel spans two images"
    );
    assert!(
        !applies(&geometry(1, 8, (28, 28), 3, 1, 1, 1)),
        "rows of 28 do not tile 32 lanes"
    );
    assert!(
        !applies(&geometry(1, 8, (34, 34), 3, 1, 0, 1)),
        "no padding: taps read past the output's size"
    );
    assert!(
        !applies(&geometry(1, 8, (64, 64), 3, 2, 0, 1)),
        "stride 2 without padding: 31 out"
    );
}
