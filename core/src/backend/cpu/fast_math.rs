//! GELU, its gradient and the softmax's exponential in f32 without calls or branches, so their
//! loops vectorize: `libm`'s
//! `erff` and `expf` are scalar calls, and GELU over a transformer's MLP activations (four times
//! its width per token, each way) was a tenth of a training step. `1 + erf` comes from erfc's
//! Chebyshev fit (relative error 1.2e-7, so the negative tail keeps its digits where `1 + erff`
//! cancels), `exp` from a range reduction by ln 2 and a degree-7 polynomial.

const LOG2_E: f32 = std::f32::consts::LOG2_E;
// ln 2 in two parts: `n * LN2_HI` is exact for the |n| <= 126 used here.
const LN2_HI: f32 = 0.693_145_75;
const LN2_LO: f32 = 1.428_606_8e-6;

/// `e^x` for `x <= 0` (GELU's Gaussian factors); 0 below -87, where it would be subnormal.
/// NaN stays NaN.
#[inline(always)]
pub fn exp_nonpositive(x: f32) -> f32 {
    let underflows = x < -87.0;
    // Selects, not `max`, which would turn a NaN into the bound.
    let x = if underflows { -87.0 } else { x };
    // Rounds to the nearest integer by the float's own rounding: |x * log2 e| < 2^22.
    const ROUND: f32 = 12_582_912.0; // 1.5 * 2^23
    let shifted = x * LOG2_E + ROUND;
    let n = shifted - ROUND;
    let r = x - n * LN2_HI - n * LN2_LO;
    let p = 1.0
        + r * (1.0
            + r * (0.5
                + r * (1.0 / 6.0 + r * (1.0 / 24.0 + r * (1.0 / 120.0 + r * (1.0 / 720.0 + r * (1.0 / 5040.0)))))));
    // 2^n from its exponent bits (n in [-126, 0]): n is in `shifted`'s low bits, and integer
    // arithmetic on them vectorizes where a float-to-int cast does not.
    let biased = shifted.to_bits().wrapping_sub(ROUND.to_bits()).wrapping_add(127);
    let value = p * f32::from_bits(biased << 23);
    if underflows { 0.0 } else { value }
}

/// `1 + erf(u)` to a few roundings relative to itself, also where it is tiny (GELU's negative
/// tail, where `1 + erf` cancels): erfc of `|u|` by the Chebyshev fit of Numerical Recipes'
/// `erfcc` (relative error below 1.2e-7).
#[inline(always)]
fn one_plus_erf(u: f32) -> f32 {
    let z = u.abs();
    let t = 1.0 / (1.0 + 0.5 * z);
    let poly = -1.265_512_2
        + t * (1.000_023_7
            + t * (0.374_091_96
                + t * (0.096_784_18
                    + t * (-0.186_288_06
                        + t * (0.278_868_07
                            + t * (-1.135_204 + t * (1.488_515_9 + t * (-0.822_152_2 + t * 0.170_872_77))))))));
    let erfc = t * exp_nonpositive(poly - z * z);
    if u < 0.0 { erfc } else { 2.0 - erfc }
}

/// `x * Φ(x)` with `Φ` the standard normal's distribution function (PyTorch's exact GELU).
#[inline(always)]
pub fn gelu(x: f32) -> f32 {
    x * 0.5 * one_plus_erf(x * std::f32::consts::FRAC_1_SQRT_2)
}

/// The derivative of `gelu`: `Φ(x) + x * φ(x)`.
#[inline(always)]
pub fn gelu_grad(x: f32) -> f32 {
    const INV_SQRT_2PI: f32 = 0.398_942_3;
    0.5 * one_plus_erf(x * std::f32::consts::FRAC_1_SQRT_2) + x * INV_SQRT_2PI * exp_nonpositive(-0.5 * x * x)
}

#[cfg(test)]
mod tests {
    use super::*;

    // 1 + erf(u) as erfc(-u): no cancellation in the negative tail.
    fn exact_gelu(x: f64) -> f64 {
        x * 0.5 * libm::erfc(-x / std::f64::consts::SQRT_2)
    }
    fn exact_gelu_grad(x: f64) -> f64 {
        0.5 * libm::erfc(-x / std::f64::consts::SQRT_2) + x * (-0.5 * x * x).exp() / (2.0 * std::f64::consts::PI).sqrt()
    }

    #[test]
    fn gelu_and_its_gradient_are_within_a_few_f32_roundings_of_exact() {
        let mut worst = [0.0f64; 2];
        for i in -200_000..=200_000 {
            let x = i as f32 * 1e-4; // [-20, 20], past where both saturate
            for (k, (what, ours, exact)) in [
                ("gelu", gelu(x), exact_gelu(x as f64)),
                ("gelu_grad", gelu_grad(x), exact_gelu_grad(x as f64)),
            ]
            .into_iter()
            .enumerate()
            {
                // Relative to the value, and to 1 where the gradient crosses 0 (near x = -0.75).
                let scale = if k == 0 { exact.abs() } else { exact.abs().max(1.0) };
                let err = (ours as f64 - exact).abs() / scale.max(f64::MIN_POSITIVE);
                // Far in the tail (x < -11) the values are below 1e-30 and only need to be tiny.
                let tiny = exact.abs() < 1e-30 && (ours as f64).abs() < 1e-30;
                // The exponent -x²/2 carries f32's rounding of x², relative to x².
                let bound = 1e-6 + 2e-7 * (x * x) as f64;
                assert!(err <= bound || tiny, "{what}({x}) = {ours}, exactly {exact}: {err:.2e}");
                if !tiny {
                    worst[k] = worst[k].max(err);
                }
            }
        }
        println!(
            "worst relative error: gelu {:.2e}, gelu_grad {:.2e}",
            worst[0], worst[1]
        );
    }

    #[test]
    fn exp_is_within_3_ulp_where_gelu_uses_it() {
        for i in 0..=870_000 {
            let x = -(i as f32) * 1e-4;
            let (ours, exact) = (exp_nonpositive(x) as f64, (x as f64).exp());
            assert!(
                (ours - exact).abs() <= 3.0 * f32::EPSILON as f64 * exact,
                "exp({x}) = {ours}, exactly {exact}"
            );
        }
    }

    #[test]
    fn huge_and_non_finite_inputs_give_what_the_exact_formulas_give() {
        for x in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY, 1e30, -1e30, 30.0, -30.0] {
            for (what, ours, exact) in [
                ("gelu", gelu(x), exact_gelu(x as f64)),
                ("gelu_grad", gelu_grad(x), exact_gelu_grad(x as f64)),
            ] {
                let same = (ours.is_nan() && exact.is_nan()) || ours as f64 == exact as f32 as f64;
                assert!(same, "{what}({x}) = {ours}, exactly {exact}");
            }
        }
    }
}
