//! reduce (reduce.cu): sum, max, min and argmax over any set of axes of a strided tensor.

use lockstep_core::backend::{BackendBuffer, BufferRef, ReduceKind, split_axes};
use lockstep_core::shape::Layout;
use lockstep_core::{DType, Result};

use crate::backend::{CudaBackend, float_suffix};
use crate::gpu::{BLOCK, launch};
use crate::views::{sub_shape, to_u32};

/// Threads that share one output: a warp for short reductions, a block for long ones.
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
        let suffix = float_suffix(op, s.dtype())?;
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
        let group = group_for(n_red);
        let cfg = self.gpu.blocks(n_out.div_ceil((BLOCK / group) as usize))?;
        let (n_out32, n_red32, offset) = (to_u32(op, n_out)?, to_u32(op, n_red)?, to_u32(op, layout.offset)?);
        launch!(&self.gpu, lockstep_kernels::REDUCE, format!("reduce_{suffix}"), cfg;
            &out.ptr, &out.ptr, &s.ptr, &n_out32, &n_red32, &offset, &kept, &reduced, &kind_index, &group);
        Ok(out)
    }
}
