//! Autocast's mixed-dtype fusions, composed: a LayerNorm whose output feeds a low-precision
//! matrix product (and whose gradient comes back in that precision), and a binary op on an f32
//! operand and a 16-bit one (the f32 residual stream plus a bf16 branch). The trait's defaults are
//! these compositions, a cast and the op; a backend with fused kernels overrides them and must
//! give the same bits (`conformance::mixed_dtype_mismatches` checks it on every device).

use super::{Backend, BinaryOp, BufferRef, InputGradient, LayerNormAffine, LayerNormGrads, LayerNormSpec};
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

/// `layer_norm_last_backward` after widening `grad` to `src`'s dtype, then `input`'s add and
/// cast.
pub fn layer_norm_last_to_backward(
    dev: &(impl Backend + ?Sized),
    grad: &BufferRef,
    src: &BufferRef,
    affine: LayerNormAffine<'_>,
    spec: &LayerNormSpec,
    input: InputGradient<'_>,
) -> Result<LayerNormGrads> {
    let mut grads = if grad.dtype() == src.dtype() {
        dev.layer_norm_last_backward(grad, src, affine, spec)?
    } else {
        let wide = dev.cast(grad, &rows(spec), src.dtype())?;
        dev.layer_norm_last_backward(&wide, src, affine, spec)?
    };
    fold_input_gradient(dev, &mut grads, spec, input)?;
    Ok(grads)
}

/// What `input` asks of a LayerNorm input's gradient that a backend's kernel did not do: the
/// accumulated gradient added first (`accumulated + dx`, the autograd walk's order), then the
/// sum cast.
pub fn fold_input_gradient(
    dev: &(impl Backend + ?Sized),
    grads: &mut LayerNormGrads,
    spec: &LayerNormSpec,
    input: InputGradient<'_>,
) -> Result<()> {
    let layout = rows(spec);
    if let Some(accumulated) = input.accumulated {
        grads.input = dev.binary(BinaryOp::Add, accumulated, &layout, &grads.input, &layout)?;
    }
    if let Some(dtype) = input.rounded {
        grads.rounded_input = Some(dev.cast(&grads.input, &layout, dtype)?);
    }
    Ok(())
}

/// `binary_mixed` Add of the residual and the branch, then `layer_norm_last_to` of the sum.
pub fn add_layer_norm_last_to(
    dev: &(impl Backend + ?Sized),
    residual: &BufferRef,
    branch: &BufferRef,
    affine: LayerNormAffine<'_>,
    spec: &LayerNormSpec,
    out: DType,
) -> Result<[BufferRef; 2]> {
    let layout = rows(spec);
    let sum = dev.binary_mixed(BinaryOp::Add, residual, &layout, branch, &layout)?;
    let normed = dev.layer_norm_last_to(&sum, affine, spec, out)?;
    Ok([sum, normed])
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
