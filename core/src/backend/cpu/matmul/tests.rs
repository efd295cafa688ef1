//! The bf16 kernels (AMX tiles, AVX512-BF16 dot products) against an f64 product of the same
//! bf16 values, over the shapes that take each of their paths: operands read in place or packed
//! (odd k, transposed), tiles landing transposed, threads splitting strips or panels, partial
//! strips and panels, sums padded to whole tiles.

use half::bf16;

use super::{Bf16Products, Pool, matmul_bf16};
use crate::backend::MatmulDims;
use crate::shape::Layout;

/// Deterministic values in [-2, 2), exactly representable in bf16.
fn values(len: usize, seed: u32) -> Vec<bf16> {
    (0..len as u32)
        .map(|i| {
            let h = (i ^ seed).wrapping_mul(2654435761).rotate_left(13).wrapping_mul(40503);
            bf16::from_f32((h % 512) as f32 / 128.0 - 2.0)
        })
        .collect()
}

/// The kernels this CPU runs (not widening); says which it does not.
fn kernels() -> Vec<Bf16Products> {
    let here = super::bf16_plan::Kernels::of_this_cpu();
    let (run, missing): (Vec<_>, Vec<_>) = [Bf16Products::Tiles, Bf16Products::DotProducts]
        .into_iter()
        .partition(|&p| here.run(p));
    for products in missing {
        eprintln!("NOTE: this CPU (or OS) lacks the {products:?} kernel: it is not checked here");
    }
    run
}

/// `[m, k] @ [k, n]` with each operand stored as given (`transposed`: its two axes swapped).
fn check(products: Bf16Products, m: usize, k: usize, n: usize, lhs_t: bool, rhs_t: bool) {
    let pool = Pool::default();
    let layout = |rows: usize, cols: usize, t: bool| {
        if t {
            Layout::contiguous([1, cols, rows]).permute(&[0, 2, 1])
        } else {
            Layout::contiguous([1, rows, cols])
        }
    };
    let (ll, rl) = (layout(m, k, lhs_t), layout(k, n, rhs_t));
    let (a, b) = (values(m * k, 1), values(k * n, 2));
    let dims = MatmulDims { batch: 1, m, n, k };
    let out = matmul_bf16(&pool, products, &a, &ll, &b, &rl, dims).expect("the kernel runs here");
    let at = |v: &[bf16], l: &Layout, r: usize, c: usize| f64::from(v[l.offset + r * l.strides[1] + c * l.strides[2]]);
    for i in 0..m {
        for j in 0..n {
            let (mut exact, mut size) = (0.0, 0.0);
            for p in 0..k {
                let x = at(&a, &ll, i, p) * at(&b, &rl, p, j);
                exact += x;
                size += x.abs();
            }
            let got = f64::from(out[i * n + j]);
            // One bf16 rounding of the result plus f32 accumulation error.
            let tol = exact.abs() / 128.0 + size * 1e-6;
            assert!(
                (got - exact).abs() <= tol,
                "{products:?} {m}x{k}@{k}x{n} (lhs_t {lhs_t}, rhs_t {rhs_t}) at ({i},{j}): {got} vs {exact}"
            );
        }
    }
}

#[test]
fn the_bf16_kernels_match_an_exact_product_on_every_path() {
    for products in kernels() {
        for (lhs_t, rhs_t) in [(false, false), (false, true), (true, false), (true, true)] {
            let check = |m, k, n| check(products, m, k, n, lhs_t, rhs_t);
            check(1, 1, 1);
            check(5, 7, 3); // odd k: both sides packed
            check(13, 64, 33); // a partial strip and a partial panel
            check(19, 40, 22); // last strips of 7 and 10 rows: the 8-row and 12-row tiles
            check(100, 30, 70); // enough strips for threads to split them
            check(40, 129, 200); // the left side is the smaller one to pack
            check(64, 96, 64); // whole tiles: no padding
            check(33, 33, 31); // one past a tile's rows and sum, one short of its columns
            check(70, 1100, 40); // a sum in chunks (tiles: 256 pairs), its last one short
        }
    }
}

#[test]
fn an_empty_sum_gives_zeros() {
    let pool = Pool::default();
    let dims = MatmulDims {
        batch: 2,
        m: 3,
        n: 4,
        k: 0,
    };
    let (ll, rl) = (Layout::contiguous([2, 3, 0]), Layout::contiguous([2, 0, 4]));
    for products in kernels() {
        let out = matmul_bf16(&pool, products, &[], &ll, &[], &rl, dims).expect("the kernel runs here");
        assert_eq!(out, vec![bf16::ZERO; 24]);
    }
}

/// No rows or no columns: an empty product, on every kernel (the tiles split nothing).
#[test]
fn an_empty_output_is_an_empty_product() {
    let pool = Pool::default();
    for (m, n) in [(0, 4), (3, 0)] {
        let dims = MatmulDims { batch: 1, m, n, k: 5 };
        let (ll, rl) = (Layout::contiguous([1, m, 5]), Layout::contiguous([1, 5, n]));
        let (a, b) = (values(m * 5, 1), values(5 * n, 2));
        for products in kernels() {
            let out = matmul_bf16(&pool, products, &a, &ll, &b, &rl, dims).expect("the kernel runs here");
            assert!(out.is_empty(), "{products:?} {m}x{n}");
        }
    }
}

/// `left @ rightᵀ` into f32, stored and added, on the tiles that land transposed (the smaller
/// side packed as the vector side: a convolution's weight gradient), against the exact sums.
#[test]
fn f32_outputs_of_transposed_tiles_are_stored_and_added_exactly_where_they_belong() {
    use super::bf16::{Dst, Product, Side};
    fn rows_along_k(data: &[bf16], rows: usize, k: usize) -> Side<'_> {
        Side {
            data,
            offset: 0,
            rows,
            row_stride: k,
            k_stride: 1,
        }
    }
    let product_of = |products| -> Product {
        match products {
            Bf16Products::Tiles => super::amx::product,
            _ => super::bf16::product,
        }
    };
    // The right side is broadcast (100, 13, 7 rows: full strips and the 4- and 8-row tiles),
    // the left packed into panels (37, 5, 3 rows: partial panels).
    for (products, (m, n, k)) in kernels()
        .into_iter()
        .flat_map(|p| [(37, 100, 30), (5, 13, 64), (3, 7, 2), (140, 33, 1250)].map(|shape| (p, shape)))
    {
        let product = product_of(products);
        let (a, b) = (values(m * k, 3), values(n * k, 4));
        let exact =
            |i: usize, j: usize| -> f64 { (0..k).map(|p| f64::from(a[i * k + p]) * f64::from(b[j * k + p])).sum() };
        for add in [false, true] {
            let pool = Pool::default();
            let mut out = vec![1.0f32; m * n];
            let dst = if add {
                Dst::F32Add(out.as_mut_ptr())
            } else {
                Dst::F32(out.as_mut_ptr())
            };
            // SAFETY: the kernel runs here (`kernels`), k > 0, and `out` holds m rows of n.
            unsafe { product(&pool, dst, n, rows_along_k(&a, m, k), rows_along_k(&b, n, k), k) };
            for i in 0..m {
                for j in 0..n {
                    let want = exact(i, j) + if add { 1.0 } else { 0.0 };
                    let got = f64::from(out[i * n + j]);
                    assert!(
                        (got - want).abs() <= 1e-5 * (1.0 + want.abs()),
                        "{products:?} {m}x{n} over {k} (add {add}) at ({i},{j}): {got} vs {want}"
                    );
                }
            }
        }
    }
}
