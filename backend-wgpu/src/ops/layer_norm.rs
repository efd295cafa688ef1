//! layer_norm_last and its gradient (layer_norm.wgsl): a group of invocations per row.

use lockstep_core::Result;
use lockstep_core::backend::BufferRef;
use lockstep_core::shape::Layout;

use crate::backend::{WgpuBackend, to_u32};
use crate::pipelines::Variant;

impl WgpuBackend {
    /// The normalised rows of `src`, or (with `grad`) the gradient at `src`.
    pub(crate) fn layer_norm_rows(
        &self,
        src: &BufferRef,
        grad: Option<&BufferRef>,
        rows: usize,
        cols: usize,
        eps: f64,
    ) -> Result<BufferRef> {
        let (op, entry) = match grad {
            None => ("layer_norm_last", "layer_norm"),
            Some(_) => ("layer_norm_last_backward", "layer_norm_backward"),
        };
        let layout = Layout::contiguous([rows, cols]);
        let src = self.operand(op, src, Some(&layout))?;
        let t = self.float_type(op, src.dtype())?;
        let out = self.alloc("layer_norm_rows", src.dtype(), rows * cols)?;
        if rows * cols == 0 {
            return Ok(out);
        }
        let (group, workgroups) = self.row_groups(op, rows, cols)?;
        let params = [to_u32(op, rows)?, to_u32(op, cols)?, (eps as f32).to_bits(), group];
        let variant = Variant::new("layer_norm", entry, &[t]);
        match grad {
            None => self.launch(&variant, &params, &[(1, src), (3, &out)], workgroups)?,
            Some(grad) => {
                let grad = self.operand(op, grad, Some(&layout))?;
                let bindings = [(1, src), (2, grad), (3, &out)];
                self.launch(&variant, &params, &bindings, workgroups)?
            }
        }
        Ok(out as BufferRef)
    }
}
