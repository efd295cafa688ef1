//! axpy, sgd_step and adam_step (optim.cu): in place on contiguous parameters and state; the
//! step's constants folded in f64 on the host, as the CPU does.

use lockstep_core::backend::{AdamStep, BackendBuffer, BufferRef, SgdStep};
use lockstep_core::shape::Layout;
use lockstep_core::{Error, Result};

use crate::backend::CudaBackend;
use crate::buffer::CudaBuffer;
use crate::entry_points::{self, EntryPoint, Floats};
use crate::gpu::launch;
use crate::views::to_u32;

impl CudaBackend {
    /// The operands of an update (same dtype and length as the first) and `kernel`'s entry
    /// point for their dtype.
    fn update_operands<'a>(
        &self,
        op: &'static str,
        kernel: Floats,
        bufs: &[&'a BufferRef],
    ) -> Result<(Vec<&'a CudaBuffer>, EntryPoint, u32)> {
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
        Ok((all, kernel.of(op, first.dtype())?, to_u32(op, first.len())?))
    }

    pub(crate) fn add_scaled(&self, dst: &BufferRef, src: &BufferRef, alpha: f64) -> Result<()> {
        let (b, axpy, n) = self.update_operands("axpy", entry_points::AXPY, &[dst, src])?;
        if n > 0 {
            launch!(&self.gpu, axpy, self.gpu.grid(n as usize);
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
        let (b, sgd_step, n) = self.update_operands("sgd_step", entry_points::SGD_STEP, &all)?;
        let (keep, take) = if s.first_step {
            (0.0, 1.0)
        } else {
            (s.momentum, 1.0 - s.dampening)
        };
        // A null momentum pointer selects plain SGD in the kernel.
        let momentum_ptr: u64 = b.get(2).map_or(0, |m| m.ptr);
        let f = |x: f64| x as f32;
        if n > 0 {
            launch!(&self.gpu, sgd_step, self.gpu.grid(n as usize);
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
        let (b, adam_step, n) = self.update_operands("adam_step", entry_points::ADAM_STEP, &[param, grad, m, v])?;
        let k = s.constants().in_kernel_order().map(|x| x as f32);
        if n > 0 {
            launch!(&self.gpu, adam_step, self.gpu.grid(n as usize);
                &b[0].ptr, &b[1].ptr, &b[2].ptr, &b[3].ptr, &n, &k[0], &k[1], &k[2], &k[3], &k[4], &k[5], &k[6],
                &k[7], &k[8]);
        }
        Ok(())
    }
}
