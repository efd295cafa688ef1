//! Batched matrix multiply on the `gemm` crate (AVX2/AVX-512 kernels, rayon threads). Any
//! strides are passed straight through, so transposed and broadcast operands cost no copy.
//! (Copying a column-major right operand row-major first was measured and made the MLP step
//! slower, 54k -> 29k samples/s: `gemm` packs it well enough.)

#[cfg(target_arch = "x86_64")]
pub(super) mod amx;
#[cfg(target_arch = "x86_64")]
pub(super) mod bf16;
#[cfg(target_arch = "x86_64")]
pub(super) mod bf16_kernel;
pub(super) mod bf16_plan;
#[cfg(target_arch = "x86_64")]
pub(super) mod f32_kernel;

use std::ops::Range;

use gemm::Parallelism;
use rayon::prelude::*;

pub use bf16_plan::Bf16Products;

use super::pool::Pool;
use crate::backend::MatmulDims;
use crate::shape::Layout;

/// Outputs this small with sums at least this long are split along k across threads.
const SPLIT_K_MAX_OUTPUT: usize = 64 * 64;
const SPLIT_K_MIN_K: usize = 4096;

/// Below this many multiply-adds a single thread wins.
const PARALLEL_FLOPS: usize = 1 << 18;

pub trait GemmElement: crate::dtype::Element + num_traits::Zero + num_traits::One {
    /// The values as f32 where they are: for kernels written for f32 alone.
    fn as_f32(_values: &[Self]) -> Option<&[f32]> {
        None
    }
    /// `as_f32`, writable.
    fn as_f32_mut(_values: &mut [Self]) -> Option<&mut [f32]> {
        None
    }
}
impl GemmElement for f32 {
    fn as_f32(values: &[f32]) -> Option<&[f32]> {
        Some(values)
    }
    fn as_f32_mut(values: &mut [f32]) -> Option<&mut [f32]> {
        Some(values)
    }
}
impl GemmElement for f64 {}

/// Whether this CPU has the bf16 dot-product instructions (AVX512-BF16) the bf16 kernel needs;
/// whether products take it is `bf16_plan`'s choice.
pub fn bf16_kernel_available() -> bool {
    #[cfg(target_arch = "x86_64")]
    return bf16_kernel::available();
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// Whether this CPU has AMX tiles with bf16 and the OS lets this process use them.
pub fn bf16_tiles_available() -> bool {
    #[cfg(target_arch = "x86_64")]
    return amx::available();
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// bf16 products on `products`' kernel (AMX tiles or AVX512-BF16 dot products), f32
/// accumulation, one rounding; `None` for `Widened` or where the CPU lacks the kernel (the
/// caller then widens to f32).
pub fn matmul_bf16(
    pool: &Pool,
    products: Bf16Products,
    lhs: &[half::bf16],
    ll: &Layout,
    rhs: &[half::bf16],
    rl: &Layout,
    d: MatmulDims,
) -> Option<Vec<half::bf16>> {
    #[cfg(target_arch = "x86_64")]
    {
        let product: bf16::Product = match products {
            Bf16Products::Tiles if amx::available() => amx::product,
            Bf16Products::DotProducts if bf16_kernel::available() => bf16::product,
            _ => return None,
        };
        let mut out = pool.take(d.batch * d.m * d.n);
        if d.k == 0 {
            out.fill(half::bf16::ZERO);
        } else {
            // SAFETY: the kernel's CPU check passed above; k > 0; the caller validated the
            // layouts against the operands.
            unsafe { bf16::matmul(product, pool, &mut out, (lhs, ll), (rhs, rl), d) };
        }
        Some(out)
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (pool, products, lhs, ll, rhs, rl, d);
        None
    }
}

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
    let threads = rayon::current_num_threads();
    for b in 0..d.batch {
        let dst = &mut out[b * d.m * d.n..(b + 1) * d.m * d.n];
        if threads > 1 && d.m * d.n <= SPLIT_K_MAX_OUTPUT && d.k >= SPLIT_K_MIN_K {
            // A small output with a long sum (a convolution's weight gradient: k = batch * pixels)
            // gives gemm a single block to work on, so one thread would do it all. Each thread
            // sums its own slice of k; the partials are added in a fixed order (deterministic).
            let chunk = d.k.div_ceil(threads);
            let partials: Vec<Vec<T>> = (0..threads)
                .into_par_iter()
                .map(|p| {
                    let mut part = vec![T::zero(); d.m * d.n];
                    let ks = (p * chunk).min(d.k)..((p + 1) * chunk).min(d.k);
                    product(&mut part, lhs, ll, rhs, rl, d, b, ks, Parallelism::None);
                    part
                })
                .collect();
            dst.copy_from_slice(&partials[0]);
            for part in &partials[1..] {
                dst.iter_mut().zip(part).for_each(|(o, &x)| *o = *o + x);
            }
        } else {
            product(dst, lhs, ll, rhs, rl, d, b, 0..d.k, par);
        }
    }
    out
}

/// `dst = lhs[b][:, ks] @ rhs[b][ks, :]` for batch item `b` and the slice `ks` of the inner axis.
#[allow(clippy::too_many_arguments)]
fn product<T: GemmElement>(
    dst: &mut [T],
    lhs: &[T],
    ll: &Layout,
    rhs: &[T],
    rl: &Layout,
    d: MatmulDims,
    b: usize,
    ks: Range<usize>,
    par: Parallelism,
) {
    let (ls, rs) = (&ll.strides, &rl.strides);
    if ks.is_empty() {
        dst.fill(T::zero());
        return;
    }
    let lhs_off = ll.offset + b * ls[0] + ks.start * ls[2];
    let rhs_off = rl.offset + b * rs[0] + ks.start * rs[1];
    // SAFETY: the layouts were validated against the buffers by the caller (`extent()` fits) and
    // `ks` lies within 0..k, so every index gemm forms from (offset, rows, cols, strides) is in
    // bounds; `dst` is a distinct, exclusively borrowed m*n block with row stride n, column stride 1.
    unsafe {
        gemm::gemm(
            d.m,
            d.n,
            ks.len(),
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

#[cfg(test)]
mod tests;
