//! index_select, gather, index_add and scatter_add (index.cu) over contiguous [outer, dim, inner].
//! The adds sum each destination's sources in source order, scanning them all where they are
//! few, else walking per-id lists built first.

use lockstep_core::backend::gpu_plan::linking_pays;
use lockstep_core::backend::{BackendBuffer, BufferRef};
use lockstep_core::shape::Layout;
use lockstep_core::{DType, Error, Result};

use crate::backend::CudaBackend;
use crate::buffer::CudaBuffer;
use crate::entry_points;
use crate::gpu::launch;
use crate::views::to_u32;

impl CudaBackend {
    pub(crate) fn ids<'a>(&self, op: &'static str, ids: &'a BufferRef, len: usize) -> Result<&'a CudaBuffer> {
        let i = self.operand(op, ids, Some(&Layout::contiguous([len])))?;
        if i.dtype() != DType::U32 {
            return Err(Error::UnsupportedDType {
                op,
                dtype: i.dtype(),
                hint: "; indices are u32 (convert with `to_dtype(U32)`)",
            });
        }
        Ok(i)
    }

    /// index_select (`per_element` false: ids of length out_dim) and gather (ids shaped like the output).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn pick(
        &self,
        op: &'static str,
        src: &BufferRef,
        outer: usize,
        dim: usize,
        inner: usize,
        ids: &BufferRef,
        out_dim: usize,
        per_element: bool,
    ) -> Result<BufferRef> {
        let s = self.operand(op, src, Some(&Layout::contiguous([outer * dim * inner])))?;
        let n = outer * out_dim * inner;
        let i = self.ids(op, ids, if per_element { n } else { out_dim })?;
        let pick = if per_element {
            entry_points::GATHER
        } else {
            entry_points::INDEX_SELECT
        };
        let entry = pick.of(op, s.dtype())?;
        let out = self.output(s.dtype(), n)?;
        if n > 0 {
            let (n32, dim32, inner32, out_dim32) = (
                to_u32(op, n)?,
                to_u32(op, dim)?,
                to_u32(op, inner)?,
                to_u32(op, out_dim)?,
            );
            launch!(&self.gpu, entry, self.gpu.grid(n);
                &out.ptr, &s.ptr, &i.ptr, &n32, &dim32, &inner32, &out_dim32);
        }
        Ok(out)
    }

    /// index_add (`per_element` false) and scatter_add, in place on `dst` [outer, dst_dim, inner].
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn add_at(
        &self,
        op: &'static str,
        dst: &BufferRef,
        dst_dim: usize,
        src: &BufferRef,
        outer: usize,
        src_dim: usize,
        inner: usize,
        ids: &BufferRef,
        per_element: bool,
    ) -> Result<()> {
        let d = self.operand(op, dst, Some(&Layout::contiguous([outer * dst_dim * inner])))?;
        let src_len = outer * src_dim * inner;
        let s = self.operand(op, src, Some(&Layout::contiguous([src_len])))?;
        let dtype = self.same_dtype(op, d, s)?;
        let (add_at, add_linked) = (
            entry_points::ADD_AT.of(op, dtype)?,
            entry_points::ADD_LINKED.of(op, dtype)?,
        );
        let positions = if per_element { src_len } else { src_dim };
        let i = self.ids(op, ids, positions)?;
        let n = outer * dst_dim * inner;
        if n == 0 {
            return Ok(());
        }
        let (n32, src_dim32, inner32, dst_dim32) = (
            to_u32(op, n)?,
            to_u32(op, src_dim)?,
            to_u32(op, inner)?,
            to_u32(op, dst_dim)?,
        );
        let per = u32::from(per_element);
        if !linking_pays(n, src_dim, positions) {
            launch!(&self.gpu, add_at, self.gpu.grid(n);
                &d.ptr, &s.ptr, &i.ptr, &n32, &src_dim32, &inner32, &dst_dim32, &per);
            return Ok(());
        }
        // Lists of each id's sources: one per destination row, or per element for scatter_add.
        let first = self.fill(DType::U32, if per_element { n } else { dst_dim }, f64::from(u32::MAX))?;
        let first = self.operand(op, &first, None)?;
        let next = self.output(DType::U32, positions)?;
        let positions32 = to_u32(op, positions)?;
        launch!(&self.gpu, entry_points::LINK_SOURCES.entry(), self.gpu.grid(positions);
            &first.ptr, &next.ptr, &i.ptr, &positions32, &src_dim32, &inner32, &dst_dim32, &per);
        launch!(&self.gpu, add_linked, self.gpu.grid(n);
            &d.ptr, &s.ptr, &first.ptr, &next.ptr, &n32, &src_dim32, &inner32, &dst_dim32, &per);
        Ok(())
    }
}
