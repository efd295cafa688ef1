use super::*;
use crate::backend::cpu::conv::unfold::{col2im, im2col};

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
fn values<T: Lanes>(len: usize, seed: usize) -> Vec<T> {
    (0..len)
        .map(|i| T::from_f64(((i * 7 + seed * 13) % 17) as f64 / 4.0 - 2.0))
        .collect()
}

/// Each output (`[rows, n, positions]`, f64) against what `plan` writes at both output
/// layouts, `[rows, n·positions]` and NCHW: the exact sum rounded once.
fn check<T: Lanes>(plan: &Plan, src: &[T], planes: Planes, weight: &[T], rows: usize, want: &[f64], what: &str) {
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
        let mut dst = vec![T::from_f64(99.0); rows * width];
        plan.run(&pool, (src, planes), weight, rows, (&mut dst, out));
        for r in 0..rows {
            for i in 0..n {
                for p in 0..positions {
                    let got = dst[i * out.image + r * out.channel + p].to_f64();
                    let exact = want[r * width + i * positions + p];
                    assert_eq!(
                        got,
                        T::from_f64(exact).to_f64(),
                        "{what} {:?} rows {rows} image stride {}: row {r} image {i} position {p}",
                        T::DTYPE,
                        out.image
                    );
                }
            }
        }
    }
}

fn wide<T: Lanes>(v: &[T]) -> Vec<f64> {
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

/// Whether this CPU has `T`'s kernel; says so loudly where it has not.
fn has_kernel<T: Lanes>() -> bool {
    let has = T::available();
    if !has {
        eprintln!(
            "\n*** SKIPPED: this CPU has no {:?} kernel for this path; it never runs on it ***\n",
            T::DTYPE
        );
    }
    has
}

fn forward<T: Lanes>() {
    if !has_kernel::<T>() {
        return;
    }
    for (g, rows) in CASES {
        let src = values::<T>(g.n * g.c * g.h * g.w, 1);
        let weight = values::<T>(rows * g.c * g.kh * g.kw, 2);
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

fn input_gradient<T: Lanes>() {
    if !has_kernel::<T>() {
        return;
    }
    // `g` has `o` output channels; the gradient `[o, n·oh·ow]` is the source, `g.c` rows.
    for (g, o) in CASES {
        let (taps, width) = (g.c * g.kh * g.kw, g.n * g.out_h() * g.out_w());
        let grad = values::<T>(o * width, 3);
        let weight = values::<T>(o * taps, 4);
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

fn weight_gradient<T: Lanes>() {
    if !has_kernel::<T>() {
        return;
    }
    for (g, o) in CASES {
        let (taps, width) = (g.c * g.kh * g.kw, g.n * g.out_h() * g.out_w());
        let src = values::<T>(g.n * g.c * g.h * g.w, 5);
        let grad = values::<T>(o * width, 6);
        let cols = im2col(&Pool::default(), &wide(&src), &g);
        // grad @ colsᵀ: [o, c·kh·kw], the layout `check` compares (lanes are channels).
        let want = matmul(
            &|r, col| grad[r * width + col].to_f64(),
            &|col, t| cols[t * width + col],
            (o, width, taps),
        );
        let channels = Planes {
            image: g.h * g.w,
            channel: g.c * g.h * g.w,
        };
        let plan = Plan::weight_gradient(&g);
        check(
            &plan,
            &src,
            channels,
            &grad,
            o,
            &want,
            &format!("weight gradient {g:?}"),
        );
    }
}

#[test]
fn tiles_of_one_position_in_many_images_match_plain_loops() {
    forward::<bf16>();
    forward::<f32>();
}

#[test]
fn input_gradients_of_one_position_in_many_images_match_plain_loops() {
    input_gradient::<bf16>();
    input_gradient::<f32>();
}

#[test]
fn weight_gradients_tap_by_tap_match_plain_loops() {
    weight_gradient::<bf16>();
    weight_gradient::<f32>();
}

#[test]
fn only_convolutions_with_enough_taps_in_the_padding_pay() {
    let pays = |g| Plan::forward(&g).pays::<bf16>();
    assert!(
        pays(geometry(64, 512, 4, 3, 1, 1)),
        "4x4: 31% of the taps in the padding"
    );
    assert!(pays(geometry(64, 256, 8, 3, 1, 1)), "8x8: 16%");
    assert!(!pays(geometry(64, 64, 32, 3, 1, 1)), "32x32: 4%");
    assert!(!pays(geometry(64, 256, 8, 1, 1, 0)), "1x1: none");
    assert!(!pays(geometry(40, 512, 4, 3, 1, 1)), "24 of 64 lanes empty");
    assert!(!pays(geometry(64, 3, 4, 3, 1, 1)), "three channels: pieces too short");
    let gradient_pays = |g, o| Plan::input_gradient(&g, o).pays::<bf16>();
    assert!(
        gradient_pays(geometry(64, 128, 16, 3, 2, 1), 256),
        "stride 2: three in four taps read no pixel"
    );
    assert!(!gradient_pays(geometry(64, 64, 16, 3, 1, 1), 64), "16x16: 8%");
    let f32_gradient_pays = |g, o| Plan::input_gradient(&g, o).pays::<f32>();
    assert!(
        f32_gradient_pays(geometry(64, 256, 8, 3, 2, 1), 512),
        "968 words a tile"
    );
    assert!(
        !f32_gradient_pays(geometry(64, 128, 16, 3, 2, 1), 256),
        "553 words a tile"
    );
    let weight_pays = |g| Plan::weight_gradient(&g).pays::<f32>();
    assert!(weight_pays(geometry(64, 512, 4, 3, 1, 1)), "4x4: 711 words a tile");
    assert!(!weight_pays(geometry(64, 64, 16, 3, 1, 1)), "16x16: 8% in the padding");
    assert!(!weight_pays(geometry(16, 512, 4, 3, 1, 1)), "16 images: sums too short");
}
