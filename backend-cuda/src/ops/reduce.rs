//! reduce (reduce.cu): sum, max, min and argmax over any set of axes of a strided tensor.

use lockstep_core::backend::gpu_plan::chunk_len;
use lockstep_core::backend::{BackendBuffer, BufferRef, ReduceKind, split_axes};
use lockstep_core::shape::Layout;
use lockstep_core::{DType, Result};

use crate::backend::CudaBackend;
use crate::entry_points;
use crate::gpu::{BLOCK, launch};
use crate::views::{sub_shape, to_u32};

/// Threads that share one output (or chunk of one): a warp for short reductions, a block for long ones.
pub(crate) fn group_for(len: usize) -> u32 {
    if len <= 1024 { 32 } else { BLOCK }
}

impl CudaBackend {
    pub(crate) fn reduce_axes(
        &self,
        kind: ReduceKind,
        src: &BufferRef,
        layout: &Layout,
        axes: &[usize],
    ) -> Result<BufferRef> {
        let op = kind.name();
        let s = self.operand(op, src, Some(layout))?;
        let (reduce, combine) = (
            entry_points::REDUCE.of(op, s.dtype())?,
            entry_points::COMBINE_CHUNKS.of(op, s.dtype())?,
        );
        kind.check_axes(layout.shape.rank(), axes)?;
        let [kept, reduced] = split_axes(layout, axes);
        let n_out: usize = kept.0.iter().product();
        let n_red: usize = reduced.0.iter().product();
        let out_dtype = if kind == ReduceKind::ArgMax {
            DType::U32
        } else {
            s.dtype()
        };
        let out = self.output(out_dtype, n_out)?;
        if n_out == 0 {
            return Ok(out);
        }
        let kept = sub_shape(op, &kept.0, &kept.1)?;
        let reduced = sub_shape(op, &reduced.0, &reduced.1)?;
        let kind_index = ReduceKind::ALL.iter().position(|k| *k == kind).unwrap_or(0) as u32;
        let chunk_len = chunk_len(n_out, n_red);
        let chunks = n_red.div_ceil(chunk_len).max(1);
        let (n_out32, n_red32, offset) = (to_u32(op, n_out)?, to_u32(op, n_red)?, to_u32(op, layout.offset)?);
        let (chunk_len32, chunks32) = (to_u32(op, chunk_len)?, to_u32(op, chunks)?);
        // The chunks' partials, or (one chunk per output: never written) the output again.
        let partials = if chunks > 1 {
            Some((
                self.output(DType::F32, n_out * chunks)?,
                self.output(DType::U32, n_out * chunks)?,
            ))
        } else {
            None
        };
        let (value, index) = partials.as_ref().map_or((out.ptr, out.ptr), |(v, i)| (v.ptr, i.ptr));
        let group = group_for(chunk_len);
        let cfg = self.gpu.blocks((n_out * chunks).div_ceil((BLOCK / group) as usize))?;
        launch!(&self.gpu, reduce, cfg;
            &out.ptr, &out.ptr, &value, &index, &s.ptr, &n_out32, &n_red32, &offset, &kept, &reduced,
            &kind_index, &group, &chunk_len32);
        if chunks > 1 {
            let group = group_for(chunks);
            let cfg = self.gpu.blocks(n_out.div_ceil((BLOCK / group) as usize))?;
            launch!(&self.gpu, combine, cfg;
                &out.ptr, &out.ptr, &value, &index, &n_out32, &chunks32, &kind_index, &group);
        }
        Ok(out)
    }
}
