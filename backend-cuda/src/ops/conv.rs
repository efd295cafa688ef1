//! im2col, col2im and max_pool2d (conv.cu) over contiguous NCHW.

use cudarc::driver::DeviceRepr;

use lockstep_core::backend::{BackendBuffer, BufferRef, Conv2dGeometry, Pool2dGeometry};
use lockstep_core::shape::Layout;
use lockstep_core::{DType, Error, Result};

use crate::backend::CudaBackend;
use crate::entry_points;
use crate::gpu::launch;
use crate::views::to_u32;

/// `Geometry` of conv.cu.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
struct Geometry {
    n: u32,
    c: u32,
    h: u32,
    w: u32,
    kh: u32,
    kw: u32,
    stride: [u32; 2],
    pad: [u32; 2],
    dil: [u32; 2],
    oh: u32,
    ow: u32,
}

// SAFETY: #[repr(C)] u32 fields in the order of conv.cu's `Geometry` (no padding).
unsafe impl DeviceRepr for Geometry {}

fn geometry(op: &'static str, g: &Conv2dGeometry) -> Result<Geometry> {
    let u = |x: usize| to_u32(op, x);
    Ok(Geometry {
        n: u(g.n)?,
        c: u(g.c)?,
        h: u(g.h)?,
        w: u(g.w)?,
        kh: u(g.kh)?,
        kw: u(g.kw)?,
        stride: [u(g.stride[0])?, u(g.stride[1])?],
        pad: [u(g.padding[0])?, u(g.padding[1])?],
        dil: [u(g.dilation[0])?, u(g.dilation[1])?],
        oh: u(g.out_h())?,
        ow: u(g.out_w())?,
    })
}

impl CudaBackend {
    /// im2col (`to_columns`) or col2im: one output element per thread.
    pub(crate) fn unfold_or_fold(&self, src: &BufferRef, g: &Conv2dGeometry, to_columns: bool) -> Result<BufferRef> {
        let (op, kernel) = if to_columns {
            ("im2col", entry_points::IM2COL)
        } else {
            ("col2im", entry_points::COL2IM)
        };
        g.validate(op)?;
        let image = g.n * g.c * g.h * g.w;
        let columns = g.c * g.kh * g.kw * g.n * g.out_h() * g.out_w();
        let (src_len, out_len) = if to_columns { (image, columns) } else { (columns, image) };
        let s = self.operand(op, src, Some(&Layout::contiguous([src_len])))?;
        let entry = kernel.of(op, s.dtype())?;
        let out = self.output(s.dtype(), out_len)?;
        if out_len > 0 {
            let (total, geom) = (to_u32(op, out_len)?, geometry(op, g)?);
            let cfg = if to_columns {
                self.gpu.rows_grid(g.c * g.kh * g.kw, g.n * g.out_h() * g.out_w())
            } else {
                self.gpu.grid(out_len)
            };
            launch!(&self.gpu, entry, cfg;
                &out.ptr, &s.ptr, &total, &geom);
        }
        Ok(out)
    }

    pub(crate) fn pool_max(&self, src: &BufferRef, g: &Pool2dGeometry) -> Result<(BufferRef, BufferRef)> {
        const OP: &str = "max_pool2d";
        g.validate(OP)?;
        let s = self.operand(OP, src, Some(&Layout::contiguous([g.n * g.c * g.h * g.w])))?;
        let entry = entry_points::MAX_POOL2D.of(OP, s.dtype())?;
        let len = g.n * g.c * g.out_h() * g.out_w();
        let values = self.output(s.dtype(), len)?;
        let indices = self.output(DType::U32, len)?;
        if len > 0 {
            let (total, geom) = (to_u32(OP, len)?, geometry(OP, &g.as_conv())?);
            launch!(&self.gpu, entry, self.gpu.grid(len);
                &values.ptr, &indices.ptr, &s.ptr, &total, &geom);
        }
        Ok((values, indices))
    }

    /// The gradient of `pool_max` as a gather over the windows covering each pixel (conv.cu).
    pub(crate) fn pool_max_backward(
        &self,
        grad: &BufferRef,
        indices: &BufferRef,
        g: &Pool2dGeometry,
    ) -> Result<BufferRef> {
        const OP: &str = "max_pool2d_backward";
        g.validate(OP)?;
        let windows = g.n * g.c * g.out_h() * g.out_w();
        let gr = self.operand(OP, grad, Some(&Layout::contiguous([windows])))?;
        let ids = self.operand(OP, indices, Some(&Layout::contiguous([windows])))?;
        if ids.dtype() != DType::U32 {
            return Err(Error::dtype(OP, ids.dtype()));
        }
        let entry = entry_points::MAX_POOL2D_BACKWARD.of(OP, gr.dtype())?;
        let len = g.n * g.c * g.h * g.w;
        let out = self.output(gr.dtype(), len)?;
        if len > 0 {
            let (total, geom) = (to_u32(OP, len)?, geometry(OP, &g.as_conv())?);
            launch!(&self.gpu, entry, self.gpu.grid(len);
                &out.ptr, &gr.ptr, &ids.ptr, &total, &geom);
        }
        Ok(out)
    }
}
