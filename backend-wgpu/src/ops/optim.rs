//! axpy, sgd_step and adam_step (optim.wgsl): fused, in place, f32. The per-step constants are
//! folded in f64 exactly as the CPU backend folds them.

use lockstep_core::backend::{AdamStep, BufferRef, SgdStep};
use lockstep_core::{DType, Error, Result};

use crate::backend::{WgpuBackend, to_u32};
use crate::buffer::WgpuBuffer;
use crate::pipelines::Variant;

fn bits(x: f64) -> u32 {
    (x as f32).to_bits()
}

impl WgpuBackend {
    /// The buffers of an update: f32, and each as long as the first.
    fn f32_operands<'a>(&self, op: &'static str, buffers: &[&'a BufferRef]) -> Result<Vec<&'a WgpuBuffer>> {
        let out: Vec<&WgpuBuffer> = buffers
            .iter()
            .map(|b| self.operand(op, b, None))
            .collect::<Result<_>>()?;
        for b in &out {
            if b.dtype() != DType::F32 {
                return Err(Error::UnsupportedDType {
                    op,
                    dtype: b.dtype(),
                    hint: "; parameters and optimizer state are f32 (master weights)",
                });
            }
            if b.len() < out[0].len() {
                return Err(Error::invalid(
                    op,
                    format!("a buffer of {} elements, {} needed", b.len(), out[0].len()),
                ));
            }
        }
        Ok(out)
    }

    fn update(&self, entry: &'static str, params: Vec<u32>, buffers: &[&WgpuBuffer]) -> Result<()> {
        let bindings: Vec<(u32, &WgpuBuffer)> = buffers.iter().enumerate().map(|(i, b)| (i as u32 + 1, *b)).collect();
        self.launch(
            &Variant::new("optim", entry, &[]),
            &params,
            &bindings,
            self.grid(entry, buffers[0].len())?,
        )
    }

    pub(crate) fn add_scaled(&self, dst: &BufferRef, src: &BufferRef, alpha: f64) -> Result<()> {
        let b = self.f32_operands("axpy", &[dst, src])?;
        self.update("axpy", vec![to_u32("axpy", b[0].len())?, bits(alpha)], &b)
    }

    pub(crate) fn sgd(
        &self,
        param: &BufferRef,
        grad: &BufferRef,
        momentum_buf: Option<&BufferRef>,
        s: &SgdStep,
    ) -> Result<()> {
        let (keep, take) = if s.first_step {
            (0.0, 1.0)
        } else {
            (s.momentum, 1.0 - s.dampening)
        };
        let mut all = vec![param, grad];
        all.extend(momentum_buf);
        let b = self.f32_operands("sgd_step", &all)?;
        let params = vec![
            to_u32("sgd_step", b[0].len())?,
            bits(s.lr),
            bits(s.weight_decay),
            bits(keep),
            bits(take),
            bits(s.momentum),
            u32::from(s.nesterov),
        ];
        let entry = if momentum_buf.is_some() {
            "sgd_momentum_step"
        } else {
            "sgd_step"
        };
        self.update(entry, params, &b)
    }

    pub(crate) fn adam(
        &self,
        param: &BufferRef,
        grad: &BufferRef,
        m: &BufferRef,
        v: &BufferRef,
        s: &AdamStep,
    ) -> Result<()> {
        let b = self.f32_operands("adam_step", &[param, grad, m, v])?;
        let mut params = vec![to_u32("adam_step", b[0].len())?];
        params.extend(s.constants().in_kernel_order().map(bits));
        self.update("adam_step", params, &b)
    }
}
