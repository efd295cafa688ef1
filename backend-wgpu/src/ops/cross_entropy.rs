//! The mean cross-entropy's row losses and gradient in one pass per row of the logits, and its
//! backward pass, which scales that gradient by the loss' (cross_entropy.wgsl). bf16 logits are
//! read and the gradient written in their packed words.

use lockstep_core::backend::{BufferRef, CrossEntropy};
use lockstep_core::shape::Layout;
use lockstep_core::{DType, Result};

use crate::backend::{WgpuBackend, to_u32};
use crate::pipelines::Variant;

impl WgpuBackend {
    /// `Backend::cross_entropy`: F32 row losses and, with `spec.grad`, the gradient in the logits' dtype.
    pub(crate) fn cross_entropy_rows(
        &self,
        logits: &BufferRef,
        targets: &BufferRef,
        spec: &CrossEntropy,
    ) -> Result<(BufferRef, Option<BufferRef>)> {
        let op = CrossEntropy::name(false);
        let n = spec.rows * spec.classes;
        let x = self.operand(op, logits, Some(&Layout::contiguous([n])))?;
        let t = self.ids(op, targets, spec.rows)?;
        let ty = self.element_type(op, x.dtype())?;
        let losses = self.alloc("cross_entropy", DType::F32, spec.rows)?;
        // Without a gradient the shader writes none: a one-element stand-in fills its binding.
        let out = self.alloc("cross_entropy", x.dtype(), if spec.grad { n } else { 1 })?;
        if n == 0 {
            return Ok((losses, spec.grad.then_some(out as BufferRef)));
        }
        // Every element's flat index must fit the shader's u32 arithmetic.
        to_u32(op, n)?;
        let lse = self.alloc("cross_entropy", DType::F32, spec.rows)?;
        let (group, workgroups) = self.row_groups(op, spec.rows, spec.classes)?;
        let params = [
            to_u32(op, spec.rows)?,
            to_u32(op, spec.classes)?,
            group,
            spec.inv_rows().to_bits(),
            u32::from(spec.grad),
        ];
        self.launch(
            &Variant::new("cross_entropy", "cross_entropy", &[ty]),
            &params,
            &[(1, x), (2, t), (3, &losses), (4, &out), (5, &lse)],
            workgroups,
        )?;
        // bf16 rows of odd length share a storage word at every other seam.
        if spec.grad && x.dtype() == DType::BF16 && spec.classes % 2 == 1 {
            self.launch(
                &Variant::new("cross_entropy", "cross_entropy_seams", &[ty]),
                &params,
                &[(1, x), (2, t), (4, &out), (5, &lse)],
                self.grid(op, spec.rows)?,
            )?;
        }
        Ok((losses, spec.grad.then_some(out as BufferRef)))
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
        let ty = self.element_type(op, d.dtype())?;
        let out = self.alloc("cross_entropy_scaled", d.dtype(), n)?;
        if n == 0 {
            return Ok(out);
        }
        let words = n.div_ceil(if d.dtype() == DType::BF16 { 2 } else { 1 });
        self.launch(
            &Variant::new("cross_entropy", "cross_entropy_backward", &[ty]),
            &[to_u32(op, n)?, to_u32(op, words)?],
            &[(1, d), (4, &out), (6, g)],
            self.word_grid(op, d.dtype(), n)?,
        )?;
        Ok(out)
    }
}
