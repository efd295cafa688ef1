//! The operands of the multi-tensor operations (`Backend::adam_steps`, `sgd_steps`,
//! `sum_of_squares`, `scaled_copies`, `non_finite_count`) and their default implementations, which loop over the
//! per-tensor operations so every backend is correct before it has a kernel of its own.

use super::{AdamStep, Backend, BinaryOp, BufferRef, ReduceKind, SgdStep, UnaryOp, shares_a_buffer};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::shape::{Layout, Shape};

/// One parameter of an [`Backend::adam_steps`] call: its buffers (one dtype, one length) and its
/// own update, so step counts and weight decay can differ between parameters.
#[derive(Clone, Copy, Debug)]
pub struct AdamOperands<'a> {
    /// The parameter, updated in place.
    pub param: &'a BufferRef,
    /// Its gradient, read only.
    pub grad: &'a BufferRef,
    /// The first moment estimate, updated in place.
    pub exp_avg: &'a BufferRef,
    /// The second moment estimate, updated in place.
    pub exp_avg_sq: &'a BufferRef,
    /// This parameter's update.
    pub step: AdamStep,
}

/// One parameter of an [`Backend::sgd_steps`] call, as `sgd_step` takes it.
#[derive(Clone, Copy, Debug)]
pub struct SgdOperands<'a> {
    /// The parameter, updated in place.
    pub param: &'a BufferRef,
    /// Its gradient, read only.
    pub grad: &'a BufferRef,
    /// The momentum buffer, updated in place; `None` without momentum.
    pub momentum_buf: Option<&'a BufferRef>,
    /// This parameter's update.
    pub step: SgdStep,
}

/// The dtype `sum_of_squares` answers in: f64 when any buffer is f64, else f32.
pub fn sum_of_squares_dtype(bufs: &[&BufferRef]) -> DType {
    if bufs.iter().any(|b| b.dtype() == DType::F64) {
        DType::F64
    } else {
        DType::F32
    }
}

/// Refuses `adam_steps` items that no backend can take: a buffer updated twice or also read as
/// a gradient, or a step count of 0.
pub fn check_adam_items(items: &[AdamOperands<'_>]) -> Result<()> {
    check_written_once(
        "adam_steps",
        items.iter().flat_map(|it| [it.param, it.exp_avg, it.exp_avg_sq]),
        items.iter().map(|it| it.grad),
    )?;
    if items.iter().any(|it| it.step.step == 0) {
        return Err(Error::invalid(
            "adam_steps",
            "step counts from 1 (bias correction divides by 1 - beta^step)",
        ));
    }
    Ok(())
}

/// Refuses `sgd_steps` items that update a buffer twice or also read it as a gradient.
pub fn check_sgd_items(items: &[SgdOperands<'_>]) -> Result<()> {
    check_written_once(
        "sgd_steps",
        items
            .iter()
            .flat_map(|it| std::iter::once(it.param).chain(it.momentum_buf)),
        items.iter().map(|it| it.grad),
    )
}

/// Refuses a parameter, moment or momentum buffer named twice among `items`' written buffers
/// (it would be updated twice), or also passed as a gradient (read while written).
fn check_written_once<'a>(
    op: &'static str,
    written: impl Iterator<Item = &'a BufferRef>,
    read: impl Iterator<Item = &'a BufferRef>,
) -> Result<()> {
    if shares_a_buffer(written, read) {
        return Err(Error::invalid(
            op,
            "a buffer is updated twice or is both updated and read as a gradient; pass each parameter and state \
             buffer once, distinct from the gradients",
        ));
    }
    Ok(())
}

/// `adam_steps` as one `adam_step` per item.
pub fn adam_steps_one_by_one(dev: &(impl Backend + ?Sized), items: &[AdamOperands<'_>]) -> Result<()> {
    items
        .iter()
        .try_for_each(|it| dev.adam_step(it.param, it.grad, it.exp_avg, it.exp_avg_sq, &it.step))
}

/// `sgd_steps` as one `sgd_step` per item.
pub fn sgd_steps_one_by_one(dev: &(impl Backend + ?Sized), items: &[SgdOperands<'_>]) -> Result<()> {
    items
        .iter()
        .try_for_each(|it| dev.sgd_step(it.param, it.grad, it.momentum_buf, &it.step))
}

/// `sum_of_squares` from per-tensor ops: each buffer widened to the answer's dtype, squared
/// and summed by `reduce`, the sums added in the order given.
pub fn sum_of_squares_composed(dev: &(impl Backend + ?Sized), bufs: &[&BufferRef]) -> Result<BufferRef> {
    let dtype = sum_of_squares_dtype(bufs);
    let mut total = dev.zeros(dtype, 1)?;
    let one = Layout::contiguous([1]);
    for b in bufs.iter().filter(|b| !b.is_empty()) {
        let whole = Layout::contiguous([b.len()]);
        let wide = if b.dtype() == dtype {
            (*b).clone()
        } else {
            dev.cast(b, &whole, dtype)?
        };
        let squares = dev.binary(BinaryOp::Mul, &wide, &whole, &wide, &whole)?;
        let sum = dev.reduce(ReduceKind::Sum, &squares, &whole, &[0])?;
        total = dev.binary(BinaryOp::Add, &total, &one, &sum, &one)?;
    }
    Ok(total)
}

/// `non_finite_count` from per-tensor ops: each buffer's `NonFinite` flags widened to f32 and
/// summed, the sums added in the order given.
pub fn non_finite_count_composed(dev: &(impl Backend + ?Sized), bufs: &[&BufferRef]) -> Result<BufferRef> {
    let mut total = dev.zeros(DType::F32, 1)?;
    let one = Layout::contiguous([1]);
    for b in bufs.iter().filter(|b| !b.is_empty()) {
        let whole = Layout::contiguous([b.len()]);
        let flags = dev.unary(UnaryOp::NonFinite, b, &whole)?;
        // Summed in f32: a 16-bit dtype would stop counting at 256 (bf16) or 2048 (f16).
        let flags = if flags.dtype() == DType::F32 {
            flags
        } else {
            dev.cast(&flags, &whole, DType::F32)?
        };
        let count = dev.reduce(ReduceKind::Sum, &flags, &whole, &[0])?;
        total = dev.binary(BinaryOp::Add, &total, &one, &count, &one)?;
    }
    Ok(total)
}

/// `scaled_copies` from per-tensor ops: the factor cast to each buffer's dtype, then `binary`'s
/// product with it broadcast.
pub fn scaled_copies_composed(
    dev: &(impl Backend + ?Sized),
    bufs: &[&BufferRef],
    factor: &BufferRef,
) -> Result<Vec<BufferRef>> {
    check_factor("scaled_copies", factor)?;
    let one = Layout::contiguous([1]);
    bufs.iter()
        .map(|b| {
            let whole = Layout::contiguous([b.len()]);
            let f = if factor.dtype() == b.dtype() {
                factor.clone()
            } else {
                dev.cast(factor, &one, b.dtype())?
            };
            let broadcast = Layout::contiguous([1]).broadcast_to("scaled_copies", &Shape::new([b.len()]))?;
            dev.binary(BinaryOp::Mul, b, &whole, &f, &broadcast)
        })
        .collect()
}

/// `cast_copies` as one `cast` per buffer.
pub fn cast_copies_one_by_one(
    dev: &(impl Backend + ?Sized),
    bufs: &[&BufferRef],
    dtype: DType,
) -> Result<Vec<BufferRef>> {
    bufs.iter()
        .map(|b| dev.cast(b, &Layout::contiguous([b.len()]), dtype))
        .collect()
}

/// The factor of `scaled_copies` is one float element.
pub fn check_factor(op: &'static str, factor: &BufferRef) -> Result<()> {
    if factor.len() != 1 || !factor.dtype().is_float() {
        return Err(Error::invalid(
            op,
            format!(
                "the factor must be one float element, got {} elements of {}",
                factor.len(),
                factor.dtype()
            ),
        ));
    }
    Ok(())
}
