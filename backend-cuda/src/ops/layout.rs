//! copy_strided and cast (layout.cu).

use lockstep_core::backend::{BackendBuffer, BufferRef};
use lockstep_core::shape::Layout;
use lockstep_core::{DType, Error, Result};

use crate::backend::CudaBackend;
use crate::buffer::CudaBuffer;
use crate::entry_points;
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
        if overlap(s, src_layout, d, dst_layout) {
            // Threads would read elements other threads already wrote: go through a copy, as
            // the CPU does.
            let staged = self.output(s.dtype(), src_layout.elem_count())?;
            let contiguous = Layout::contiguous(src_layout.dims().to_vec());
            self.copy_into(s, src_layout, &staged, &contiguous)?;
            return self.copy_into(&staged, &contiguous, d, dst_layout);
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
        let entry = entry_points::COPY_STRIDED.of(OP, src.dtype())?;
        let (shape, views) = strided(OP, &[src_layout, dst_layout])?;
        if shape.n == 0 {
            return Ok(());
        }
        launch!(&self.gpu, entry, self.gpu.grid(shape.n as usize);
            &dst.ptr, &src.ptr, &shape, &views[0], &views[1]);
        Ok(())
    }
}

/// Whether a copy reads elements of the buffer it writes: the same allocation and overlapping
/// spans (conservative: interleaved views that never share an element also count).
fn overlap(src: &CudaBuffer, src_layout: &Layout, dst: &CudaBuffer, dst_layout: &Layout) -> bool {
    src.ptr == dst.ptr && spans_overlap(src_layout, dst_layout)
}

fn spans_overlap(a: &Layout, b: &Layout) -> bool {
    a.elem_count() > 0 && b.elem_count() > 0 && a.offset < b.extent() && b.offset < a.extent()
}

impl CudaBackend {
    pub(crate) fn convert(&self, src: &BufferRef, layout: &Layout, dtype: DType) -> Result<BufferRef> {
        const OP: &str = "cast";
        let s = self.operand(OP, src, Some(layout))?;
        let cast = entry_points::cast(OP, s.dtype(), dtype)?;
        let out = self.output(dtype, layout.elem_count())?;
        let (shape, views) = strided(OP, &[layout])?;
        if shape.n > 0 {
            launch!(&self.gpu, cast, self.gpu.grid(shape.n as usize);
                &out.ptr, &s.ptr, &shape, &views[0]);
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn window(start: usize, len: usize) -> Layout {
        Layout {
            offset: start,
            ..Layout::contiguous([len])
        }
    }

    #[test]
    fn shifted_windows_of_one_buffer_overlap_and_disjoint_ones_do_not() {
        assert!(spans_overlap(&window(0, 10), &window(2, 10)));
        assert!(spans_overlap(&window(2, 10), &window(0, 10)));
        assert!(!spans_overlap(&window(0, 5), &window(5, 5)));
        assert!(
            !spans_overlap(&window(0, 0), &window(0, 5)),
            "an empty view touches nothing"
        );
    }
}
