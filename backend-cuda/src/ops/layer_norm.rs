//! layer_norm_last and its gradient (layer_norm.cu) over the last axis of a contiguous
//! [rows, cols].

use lockstep_core::Result;
use lockstep_core::backend::{BackendBuffer, BufferRef};
use lockstep_core::shape::Layout;

use super::reduce::group_for;
use crate::backend::CudaBackend;
use crate::entry_points;
use crate::gpu::{BLOCK, launch};
use crate::views::to_u32;

impl CudaBackend {
    /// The normalised rows of `src`, or (with `grad`) the gradient at `src`.
    pub(crate) fn layer_norm_rows(
        &self,
        src: &BufferRef,
        grad: Option<&BufferRef>,
        rows: usize,
        cols: usize,
        eps: f64,
    ) -> Result<BufferRef> {
        let (op, kernel) = if grad.is_some() {
            ("layer_norm_backward", entry_points::LAYER_NORM_BACKWARD)
        } else {
            ("layer_norm", entry_points::LAYER_NORM)
        };
        let layout = Layout::contiguous([rows, cols]);
        let s = self.operand(op, src, Some(&layout))?;
        let entry = kernel.of(op, s.dtype())?;
        let out = self.output(s.dtype(), rows * cols)?;
        if rows * cols == 0 {
            return Ok(out);
        }
        let group = group_for(cols);
        let cfg = self.gpu.blocks(rows.div_ceil((BLOCK / group) as usize))?;
        let (rows32, cols32, eps32) = (to_u32(op, rows)?, to_u32(op, cols)?, eps as f32);
        match grad {
            None => launch!(&self.gpu, entry, cfg;
                &out.ptr, &s.ptr, &rows32, &cols32, &eps32, &group),
            Some(grad) => {
                let g = self.operand(op, grad, Some(&layout))?;
                launch!(&self.gpu, entry, cfg;
                    &out.ptr, &g.ptr, &s.ptr, &rows32, &cols32, &eps32, &group)
            }
        }
        Ok(out)
    }
}
