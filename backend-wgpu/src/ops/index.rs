//! index_select, gather, index_add and scatter_add (index.wgsl) over contiguous
//! [outer, dim, inner] views with u32 indices. The adds sum each destination's sources in source
//! order, scanning them all where they are few, else walking per-id lists built first.

use lockstep_core::backend::BufferRef;
use lockstep_core::backend::gpu_plan::linking_pays;
use lockstep_core::{DType, Error, Result};

use crate::backend::{WgpuBackend, to_u32};
use crate::buffer::WgpuBuffer;
use crate::pipelines::Variant;

/// Which tensor plays which role in one indexing dispatch.
struct Indexing<'a> {
    entry: &'static str,
    src: &'a WgpuBuffer,
    ids: &'a WgpuBuffer,
    out: &'a WgpuBuffer,
    outer: usize,
    src_dim: usize,
    inner: usize,
    out_dim: usize,
}

impl WgpuBackend {
    pub(crate) fn ids<'a>(&self, op: &'static str, ids: &'a BufferRef, at_least: usize) -> Result<&'a WgpuBuffer> {
        let ids = self.operand(op, ids, None)?;
        if ids.dtype() != DType::U32 {
            return Err(Error::UnsupportedDType {
                op,
                dtype: ids.dtype(),
                hint: "; indices are u32",
            });
        }
        if ids.len() < at_least {
            return Err(Error::invalid(op, format!("{} indices, {at_least} needed", ids.len())));
        }
        Ok(ids)
    }

    fn index_dispatch(&self, x: Indexing) -> Result<()> {
        let op = x.entry;
        let t = self.value_type(op, x.src.dtype())?;
        let n = x.outer * x.out_dim * x.inner;
        let params = [n, x.outer, x.src_dim, x.inner, x.out_dim]
            .iter()
            .map(|&v| to_u32(op, v))
            .collect::<Result<Vec<_>>>()?;
        self.launch(
            &Variant::new("index", op, &[t]),
            &params,
            &[(1, x.src), (2, x.ids), (3, x.out)],
            self.grid(op, n)?,
        )
    }

    fn check_len(op: &'static str, b: &WgpuBuffer, len: usize) -> Result<()> {
        if b.len() < len {
            return Err(Error::invalid(
                op,
                format!("a buffer of {} elements, {len} needed", b.len()),
            ));
        }
        Ok(())
    }

    pub(crate) fn select_rows(
        &self,
        src: &BufferRef,
        outer: usize,
        dim: usize,
        inner: usize,
        ids: &BufferRef,
    ) -> Result<BufferRef> {
        const OP: &str = "index_select";
        let src = self.operand(OP, src, None)?;
        Self::check_len(OP, src, outer * dim * inner)?;
        let ids = self.ids(OP, ids, 0)?;
        let out = self.alloc("select_rows", src.dtype(), outer * ids.len() * inner)?;
        let out_dim = ids.len();
        self.index_dispatch(Indexing {
            entry: OP,
            src,
            ids,
            out: &out,
            outer,
            src_dim: dim,
            inner,
            out_dim,
        })?;
        Ok(out)
    }

    pub(crate) fn gather_along(
        &self,
        src: &BufferRef,
        outer: usize,
        dim: usize,
        inner: usize,
        ids: &BufferRef,
        out_dim: usize,
    ) -> Result<BufferRef> {
        const OP: &str = "gather";
        let src = self.operand(OP, src, None)?;
        Self::check_len(OP, src, outer * dim * inner)?;
        let ids = self.ids(OP, ids, outer * out_dim * inner)?;
        let out = self.alloc("gather_along", src.dtype(), outer * out_dim * inner)?;
        self.index_dispatch(Indexing {
            entry: OP,
            src,
            ids,
            out: &out,
            outer,
            src_dim: dim,
            inner,
            out_dim,
        })?;
        Ok(out)
    }

    /// index_add (entry "index_add": one id per source slice) or scatter_add (one id per source
    /// element), in place on `dst`.
    #[allow(clippy::too_many_arguments)] // the [outer, dim, inner] geometry of two tensors
    pub(crate) fn add_at(
        &self,
        entry: &'static str,
        dst: &BufferRef,
        dst_dim: usize,
        src: &BufferRef,
        outer: usize,
        src_dim: usize,
        inner: usize,
        ids: &BufferRef,
    ) -> Result<()> {
        let dst = self.operand(entry, dst, None)?;
        let src = self.operand(entry, src, None)?;
        Self::check_len(entry, dst, outer * dst_dim * inner)?;
        Self::check_len(entry, src, outer * src_dim * inner)?;
        if dst.dtype() != src.dtype() {
            return Err(Error::DTypeMismatch {
                op: entry,
                lhs: dst.dtype(),
                rhs: src.dtype(),
            });
        }
        let per_element = entry == "scatter_add";
        let positions = if per_element { outer * src_dim * inner } else { src_dim };
        let ids = self.ids(entry, ids, positions)?;
        let dst_len = outer * dst_dim * inner;
        let add = AddAt {
            op: entry,
            per_element,
            ty: self.value_type(entry, src.dtype())?,
            params: [dst_len, outer, src_dim, inner, dst_dim]
                .iter()
                .map(|&v| to_u32(entry, v))
                .collect::<Result<Vec<_>>>()?,
        };
        if linking_pays(dst_len, src_dim, positions) {
            let heads = if per_element { dst_len } else { dst_dim };
            self.add_linked(&add, src, ids, dst, positions, heads)
        } else {
            self.launch(
                &add.variant("add_scanning"),
                &add.params,
                &[(1, src), (2, ids), (3, dst)],
                self.grid(entry, dst_len)?,
            )
        }
    }

    /// Threads each id's sources into a list (link_sources), then walks each destination's list
    /// (add_linked); `heads` lists: one per destination row, or per element for scatter_add.
    fn add_linked(
        &self,
        add: &AddAt,
        src: &WgpuBuffer,
        ids: &WgpuBuffer,
        dst: &WgpuBuffer,
        positions: usize,
        heads: usize,
    ) -> Result<()> {
        let first = self.fill(DType::U32, heads, f64::from(u32::MAX))?;
        let first = self.operand(add.op, &first, None)?;
        let next = self.alloc("add_linked", DType::U32, positions)?;
        let mut link_params = add.params.clone();
        link_params[0] = to_u32(add.op, positions)?;
        self.launch(
            &add.variant("link_sources"),
            &link_params,
            &[(2, ids), (4, first), (5, &next)],
            self.grid(add.op, positions)?,
        )?;
        self.launch(
            &add.variant("add_linked"),
            &add.params,
            &[(1, src), (3, dst), (4, first), (5, &next)],
            self.grid(add.op, add.params[0] as usize)?,
        )
    }
}

/// One in-place add's pipeline choice and parameters (index.wgsl's).
struct AddAt {
    op: &'static str,
    per_element: bool,
    ty: &'static str,
    params: Vec<u32>,
}

impl AddAt {
    fn variant(&self, entry: &'static str) -> Variant {
        Variant::new("index", entry, &[self.ty]).constant("PER_ELEMENT", f64::from(u8::from(self.per_element)))
    }
}
