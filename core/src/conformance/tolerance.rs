//! How close a device's result must be to the f64 reference, per dtype.
//!
//! A value passes when `|device - reference| <= scale * (atol + rtol * |reference|)`. The inputs
//! are O(1), so `atol` is in the units of the values and absorbs cancellation (e.g. `1 - y` in a
//! sigmoid gradient), while `rtol` covers large results (exp, long sums). Both sit a few units in
//! the last place above what one rounding of the result costs, since backward passes chain several
//! rounded operations: f32 2^-23 ≈ 1.2e-7 (allow ~100 ulp: kernels may use fast math and other
//! summation orders), f16 2^-10 ≈ 9.8e-4 (allow ~8 ulp), bf16 2^-7 ≈ 7.8e-3 (allow ~6 ulp).
//! f64 must agree to near round-off. Integer results (indices, masks, casts) must match exactly.

use crate::dtype::DType;

/// How close a result must be to the reference: `|value - reference| <= atol + rtol * |reference|`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Tolerance {
    /// Absolute allowance, in the units of the values.
    pub atol: f64,
    /// Allowance relative to `|reference|`.
    pub rtol: f64,
}

impl Tolerance {
    /// Zero allowance: integer results (indices, masks, casts) must match exactly.
    pub const EXACT: Tolerance = Tolerance { atol: 0.0, rtol: 0.0 };

    /// The tolerance for results held in `dtype`.
    pub fn for_dtype(dtype: DType) -> Tolerance {
        match dtype {
            DType::F64 => Tolerance {
                atol: 1e-10,
                rtol: 1e-10,
            },
            DType::F32 => Tolerance { atol: 1e-5, rtol: 1e-5 },
            DType::F16 => Tolerance { atol: 8e-3, rtol: 8e-3 },
            DType::BF16 => Tolerance { atol: 5e-2, rtol: 5e-2 },
            DType::I64 | DType::U32 => Tolerance::EXACT,
        }
    }

    /// Both `atol` and `rtol` multiplied by `scale` (a case's `tol_scale`).
    pub fn scaled(self, scale: f64) -> Tolerance {
        Tolerance {
            atol: self.atol * scale,
            rtol: self.rtol * scale,
        }
    }

    /// The largest admissible |error| around `reference`.
    pub fn bound(&self, reference: f64) -> f64 {
        self.atol + self.rtol * reference.abs()
    }

    /// Whether `value` is close enough to `reference`. NaN matches NaN and infinities must match
    /// exactly (an op that overflows on one device must overflow on the other).
    pub fn accepts(&self, value: f64, reference: f64) -> bool {
        if reference.is_nan() || value.is_nan() {
            return reference.is_nan() && value.is_nan();
        }
        if reference.is_infinite() || value.is_infinite() {
            return reference == value;
        }
        (value - reference).abs() <= self.bound(reference)
    }
}
