//! reduce (reduce.cu): sum, max, min and argmax over any set of axes of a strided tensor.

use lockstep_core::backend::{BackendBuffer, BufferRef, ReduceKind};
use lockstep_core::shape::Layout;
use lockstep_core::{DType, Error, Result};

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
        let rank = layout.shape.rank();
        if axes.iter().any(|&a| a >= rank) || axes.windows(2).any(|w| w[0] >= w[1]) {
            return Err(Error::invalid(
                op,
                format!("axes {axes:?} must be sorted, unique and below rank {rank}"),
            ));
        }
        if kind == ReduceKind::ArgMax && axes.len() != 1 {
            return Err(Error::invalid(op, "argmax reduces exactly one axis"));
        }
        let (mut kept, mut reduced) = ((vec![], vec![]), (vec![], vec![]));
        for (axis, (&d, &st)) in layout.dims().iter().zip(&layout.strides).enumerate() {
            let part = if axes.contains(&axis) { &mut reduced } else { &mut kept };
            part.0.push(d);
            part.1.push(st);
        }
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
