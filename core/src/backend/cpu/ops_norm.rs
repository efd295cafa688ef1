//! The fused normalizations and losses (batch norm, causal softmax, cross entropy) of the CPU
//! backend, in the element types they run in; f64 keeps the composed ops.

use super::float::ViaF32;
use super::{CpuBackend, batch_norm, causal_softmax, check_len, cpu, cross_entropy, index, u32_ids};
use crate::backend::{BatchNormSpec, BufferRef, CausalSoftmax, CrossEntropy, RunningStatsSpec};
use crate::dtype::{Element, HostVec};
use crate::error::{Error, Result};

pub(super) fn batch_norm(
    dev: &CpuBackend,
    x: &BufferRef,
    weight: &BufferRef,
    bias: &BufferRef,
    spec: &BatchNormSpec,
) -> Option<Result<[BufferRef; 3]>> {
    const OP: &str = "batch_norm";
    let checked = || {
        let (x, w, b) = (cpu(OP, x)?.read(), cpu(OP, weight)?.read(), cpu(OP, bias)?.read());
        check_len(OP, &x, spec.outer * spec.channels * spec.inner)?;
        check_len(OP, &w, spec.channels)?;
        check_len(OP, &b, spec.channels)?;
        let (HostVec::F32(w), HostVec::F32(b)) = (&*w, &*b) else {
            return Ok(None);
        };
        let (y, stats) = match &*x {
            HostVec::F32(x) => in_host_vec(batch_norm::forward(&dev.pool, x, w, b, spec)),
            HostVec::BF16(x) => in_host_vec(batch_norm::forward(&dev.pool, x, w, b, spec)),
            HostVec::F16(x) => in_host_vec(batch_norm::forward(&dev.pool, x, w, b, spec)),
            // f64 (the conformance reference) keeps the composed ops.
            _ => return Ok(None),
        };
        let [mean, var] = stats.map(|v| dev.wrap("batch_norm", HostVec::F32(v)));
        Ok(Some([dev.wrap("batch_norm", y)?, mean?, var?]))
    };
    checked().transpose()
}

pub(super) fn batch_norm_backward(
    dev: &CpuBackend,
    grad: &BufferRef,
    x: &BufferRef,
    weight: &BufferRef,
    [mean, var]: [&BufferRef; 2],
    spec: &BatchNormSpec,
) -> Option<Result<[BufferRef; 3]>> {
    const OP: &str = "batch_norm_backward";
    let checked = || {
        let (g, x, w) = (cpu(OP, grad)?.read(), cpu(OP, x)?.read(), cpu(OP, weight)?.read());
        let (m, v) = (cpu(OP, mean)?.read(), cpu(OP, var)?.read());
        check_len(OP, &g, spec.outer * spec.channels * spec.inner)?;
        check_len(OP, &x, spec.outer * spec.channels * spec.inner)?;
        for per_channel in [&w, &m, &v] {
            check_len(OP, per_channel, spec.channels)?;
        }
        let (HostVec::F32(w), HostVec::F32(m), HostVec::F32(v)) = (&*w, &*m, &*v) else {
            return Ok(None);
        };
        let (dx, grads) = match (&*g, &*x) {
            (HostVec::F32(g), HostVec::F32(x)) => in_host_vec(batch_norm::backward(&dev.pool, g, x, w, [m, v], spec)),
            (HostVec::BF16(g), HostVec::BF16(x)) => in_host_vec(batch_norm::backward(&dev.pool, g, x, w, [m, v], spec)),
            (HostVec::F16(g), HostVec::F16(x)) => in_host_vec(batch_norm::backward(&dev.pool, g, x, w, [m, v], spec)),
            _ => return Ok(None),
        };
        let [dweight, dbias] = grads.map(|v| dev.wrap("batch_norm_backward", HostVec::F32(v)));
        Ok(Some([dev.wrap("batch_norm_backward", dx)?, dweight?, dbias?]))
    };
    checked().transpose()
}

/// `Backend::batch_norm_running` on f32 statistics and an I64 count; `None` for other dtypes
/// (the f64 conformance reference composes it).
pub(super) fn batch_norm_running(
    running: [&BufferRef; 2],
    [mean, var]: [&BufferRef; 2],
    batches: Option<&BufferRef>,
    spec: &RunningStatsSpec,
) -> Option<Result<()>> {
    const OP: &str = "batch_norm_running";
    let checked = || {
        let Some([keep, take, unbias]) = spec.fused_factors(OP, running, [mean, var], batches)? else {
            return Ok(None);
        };
        let (m, v) = (cpu(OP, mean)?.read(), cpu(OP, var)?.read());
        let (mut rm, mut rv) = (cpu(OP, running[0])?.write(), cpu(OP, running[1])?.write());
        let mut count = batches.map(|b| cpu(OP, b).map(|b| b.write())).transpose()?;
        for stat in [&*m, &*v, &*rm, &*rv] {
            check_len(OP, stat, spec.channels)?;
        }
        let count = match count.as_deref_mut() {
            None => None,
            Some(HostVec::I64(n)) if n.len() == 1 => Some(n),
            Some(_) => return Ok(None),
        };
        let (HostVec::F32(m), HostVec::F32(v), HostVec::F32(rm), HostVec::F32(rv)) = (&*m, &*v, &mut *rm, &mut *rv)
        else {
            return Ok(None);
        };
        // The composed ops' products and sum, in their order (no fused multiply-add).
        for c in 0..spec.channels {
            rm[c] = rm[c] * keep + m[c] * take;
            rv[c] = rv[c] * keep + v[c] * unbias * take;
        }
        if let Some(n) = count {
            n[0] = n[0].saturating_add(1);
        }
        Ok(Some(()))
    };
    checked().transpose()
}

pub(super) fn causal_softmax(dev: &CpuBackend, scores: &BufferRef, spec: &CausalSoftmax) -> Option<Result<BufferRef>> {
    let checked = || {
        let x = cpu("causal_softmax", scores)?.read();
        check_len("causal_softmax", &x, spec.rows * spec.t)?;
        let pool = &dev.pool;
        Ok(match &*x {
            HostVec::F32(x) => Some(HostVec::F32(causal_softmax::forward(pool, x, spec))),
            HostVec::BF16(x) => Some(HostVec::BF16(causal_softmax::forward(pool, x, spec))),
            HostVec::F16(x) => Some(HostVec::F16(causal_softmax::forward(pool, x, spec))),
            // f64 (the conformance reference) keeps the composed ops.
            _ => None,
        })
    };
    checked()
        .and_then(|out| out.map(|out| dev.wrap("causal_softmax", out)).transpose())
        .transpose()
}

pub(super) fn causal_softmax_backward(
    dev: &CpuBackend,
    grad: &BufferRef,
    scores: &BufferRef,
    spec: &CausalSoftmax,
) -> Option<Result<BufferRef>> {
    const OP: &str = "causal_softmax_backward";
    let checked = || {
        let (g, x) = (cpu(OP, grad)?.read(), cpu(OP, scores)?.read());
        check_len(OP, &g, spec.rows * spec.t)?;
        check_len(OP, &x, spec.rows * spec.t)?;
        let pool = &dev.pool;
        Ok(match (&*g, &*x) {
            (HostVec::F32(g), HostVec::F32(x)) => Some(HostVec::F32(causal_softmax::backward(pool, g, x, spec))),
            (HostVec::BF16(g), HostVec::BF16(x)) => Some(HostVec::BF16(causal_softmax::backward(pool, g, x, spec))),
            (HostVec::F16(g), HostVec::F16(x)) => Some(HostVec::F16(causal_softmax::backward(pool, g, x, spec))),
            _ => None,
        })
    };
    checked()
        .and_then(|out| out.map(|out| dev.wrap("causal_softmax_backward", out)).transpose())
        .transpose()
}

pub(super) fn cross_entropy(
    dev: &CpuBackend,
    logits: &BufferRef,
    targets: &BufferRef,
    spec: &CrossEntropy,
) -> Option<Result<(BufferRef, Option<BufferRef>)>> {
    const OP: &str = "cross_entropy";
    let checked = || {
        let (x, t) = (cpu(OP, logits)?.read(), cpu(OP, targets)?.read());
        check_len(OP, &x, spec.rows * spec.classes)?;
        let t = u32_ids(OP, &t)?;
        if t.len() != spec.rows {
            return Err(Error::invalid(
                OP,
                format!("{} targets for {} rows", t.len(), spec.rows),
            ));
        }
        index::check(OP, t, spec.classes)?;
        Ok(match &*x {
            HostVec::F32(x) => Some(cross_entropy_rows(dev, x, t, spec)?),
            HostVec::BF16(x) => Some(cross_entropy_rows(dev, x, t, spec)?),
            HostVec::F16(x) => Some(cross_entropy_rows(dev, x, t, spec)?),
            // f64 (the conformance reference) keeps the composed ops.
            _ => None,
        })
    };
    checked().transpose()
}

pub(super) fn cross_entropy_backward(
    dev: &CpuBackend,
    dlogits: &BufferRef,
    grad: &BufferRef,
    spec: &CrossEntropy,
) -> Option<Result<BufferRef>> {
    const OP: &str = "cross_entropy_backward";
    let checked = || {
        let g = cpu(OP, grad)?.read();
        CrossEntropy::check_upstream(g.dtype(), g.len())?;
        let g = g.to_f64_vec()[0] as f32;
        // The host holds the gradient already: a loss not scaled after it costs no pass.
        if g == 1.0 {
            return Ok(Some(dlogits.clone()));
        }
        let d = cpu(OP, dlogits)?.read();
        check_len(OP, &d, spec.rows * spec.classes)?;
        Ok(match &*d {
            HostVec::F32(d) => Some(dev.wrap("cross_entropy_backward", HostVec::F32(cross_entropy_scaled(dev, d, g)))?),
            HostVec::BF16(d) => {
                Some(dev.wrap("cross_entropy_backward", HostVec::BF16(cross_entropy_scaled(dev, d, g)))?)
            }
            HostVec::F16(d) => Some(dev.wrap("cross_entropy_backward", HostVec::F16(cross_entropy_scaled(dev, d, g)))?),
            _ => None,
        })
    };
    checked().transpose()
}

/// `Backend::cross_entropy` on logits of one dtype: the row losses and the gradient.
fn cross_entropy_rows<T: ViaF32>(
    dev: &CpuBackend,
    x: &[T],
    targets: &[u32],
    spec: &CrossEntropy,
) -> Result<(BufferRef, Option<BufferRef>)> {
    let mut losses = dev.pool.take::<f32>(spec.rows);
    let mut grad = spec.grad.then(|| dev.pool.take::<T>(x.len()));
    cross_entropy::forward(x, targets, &mut losses, grad.as_deref_mut(), spec);
    let grad = grad.map(|g| dev.wrap("cross_entropy", T::into_host(g))).transpose()?;
    Ok((dev.wrap("cross_entropy", HostVec::F32(losses))?, grad))
}

/// The saved gradient `d` of `cross_entropy` times the loss' gradient `g`.
fn cross_entropy_scaled<T: ViaF32>(dev: &CpuBackend, d: &[T], g: f32) -> Vec<T> {
    let mut out = dev.pool.take::<T>(d.len());
    cross_entropy::backward(d, g, &mut out);
    out
}

/// A batch norm's element-wise result as a `HostVec`, beside its per-channel f32 vectors.
fn in_host_vec<E: Element>((values, per_channel): (Vec<E>, [Vec<f32>; 2])) -> (HostVec, [Vec<f32>; 2]) {
    (E::into_host(values), per_channel)
}
