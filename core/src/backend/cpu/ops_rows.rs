//! The CPU backend's operations along a tensor's last axis (softmax, layer norm) and dropout.

use super::float::ViaF32;
use super::pool::Pool;
use super::{CpuBackend, check_len, cpu, dropout, layer_norm, softmax};
use crate::backend::{BufferRef, LayerNormAffine, LayerNormGrads, LayerNormSpec};
use crate::dtype::HostVec;
use crate::error::{Error, Result};
use crate::{float_binary_dispatch, float_unary_dispatch};

pub(super) fn softmax_last(dev: &CpuBackend, src: &BufferRef, rows: usize, cols: usize) -> Result<BufferRef> {
    let data = cpu("softmax", src)?.read();
    check_len("softmax", &data, rows * cols)?;
    dev.wrap(
        "softmax_last",
        float_unary_dispatch!(&dev.pool, "softmax", &*data, |v| {
            softmax::softmax(&dev.pool, v, cols)
        }),
    )
}

pub(super) fn log_softmax_last(dev: &CpuBackend, src: &BufferRef, rows: usize, cols: usize) -> Result<BufferRef> {
    let data = cpu("log_softmax", src)?.read();
    check_len("log_softmax", &data, rows * cols)?;
    dev.wrap(
        "log_softmax_last",
        float_unary_dispatch!(&dev.pool, "log_softmax", &*data, |v| {
            softmax::log_softmax(&dev.pool, v, cols)
        }),
    )
}

pub(super) fn softmax_last_backward(
    dev: &CpuBackend,
    grad: &BufferRef,
    out: &BufferRef,
    rows: usize,
    cols: usize,
) -> Result<BufferRef> {
    const OP: &str = "softmax_backward";
    let (g, y) = (cpu(OP, grad)?.read(), cpu(OP, out)?.read());
    check_len(OP, &g, rows * cols)?;
    check_len(OP, &y, rows * cols)?;
    dev.wrap(
        "softmax_last_backward",
        float_binary_dispatch!(&dev.pool, OP, &*g, &*y, |g, y| {
            softmax::softmax_backward(&dev.pool, g, y, cols)
        }),
    )
}

/// The affine part's values in f64, for the kernels.
fn widened(op: &'static str, part: Option<&BufferRef>) -> Result<Option<Vec<f64>>> {
    part.map(|p| Ok(cpu(op, p)?.read().to_f64_vec())).transpose()
}

pub(super) fn layer_norm_last(
    dev: &CpuBackend,
    src: &BufferRef,
    affine: LayerNormAffine<'_>,
    spec: &LayerNormSpec,
) -> Result<BufferRef> {
    const OP: &str = "layer_norm";
    affine.check(OP, src, spec)?;
    let (weight, bias) = (widened(OP, affine.weight)?, widened(OP, affine.bias)?);
    let parts = layer_norm::Affine {
        weight: weight.as_deref(),
        bias: bias.as_deref(),
    };
    let data = cpu(OP, src)?.read();
    check_len(OP, &data, spec.rows * spec.cols)?;
    dev.wrap(
        "layer_norm_last",
        float_unary_dispatch!(&dev.pool, OP, &*data, |v| {
            layer_norm::forward(&dev.pool, v, parts, spec.cols, spec.eps)
        }),
    )
}

pub(super) fn layer_norm_last_backward(
    dev: &CpuBackend,
    grad: &BufferRef,
    src: &BufferRef,
    affine: LayerNormAffine<'_>,
    spec: &LayerNormSpec,
) -> Result<LayerNormGrads> {
    const OP: &str = "layer_norm_backward";
    affine.check_backward(OP, grad, src, spec)?;
    let weight = widened(OP, affine.weight)?;
    let (g, x) = (cpu(OP, grad)?.read(), cpu(OP, src)?.read());
    check_len(OP, &g, spec.rows * spec.cols)?;
    check_len(OP, &x, spec.rows * spec.cols)?;
    let mut sums = None;
    let dx = float_binary_dispatch!(&dev.pool, OP, &*g, &*x, |g, x| {
        let (dx, column_sums) =
            layer_norm::backward(&dev.pool, g, x, weight.as_deref(), affine.any(), spec.cols, spec.eps);
        sums = column_sums;
        dx
    });
    let dtype = dx.dtype();
    let mut grads = LayerNormGrads {
        input: dev.wrap("layer_norm_last_backward", dx)?,
        weight: None,
        bias: None,
        rounded_input: None,
    };
    if let Some(sums) = sums {
        let wrap = |values: &[f64]| dev.wrap("layer_norm_last_backward", HostVec::from_f64(dtype, values));
        grads.weight = affine.weight.map(|_| wrap(&sums.weight)).transpose()?;
        grads.bias = affine.bias.map(|_| wrap(&sums.bias)).transpose()?;
    }
    Ok(grads)
}

pub(super) fn dropout(
    dev: &CpuBackend,
    src: &BufferRef,
    len: usize,
    p: f64,
    seed: u64,
    counter: u64,
) -> Result<BufferRef> {
    let data = cpu("dropout", src)?.read();
    check_len("dropout", &data, len)?;
    let pool = &dev.pool;
    let keep = 1.0 / (1.0 - p);
    // 16-bit floats scaled in f32 and rounded once, as the f32 kernel then a cast would.
    fn via_f32<T: ViaF32>(pool: &Pool, v: &[T], p: f64, seed: u64, counter: u64, keep: f32) -> Vec<T> {
        dropout::dropout(pool, v, p, seed, counter, move |x, kept| {
            T::from_f32(x.to_f32() * if kept { keep } else { 0.0 })
        })
    }
    dev.wrap(
        "dropout",
        match &*data {
            HostVec::F64(v) => HostVec::F64(dropout::dropout(pool, v, p, seed, counter, move |x, kept| {
                x * if kept { keep } else { 0.0 }
            })),
            HostVec::F32(v) => HostVec::F32(via_f32(pool, v, p, seed, counter, keep as f32)),
            HostVec::BF16(v) => HostVec::BF16(via_f32(pool, v, p, seed, counter, keep as f32)),
            HostVec::F16(v) => HostVec::F16(via_f32(pool, v, p, seed, counter, keep as f32)),
            other => return Err(Error::dtype("dropout", other.dtype())),
        },
    )
}
