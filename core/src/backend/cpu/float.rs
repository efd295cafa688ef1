//! The float element types the CPU kernels compute in, and the dispatch that runs f16/bf16
//! through f32 kernels (convert, compute, round once), so each kernel is written once.

use half::slice::HalfFloatSliceExt;
use half::{bf16, f16};
use num_traits::Float;
use rayon::prelude::*;

use super::pool::Pool;
use super::simd::{Kernel, wide};
use crate::dtype::{Element, HostVec};
use crate::error::Error;

/// The float types the CPU kernels are written for (f32 and f64; f16/bf16 run through f32).
pub trait CpuFloat: Float + Element + Send + Sync + std::iter::Sum {
    /// The error function, from `libm` (GELU needs it; `num_traits::Float` lacks it).
    fn erf(self) -> Self;
    /// `e^x` for `x <= 0` (a softmax's shifted logits).
    fn exp_nonpositive(self) -> Self {
        self.exp()
    }
    /// `x * Φ(x)` (PyTorch's exact GELU).
    fn gelu(self) -> Self {
        self * Self::of(0.5) * (Self::one() + (self * Self::of(std::f64::consts::FRAC_1_SQRT_2)).erf())
    }
    /// The derivative of `gelu`, `Φ(x) + x * φ(x)`.
    fn gelu_grad(self) -> Self {
        let half = Self::of(0.5);
        half * (Self::one() + (self * Self::of(std::f64::consts::FRAC_1_SQRT_2)).erf())
            + self * Self::of(0.398_942_280_401_432_7) * (-half * self * self).exp()
    }
    /// An f64 constant (a step size, an epsilon) in this type, rounded to nearest.
    fn of(x: f64) -> Self {
        <Self as Element>::from_f64(x)
    }
}

impl CpuFloat for f32 {
    fn erf(self) -> Self {
        libm::erff(self)
    }
    // Branch-free, so the loops vectorize (see `fast_math`).
    #[inline(always)]
    fn exp_nonpositive(self) -> Self {
        super::fast_math::exp_nonpositive(self)
    }
    #[inline(always)]
    fn gelu(self) -> Self {
        super::fast_math::gelu(self)
    }
    #[inline(always)]
    fn gelu_grad(self) -> Self {
        super::fast_math::gelu_grad(self)
    }
}
impl CpuFloat for f64 {
    fn erf(self) -> Self {
        libm::erf(self)
    }
}

/// The floats kept in memory as themselves and computed in f32 (f32, and f16/bf16 widened
/// exactly): kernels that widen as they read and round as they write, instead of going through
/// whole f32 copies.
pub trait ViaF32: Element + Copy + Send + Sync {
    /// Widened, exactly.
    fn to_f32(self) -> f32;
    /// Rounded to nearest.
    fn from_f32(v: f32) -> Self;
}

impl ViaF32 for f32 {
    fn to_f32(self) -> f32 {
        self
    }
    fn from_f32(v: f32) -> Self {
        v
    }
}
// On the bits and without branches, so loops over bf16 vectorize (`half`'s scalar conversion
// branches per element); the same values as `half`, NaN a quiet NaN of the same sign.
impl ViaF32 for bf16 {
    fn to_f32(self) -> f32 {
        f32::from_bits((self.to_bits() as u32) << 16)
    }
    fn from_f32(v: f32) -> Self {
        let x = v.to_bits();
        let nearest_even = x.wrapping_add(0x7FFF + ((x >> 16) & 1)) >> 16;
        let quiet_nan = (x >> 16) | 0x40;
        bf16::from_bits(if v.is_nan() { quiet_nan } else { nearest_even } as u16)
    }
}
impl ViaF32 for f16 {
    fn to_f32(self) -> f32 {
        f16::to_f32(self)
    }
    fn from_f32(v: f32) -> Self {
        f16::from_f32(v)
    }
}

/// Elements per parallel conversion chunk: large enough to amortise a task, small enough to
/// split a weight matrix across the threads.
const CONVERT_CHUNK: usize = 1 << 16;

/// `convert` applied chunk by chunk in parallel, from `src` into `out`: `half`'s slice
/// conversions (SIMD where the CPU has it) over whole weight matrices, which mixed precision
/// converts every step.
fn convert<S: Sync, D: Send>(src: &[S], mut out: Vec<D>, convert: impl Fn(&[S], &mut [D]) + Sync) -> Vec<D> {
    out.par_chunks_mut(CONVERT_CHUNK)
        .zip(src.par_chunks(CONVERT_CHUNK))
        .for_each(|(o, i)| convert(i, o));
    out
}

/// f16 values widened to f32 (exact), in a vector from `pool`.
pub fn widen_f16(pool: &Pool, v: &[f16]) -> Vec<f32> {
    convert(v, pool.take(v.len()), |i, o| i.convert_to_f32_slice(o))
}
/// `src` widened into `dst` (exact), by `ViaF32`'s bit operations, which vectorize: `half`
/// converts bf16 slices one element at a time.
#[inline(always)]
pub fn bf16_to_f32_slice(dst: &mut [f32], src: &[bf16]) {
    for (o, &x) in dst.iter_mut().zip(src) {
        *o = ViaF32::to_f32(x);
    }
}
/// `src` rounded to nearest into `dst`, vectorized as `bf16_to_f32_slice`.
#[inline(always)]
pub fn bf16_from_f32_slice(dst: &mut [bf16], src: &[f32]) {
    for (o, &x) in dst.iter_mut().zip(src) {
        *o = <bf16 as ViaF32>::from_f32(x);
    }
}

/// bf16 values widened to f32 (exact), in a vector from `pool`.
pub fn widen_bf16(pool: &Pool, v: &[bf16]) -> Vec<f32> {
    struct Chunk<'a>(&'a mut [f32], &'a [bf16]);
    impl Kernel for Chunk<'_> {
        type Out = ();
        #[inline(always)]
        fn run(self) {
            bf16_to_f32_slice(self.0, self.1)
        }
    }
    convert(v, pool.take(v.len()), |i, o| wide(Chunk(o, i)))
}
/// f32 values rounded to nearest f16, in a vector from `pool`.
pub fn narrow_f16(pool: &Pool, v: &[f32]) -> Vec<f16> {
    convert(v, pool.take(v.len()), |i, o| o.convert_from_f32_slice(i))
}
/// f32 values rounded to nearest bf16, in a vector from `pool`.
pub fn narrow_bf16(pool: &Pool, v: &[f32]) -> Vec<bf16> {
    struct Chunk<'a>(&'a mut [bf16], &'a [f32]);
    impl Kernel for Chunk<'_> {
        type Out = ();
        #[inline(always)]
        fn run(self) {
            bf16_from_f32_slice(self.0, self.1)
        }
    }
    convert(v, pool.take(v.len()), |i, o| wide(Chunk(o, i)))
}

/// Runs an f32 kernel on 16-bit data: widens `inputs`, runs `body`, rounds its result once, and
/// hands the f32 temporaries back to the pool.
pub fn through_f32<H: Copy, const N: usize>(
    pool: &Pool,
    inputs: [&[H]; N],
    widen: fn(&Pool, &[H]) -> Vec<f32>,
    narrow: fn(&Pool, &[f32]) -> Vec<H>,
    body: impl FnOnce([&[f32]; N]) -> Vec<f32>,
) -> Vec<H> {
    let [out] = through_f32_outputs(pool, inputs, widen, narrow, |wide| [body(wide)]);
    out
}

/// As `through_f32`, for a kernel with several results, each rounded once.
pub fn through_f32_outputs<H: Copy, const N: usize, const M: usize>(
    pool: &Pool,
    inputs: [&[H]; N],
    widen: fn(&Pool, &[H]) -> Vec<f32>,
    narrow: fn(&Pool, &[f32]) -> Vec<H>,
    body: impl FnOnce([&[f32]; N]) -> [Vec<f32>; M],
) -> [Vec<H>; M] {
    let wide: [Vec<f32>; N] = inputs.map(|x| widen(pool, x));
    let outs = body(std::array::from_fn(|i| wide[i].as_slice()));
    let rounded = outs.each_ref().map(|out| narrow(pool, out));
    for w in wide.into_iter().chain(outs) {
        pool.recycle(HostVec::F32(w));
    }
    rounded
}

/// The error for a binary op's operands that no float arm of a dispatch macro took: dtypes
/// that differ, or a dtype that is not a float.
pub fn binary_dtype_error(op: &'static str, a: &HostVec, b: &HostVec) -> Error {
    if a.dtype() != b.dtype() {
        Error::DTypeMismatch {
            op,
            lhs: a.dtype(),
            rhs: b.dtype(),
        }
    } else {
        Error::dtype(op, a.dtype())
    }
}

/// Runs `$body` with `$v` bound to the float data of `$src` as a slice of f32 or f64 (16-bit
/// floats through f32 temporaries from `$pool`), and wraps
/// the `Vec` it returns back into a `HostVec` of the source dtype. Non-float dtypes are an error
/// naming `$op`.
#[macro_export]
macro_rules! float_unary_dispatch {
    ($pool:expr, $op:expr, $src:expr, |$v:ident| $body:expr) => {{
        use $crate::backend::cpu::float::*;
        use $crate::dtype::HostVec;
        match $src {
            HostVec::F32(x) => {
                let $v: &[f32] = x;
                HostVec::F32($body)
            }
            HostVec::F64(x) => {
                let $v: &[f64] = x;
                HostVec::F64($body)
            }
            HostVec::F16(x) => HostVec::F16(through_f32($pool, [x], widen_f16, narrow_f16, |[$v]| $body)),
            HostVec::BF16(x) => HostVec::BF16(through_f32($pool, [x], widen_bf16, narrow_bf16, |[$v]| $body)),
            other => return Err($crate::error::Error::dtype($op, other.dtype())),
        }
    }};
}

/// As `float_unary_dispatch!`, for two operands of the same dtype.
#[macro_export]
macro_rules! float_binary_dispatch {
    ($pool:expr, $op:expr, $a:expr, $b:expr, |$x:ident, $y:ident| $body:expr) => {{
        use $crate::backend::cpu::float::*;
        use $crate::dtype::HostVec;
        match ($a, $b) {
            (HostVec::F32(a), HostVec::F32(b)) => {
                let ($x, $y): (&[f32], &[f32]) = (a, b);
                HostVec::F32($body)
            }
            (HostVec::F64(a), HostVec::F64(b)) => {
                let ($x, $y): (&[f64], &[f64]) = (a, b);
                HostVec::F64($body)
            }
            (HostVec::F16(a), HostVec::F16(b)) => {
                HostVec::F16(through_f32($pool, [a, b], widen_f16, narrow_f16, |[$x, $y]| $body))
            }
            (HostVec::BF16(a), HostVec::BF16(b)) => {
                HostVec::BF16(through_f32($pool, [a, b], widen_bf16, narrow_bf16, |[$x, $y]| $body))
            }
            (a, b) => return Err($crate::backend::cpu::float::binary_dtype_error($op, a, b)),
        }
    }};
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn branch_free_bf16_rounding_is_halfs() {
        let specials = [
            0u32,
            0x8000_0000,
            0x7F80_0000,
            0xFF80_0000,
            0x7F7F_FFFF,
            0x3F80_8000,
            0x3F81_8000,
        ];
        let spread = (0..1u64 << 22).map(|i| (i.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32) as u32);
        for bits in specials.into_iter().chain(spread) {
            let v = f32::from_bits(bits);
            let (ours, theirs) = (<bf16 as ViaF32>::from_f32(v), bf16::from_f32(v));
            if v.is_nan() {
                assert!(
                    ours.is_nan() && ours.is_sign_negative() == v.is_sign_negative(),
                    "{bits:#x}"
                );
            } else {
                assert_eq!(ours.to_bits(), theirs.to_bits(), "{bits:#x}");
            }
            assert_eq!(<bf16 as ViaF32>::to_f32(ours).to_bits(), ours.to_f32().to_bits());
        }
    }
}
