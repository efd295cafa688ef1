//! The operands of `Backend::layer_norm_last` and its gradient: the shape, the optional affine
//! weight and bias, and the gradients the backward pass returns.

use super::BufferRef;
use crate::dtype::DType;
use crate::error::{Error, Result};

/// Layer normalisation of a contiguous `[rows, cols]` over each row, for
/// `Backend::layer_norm_last` and `Backend::layer_norm_last_backward`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LayerNormSpec {
    /// Rows normalised separately.
    pub rows: usize,
    /// The length of each row: the normalised axis.
    pub cols: usize,
    /// Added to the (biased) variance before its square root.
    pub eps: f64,
}

/// The affine part of a layer normalisation, each part optional: `[cols]` buffers in the input's
/// dtype, `y = n * weight + bias` for the normalised `n`.
#[derive(Clone, Copy, Debug, Default)]
pub struct LayerNormAffine<'a> {
    /// Scales each column of the normalised rows.
    pub weight: Option<&'a BufferRef>,
    /// Added to each column after the scale.
    pub bias: Option<&'a BufferRef>,
}

/// What `Backend::layer_norm_last_backward` returns, each in the input's dtype.
#[derive(Debug)]
pub struct LayerNormGrads {
    /// The input's gradient, `[rows, cols]`.
    pub input: BufferRef,
    /// The weight's gradient `[cols]`, `sum over rows of g * n`, when a weight was given.
    pub weight: Option<BufferRef>,
    /// The bias's gradient `[cols]`, `sum over rows of g`, when a bias was given.
    pub bias: Option<BufferRef>,
    /// `input` rounded to `InputGradient::rounded`, when asked for.
    pub rounded_input: Option<BufferRef>,
}

/// What a LayerNorm's backward folds into its input's gradient besides its own share
/// (`Backend::layer_norm_last_to_backward`). On a residual stream the input is also the next
/// residual add's operand, whose gradient reaches it first: one pass adds the two, and rounds the
/// sum for the 16-bit branch that the residual add producing the input widened.
#[derive(Clone, Copy, Debug, Default)]
pub struct InputGradient<'a> {
    /// The gradient the input's other uses delivered, `[rows, cols]` in the input's dtype: the
    /// input's gradient is then `accumulated + dx`, the bits of that add after the backward.
    pub accumulated: Option<&'a BufferRef>,
    /// Also return the input's gradient cast to this dtype (`LayerNormGrads::rounded_input`).
    pub rounded: Option<DType>,
}

impl LayerNormGrads {
    /// The gradients of an input with no rows or no columns: `input` (empty) and, for each part
    /// `affine` gives, a `[cols]` buffer of zeros from `zeros` (nothing was summed into it).
    pub fn of_empty(
        input: BufferRef,
        affine: &LayerNormAffine<'_>,
        zeros: impl Fn() -> Result<BufferRef>,
    ) -> Result<LayerNormGrads> {
        Ok(LayerNormGrads {
            input,
            weight: affine.weight.map(|_| zeros()).transpose()?,
            bias: affine.bias.map(|_| zeros()).transpose()?,
            rounded_input: None,
        })
    }
}

impl LayerNormAffine<'_> {
    /// Whether either part is given (the backward pass then sums its gradients over rows).
    pub fn any(&self) -> bool {
        self.weight.is_some() || self.bias.is_some()
    }

    /// Checks that each given part is `[spec.cols]` in `src`'s dtype, for backend `op`.
    pub fn check(&self, op: &'static str, src: &BufferRef, spec: &LayerNormSpec) -> Result<()> {
        for (what, part) in [("weight", self.weight), ("bias", self.bias)] {
            let Some(part) = part else { continue };
            if part.len() != spec.cols || part.dtype() != src.dtype() {
                return Err(Error::invalid(
                    op,
                    format!(
                        "the {what} is {} {} elements; it must be {} {} (one per column, in the input's dtype)",
                        part.dtype(),
                        part.len(),
                        src.dtype(),
                        spec.cols
                    ),
                ));
            }
        }
        Ok(())
    }

    /// `check`, and that the backward pass's `grad` has `src`'s dtype.
    pub fn check_backward(
        &self,
        op: &'static str,
        grad: &BufferRef,
        src: &BufferRef,
        spec: &LayerNormSpec,
    ) -> Result<()> {
        self.check(op, src, spec)?;
        if grad.dtype() != src.dtype() {
            return Err(Error::DTypeMismatch {
                op,
                lhs: grad.dtype(),
                rhs: src.dtype(),
            });
        }
        Ok(())
    }
}
