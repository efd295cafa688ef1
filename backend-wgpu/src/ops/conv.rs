//! im2col, col2im and max_pool2d (conv.wgsl) over contiguous NCHW; im2col and col2im read and
//! write bf16 in its packed words.

use lockstep_core::backend::{BufferRef, Conv2dGeometry, Pool2dGeometry};
use lockstep_core::{DType, Error, Result};

use crate::backend::{WgpuBackend, to_u32};
use crate::pipelines::Variant;

/// [total, n, c, h, w, kh, kw, stride, padding, dilation, oh, ow], as `geometry()` reads them.
fn geometry_params(op: &'static str, total: usize, g: &Conv2dGeometry) -> Result<Vec<u32>> {
    [
        total,
        g.n,
        g.c,
        g.h,
        g.w,
        g.kh,
        g.kw,
        g.stride[0],
        g.stride[1],
        g.padding[0],
        g.padding[1],
        g.dilation[0],
        g.dilation[1],
        g.out_h(),
        g.out_w(),
    ]
    .iter()
    .map(|&v| to_u32(op, v))
    .collect()
}

impl WgpuBackend {
    /// Runs `entry` from `src` (at least `src_len` elements) into a new `out_len` buffer, with
    /// an invocation per storage word of `grid_len` elements.
    fn conv_dispatch(
        &self,
        entry: &'static str,
        src: &BufferRef,
        src_len: usize,
        out_len: usize,
        grid_len: usize,
        g: &Conv2dGeometry,
    ) -> Result<BufferRef> {
        g.validate(entry)?;
        let src = self.operand(entry, src, None)?;
        if src.len() < src_len {
            return Err(Error::invalid(
                entry,
                format!("{g:?} needs {src_len} elements, the buffer has {}", src.len()),
            ));
        }
        let t = self.element_type(entry, src.dtype())?;
        let out = self.alloc("conv2d", src.dtype(), out_len)?;
        self.launch(
            &Variant::new("conv", entry, &[t]),
            &geometry_params(entry, out_len, g)?,
            &[(1, src), (2, &out)],
            self.word_grid(entry, src.dtype(), grid_len)?,
        )?;
        Ok(out)
    }

    pub(crate) fn unfold(&self, src: &BufferRef, g: &Conv2dGeometry) -> Result<BufferRef> {
        g.validate("im2col")?;
        let pixels = g.n * g.out_h() * g.out_w();
        let unfold = |src: &BufferRef| {
            // An invocation per channel and word of a column row, which it writes in each tap's row.
            self.conv_dispatch(
                "im2col",
                src,
                g.n * g.c * g.h * g.w,
                g.c * g.kh * g.kw * pixels,
                g.c * pixels,
                g,
            )
        };
        // bf16 rows of an odd length end mid-word: those columns are made in f32.
        if pixels.is_multiple_of(2) {
            return unfold(src);
        }
        self.in_f32("im2col", [src], |[src]| unfold(src))
    }

    pub(crate) fn fold(&self, cols: &BufferRef, g: &Conv2dGeometry) -> Result<BufferRef> {
        g.validate("col2im")?;
        let len = g.c * g.kh * g.kw * g.n * g.out_h() * g.out_w();
        let image = g.n * g.c * g.h * g.w;
        self.conv_dispatch("col2im", cols, len, image, image, g)
    }

    pub(crate) fn pool_max(&self, src: &BufferRef, g: &Pool2dGeometry) -> Result<(BufferRef, BufferRef)> {
        const OP: &str = "max_pool2d";
        g.validate(OP)?;
        let conv = g.as_conv();
        let src = self.operand(OP, src, None)?;
        let needed = g.n * g.c * g.h * g.w;
        if src.len() < needed {
            return Err(Error::invalid(
                OP,
                format!("{g:?} needs {needed} elements, the buffer has {}", src.len()),
            ));
        }
        let t = self.float_type(OP, src.dtype())?;
        let len = g.n * g.c * g.out_h() * g.out_w();
        let values = self.alloc("max_pool2d", src.dtype(), len)?;
        let indices = self.alloc("max_pool2d", DType::U32, len)?;
        self.launch(
            &Variant::new("conv", OP, &[t]),
            &geometry_params(OP, len, &conv)?,
            &[(1, src), (2, &values), (3, &indices)],
            self.grid(OP, len)?,
        )?;
        Ok((values, indices))
    }

    /// The gradient of `pool_max`: one invocation per input pixel gathers the windows covering
    /// it (see conv.wgsl).
    pub(crate) fn pool_max_backward(
        &self,
        grad: &BufferRef,
        indices: &BufferRef,
        g: &Pool2dGeometry,
    ) -> Result<BufferRef> {
        const OP: &str = "max_pool2d_backward";
        g.validate(OP)?;
        let windows = g.n * g.c * g.out_h() * g.out_w();
        let (grad, indices) = (self.operand(OP, grad, None)?, self.operand(OP, indices, None)?);
        if grad.len() < windows || indices.len() < windows || indices.dtype() != DType::U32 {
            return Err(Error::invalid(
                OP,
                format!(
                    "{g:?} needs {windows} gradients and u32 indices, got {} and {}",
                    grad.len(),
                    indices.len()
                ),
            ));
        }
        let t = self.float_type(OP, grad.dtype())?;
        let len = g.n * g.c * g.h * g.w;
        let out = self.alloc("max_pool2d_backward", grad.dtype(), len)?;
        if len > 0 {
            self.launch(
                &Variant::new("conv", OP, &[t]),
                &geometry_params(OP, len, &g.as_conv())?,
                &[(1, grad), (2, &out), (3, indices)],
                self.grid(OP, len)?,
            )?;
        }
        Ok(out)
    }
}
