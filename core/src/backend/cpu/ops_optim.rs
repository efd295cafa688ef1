//! The CPU backend's in-place parameter updates: `axpy` and the optimizer steps.

use super::{CpuBackend, check_len, cpu, distinct, float_pair_mut, optim};
use crate::backend::{AdamStep, Backend, BufferRef, SgdStep};
use crate::dtype::HostVec;
use crate::error::{Error, Result};
use crate::shape::Layout;

pub(super) fn axpy(dev: &CpuBackend, dst: &BufferRef, src: &BufferRef, alpha: f64) -> Result<()> {
    let s = dev.to_host(src, &Layout::contiguous([src.len()]))?;
    let mut d = cpu("axpy", dst)?.write();
    check_len("axpy", &d, s.len())?;
    float_pair_mut(
        &dev.pool,
        "axpy",
        &mut d,
        &s,
        |d, s| {
            let _: () = optim::axpy(d, s, alpha);
            Ok(())
        },
        |d, s| {
            let _: () = optim::axpy(d, s, alpha);
            Ok(())
        },
    )
}

pub(super) fn sgd_step(
    param: &BufferRef,
    grad: &BufferRef,
    momentum_buf: Option<&BufferRef>,
    step: &SgdStep,
) -> Result<()> {
    let mut roles = vec![param, grad];
    roles.extend(momentum_buf);
    distinct("sgd_step", &roles)?;
    let g = cpu("sgd_step", grad)?.read();
    let mut p = cpu("sgd_step", param)?.write();
    check_len("sgd_step", &g, p.len())?;
    let mut buf = momentum_buf
        .map(|b| cpu("sgd_step", b).map(|b| b.write()))
        .transpose()?;
    match (&mut *p, &*g, buf.as_deref_mut()) {
        (HostVec::F32(p), HostVec::F32(g), None) => optim::sgd(p, g, None, step),
        (HostVec::F32(p), HostVec::F32(g), Some(HostVec::F32(b))) if b.len() == p.len() => {
            optim::sgd(p, g, Some(b), step)
        }
        (HostVec::F64(p), HostVec::F64(g), None) => optim::sgd(p, g, None, step),
        (HostVec::F64(p), HostVec::F64(g), Some(HostVec::F64(b))) if b.len() == p.len() => {
            optim::sgd(p, g, Some(b), step)
        }
        (p, _, _) => {
            return Err(Error::UnsupportedDType {
                op: "sgd_step",
                dtype: p.dtype(),
                hint: "; parameter, gradient and momentum must all be f32 (or f64) of one length",
            });
        }
    }
    Ok(())
}

pub(super) fn adam_step(
    param: &BufferRef,
    grad: &BufferRef,
    exp_avg: &BufferRef,
    exp_avg_sq: &BufferRef,
    step: &AdamStep,
) -> Result<()> {
    distinct("adam_step", &[param, grad, exp_avg, exp_avg_sq])?;
    if step.step == 0 {
        return Err(Error::invalid(
            "adam_step",
            "step counts from 1 (bias correction divides by 1 - beta^step)",
        ));
    }
    let g = cpu("adam_step", grad)?.read();
    let mut p = cpu("adam_step", param)?.write();
    let (mut m, mut v) = (
        cpu("adam_step", exp_avg)?.write(),
        cpu("adam_step", exp_avg_sq)?.write(),
    );
    let n = p.len();
    if g.len() != n || m.len() != n || v.len() != n {
        return Err(Error::invalid(
            "adam_step",
            "parameter, gradient and moment buffers must have one length",
        ));
    }
    match (&mut *p, &*g, &mut *m, &mut *v) {
        (HostVec::F32(p), HostVec::F32(g), HostVec::F32(m), HostVec::F32(v)) => optim::adam(p, g, m, v, step),
        (HostVec::F64(p), HostVec::F64(g), HostVec::F64(m), HostVec::F64(v)) => optim::adam(p, g, m, v, step),
        (p, ..) => {
            return Err(Error::UnsupportedDType {
                op: "adam_step",
                dtype: p.dtype(),
                hint: "; parameter, gradient and moments must all be f32 (or f64)",
            });
        }
    }
    Ok(())
}
