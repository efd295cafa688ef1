//! Batched matrix multiply on the `gemm` crate (AVX2/AVX-512 kernels, rayon threads). Strides
//! are passed straight through, so transposed and broadcast operands need no copy, except a
//! large column-major right operand (Linear's `x @ W^T`): `gemm` packs that layout about 1.5x
//! slower, so it is first transposed into a row-major scratch copy, tile by tile.

use gemm::Parallelism;

use super::pool::Pool;
use crate::backend::MatmulDims;
use crate::shape::Layout;

/// A column-major right operand with at least this many elements is copied row-major first.
const TRANSPOSE_RHS_ELEMS: usize = 1 << 14;

/// Tile edge of the transpose: two 32x32 f32 tiles sit comfortably in L1.
const TILE: usize = 32;

/// Writes the `rows x cols` matrix at `src` (row stride 1, column stride `rows`, i.e. column-major)
/// into `dst` row-major, tile by tile so reads and writes both stay in cache.
fn transpose_into<T: Copy>(src: &[T], rows: usize, cols: usize, dst: &mut [T]) {
    for r0 in (0..rows).step_by(TILE) {
        for c0 in (0..cols).step_by(TILE) {
            for c in c0..(c0 + TILE).min(cols) {
                let column = &src[c * rows..c * rows + rows];
                for r in r0..(r0 + TILE).min(rows) {
                    dst[r * cols + c] = column[r];
                }
            }
        }
    }
}

/// Below this many multiply-adds a single thread wins.
const PARALLEL_FLOPS: usize = 1 << 18;

pub trait GemmElement: crate::dtype::Element + num_traits::Zero + num_traits::One {}
impl GemmElement for f32 {}
impl GemmElement for f64 {}

pub fn matmul<T: GemmElement>(pool: &Pool, lhs: &[T], ll: &Layout, rhs: &[T], rl: &Layout, d: MatmulDims) -> Vec<T> {
    let mut out = pool.take::<T>(d.batch * d.m * d.n);
    if d.k == 0 {
        out.fill(T::zero());
        return out;
    }
    let par = if d.m * d.n * d.k >= PARALLEL_FLOPS {
        Parallelism::Rayon(0)
    } else {
        Parallelism::None
    };
    let (ls, mut rs) = (&ll.strides, rl.strides.clone());
    // A dense column-major right operand shared by the whole batch (stride 0) or alone.
    let column_major = rs[1] == 1 && rs[2] == d.k && (d.batch == 1 || rs[0] == 0);
    let mut scratch: Option<Vec<T>> = None;
    let (rhs, rhs_offset) = if column_major && d.k * d.n >= TRANSPOSE_RHS_ELEMS {
        let mut rows = pool.take::<T>(d.k * d.n);
        transpose_into(&rhs[rl.offset..rl.offset + d.k * d.n], d.k, d.n, &mut rows);
        rs = vec![0, d.n, 1];
        (&scratch.insert(rows)[..], 0)
    } else {
        (rhs, rl.offset)
    };
    for b in 0..d.batch {
        let dst = &mut out[b * d.m * d.n..(b + 1) * d.m * d.n];
        let lhs_off = ll.offset + b * ls[0];
        let rhs_off = rhs_offset + b * rs[0];
        // SAFETY: the layouts were validated against the buffers by the caller (`extent()` fits),
        // so every index gemm forms from (offset, rows, cols, strides) is in bounds; `dst` is a
        // distinct, exclusively borrowed m*n block with row stride n and column stride 1.
        unsafe {
            gemm::gemm(
                d.m,
                d.n,
                d.k,
                dst.as_mut_ptr(),
                1,
                d.n as isize,
                false,
                lhs.as_ptr().add(lhs_off),
                ls[2] as isize,
                ls[1] as isize,
                rhs.as_ptr().add(rhs_off),
                rs[2] as isize,
                rs[1] as isize,
                T::zero(),
                T::one(),
                false,
                false,
                false,
                par,
            );
        }
    }
    // The scratch copy goes back to the pool: the next step needs the same size again.
    if let Some(rows) = scratch {
        pool.recycle(T::into_host(rows));
    }
    out
}
