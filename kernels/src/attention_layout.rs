//! A model of attention.cu's tensor-core index maps, run on the host: ldmatrix and
//! mma.sync.m16n8k16 as the PTX ISA defines which lane holds which element, driven by the same
//! formulas as the kernels (`x4_offset`, `acc_row`, `acc_col`, copied from attention.cu, whose text
//! the first test checks), and compared with plain matrix products and plain causal attention.
//! The PTX cannot run without a GPU; its index logic can.

const SOURCE: &str = include_str!("../cuda/attention.cu");

/// A warp's registers: 32 lanes of `n` registers of two 16-bit elements (low half first).
type Regs = Vec<Vec<[f64; 2]>>;
/// A warp's f32 accumulator tile, 16 x 8·n: per lane, n-block × 4 registers.
type Acc = Vec<Vec<[f64; 4]>>;

// ---- the kernels' formulas (kept textually equal to attention.cu) ----

fn x4_offset(lane: usize, row0: usize, col0: usize, pitch: usize, rows_first: bool) -> usize {
    let row = if rows_first {
        (lane & 7) + ((lane >> 3) & 1) * 8
    } else {
        (lane & 7) + (lane >> 4) * 8
    };
    let col = if rows_first {
        (lane >> 4) * 8
    } else {
        ((lane >> 3) & 1) * 8
    };
    (row0 + row) * pitch + col0 + col
}
fn acc_row(lane: usize, e: usize) -> usize {
    (lane >> 2) + (e >> 1) * 8
}
fn acc_col(lane: usize, nb: usize, e: usize) -> usize {
    nb * 8 + (lane & 3) * 2 + (e & 1)
}

// ---- the hardware, as the PTX ISA specifies it ----

/// ldmatrix.sync.aligned.m8n8.x4(.trans): lanes 8j..8j+7 give the addresses of matrix j's rows;
/// register j of lane l holds matrix j's (row l/4, cols 2(l%4), +1), or with .trans
/// (rows 2(l%4), +1; col l/4).
fn ldmatrix_x4(tile: &[f64], address: impl Fn(usize) -> usize, trans: bool) -> Regs {
    (0..32)
        .map(|lane| {
            (0..4)
                .map(|j| {
                    let (r, c) = (lane / 4, 2 * (lane % 4));
                    let at = |row: usize, col: usize| tile[address(8 * j + row) + col];
                    if trans {
                        [at(c, r), at(c + 1, r)]
                    } else {
                        [at(r, c), at(r, c + 1)]
                    }
                })
                .collect()
        })
        .collect()
}

/// mma.m16n8k16.row.col: c (16x8) += a (16x16) · b (16x8) with groupID g = lane/4 and t = lane%4:
/// a's registers hold (g, 2t..), (g+8, 2t..), (g, 2t+8..), (g+8, 2t+8..); b's (k 2t.., n g),
/// (k 2t+8.., n g); c's (g, 2t), (g, 2t+1), (g+8, 2t), (g+8, 2t+1).
fn mma(c: &mut [[f64; 4]], a: &[[[f64; 2]; 4]], b: &[[[f64; 2]; 2]]) {
    let mut am = [[0.0; 16]; 16];
    let mut bm = [[0.0; 8]; 16];
    for lane in 0..32 {
        let (g, t) = (lane / 4, lane % 4);
        for (reg, (row, col)) in [(g, 2 * t), (g + 8, 2 * t), (g, 2 * t + 8), (g + 8, 2 * t + 8)]
            .into_iter()
            .enumerate()
        {
            am[row][col] = a[lane][reg][0];
            am[row][col + 1] = a[lane][reg][1];
        }
        for (reg, k) in [2 * t, 2 * t + 8].into_iter().enumerate() {
            bm[k][g] = b[lane][reg][0];
            bm[k + 1][g] = b[lane][reg][1];
        }
    }
    for (lane, c) in c.iter_mut().enumerate() {
        let (g, t) = (lane / 4, lane % 4);
        for (e, (row, col)) in [(g, 2 * t), (g, 2 * t + 1), (g + 8, 2 * t), (g + 8, 2 * t + 1)]
            .into_iter()
            .enumerate()
        {
            c[e] += (0..16).map(|k| am[row][k] * bm[k][col]).sum::<f64>();
        }
    }
}

fn quads(r: &Regs, lane: usize) -> [[f64; 2]; 4] {
    [r[lane][0], r[lane][1], r[lane][2], r[lane][3]]
}

// ---- the kernels' warp products, step for step ----

/// warp_product_abt: acc (16 x n) += A·Bᵀ, A the 16 x d rows at `a`, B the n x d rows at `b`.
fn warp_product_abt(acc: &mut Acc, a: &[f64], b: &[f64], d: usize, n: usize) {
    let p = d + 8;
    for kk in 0..d / 16 {
        let af = ldmatrix_x4(a, |lane| x4_offset(lane, 0, kk * 16, p, true), false);
        let af: Vec<_> = (0..32).map(|l| quads(&af, l)).collect();
        for j in 0..n / 16 {
            let bf = ldmatrix_x4(b, |lane| x4_offset(lane, j * 16, kk * 16, p, false), false);
            for (nb, regs) in [(2 * j, [0, 1]), (2 * j + 1, [2, 3])] {
                let bl: Vec<_> = (0..32).map(|l| [bf[l][regs[0]], bf[l][regs[1]]]).collect();
                let mut c: Vec<[f64; 4]> = acc.iter().map(|lane| lane[nb]).collect();
                mma(&mut c, &af, &bl);
                acc.iter_mut().zip(c).for_each(|(lane, c)| lane[nb] = c);
            }
        }
    }
}

/// warp_product_pb: acc (16 x d) += P·B, P the accumulator tile `pt` (16 x n), B the n x d rows at `b`.
fn warp_product_pb(acc: &mut Acc, pt: &Acc, b: &[f64], d: usize, n: usize) {
    let p = d + 8;
    for kk in 0..n / 16 {
        let af: Vec<[[f64; 2]; 4]> = pt
            .iter()
            .map(|s| {
                let (x, y) = (s[2 * kk], s[2 * kk + 1]);
                [[x[0], x[1]], [x[2], x[3]], [y[0], y[1]], [y[2], y[3]]]
            })
            .collect();
        for j in 0..d / 16 {
            let bf = ldmatrix_x4(b, |lane| x4_offset(lane, kk * 16, j * 16, p, true), true);
            for (nb, regs) in [(2 * j, [0, 1]), (2 * j + 1, [2, 3])] {
                let bl: Vec<_> = (0..32).map(|l| [bf[l][regs[0]], bf[l][regs[1]]]).collect();
                let mut c: Vec<[f64; 4]> = acc.iter().map(|lane| lane[nb]).collect();
                mma(&mut c, &af, &bl);
                acc.iter_mut().zip(c).for_each(|(lane, c)| lane[nb] = c);
            }
        }
    }
}

fn zero_acc(n: usize) -> Acc {
    vec![vec![[0.0; 4]; n / 8]; 32]
}

/// The accumulator tile as a 16 x n matrix, through acc_row / acc_col.
fn unpack(acc: &Acc) -> Vec<Vec<f64>> {
    let n = acc[0].len() * 8;
    let mut m = vec![vec![f64::NAN; n]; 16];
    for (lane, regs) in acc.iter().enumerate() {
        for (nb, r) in regs.iter().enumerate() {
            for (e, v) in r.iter().enumerate() {
                m[acc_row(lane, e)][acc_col(lane, nb, e)] = *v;
            }
        }
    }
    m
}

/// A tile of `rows` x d values (pitch d + 8, the padding NaN so a stray read shows).
fn tile(rows: usize, d: usize, f: impl Fn(usize, usize) -> f64) -> Vec<f64> {
    let mut t = vec![f64::NAN; rows * (d + 8)];
    for r in 0..rows {
        for c in 0..d {
            t[r * (d + 8) + c] = f(r, c);
        }
    }
    t
}

fn value(seed: usize, r: usize, c: usize) -> f64 {
    // Distinct small values, so a swapped index changes the product.
    (((seed * 7919 + r * 131 + c * 31) % 97) as f64 - 48.0) / 16.0
}

#[test]
fn the_model_uses_the_kernels_formulas() {
    for formula in [
        "u32 row = rows_first ? (lane & 7) + ((lane >> 3) & 1) * 8 : (lane & 7) + (lane >> 4) * 8;",
        "u32 col = rows_first ? (lane >> 4) * 8 : ((lane >> 3) & 1) * 8;",
        "return (row0 + row) * pitch + col0 + col;",
        "acc_row(u32 lane, int e) { return (lane >> 2) + (e >> 1) * 8; }",
        "acc_col(u32 lane, int nb, int e) { return nb * 8 + (lane & 3) * 2 + (e & 1); }",
        "ldmatrix_x4(af, a + x4_offset(lane, 0, kk * 16, P, true));",
        "ldmatrix_x4(bf, b + x4_offset(lane, j * 16, kk * 16, P, false));",
        "ldmatrix_x4_trans(bf, b + x4_offset(lane, kk * 16, j * 16, P, true));",
        "u32 af[4] = {pack2_operand<T>(p[2 * kk][0], p[2 * kk][1]), pack2_operand<T>(p[2 * kk][2], p[2 * kk][3]),",
        "pack2_operand<T>(p[2 * kk + 1][0], p[2 * kk + 1][1]),",
        "pack2_operand<T>(p[2 * kk + 1][2], p[2 * kk + 1][3])};",
        // Both halves of a packed register: the lower column low (cvt's first source is the high half).
        "asm(\"cvt.rn.bf16x2.f32 %0, %1, %2;\" : \"=r\"(packed) : \"f\"(hi), \"f\"(lo));",
        "asm(\"cvt.rn.f16x2.f32 %0, %1, %2;\" : \"=r\"(packed) : \"f\"(hi), \"f\"(lo));",
    ] {
        assert!(
            SOURCE.contains(formula),
            "attention.cu no longer holds `{formula}`: update this model"
        );
    }
}

#[test]
fn both_warp_products_match_a_plain_product() {
    for (d, n) in [(32, 16), (64, 64), (128, 32), (64, 16)] {
        let a = tile(16, d, |r, c| value(1, r, c));
        let b = tile(n, d, |r, c| value(2, r, c));
        let mut acc = zero_acc(n);
        warp_product_abt(&mut acc, &a, &b, d, n);
        let got = unpack(&acc);
        for (i, row) in got.iter().enumerate() {
            for (j, &v) in row.iter().enumerate() {
                let want: f64 = (0..d).map(|k| value(1, i, k) * value(2, j, k)).sum();
                assert_eq!(v, want, "A·Bᵀ ({i}, {j}) for d {d}, n {n}");
            }
        }
        // P (16 x n, in accumulator layout) times the n x d rows of b.
        let mut pt = zero_acc(n);
        for (lane, regs) in pt.iter_mut().enumerate() {
            for (nb, r) in regs.iter_mut().enumerate() {
                for (e, v) in r.iter_mut().enumerate() {
                    *v = value(3, acc_row(lane, e), acc_col(lane, nb, e));
                }
            }
        }
        let mut out = zero_acc(d);
        warp_product_pb(&mut out, &pt, &b, d, n);
        let got = unpack(&out);
        for (i, row) in got.iter().enumerate() {
            for (j, &v) in row.iter().enumerate() {
                let want: f64 = (0..n).map(|k| value(3, i, k) * value(2, k, j)).sum();
                assert_eq!(v, want, "P·B ({i}, {j}) for d {d}, n {n}");
            }
        }
    }
}

/// One warp's 16 query rows of the forward kernel (its masking of the tiles that straddle the
/// diagonal, online softmax and products, in f64 with exp for ex2), against softmax(q·kᵀ·scale,
/// masked)·v row by row.
#[test]
fn the_forward_tile_loop_matches_plain_causal_attention() {
    for formula in [
        "if (k0 + KV - 1 > warp_row0) scale_scores<KV, true>(s, tile_max, k0, warp_row0, scale2, lane);",
        "bool future = MASKED && k0 + acc_col(lane, nb, e) > row0 + acc_row(lane, e);",
    ] {
        assert!(
            SOURCE.contains(formula),
            "attention.cu no longer holds `{formula}`: update this model"
        );
    }
    let (d, t, kv, scale) = (64, 45, 16, 0.125);
    let q = |r: usize, c: usize| value(4, r, c) / 4.0;
    let k = |r: usize, c: usize| value(5, r, c) / 4.0;
    let v = |r: usize, c: usize| value(6, r, c);
    for warp_row0 in [0, 16, 32] {
        let q_tile = tile(16, d, |r, c| if warp_row0 + r < t { q(warp_row0 + r, c) } else { 0.0 });
        let mut o = zero_acc(d);
        let (mut row_max, mut row_sum) = (vec![[f64::NEG_INFINITY; 2]; 32], vec![[0.0; 2]; 32]);
        let mut k0 = 0;
        while k0 <= (warp_row0 + 15).min(t - 1) {
            let load =
                |f: &dyn Fn(usize, usize) -> f64| tile(kv, d, |r, c| if k0 + r < t { f(k0 + r, c) } else { 0.0 });
            let (k_tile, v_tile) = (load(&k), load(&v));
            let mut s = zero_acc(kv);
            warp_product_abt(&mut s, &q_tile, &k_tile, d, kv);
            let mut tile_max = vec![[f64::NEG_INFINITY; 2]; 32];
            let masked = k0 + kv - 1 > warp_row0;
            for (lane, lane_max) in tile_max.iter_mut().enumerate() {
                for (nb, regs) in s[lane].iter_mut().enumerate() {
                    for (e, x) in regs.iter_mut().enumerate() {
                        let future = masked && k0 + acc_col(lane, nb, e) > warp_row0 + acc_row(lane, e);
                        *x = if future { f64::NEG_INFINITY } else { *x * scale };
                        lane_max[e >> 1] = lane_max[e >> 1].max(*x);
                    }
                }
            }
            for lane in 0..32 {
                for half in 0..2 {
                    // quad_max: the 4 lanes of a row share it.
                    let quad = (lane & !3..(lane & !3) + 4)
                        .map(|l| tile_max[l][half])
                        .fold(f64::NEG_INFINITY, f64::max);
                    let m = row_max[lane][half].max(quad);
                    let rescale = (row_max[lane][half] - m).exp();
                    row_max[lane][half] = m;
                    row_sum[lane][half] *= rescale;
                    o[lane].iter_mut().for_each(|r| {
                        r[half * 2] *= rescale;
                        r[half * 2 + 1] *= rescale;
                    });
                }
                for regs in s[lane].iter_mut() {
                    for (e, x) in regs.iter_mut().enumerate() {
                        *x = (*x - row_max[lane][e >> 1]).exp();
                        row_sum[lane][e >> 1] += *x;
                    }
                }
            }
            warp_product_pb(&mut o, &s, &v_tile, d, kv);
            k0 += kv;
        }
        let got = unpack(&o);
        for (r, out_row) in got.iter().enumerate() {
            let row = warp_row0 + r;
            if row >= t {
                continue;
            }
            let lane = (r % 8) * 4;
            let total: f64 = (lane..lane + 4).map(|l| row_sum[l][r / 8]).sum();
            let scores: Vec<f64> = (0..=row)
                .map(|j| (0..d).map(|c| q(row, c) * k(j, c)).sum::<f64>() * scale)
                .collect();
            let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let weights: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
            let sum: f64 = weights.iter().sum();
            for (c, &o) in out_row.iter().enumerate() {
                let want: f64 = weights.iter().enumerate().map(|(j, w)| w * v(j, c)).sum::<f64>() / sum;
                assert!(
                    (o / total - want).abs() < 1e-9,
                    "row {row} col {c}: {} vs {want}",
                    o / total
                );
            }
        }
    }
}

/// Plain attention of one head in f64: per row, the weights over keys 0..=i, y, and lse; and the
/// gradients dq, dk, dv for output gradient `dy`.
struct Plain {
    lse: Vec<f64>,
    dot: Vec<f64>,
    dq: Vec<Vec<f64>>,
    dk: Vec<Vec<f64>>,
    dv: Vec<Vec<f64>>,
}

type Rows<'a> = &'a dyn Fn(usize, usize) -> f64;

fn plain(q: Rows, k: Rows, v: Rows, dy: Rows, t: usize, d: usize, scale: f64) -> Plain {
    let dot = |a: Rows, i: usize, b: Rows, j: usize| (0..d).map(|c| a(i, c) * b(j, c)).sum::<f64>();
    let mut out = Plain {
        lse: vec![0.0; t],
        dot: vec![0.0; t],
        dq: vec![vec![0.0; d]; t],
        dk: vec![vec![0.0; d]; t],
        dv: vec![vec![0.0; d]; t],
    };
    for i in 0..t {
        let s: Vec<f64> = (0..=i).map(|j| dot(q, i, k, j) * scale).collect();
        let max = s.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        out.lse[i] = max + s.iter().map(|s| (s - max).exp()).sum::<f64>().ln();
        let p: Vec<f64> = s.iter().map(|s| (s - out.lse[i]).exp()).collect();
        let dp: Vec<f64> = (0..=i).map(|j| dot(dy, i, v, j)).collect();
        out.dot[i] = p.iter().zip(&dp).map(|(p, g)| p * g).sum();
        for j in 0..=i {
            let ds = p[j] * (dp[j] - out.dot[i]) * scale;
            for c in 0..d {
                out.dq[i][c] += ds * k(j, c);
                out.dk[j][c] += ds * q(i, c);
                out.dv[j][c] += p[j] * dy(i, c);
            }
        }
    }
    out
}

/// weights_and_grads: the two products, then p and ds in place, masked as the kernel masks (only
/// a tile that straddles the diagonal or reaches t).
#[allow(clippy::too_many_arguments)]
fn weights_and_grads(
    tiles: [&[f64]; 4],
    lse: &[f64],
    dot: &[f64],
    (row0, col0, t, transposed): (usize, usize, usize, bool),
    d: usize,
    n: usize,
    scale: f64,
) -> (Acc, Acc) {
    let (mut s, mut dp) = (zero_acc(n), zero_acc(n));
    warp_product_abt(&mut s, tiles[0], tiles[1], d, n);
    warp_product_abt(&mut dp, tiles[2], tiles[3], d, n);
    let (last_query, first_query) = if transposed {
        (col0 + n - 1, col0)
    } else {
        (row0 + 15, row0)
    };
    let last_key = if transposed { row0 + 15 } else { col0 + n - 1 };
    let masked = !(last_key <= first_query && last_query < t);
    for lane in 0..32 {
        for nb in 0..n / 8 {
            for e in 0..4 {
                let (r, c) = (acc_row(lane, e), acc_col(lane, nb, e));
                let (query, key) = if transposed {
                    (col0 + c, row0 + r)
                } else {
                    (row0 + r, col0 + c)
                };
                let stat = if transposed { c } else { r };
                let seen = !masked || (key <= query && query < t);
                let p = if seen {
                    (s[lane][nb][e] * scale - lse[stat]).exp()
                } else {
                    0.0
                };
                s[lane][nb][e] = p;
                dp[lane][nb][e] = if seen { p * (dp[lane][nb][e] - dot[stat]) } else { 0.0 };
            }
        }
    }
    (s, dp)
}

/// The dQ pass for one warp of queries and the dK/dV pass for one warp of keys, as the kernels
/// walk their tiles (with their tails past t), against plain attention's gradients.
#[test]
fn the_backward_tile_loops_match_plain_gradients() {
    for formula in [
        "u32 query = transposed ? col0 + c : row0 + r, key = transposed ? row0 + r : col0 + c;",
        "float2 stat = stats[transposed ? c : r];",
        "bool seen = !MASKED || (key <= query && query < t);",
        "u32 last_query = transposed ? col0 + N - 1 : row0 + 15, first_query = transposed ? col0 : row0;",
        "u32 last_key = transposed ? row0 + 15 : col0 + N - 1;",
        "if (last_key <= first_query && last_query < t)",
        "weights_from_scores<N, false>(s, dp, stats, row0, col0, t, transposed, scale2, lane);",
        "warp_product_pb<T, D, KV>(dq, dp, k_tiles[stage], lane);",
        "warp_product_pb<T, D, QR>(dv, s, dy_tiles[stage], lane);",
        "warp_product_pb<T, D, QR>(dk, dp, q_tiles[stage], lane);",
    ] {
        assert!(
            SOURCE.contains(formula),
            "attention.cu no longer holds `{formula}`: update this model"
        );
    }
    let (d, t, n, scale) = (32, 41, 16, 0.2);
    let q = |r: usize, c: usize| value(7, r, c) / 4.0;
    let k = |r: usize, c: usize| value(8, r, c) / 4.0;
    let v = |r: usize, c: usize| value(9, r, c);
    let dy = |r: usize, c: usize| value(10, r, c) / 2.0;
    let want = plain(&q, &k, &v, &dy, t, d, scale);
    let rows =
        |f: Rows, row0: usize, count: usize| tile(count, d, |r, c| if row0 + r < t { f(row0 + r, c) } else { 0.0 });
    let stats = |row0: usize, count: usize| -> (Vec<f64>, Vec<f64>) {
        let at = |v: &[f64], r: usize| if row0 + r < t { v[row0 + r] } else { 0.0 };
        (
            (0..count).map(|r| at(&want.lse, r)).collect(),
            (0..count).map(|r| at(&want.dot, r)).collect(),
        )
    };
    let close = |got: f64, want: f64, what: &str| assert!((got - want).abs() < 1e-9, "{what}: {got} vs {want}");
    for warp_row0 in [0, 16, 32] {
        // dQ: this warp's queries against key tiles up to its last row.
        let (q_tile, dy_tile) = (rows(&q, warp_row0, 16), rows(&dy, warp_row0, 16));
        let (lse, dot) = stats(warp_row0, 16);
        let mut dq = zero_acc(d);
        let mut k0 = 0;
        while k0 <= (warp_row0 + 15).min(t - 1) {
            let (k_tile, v_tile) = (rows(&k, k0, n), rows(&v, k0, n));
            let tiles = [&q_tile[..], &k_tile, &dy_tile, &v_tile];
            let (_, ds) = weights_and_grads(tiles, &lse, &dot, (warp_row0, k0, t, false), d, n, scale);
            warp_product_pb(&mut dq, &ds, &k_tile, d, n);
            k0 += n;
        }
        // dK, dV: this warp's keys against query tiles from the diagonal on.
        let (k_tile, v_tile) = (rows(&k, warp_row0, 16), rows(&v, warp_row0, 16));
        let (mut dk, mut dv) = (zero_acc(d), zero_acc(d));
        // The block's keys start at 0 here (t < 64): tiles before this warp's keys are skipped.
        let mut q0 = 0;
        while q0 < t {
            if q0 + n - 1 < warp_row0 {
                q0 += n;
                continue;
            }
            let (q_tile, dy_tile) = (rows(&q, q0, n), rows(&dy, q0, n));
            let (lse, dot) = stats(q0, n);
            let tiles = [&k_tile[..], &q_tile, &v_tile, &dy_tile];
            let (p, ds) = weights_and_grads(tiles, &lse, &dot, (warp_row0, q0, t, true), d, n, scale);
            warp_product_pb(&mut dv, &p, &dy_tile, d, n);
            warp_product_pb(&mut dk, &ds, &q_tile, d, n);
            q0 += n;
        }
        let (dq, dk, dv) = (unpack(&dq), unpack(&dk), unpack(&dv));
        for r in 0..16 {
            let row = warp_row0 + r;
            if row >= t {
                continue;
            }
            for c in 0..d {
                close(dq[r][c] * scale, want.dq[row][c], &format!("dq[{row}][{c}]"));
                close(dk[r][c] * scale, want.dk[row][c], &format!("dk[{row}][{c}]"));
                close(dv[r][c], want.dv[row][c], &format!("dv[{row}][{c}]"));
            }
        }
    }
}
