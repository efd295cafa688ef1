//! Fused causal attention on the CPU (`attention`'s f32 kernels): f16 and bf16 widened to f32
//! on the way in and rounded once on the way out; f64 (the conformance reference) and a device
//! switched to the composed path decline, so the caller composes.

use std::borrow::Cow;

use super::float::{narrow_bf16, narrow_f16, widen_bf16, widen_f16};
use super::pool::Pool;
use super::{CpuBackend, attention, check_len, cpu};
use crate::backend::{BufferRef, CausalAttention};
use crate::dtype::{DType, HostVec};
use crate::error::{Error, Result};

/// `data` as f32 (borrowed for f32, widened for f16 and bf16); `None` for other dtypes.
fn as_f32<'a>(pool: &Pool, data: &'a HostVec) -> Option<Cow<'a, [f32]>> {
    match data {
        HostVec::F32(x) => Some(Cow::Borrowed(x)),
        HostVec::F16(x) => Some(Cow::Owned(widen_f16(pool, x))),
        HostVec::BF16(x) => Some(Cow::Owned(widen_bf16(pool, x))),
        _ => None,
    }
}

/// `values` rounded to `dtype` (one of those `as_f32` takes), then the f32s given back to the pool.
fn narrowed(pool: &Pool, values: Vec<f32>, dtype: DType) -> HostVec {
    let out = match dtype {
        DType::F16 => HostVec::F16(narrow_f16(pool, &values)),
        DType::BF16 => HostVec::BF16(narrow_bf16(pool, &values)),
        _ => return HostVec::F32(values),
    };
    pool.recycle(HostVec::F32(values));
    out
}

/// Gives a widened copy's memory back to the pool.
fn release(pool: &Pool, values: Cow<'_, [f32]>) {
    if let Cow::Owned(v) = values {
        pool.recycle(HostVec::F32(v));
    }
}

pub(super) fn causal_attention(
    dev: &CpuBackend,
    qkv: &BufferRef,
    spec: &CausalAttention,
) -> Option<Result<(BufferRef, BufferRef)>> {
    const OP: &str = "causal_attention";
    if !dev.attention.on() {
        return None;
    }
    let checked = || {
        let x = cpu(OP, qkv)?.read();
        check_len(OP, &x, spec.qkv_len())?;
        let pool = &dev.pool;
        let Some(wide) = as_f32(pool, &x) else {
            return Ok(None);
        };
        let (y, lse) = attention::forward(pool, &wide, spec);
        release(pool, wide);
        let y = dev.wrap(OP, narrowed(pool, y, x.dtype()))?;
        Ok(Some((y, dev.wrap(OP, HostVec::F32(lse))?)))
    };
    checked().transpose()
}

pub(super) fn causal_attention_backward(
    dev: &CpuBackend,
    [qkv, y, lse, dy]: [&BufferRef; 4],
    spec: &CausalAttention,
) -> Option<Result<BufferRef>> {
    const OP: &str = "causal_attention_backward";
    let checked = || {
        let (x, y, lse, dy) = (
            cpu(OP, qkv)?.read(),
            cpu(OP, y)?.read(),
            cpu(OP, lse)?.read(),
            cpu(OP, dy)?.read(),
        );
        check_len(OP, &x, spec.qkv_len())?;
        check_len(OP, &y, spec.out_len())?;
        check_len(OP, &dy, spec.out_len())?;
        check_len(OP, &lse, spec.rows())?;
        let HostVec::F32(lse) = &*lse else {
            return Err(Error::invalid(OP, format!("expects f32 lse, got {:?}", lse.dtype())));
        };
        if y.dtype() != x.dtype() || dy.dtype() != x.dtype() {
            return Err(Error::invalid(
                OP,
                "expects qkv, y and dy of one dtype; cast them to qkv's",
            ));
        }
        let pool = &dev.pool;
        let (Some(wx), Some(wy), Some(wdy)) = (as_f32(pool, &x), as_f32(pool, &y), as_f32(pool, &dy)) else {
            return Ok(None);
        };
        let dqkv = attention::backward(pool, [&wx, &wy, lse, &wdy], spec);
        [wx, wy, wdy].into_iter().for_each(|w| release(pool, w));
        Ok(Some(dev.wrap(OP, narrowed(pool, dqkv, x.dtype()))?))
    };
    checked().transpose()
}
