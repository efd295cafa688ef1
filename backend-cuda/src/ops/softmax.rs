//! softmax_last, log_softmax_last and the softmax's gradient (softmax.cu) over the last axis of
//! a contiguous [rows, cols], and attention's fused weights (`causal_softmax`) with theirs.

use lockstep_core::Result;
use lockstep_core::backend::{BackendBuffer, BufferRef, CausalSoftmax};
use lockstep_core::shape::Layout;

use super::reduce::group_for;
use crate::backend::CudaBackend;
use crate::entry_points;
use crate::gpu::{BLOCK, launch};
use crate::views::to_u32;

impl CudaBackend {
    pub(crate) fn softmax_rows(&self, src: &BufferRef, rows: usize, cols: usize, log: bool) -> Result<BufferRef> {
        let op = if log { "log_softmax" } else { "softmax" };
        let s = self.operand(op, src, Some(&Layout::contiguous([rows, cols])))?;
        let entry = entry_points::SOFTMAX.of(op, s.dtype())?;
        let out = self.output(s.dtype(), rows * cols)?;
        if rows * cols == 0 {
            return Ok(out);
        }
        let group = group_for(cols);
        let cfg = self.gpu.blocks(rows.div_ceil((BLOCK / group) as usize))?;
        let (rows32, cols32, log_form) = (to_u32(op, rows)?, to_u32(op, cols)?, u32::from(log));
        launch!(&self.gpu, entry, cfg;
            &out.ptr, &s.ptr, &rows32, &cols32, &log_form, &group);
        Ok(out)
    }

    /// `out * (grad - sum(grad * out))` per row.
    pub(crate) fn softmax_backward_rows(
        &self,
        grad: &BufferRef,
        out: &BufferRef,
        rows: usize,
        cols: usize,
    ) -> Result<BufferRef> {
        const OP: &str = "softmax_backward";
        let layout = Layout::contiguous([rows, cols]);
        let (g, y) = (
            self.operand(OP, grad, Some(&layout))?,
            self.operand(OP, out, Some(&layout))?,
        );
        let entry = entry_points::SOFTMAX_BACKWARD.of(OP, y.dtype())?;
        let dx = self.output(y.dtype(), rows * cols)?;
        if rows * cols == 0 {
            return Ok(dx);
        }
        let group = group_for(cols);
        let cfg = self.gpu.blocks(rows.div_ceil((BLOCK / group) as usize))?;
        let (rows32, cols32) = (to_u32(OP, rows)?, to_u32(OP, cols)?);
        launch!(&self.gpu, entry, cfg;
            &dx.ptr, &g.ptr, &y.ptr, &rows32, &cols32, &group);
        Ok(dx)
    }

    /// `Backend::causal_softmax` (no `grad`) or its backward pass (`grad` given) over the
    /// contiguous `[rows, t]` scores.
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
        let kernel = match grad {
            None => entry_points::CAUSAL_SOFTMAX,
            Some(_) => entry_points::CAUSAL_SOFTMAX_BACKWARD,
        };
        let entry = kernel.of(op, x.dtype())?;
        let out = self.output(x.dtype(), spec.rows * spec.t)?;
        if spec.rows * spec.t == 0 {
            return Ok(out);
        }
        // Every element's flat index must fit the kernel's u32 arithmetic.
        to_u32(op, spec.rows * spec.t)?;
        let group = group_for(spec.t);
        let cfg = self.gpu.blocks(spec.rows.div_ceil((BLOCK / group) as usize))?;
        let (rows, t, scale) = (to_u32(op, spec.rows)?, to_u32(op, spec.t)?, spec.scale as f32);
        let (dropout, seed, counter, p, keep) = spec.kernel_dropout();
        match g {
            None => launch!(&self.gpu, entry, cfg;
                &out.ptr, &x.ptr, &rows, &t, &scale, &dropout, &seed, &counter, &p, &keep, &group),
            Some(g) => launch!(&self.gpu, entry, cfg;
                &out.ptr, &g.ptr, &x.ptr, &rows, &t, &scale, &dropout, &seed, &counter, &p, &keep, &group),
        }
        Ok(out)
    }
}
