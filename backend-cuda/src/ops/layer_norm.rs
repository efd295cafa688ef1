//! layer_norm_last with its affine part and its gradients (layer_norm.cu) over the last axis of
//! a contiguous [rows, cols]: a group of threads per row forward, one launch; backward a group per
//! chunk of rows writes the input's gradient and the chunk's column sums, and with a weight or
//! bias a second launch adds the chunks in order (`gpu_plan::layer_norm_chunk_rows`, so every GPU sums
//! in the same order).

use lockstep_core::backend::gpu_plan::{layer_norm_chunk_rows, layer_norm_flags};
use lockstep_core::backend::{BackendBuffer, BufferRef, LayerNormAffine, LayerNormGrads, LayerNormSpec, mixed};
use lockstep_core::shape::Layout;
use lockstep_core::{DType, Result};

use super::reduce::group_for;
use crate::backend::CudaBackend;
use crate::entry_points;
use crate::gpu::{BLOCK, launch};
use crate::views::to_u32;

impl CudaBackend {
    /// `Backend::layer_norm_last_to` (and `layer_norm_last`, `out` the input's dtype): an f32
    /// input's output rounded to a half type in the same launch; other pairs composed.
    pub(crate) fn layer_norm_forward(
        &self,
        src: &BufferRef,
        affine: LayerNormAffine<'_>,
        spec: &LayerNormSpec,
        out: DType,
    ) -> Result<BufferRef> {
        const OP: &str = "layer_norm";
        affine.check(OP, src, spec)?;
        let entry = match (src.dtype(), out) {
            (from, to) if from == to => entry_points::LAYER_NORM.of(OP, from)?,
            (DType::F32, DType::F16 | DType::BF16) => entry_points::LAYER_NORM_TO_HALF.of(OP, out)?,
            _ => return mixed::layer_norm_last_to(self, src, affine, spec, out),
        };
        let (rows, cols) = (spec.rows, spec.cols);
        let s = self.operand(OP, src, Some(&Layout::contiguous([rows, cols])))?;
        let out = self.output(out, rows * cols)?;
        if rows * cols == 0 {
            return Ok(out);
        }
        to_u32(OP, rows * cols)?;
        // An absent part's pointer is the input's, which the kernel then never reads.
        let weight = self.operand(OP, affine.weight.unwrap_or(src), None)?;
        let bias = self.operand(OP, affine.bias.unwrap_or(src), None)?;
        let group = group_for(cols);
        let cfg = self.gpu.blocks(rows.div_ceil((BLOCK / group) as usize))?;
        let (rows32, cols32, eps32, flags) = (
            to_u32(OP, rows)?,
            to_u32(OP, cols)?,
            spec.eps as f32,
            layer_norm_flags(&affine, false),
        );
        launch!(&self.gpu, entry, cfg;
            &out.ptr, &s.ptr, &weight.ptr, &bias.ptr, &rows32, &cols32, &eps32, &group, &flags);
        Ok(out)
    }

    /// `Backend::layer_norm_last_to_backward` (and `layer_norm_last_backward`): a half gradient
    /// of an f32 input's output widened in the same launch; other pairs composed.
    pub(crate) fn layer_norm_backward(
        &self,
        grad: &BufferRef,
        src: &BufferRef,
        affine: LayerNormAffine<'_>,
        spec: &LayerNormSpec,
    ) -> Result<LayerNormGrads> {
        const OP: &str = "layer_norm_backward";
        let entry = match (src.dtype(), grad.dtype()) {
            (DType::F32, DType::F16 | DType::BF16) => {
                affine.check(OP, src, spec)?;
                entry_points::LAYER_NORM_BACKWARD_FROM_HALF.of(OP, grad.dtype())?
            }
            (from, to) if from == to => {
                affine.check_backward(OP, grad, src, spec)?;
                entry_points::LAYER_NORM_BACKWARD.of(OP, from)?
            }
            _ => return mixed::layer_norm_last_to_backward(self, grad, src, affine, spec),
        };
        let (rows, cols) = (spec.rows, spec.cols);
        let layout = Layout::contiguous([rows, cols]);
        let s = self.operand(OP, src, Some(&layout))?;
        let g = self.operand(OP, grad, Some(&layout))?;
        let sums_entry = entry_points::LAYER_NORM_COLUMN_SUMS.of(OP, s.dtype())?;
        let dx = self.output(s.dtype(), rows * cols)?;
        let sums = affine.any();
        let mut grads = LayerNormGrads {
            input: dx.clone(),
            weight: None,
            bias: None,
        };
        if rows * cols == 0 {
            return LayerNormGrads::of_empty(dx, &affine, || self.fill(s.dtype(), cols, 0.0));
        }
        to_u32(OP, rows * cols)?;
        let chunk_rows = layer_norm_chunk_rows(&affine, rows);
        let chunks = rows.div_ceil(chunk_rows);
        let parts = self.output(DType::F32, if sums { 2 * chunks * cols } else { 1 })?;
        let weight = self.operand(OP, affine.weight.unwrap_or(src), None)?;
        let group = group_for(cols);
        let cfg = self.gpu.blocks(chunks.div_ceil((BLOCK / group) as usize))?;
        let (rows32, cols32, eps32) = (to_u32(OP, rows)?, to_u32(OP, cols)?, spec.eps as f32);
        let flags = layer_norm_flags(&affine, true);
        let (chunk_rows32, chunks32) = (to_u32(OP, chunk_rows)?, to_u32(OP, chunks)?);
        launch!(&self.gpu, entry, cfg;
            &dx.ptr, &parts.ptr, &g.ptr, &s.ptr, &weight.ptr, &rows32, &cols32, &eps32, &group, &flags,
            &chunk_rows32, &chunks32);
        if !sums {
            return Ok(grads);
        }
        let (dweight, dbias) = (self.output(s.dtype(), cols)?, self.output(s.dtype(), cols)?);
        let cfg = self.gpu.blocks(cols.div_ceil(BLOCK as usize))?;
        launch!(&self.gpu, sums_entry, cfg;
            &dweight.ptr, &dbias.ptr, &parts.ptr, &cols32, &chunks32);
        grads.weight = affine.weight.map(|_| dweight as BufferRef);
        grads.bias = affine.bias.map(|_| dbias as BufferRef);
        Ok(grads)
    }
}
