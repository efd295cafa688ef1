//! Autocast's mixed-dtype fusions, composed: a LayerNorm whose output feeds a low-precision
//! matrix product (and whose gradient comes back in that precision), and a binary op on an f32
//! operand and a 16-bit one (the f32 residual stream plus a bf16 branch). The trait's defaults are
//! these compositions, a cast and the op; a backend with fused kernels overrides them and must
//! give the same bits (`conformance::mixed_dtype_mismatches` checks it on every device).

use super::{Backend, BinaryOp, BufferRef, LayerNormAffine, LayerNormGrads, LayerNormSpec};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::shape::Layout;

/// `layer_norm_last`, then its output cast to `out`.
pub fn layer_norm_last_to(
    dev: &(impl Backend + ?Sized),
    src: &BufferRef,
    affine: LayerNormAffine<'_>,
    spec: &LayerNormSpec,
    out: DType,
) -> Result<BufferRef> {
    let y = dev.layer_norm_last(src, affine, spec)?;
    if out == src.dtype() {
        return Ok(y);
    }
    dev.cast(&y, &rows(spec), out)
}

/// `layer_norm_last_backward` after widening `grad` to `src`'s dtype.
pub fn layer_norm_last_to_backward(
    dev: &(impl Backend + ?Sized),
    grad: &BufferRef,
    src: &BufferRef,
    affine: LayerNormAffine<'_>,
    spec: &LayerNormSpec,
) -> Result<LayerNormGrads> {
    if grad.dtype() == src.dtype() {
        return dev.layer_norm_last_backward(grad, src, affine, spec);
    }
    let wide = dev.cast(grad, &rows(spec), src.dtype())?;
    dev.layer_norm_last_backward(&wide, src, affine, spec)
}

/// `binary` after casting the narrower operand to the wider's dtype (`wider_float`).
pub fn binary_mixed(
    dev: &(impl Backend + ?Sized),
    op: BinaryOp,
    lhs: &BufferRef,
    lhs_layout: &Layout,
    rhs: &BufferRef,
    rhs_layout: &Layout,
) -> Result<BufferRef> {
    let wide = wider_float(op.name(), lhs.dtype(), rhs.dtype())?;
    let widen = |b: &BufferRef, l: &Layout| -> Result<(BufferRef, Layout)> {
        if b.dtype() == wide {
            return Ok((b.clone(), l.clone()));
        }
        Ok((dev.cast(b, l, wide)?, Layout::contiguous(l.shape.clone())))
    };
    let ((a, la), (b, lb)) = (widen(lhs, lhs_layout)?, widen(rhs, rhs_layout)?);
    dev.binary(op, &a, &la, &b, &lb)
}

/// An operand of a binary op: its buffer and its (broadcast) layout.
pub type Operand<'a> = (&'a BufferRef, &'a Layout);

/// For a fused `binary_mixed` kernel: the f32 operand, then the f16/bf16 one, and whether the
/// 16-bit one is `lhs`; None for any other pair of dtypes (which the backend composes).
pub fn f32_and_half<'a>(lhs: Operand<'a>, rhs: Operand<'a>) -> Option<(bool, [Operand<'a>; 2])> {
    let half = |d: DType| matches!(d, DType::F16 | DType::BF16);
    match (lhs.0.dtype(), rhs.0.dtype()) {
        (DType::F32, d) if half(d) => Some((false, [lhs, rhs])),
        (d, DType::F32) if half(d) => Some((true, [rhs, lhs])),
        _ => None,
    }
}

/// The wider of two float dtypes (f64, then f32, then the 16-bit ones); an error for two
/// different 16-bit dtypes, which have no wider one between them, or a dtype that is not a float.
pub fn wider_float(op: &'static str, a: DType, b: DType) -> Result<DType> {
    let rank = |d: DType| match d {
        DType::F64 => Some(3),
        DType::F32 => Some(2),
        DType::F16 | DType::BF16 => Some(1),
        _ => None,
    };
    match (rank(a), rank(b)) {
        (Some(ra), Some(rb)) if a == b || ra != rb => Ok(if ra >= rb { a } else { b }),
        _ => Err(Error::DTypeMismatch { op, lhs: a, rhs: b }),
    }
}

fn rows(spec: &LayerNormSpec) -> Layout {
    Layout::contiguous([spec.rows, spec.cols])
}
