use super::*;

use crate::backend::cpu::conv::reference::*;
use crate::dtype::DType;

/// The plan this CPU takes for `g` in `dtype`.
fn chosen(g: &Conv2dGeometry, o: usize, dtype: DType) -> Plan {
    super::super::plan(g, o, dtype, &super::super::Cpu::this(), Default::default()).unwrap()
}

#[test]
fn the_fused_product_and_its_gradients_match_plain_loops() {
    let pool = Pool::default();
    let close = |a: &[f64], b: &[f64]| a.iter().zip(b).all(|(x, y)| (x - y).abs() < 1e-9) && a.len() == b.len();
    for g in [STRIDED, UNSTRIDED, WIDE, SAME_SIZE] {
        let r = reference(&pool, g);
        let plan = chosen(&g, r.o, DType::F64);
        // One image a product, and runs of 2 and 3 (a weight too large for one image).
        for per in [1, 2, 3] {
            let forward = forward_in_runs(&pool, &r.x, &r.w, &r.g, r.o, per, &plan);
            assert!(close(&forward, &r.forward), "{g:?}, {per} a product");
            let (grad_x, grad_w) = backward_in_runs(&pool, &r.x, &r.w, &r.grad, &r.g, r.o, per, &plan);
            assert!(close(&grad_w, &r.grad_w), "{g:?}, {per} a product");
            assert!(close(&grad_x, &r.grad_x), "{g:?}, {per} a product");
        }
    }
    assert_eq!(PartialLayout::for_product(5, 81, 256), PartialLayout::ColumnMajor);
}

/// f32 on the paths this CPU's plans take (`shifted` on AVX2, `positions` on AVX-512 where
/// it pays, else unfolded), in runs of one and two images: exact in f32 on any of them.
#[test]
fn f32_products_match_plain_loops() {
    let pool = Pool::default();
    let narrow = |v: &[f64]| v.iter().map(|&x| x as f32).collect::<Vec<f32>>();
    let exact = |a: &[f32], b: &[f64]| a.len() == b.len() && a.iter().zip(b).all(|(&x, &y)| f64::from(x) == y);
    // Planes of 17x17: more pixels than one pass of the weight gradient, and a last tile
    // that overruns the plane.
    let large = Conv2dGeometry {
        n: 2,
        h: 17,
        w: 17,
        ..SAME_SIZE
    };
    // And 8x8 at stride 2: on AVX-512 their input gradients take tiles of one position
    // (`conv::positions`).
    let strided = Conv2dGeometry {
        c: 16,
        h: 8,
        w: 8,
        stride: [2, 2],
        ..POSITIONS
    };
    // And 128 channels: the product goes by position too (a sum long enough); and a batch of
    // 72: the weight gradient goes tap by tap.
    let deep = Conv2dGeometry { c: 128, ..POSITIONS };
    let batch = Conv2dGeometry {
        n: 72,
        c: 32,
        ..POSITIONS
    };
    for (g, o) in [
        (SAME_SIZE, 5),
        (WIDE, 5),
        (large, 5),
        (STRIDED, 5),
        (POSITIONS, 128),
        (strided, 416),
        (deep, 40),
        (batch, 8),
        (batch, 128),
    ] {
        let r = reference_with(&pool, g, o);
        let (x, w, grad) = (narrow(&r.x), narrow(&r.w), narrow(&r.grad));
        let plan = chosen(&g, o, DType::F32);
        for per in [1, 2] {
            assert!(
                exact(&forward_in_runs(&pool, &x, &w, &g, r.o, per, &plan), &r.forward),
                "{g:?} ({plan}), {per} a product"
            );
            let (grad_x, grad_w) = backward_in_runs(&pool, &x, &w, &grad, &g, r.o, per, &plan);
            assert!(exact(&grad_w, &r.grad_w), "{g:?} ({plan}), {per} a product");
            assert!(exact(&grad_x, &r.grad_x), "{g:?} ({plan}), {per} a product");
        }
    }
}

#[test]
fn only_unstrided_convolutions_have_a_transposed_input_gradient() {
    let pool = Pool::default();
    let plan = |g: &Conv2dGeometry| Transposed::plan(&pool, g, 5, &vec![0f32; 5 * g.c * g.kh * g.kw]).is_some();
    assert!(plan(&UNSTRIDED));
    assert!(!plan(&STRIDED));
    // Padding past dilation·(k-1) would need a negative padding.
    assert!(!plan(&Conv2dGeometry {
        padding: [5, 1],
        ..UNSTRIDED
    }));
}
