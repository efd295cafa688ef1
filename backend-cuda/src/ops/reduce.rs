//! reduce (reduce.cu): sum, max, min and argmax over any set of axes of a strided tensor.

use std::sync::Arc;

use cudarc::driver::LaunchConfig;
use cudarc::driver::sys::CUdeviceptr;
use lockstep_core::backend::gpu_plan::{chunk_len, column_chunk_len, reduces_by_columns};
use lockstep_core::backend::{BackendBuffer, BufferRef, ReduceKind, split_axes};
use lockstep_core::shape::Layout;
use lockstep_core::{DType, Result};

use crate::backend::CudaBackend;
use crate::buffer::CudaBuffer;
use crate::entry_points;
use crate::gpu::{BLOCK, launch};
use crate::views::{SubShape, sub_shape, to_u32};

/// Threads that share one output (or chunk of one): a warp for short reductions, a block for long ones.
pub(crate) fn group_for(len: usize) -> u32 {
    if len <= 1024 { 32 } else { BLOCK }
}

/// One reduction, its shapes worked out once for either kernel.
pub(crate) struct Reduction<'a> {
    op: &'static str,
    kind: ReduceKind,
    src: &'a CudaBuffer,
    offset: u32,
    n_out: usize,
    n_red: usize,
    /// Whether it runs as a column reduction (`gpu_plan::reduces_by_columns`).
    columns: bool,
    kept: SubShape,
    reduced: SubShape,
}

impl CudaBackend {
    pub(crate) fn reduce_axes(
        &self,
        kind: ReduceKind,
        src: &BufferRef,
        layout: &Layout,
        axes: &[usize],
    ) -> Result<BufferRef> {
        let r = self.reduction(kind, src, layout, axes)?;
        if r.columns && self.column_reduce_passes_check(r.src.dtype()) {
            self.reduce_by_columns(&r)
        } else {
            self.reduce_by_groups(&r)
        }
    }

    pub(crate) fn reduction<'a>(
        &'a self,
        kind: ReduceKind,
        src: &'a BufferRef,
        layout: &Layout,
        axes: &[usize],
    ) -> Result<Reduction<'a>> {
        let op = kind.name();
        let src = self.operand(op, src, Some(layout))?;
        kind.check_axes(layout.shape.rank(), axes)?;
        let [kept, reduced] = split_axes(layout, axes);
        let n_out = kept.0.iter().product();
        Ok(Reduction {
            op,
            kind,
            src,
            offset: to_u32(op, layout.offset)?,
            n_out,
            n_red: reduced.0.iter().product(),
            columns: reduces_by_columns(&kept.1, n_out),
            kept: sub_shape(op, &kept.0, &kept.1)?,
            reduced: sub_shape(op, &reduced.0, &reduced.1)?,
        })
    }

    /// The output, the chunks' partials and the kernel's counts, for chunks of `chunk_len`.
    fn prepare(&self, r: &Reduction, chunk_len: usize) -> Result<Prepared> {
        let chunks = r.n_red.div_ceil(chunk_len).max(1);
        let out_dtype = if r.kind == ReduceKind::ArgMax {
            DType::U32
        } else {
            r.src.dtype()
        };
        let out = self.output(out_dtype, r.n_out)?;
        // Without chunks the output's pointer stands in for the partials (never written).
        let partials = if chunks > 1 && r.n_out > 0 {
            let (value, index) = (
                self.output(DType::F32, r.n_out * chunks)?,
                self.output(DType::U32, r.n_out * chunks)?,
            );
            Partials {
                value: value.ptr,
                index: index.ptr,
                _kept: Some([value, index]),
            }
        } else {
            Partials {
                value: out.ptr,
                index: out.ptr,
                _kept: None,
            }
        };
        Ok(Prepared {
            out,
            partials,
            chunks,
            counts: [to_u32(r.op, r.n_out)?, to_u32(r.op, r.n_red)?, to_u32(r.op, chunk_len)?],
            kind: ReduceKind::ALL.iter().position(|k| *k == r.kind).unwrap_or(0) as u32,
        })
    }

    /// Groups of threads per output (or chunk of one), combined in shared memory: any layout.
    pub(crate) fn reduce_by_groups(&self, r: &Reduction) -> Result<BufferRef> {
        let reduce = entry_points::REDUCE.of(r.op, r.src.dtype())?;
        let chunk_len = chunk_len(r.n_out, r.n_red);
        let p = self.prepare(r, chunk_len)?;
        if r.n_out == 0 {
            return Ok(p.out);
        }
        let [n_out, n_red, chunk_len32] = p.counts;
        let group = group_for(chunk_len);
        let cfg = self
            .gpu
            .blocks((r.n_out * p.chunks).div_ceil((BLOCK / group) as usize))?;
        launch!(&self.gpu, reduce, cfg;
            &p.out.ptr, &p.out.ptr, &p.partials.value, &p.partials.index, &r.src.ptr, &n_out, &n_red,
            &r.offset, &r.kept, &r.reduced, &p.kind, &group, &chunk_len32);
        self.combine_chunks(r, &p)
    }

    /// A thread per kept element and chunk, reading neighbouring columns: kept elements of stride 1.
    pub(crate) fn reduce_by_columns(&self, r: &Reduction) -> Result<BufferRef> {
        let kernel = entry_points::REDUCE_COLUMNS.of(r.op, r.src.dtype())?;
        let p = self.prepare(r, column_chunk_len(r.n_out, r.n_red))?;
        if r.n_out == 0 {
            return Ok(p.out);
        }
        let [n_out, n_red, chunk_len32] = p.counts;
        let cfg = LaunchConfig {
            grid_dim: (
                to_u32(r.op, r.n_out.div_ceil(BLOCK as usize))?,
                to_u32(r.op, p.chunks)?,
                1,
            ),
            block_dim: (BLOCK, 1, 1),
            shared_mem_bytes: 0,
        };
        launch!(&self.gpu, kernel, cfg;
            &p.out.ptr, &p.out.ptr, &p.partials.value, &p.partials.index, &r.src.ptr, &n_out, &n_red,
            &r.offset, &r.reduced, &p.kind, &chunk_len32);
        self.combine_chunks(r, &p)
    }

    /// Pass 2 of a reduction split into chunks: their partials folded in order; the output.
    fn combine_chunks(&self, r: &Reduction, p: &Prepared) -> Result<BufferRef> {
        if p.chunks > 1 {
            let combine = entry_points::COMBINE_CHUNKS.of(r.op, r.src.dtype())?;
            let (n_out, chunks) = (p.counts[0], to_u32(r.op, p.chunks)?);
            let group = group_for(p.chunks);
            let cfg = self.gpu.blocks(r.n_out.div_ceil((BLOCK / group) as usize))?;
            launch!(&self.gpu, combine, cfg;
                &p.out.ptr, &p.out.ptr, &p.partials.value, &p.partials.index, &n_out, &chunks, &p.kind, &group);
        }
        Ok(p.out.clone())
    }
}

/// One reduction's output and partials, ready for its kernels.
struct Prepared {
    out: Arc<CudaBuffer>,
    partials: Partials,
    chunks: usize,
    /// n_out, n_red and the chunk length, as the kernels take them.
    counts: [u32; 3],
    /// The kind as the kernels number it (its place in `ReduceKind::ALL`).
    kind: u32,
}

/// Where a split reduction's first pass leaves its chunks' partials (kept alive until both
/// passes are queued).
struct Partials {
    value: CUdeviceptr,
    index: CUdeviceptr,
    _kept: Option<[Arc<CudaBuffer>; 2]>,
}
