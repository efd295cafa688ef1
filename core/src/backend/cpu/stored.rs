//! Elements kept in memory as one type and computed in another: f32 and f64 as themselves, bf16
//! and f16 widened exactly to f32 as a kernel reads them and rounded once as it writes. The
//! same bits as converting whole arrays to f32, running the f32 kernel and rounding its result
//! (what `float::through_f32` does), without the two copies — which under bf16 autocast were a
//! tenth of a GPT step's time.

use half::{bf16, f16};

use super::float::{CpuFloat, ViaF32};
use crate::dtype::Element;

/// An element stored as `Self` that kernels compute with in `C`.
pub trait Stored<C>: Element + Copy + Send + Sync {
    /// Widened to `C`, exactly.
    fn load(self) -> C;
    /// Rounded to nearest.
    fn store(value: C) -> Self;
}

impl<T: CpuFloat> Stored<T> for T {
    #[inline(always)]
    fn load(self) -> T {
        self
    }
    #[inline(always)]
    fn store(value: T) -> T {
        value
    }
}

impl Stored<f32> for bf16 {
    #[inline(always)]
    fn load(self) -> f32 {
        ViaF32::to_f32(self)
    }
    #[inline(always)]
    fn store(value: f32) -> bf16 {
        <bf16 as ViaF32>::from_f32(value)
    }
}

impl Stored<f32> for f16 {
    #[inline(always)]
    fn load(self) -> f32 {
        ViaF32::to_f32(self)
    }
    #[inline(always)]
    fn store(value: f32) -> f16 {
        <f16 as ViaF32>::from_f32(value)
    }
}

/// `f` on stored operands: load both, compute, store once.
#[inline(always)]
pub fn stored2<S: Stored<T>, T>(f: impl Fn(T, T) -> T + Copy) -> impl Fn(S, S) -> S + Copy {
    move |a: S, b: S| S::store(f(a.load(), b.load()))
}

/// Runs `$body` with `$v` bound to the float data of `$src` as a slice of its own element type
/// (f32, f64, bf16 or f16, each computed in its `Stored` type), and wraps the `Vec` it returns
/// in a `HostVec` of that dtype. Non-float dtypes are an error naming `$op`.
#[macro_export]
macro_rules! stored_unary_dispatch {
    ($op:expr, $src:expr, |$v:ident| $body:expr) => {{
        use $crate::dtype::HostVec;
        match $src {
            HostVec::F32($v) => HostVec::F32($body),
            HostVec::F64($v) => HostVec::F64($body),
            HostVec::BF16($v) => HostVec::BF16($body),
            HostVec::F16($v) => HostVec::F16($body),
            other => return Err($crate::error::Error::dtype($op, other.dtype())),
        }
    }};
}

/// As `stored_unary_dispatch!`, for two operands of the same dtype.
#[macro_export]
macro_rules! stored_binary_dispatch {
    ($op:expr, $a:expr, $b:expr, |$x:ident, $y:ident| $body:expr) => {{
        use $crate::dtype::HostVec;
        match ($a, $b) {
            (HostVec::F32($x), HostVec::F32($y)) => HostVec::F32($body),
            (HostVec::F64($x), HostVec::F64($y)) => HostVec::F64($body),
            (HostVec::BF16($x), HostVec::BF16($y)) => HostVec::BF16($body),
            (HostVec::F16($x), HostVec::F16($y)) => HostVec::F16($body),
            (a, b) => return Err($crate::backend::cpu::float::binary_dtype_error($op, a, b)),
        }
    }};
}

#[cfg(test)]
mod tests {
    use super::super::float::{narrow_bf16, through_f32, widen_bf16};
    use super::super::pool::Pool;
    use super::super::{bias, elementwise, reduce};
    use super::*;
    use crate::backend::{BinaryOp, ReduceKind, UnaryOp};
    use crate::shape::Layout;

    /// bf16 values spread over many binades, a few of them NaN, infinite or zero.
    fn values(n: usize, salt: u64) -> Vec<bf16> {
        (0..n as u64)
            .map(|i| {
                let r = (i ^ salt).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 40;
                match r % 97 {
                    0 => bf16::NAN,
                    1 => bf16::NEG_INFINITY,
                    2 => bf16::ZERO,
                    _ => bf16::from_f32(((r % 20_000) as f32 - 10_000.0) * 1e-3 * (1 + r % 7) as f32),
                }
            })
            .collect()
    }

    fn bits(v: &[bf16]) -> Vec<u16> {
        v.iter().map(|x| x.to_bits()).collect()
    }

    /// Each kernel on bf16 directly gives the bits of the f32 kernel between whole-array
    /// conversions (the path it replaced).
    #[test]
    fn direct_bf16_kernels_give_the_bits_of_f32_kernels_between_conversions() {
        let pool = Pool::default();
        let (rows, channels) = (300, 70);
        let (x, y, b) = (
            values(rows * channels, 1),
            values(rows * channels, 2),
            values(channels, 3),
        );
        let flat = Layout::contiguous([rows * channels]);
        let grid = Layout::contiguous([rows, channels]);
        let via = |inputs: &[&[bf16]], body: &dyn Fn(&[&[f32]]) -> Vec<f32>| {
            let wide: Vec<Vec<f32>> = inputs.iter().map(|v| widen_bf16(&pool, v)).collect();
            let slices: Vec<&[f32]> = wide.iter().map(|w| w.as_slice()).collect();
            narrow_bf16(&pool, &body(&slices))
        };
        for op in [
            UnaryOp::Gelu,
            UnaryOp::GeluGrad,
            UnaryOp::Exp,
            UnaryOp::Relu,
            UnaryOp::Sqrt,
        ] {
            let direct = elementwise::unary::<bf16, f32>(&pool, &x, &flat, op);
            let reference = via(&[&x], &|v| elementwise::unary(&pool, v[0], &flat, op));
            assert_eq!(bits(&direct), bits(&reference), "{op:?}");
        }
        for op in [BinaryOp::Add, BinaryOp::Mul, BinaryOp::Div, BinaryOp::Maximum] {
            let direct = elementwise::binary::<bf16, f32>(&pool, &x, &flat, &y, &flat, op);
            let reference = via(&[&x, &y], &|v| elementwise::binary(&pool, v[0], &flat, v[1], &flat, op));
            assert_eq!(bits(&direct), bits(&reference), "{op:?}");
        }
        for act in [None, Some(UnaryOp::Gelu)] {
            let direct = bias::bias_act::<bf16, f32>(&pool, &x, &b, channels, 1, act);
            let reference = via(&[&x, &b], &|v| bias::bias_act(&pool, v[0], v[1], channels, 1, act));
            assert_eq!(bits(&direct), bits(&reference), "bias_act {act:?}");
        }
        for (kind, axes) in [
            (ReduceKind::Sum, vec![0]),
            (ReduceKind::Sum, vec![1]),
            (ReduceKind::Max, vec![0]),
        ] {
            let direct = reduce::reduce::<bf16, f32>(&pool, kind, &x, &grid, &axes);
            let reference = through_f32(&pool, [&x[..]], widen_bf16, narrow_bf16, |[v]| {
                reduce::reduce(&pool, kind, v, &grid, &axes)
            });
            assert_eq!(bits(&direct), bits(&reference), "{kind:?} over {axes:?}");
        }
    }

    #[test]
    fn stored_16_bit_floats_round_trip_and_round_as_half_does() {
        for bits in (0..=u16::MAX).step_by(7) {
            let (b, h) = (bf16::from_bits(bits), f16::from_bits(bits));
            if !b.is_nan() {
                assert_eq!(<bf16 as Stored<f32>>::store(b.load()).to_bits(), bits);
            }
            if !h.is_nan() {
                assert_eq!(<f16 as Stored<f32>>::store(h.load()).to_bits(), bits);
            }
        }
        let v = 1.0f32 + 3.0 * f32::EPSILON;
        assert_eq!(<bf16 as Stored<f32>>::store(v), bf16::from_f32(v));
        assert_eq!(<f16 as Stored<f32>>::store(v), f16::from_f32(v));
    }
}
