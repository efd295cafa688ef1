//! copy_strided and cast (layout.cu).

use lockstep_core::backend::{BackendBuffer, BufferRef};
use lockstep_core::shape::Layout;
use lockstep_core::{DType, Error, Result};

use crate::backend::{CudaBackend, value_suffix, width_suffix};
use crate::buffer::CudaBuffer;
use crate::gpu::launch;
use crate::views::strided;

impl CudaBackend {
    pub(crate) fn copy_between(
        &self,
        src: &BufferRef,
        src_layout: &Layout,
        dst: &BufferRef,
        dst_layout: &Layout,
    ) -> Result<()> {
        const OP: &str = "copy_strided";
        let s = self.operand(OP, src, Some(src_layout))?;
        let d = self.operand(OP, dst, Some(dst_layout))?;
        self.same_dtype(OP, s, d)?;
        if src_layout.shape != dst_layout.shape {
            return Err(Error::shape(
                OP,
                &src_layout.shape,
                &dst_layout.shape,
                "source and destination differ",
            ));
        }
        self.copy_into(s, src_layout, d, dst_layout)
    }

    /// `dst[dst_layout] = src[src_layout]`, bits moved as they are.
    pub(crate) fn copy_into(
        &self,
        src: &CudaBuffer,
        src_layout: &Layout,
        dst: &CudaBuffer,
        dst_layout: &Layout,
    ) -> Result<()> {
        const OP: &str = "copy_strided";
        let suffix = width_suffix(OP, src.dtype())?;
        let (shape, views) = strided(OP, &[src_layout, dst_layout])?;
        if shape.n == 0 {
            return Ok(());
        }
        launch!(&self.gpu, lockstep_kernels::LAYOUT, format!("copy_strided_{suffix}"), self.gpu.grid(shape.n as usize);
            &dst.ptr, &src.ptr, &shape, &views[0], &views[1]);
        Ok(())
    }

    pub(crate) fn convert(&self, src: &BufferRef, layout: &Layout, dtype: DType) -> Result<BufferRef> {
        const OP: &str = "cast";
        let s = self.operand(OP, src, Some(layout))?;
        let from = value_suffix(OP, s.dtype())?;
        let to = value_suffix(OP, dtype)?;
        let out = self.output(dtype, layout.elem_count())?;
        let (shape, views) = strided(OP, &[layout])?;
        if shape.n > 0 {
            launch!(&self.gpu, lockstep_kernels::LAYOUT, format!("cast_{from}_{to}"), self.gpu.grid(shape.n as usize);
                &out.ptr, &s.ptr, &shape, &views[0]);
        }
        Ok(out)
    }
}
