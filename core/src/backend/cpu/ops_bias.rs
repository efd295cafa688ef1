//! The CPU backend's bias-and-activation ops: the buffers checked, the dtypes dispatched, the
//! work in `bias`.

use std::any::Any;

use super::{CpuBackend, bias, cpu};
use crate::backend::{BiasGeometry, BufferRef, UnaryOp};
use crate::dtype::HostVec;
use crate::error::{Error, Result};
use crate::{map_host_vec, stored_binary_dispatch};

pub(super) fn bias_act(
    dev: &CpuBackend,
    src: &BufferRef,
    bias: &BufferRef,
    geom: BiasGeometry,
    act: Option<UnaryOp>,
) -> Result<BufferRef> {
    const OP: &str = "bias_act";
    geom.check(OP, src.len(), bias.len())?;
    let (x, b) = (cpu(OP, src)?.read(), cpu(OP, bias)?.read());
    let out = stored_binary_dispatch!(OP, &*x, &*b, |x, b| bias::bias_act(
        &dev.pool,
        &x[..geom.len()],
        b,
        geom.channels,
        geom.inner,
        act
    ));
    dev.wrap(OP, out)
}

/// `data`'s elements if they are `S`s.
fn elements<S: 'static>(data: &HostVec) -> Option<&[S]> {
    map_host_vec!(data, v => (v as &dyn Any).downcast_ref::<Vec<S>>().map(|v| v.as_slice()))
}

pub(super) fn bias_act_grad(
    dev: &CpuBackend,
    [grad, src, bias]: [&BufferRef; 3],
    geom: BiasGeometry,
    derivative: UnaryOp,
) -> Result<BufferRef> {
    const OP: &str = "bias_act_grad";
    geom.check(OP, src.len(), bias.len())?;
    geom.check_gradient(OP, (grad.len(), grad.dtype()), src.dtype())?;
    let n = geom.len();
    let (g, x, b) = (cpu(OP, grad)?.read(), cpu(OP, src)?.read(), cpu(OP, bias)?.read());
    let unlike = || Error::invalid(OP, "the gradient's elements are not of its dtype");
    let out = stored_binary_dispatch!(OP, &*x, &*b, |x, b| bias::bias_act_grad(
        &dev.pool,
        &elements(&g).ok_or_else(unlike)?[..n],
        &x[..n],
        b,
        (geom.channels, geom.inner),
        derivative
    ));
    dev.wrap(OP, out)
}
