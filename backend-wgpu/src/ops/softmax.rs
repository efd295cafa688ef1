//! softmax_last, log_softmax_last and the softmax's gradient, and attention's fused weights
//! (`causal_softmax`) with theirs (softmax.wgsl).

use lockstep_core::backend::{BufferRef, CausalSoftmax};
use lockstep_core::shape::Layout;
use lockstep_core::{Error, Result};

use crate::backend::{WgpuBackend, to_u32};
use crate::pipelines::Variant;

impl WgpuBackend {
    pub(crate) fn softmax_rows(&self, src: &BufferRef, rows: usize, cols: usize, log: bool) -> Result<BufferRef> {
        let op = if log { "log_softmax_last" } else { "softmax_last" };
        let src = self.operand(op, src, None)?;
        if src.len() < rows * cols {
            return Err(Error::invalid(
                op,
                format!("{rows}x{cols} does not fit a buffer of {} elements", src.len()),
            ));
        }
        let t = self.float_type(op, src.dtype())?;
        let out = self.alloc("softmax_rows", src.dtype(), rows * cols)?;
        if cols == 0 {
            return Ok(out);
        }
        let (group, workgroups) = self.row_groups(op, rows, cols)?;
        self.launch(
            &Variant::new("softmax", "softmax", &[t]).constant("LOG", f64::from(u8::from(log))),
            &[to_u32(op, rows)?, to_u32(op, cols)?, group],
            &[(1, src), (2, &out)],
            workgroups,
        )?;
        Ok(out)
    }

    /// `out * (grad - sum(grad * out))` per row of a contiguous [rows, cols].
    pub(crate) fn softmax_backward_rows(
        &self,
        grad: &BufferRef,
        out: &BufferRef,
        rows: usize,
        cols: usize,
    ) -> Result<BufferRef> {
        const OP: &str = "softmax_last_backward";
        let layout = Layout::contiguous([rows, cols]);
        let (g, y) = (
            self.operand(OP, grad, Some(&layout))?,
            self.operand(OP, out, Some(&layout))?,
        );
        let t = self.float_type(OP, y.dtype())?;
        let dx = self.alloc("softmax_backward_rows", y.dtype(), rows * cols)?;
        if rows * cols == 0 {
            return Ok(dx);
        }
        let (group, workgroups) = self.row_groups(OP, rows, cols)?;
        self.launch(
            &Variant::new("softmax", "softmax_backward", &[t]),
            &[to_u32(OP, rows)?, to_u32(OP, cols)?, group],
            &[(1, y), (2, &dx), (3, g)],
            workgroups,
        )?;
        Ok(dx)
    }

    /// `Backend::causal_softmax` (no `grad`) or its backward pass (`grad` given), a group of
    /// invocations per row of the contiguous `[rows, t]` scores.
    pub(crate) fn causal_softmax_rows(
        &self,
        scores: &BufferRef,
        grad: Option<&BufferRef>,
        spec: &CausalSoftmax,
    ) -> Result<BufferRef> {
        let op = CausalSoftmax::name(grad.is_some());
        let layout = Layout::contiguous([spec.rows, spec.t]);
        let x = self.operand(op, scores, Some(&layout))?;
        let g = grad.map(|g| self.operand(op, g, Some(&layout))).transpose()?;
        let t = self.float_type(op, x.dtype())?;
        let out = self.alloc("causal_softmax_rows", x.dtype(), spec.rows * spec.t)?;
        if spec.rows * spec.t == 0 {
            return Ok(out);
        }
        let (dropout, seed, counter, p, keep) = spec.kernel_dropout();
        let (group, workgroups) = self.row_groups(op, spec.rows, spec.t)?;
        let params = [
            to_u32(op, spec.rows)?,
            to_u32(op, spec.t)?,
            (spec.scale as f32).to_bits(),
            dropout,
            seed as u32,
            (seed >> 32) as u32,
            counter as u32,
            (counter >> 32) as u32,
            p.to_bits(),
            keep.to_bits(),
            group,
        ];
        // Every element's flat index must fit the shader's u32 arithmetic.
        to_u32(op, spec.rows * spec.t)?;
        let mut bindings = vec![(1, x), (2, &out)];
        bindings.extend(g.map(|g| (3, g)));
        self.launch(&Variant::new("softmax", op, &[t]), &params, &bindings, workgroups)?;
        Ok(out)
    }
}
