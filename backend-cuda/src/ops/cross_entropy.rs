//! The mean cross-entropy's row losses and gradient in one pass per row of the logits, and its
//! backward pass, which scales that gradient by the loss' (cross_entropy.cu).

use lockstep_core::backend::{BackendBuffer, BufferRef, CrossEntropy};
use lockstep_core::shape::Layout;
use lockstep_core::{DType, Result};

use super::reduce::group_for;
use crate::backend::CudaBackend;
use crate::entry_points;
use crate::gpu::{BLOCK, launch};
use crate::views::to_u32;

impl CudaBackend {
    /// `Backend::cross_entropy`: F32 row losses and, with `spec.grad`, the gradient in the logits' dtype.
    pub(crate) fn cross_entropy_rows(
        &self,
        logits: &BufferRef,
        targets: &BufferRef,
        spec: &CrossEntropy,
    ) -> Result<(BufferRef, Option<BufferRef>)> {
        let op = CrossEntropy::name(false);
        let x = self.operand(op, logits, Some(&Layout::contiguous([spec.rows, spec.classes])))?;
        let t = self.ids(op, targets, spec.rows)?;
        let entry = entry_points::CROSS_ENTROPY.of(op, x.dtype())?;
        let losses = self.output(DType::F32, spec.rows)?;
        let grad = spec.grad.then(|| self.output(x.dtype(), x.len())).transpose()?;
        if spec.rows * spec.classes == 0 {
            return Ok((losses, grad.map(|g| g as BufferRef)));
        }
        // Every element's flat index must fit the kernel's u32 arithmetic.
        to_u32(op, spec.rows * spec.classes)?;
        let group = group_for(spec.classes);
        let cfg = self.gpu.blocks(spec.rows.div_ceil((BLOCK / group) as usize))?;
        let (rows, classes) = (to_u32(op, spec.rows)?, to_u32(op, spec.classes)?);
        let (inv_rows, write_grad) = (spec.inv_rows(), u32::from(spec.grad));
        // Without a gradient the kernel writes none: the logits stand in for its pointer.
        let dlogits = grad.as_ref().map_or(x.ptr, |g| g.ptr);
        launch!(&self.gpu, entry, cfg;
            &losses.ptr, &dlogits, &x.ptr, &t.ptr, &rows, &classes, &inv_rows, &write_grad, &group);
        Ok((losses, grad.map(|g| g as BufferRef)))
    }

    /// `Backend::cross_entropy_backward`: `dlogits * grad[0]`, the gradient read on the device.
    pub(crate) fn cross_entropy_scaled(
        &self,
        dlogits: &BufferRef,
        grad: &BufferRef,
        spec: &CrossEntropy,
    ) -> Result<BufferRef> {
        let op = CrossEntropy::name(true);
        let n = spec.rows * spec.classes;
        let d = self.operand(op, dlogits, Some(&Layout::contiguous([n])))?;
        let g = self.operand(op, grad, Some(&Layout::contiguous([1])))?;
        CrossEntropy::check_upstream(g.dtype(), g.len())?;
        let entry = entry_points::CROSS_ENTROPY_BACKWARD.of(op, d.dtype())?;
        let out = self.output(d.dtype(), n)?;
        if n == 0 {
            return Ok(out);
        }
        let n32 = to_u32(op, n)?;
        launch!(&self.gpu, entry,
            self.gpu.grid(n); &out.ptr, &d.ptr, &g.ptr, &n32);
        Ok(out)
    }
}
