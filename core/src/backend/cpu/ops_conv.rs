//! The CPU backend's convolution operations: unfolding, the convolution's product and its
//! gradients (on the paths `conv::chosen` plans), and max pooling.

use super::{CpuBackend, check_len, conv, cpu, max_pool};
use crate::backend::{BufferRef, Conv2dGeometry, Pool2dGeometry};
use crate::dtype::HostVec;
use crate::error::Result;
use crate::float_unary_dispatch;

pub(super) fn im2col(dev: &CpuBackend, src: &BufferRef, geom: &Conv2dGeometry) -> Result<BufferRef> {
    geom.validate("im2col")?;
    let data = cpu("im2col", src)?.read();
    check_len("im2col", &data, geom.n * geom.c * geom.h * geom.w)?;
    dev.wrap(
        "im2col",
        float_unary_dispatch!(&dev.pool, "im2col", &*data, |v| {
            conv::unfold::im2col(&dev.pool, v, geom)
        }),
    )
}

pub(super) fn col2im(dev: &CpuBackend, cols: &BufferRef, geom: &Conv2dGeometry) -> Result<BufferRef> {
    geom.validate("col2im")?;
    let data = cpu("col2im", cols)?.read();
    check_len(
        "col2im",
        &data,
        geom.n * geom.c * geom.kh * geom.kw * geom.out_h() * geom.out_w(),
    )?;
    dev.wrap(
        "col2im",
        float_unary_dispatch!(&dev.pool, "col2im", &*data, |v| {
            conv::unfold::col2im(&dev.pool, v, geom)
        }),
    )
}

pub(super) fn conv2d_product(
    dev: &CpuBackend,
    x: &BufferRef,
    weight: &BufferRef,
    geom: &Conv2dGeometry,
    out_channels: usize,
) -> Option<Result<BufferRef>> {
    let checked = || {
        geom.validate("conv2d")?;
        let (x, w) = (cpu("conv2d", x)?.read(), cpu("conv2d", weight)?.read());
        check_len("conv2d", &x, geom.n * geom.c * geom.h * geom.w)?;
        check_len("conv2d (weight)", &w, out_channels * geom.c * geom.kh * geom.kw)?;
        let Some(plan) = conv::chosen(geom, out_channels, x.dtype()) else {
            return Ok(None);
        };
        Ok(conv::forward(&dev.pool, &x, &w, geom, out_channels, &plan))
    };
    checked()
        .and_then(|out| out.map(|out| dev.wrap("conv2d", out)).transpose())
        .transpose()
}

pub(super) fn conv2d_product_backward(
    dev: &CpuBackend,
    x: &BufferRef,
    weight: &BufferRef,
    grad: &BufferRef,
    geom: &Conv2dGeometry,
    out_channels: usize,
) -> Option<Result<(BufferRef, BufferRef)>> {
    let checked = || {
        geom.validate("conv2d backward")?;
        let (x, w, g) = (
            cpu("conv2d backward", x)?.read(),
            cpu("conv2d backward", weight)?.read(),
            cpu("conv2d backward", grad)?.read(),
        );
        check_len("conv2d backward", &x, geom.n * geom.c * geom.h * geom.w)?;
        check_len(
            "conv2d backward (weight)",
            &w,
            out_channels * geom.c * geom.kh * geom.kw,
        )?;
        check_len(
            "conv2d backward (gradient)",
            &g,
            out_channels * geom.n * geom.out_h() * geom.out_w(),
        )?;
        let Some(plan) = conv::chosen(geom, out_channels, x.dtype()) else {
            return Ok(None);
        };
        Ok(conv::backward(&dev.pool, &x, &w, &g, geom, out_channels, &plan))
    };
    const OP: &str = "conv2d backward";
    checked()
        .and_then(|out| {
            out.map(|(gx, gw)| Ok((dev.wrap(OP, gx)?, dev.wrap(OP, gw)?)))
                .transpose()
        })
        .transpose()
}

pub(super) fn max_pool2d(dev: &CpuBackend, src: &BufferRef, geom: &Pool2dGeometry) -> Result<(BufferRef, BufferRef)> {
    geom.validate("max_pool2d")?;
    let data = cpu("max_pool2d", src)?.read();
    check_len("max_pool2d", &data, geom.n * geom.c * geom.h * geom.w)?;
    let mut indices = Vec::new();
    let values = float_unary_dispatch!(&dev.pool, "max_pool2d", &*data, |v| {
        let (vals, idx) = max_pool::max_pool2d(&dev.pool, v, geom);
        indices = idx;
        vals
    });
    Ok((
        dev.wrap("max_pool2d", values)?,
        dev.wrap("max_pool2d", HostVec::U32(indices))?,
    ))
}
