//! Autocast's mixed-dtype fusions, composed: a LayerNorm whose output feeds a low-precision
//! matrix product (and whose gradient comes back in that precision), and a binary op on an f32
//! operand and a 16-bit one (the f32 residual stream plus a bf16 branch). The trait's defaults are
//! these compositions, a cast and the op; a backend with fused kernels overrides them and must
//! give the same bits (`conformance::mixed_dtype_mismatches` checks it on every device).

use super::{Backend, BinaryOp, BufferRef, LayerNormAffine, LayerNormGrads, LayerNormSpec};
use crate::dtype::DType;
use crate::error::Result;
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

/// `binary` after widening the f16/bf16 operand of an f32 and 16-bit pair (`f32_and_half`);
/// any other pair goes to `binary` as it is (one dtype, or the mismatch `binary` reports).
pub fn binary_mixed(
    dev: &(impl Backend + ?Sized),
    op: BinaryOp,
    lhs: &BufferRef,
    lhs_layout: &Layout,
    rhs: &BufferRef,
    rhs_layout: &Layout,
) -> Result<BufferRef> {
    let Some((narrow_first, [wide, (narrow, nl)])) = f32_and_half((lhs, lhs_layout), (rhs, rhs_layout)) else {
        return dev.binary(op, lhs, lhs_layout, rhs, rhs_layout);
    };
    let (widened, wl) = (dev.cast(narrow, nl, DType::F32)?, Layout::contiguous(nl.shape.clone()));
    let ((a, la), (b, lb)) = if narrow_first {
        ((&widened, &wl), wide)
    } else {
        (wide, (&widened, &wl))
    };
    dev.binary(op, a, la, b, lb)
}

/// An operand of a binary op: its buffer and its (broadcast) layout.
pub type Operand<'a> = (&'a BufferRef, &'a Layout);

/// The 16-bit dtype of a pair of one f32 and one f16/bf16 dtype (either order); None for any
/// other pair. The pairs `binary_mixed` fuses, and autocast sends it.
pub fn half_beside_f32(a: DType, b: DType) -> Option<DType> {
    match (a, b) {
        (DType::F32, h @ (DType::F16 | DType::BF16)) | (h @ (DType::F16 | DType::BF16), DType::F32) => Some(h),
        _ => None,
    }
}

/// For a fused `binary_mixed` kernel: the f32 operand, then the f16/bf16 one, and whether the
/// 16-bit one is `lhs`; None for any other pair of dtypes (which the backend composes).
pub fn f32_and_half<'a>(lhs: Operand<'a>, rhs: Operand<'a>) -> Option<(bool, [Operand<'a>; 2])> {
    half_beside_f32(lhs.0.dtype(), rhs.0.dtype())?;
    Some(if lhs.0.dtype() == DType::F32 {
        (false, [lhs, rhs])
    } else {
        (true, [rhs, lhs])
    })
}

fn rows(spec: &LayerNormSpec) -> Layout {
    Layout::contiguous([spec.rows, spec.cols])
}
