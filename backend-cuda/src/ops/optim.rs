//! axpy, sgd_step and adam_step (optim.cu): in place on contiguous parameters and state; the
//! step's constants folded in f64 on the host, as the CPU does.

use lockstep_core::backend::{AdamStep, BackendBuffer, BufferRef, SgdStep};
use lockstep_core::shape::Layout;
use lockstep_core::{Error, Result};

use crate::backend::{CudaBackend, float_suffix};
use crate::buffer::CudaBuffer;
use crate::gpu::launch;
use crate::views::to_u32;

impl CudaBackend {
    /// The operands of an update: same dtype and length as the first.
    fn update_operands<'a>(
        &self,
        op: &'static str,
        bufs: &[&'a BufferRef],
    ) -> Result<(Vec<&'a CudaBuffer>, &'static str, u32)> {
        let first = self.operand(op, bufs[0], None)?;
        let layout = Layout::contiguous([first.len()]);
        let mut all = vec![first];
        for b in &bufs[1..] {
            let other = self.operand(op, b, Some(&layout))?;
            self.same_dtype(op, first, other)?;
            if other.len() != first.len() {
                return Err(Error::invalid(
                    op,
                    format!("lengths differ: {} and {}", first.len(), other.len()),
                ));
            }
            all.push(other);
        }
        let suffix = float_suffix(op, first.dtype())?;
        Ok((all, suffix, to_u32(op, first.len())?))
    }

    pub(crate) fn add_scaled(&self, dst: &BufferRef, src: &BufferRef, alpha: f64) -> Result<()> {
        let (b, suffix, n) = self.update_operands("axpy", &[dst, src])?;
        if n > 0 {
            launch!(&self.gpu, lockstep_kernels::OPTIM, format!("axpy_{suffix}"), self.gpu.grid(n as usize);
                &b[0].ptr, &b[1].ptr, &n, &(alpha as f32));
        }
        Ok(())
    }

    pub(crate) fn sgd(
        &self,
        param: &BufferRef,
        grad: &BufferRef,
        momentum_buf: Option<&BufferRef>,
        s: &SgdStep,
    ) -> Result<()> {
        let mut all = vec![param, grad];
        all.extend(momentum_buf);
        let (b, suffix, n) = self.update_operands("sgd_step", &all)?;
        let (keep, take) = if s.first_step {
            (0.0, 1.0)
        } else {
            (s.momentum, 1.0 - s.dampening)
        };
        // A null momentum pointer selects plain SGD in the kernel.
        let momentum_ptr: u64 = b.get(2).map_or(0, |m| m.ptr);
        let f = |x: f64| x as f32;
        if n > 0 {
            launch!(&self.gpu, lockstep_kernels::OPTIM, format!("sgd_step_{suffix}"), self.gpu.grid(n as usize);
                &b[0].ptr, &b[1].ptr, &momentum_ptr, &n, &f(s.lr), &f(s.weight_decay), &f(keep), &f(take),
                &f(s.momentum), &u32::from(s.nesterov));
        }
        Ok(())
    }

    pub(crate) fn adam(
        &self,
        param: &BufferRef,
        grad: &BufferRef,
        m: &BufferRef,
        v: &BufferRef,
        s: &AdamStep,
    ) -> Result<()> {
        let (b, suffix, n) = self.update_operands("adam_step", &[param, grad, m, v])?;
        let k = s.constants().in_kernel_order().map(|x| x as f32);
        if n > 0 {
            launch!(&self.gpu, lockstep_kernels::OPTIM, format!("adam_step_{suffix}"), self.gpu.grid(n as usize);
                &b[0].ptr, &b[1].ptr, &b[2].ptr, &b[3].ptr, &n, &k[0], &k[1], &k[2], &k[3], &k[4], &k[5], &k[6],
                &k[7], &k[8]);
        }
        Ok(())
    }
}
