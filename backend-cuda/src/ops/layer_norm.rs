//! layer_norm_last with its affine part and its gradients (layer_norm.cu) over the last axis of
//! a contiguous [rows, cols]: a group of threads per row forward, one launch (also with the
//! residual add before it: add_layer_norm); backward a group per chunk of rows writes the input's
//! gradient (its other uses' gradient added, and rounded for a 16-bit branch, where asked) and
//! the chunk's column sums, and with a weight or bias a second launch adds the chunks in order
//! (`gpu_plan::layer_norm_chunk_rows`, so every GPU sums in the same order).

use cudarc::driver::LaunchConfig;
use lockstep_core::backend::gpu_plan::{layer_norm_chunk_rows, layer_norm_flags};
use lockstep_core::backend::{
    BackendBuffer, BufferRef, InputGradient, LayerNormAffine, LayerNormGrads, LayerNormSpec, mixed,
};
use lockstep_core::shape::Layout;
use lockstep_core::{DType, Result};

use super::reduce::group_for;
use crate::backend::CudaBackend;
use crate::buffer::CudaBuffer;
use crate::entry_points;
use crate::gpu::{BLOCK, launch};
use crate::views::to_u32;

/// The backward kernel's flags beyond `layer_norm_flags`': `accumulated` read and added, the
/// sum also written rounded to the output gradient's half type.
const LN_ACCUMULATE: u32 = 8;
const LN_ROUNDED: u32 = 16;

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
        let s = self.operand(OP, src, Some(&Layout::contiguous([spec.rows, spec.cols])))?;
        let out = self.output(out, spec.rows * spec.cols)?;
        if spec.rows * spec.cols == 0 {
            return Ok(out);
        }
        let a = self.row_args(OP, src, affine, spec)?;
        launch!(&self.gpu, entry, a.cfg;
            &out.ptr, &s.ptr, &a.weight.ptr, &a.bias.ptr, &a.rows, &a.cols, &a.eps, &a.group, &a.flags);
        Ok(out)
    }

    /// `Backend::add_layer_norm_last_to`: the sum and its LayerNorm in one launch where the
    /// residual, the branch and the output share a dtype, or the residual is f32 and the branch
    /// and the output one half type; other combinations composed.
    pub(crate) fn add_layer_norm_forward(
        &self,
        residual: &BufferRef,
        branch: &BufferRef,
        affine: LayerNormAffine<'_>,
        spec: &LayerNormSpec,
        out: DType,
    ) -> Result<[BufferRef; 2]> {
        const OP: &str = "add_layer_norm";
        affine.check(OP, residual, spec)?;
        let entry = match (residual.dtype(), branch.dtype(), out) {
            (r, b, o) if r == b && b == o => entry_points::ADD_LAYER_NORM.of(OP, r)?,
            (DType::F32, h @ (DType::F16 | DType::BF16), o) if o == h => entry_points::ADD_LAYER_NORM_HALF.of(OP, h)?,
            _ => return mixed::add_layer_norm_last_to(self, residual, branch, affine, spec, out),
        };
        let layout = Layout::contiguous([spec.rows, spec.cols]);
        let r = self.operand(OP, residual, Some(&layout))?;
        let b = self.operand(OP, branch, Some(&layout))?;
        let sum = self.output(residual.dtype(), spec.rows * spec.cols)?;
        let normed = self.output(out, spec.rows * spec.cols)?;
        if spec.rows * spec.cols == 0 {
            return Ok([sum, normed]);
        }
        let a = self.row_args(OP, residual, affine, spec)?;
        launch!(&self.gpu, entry, a.cfg;
            &sum.ptr, &normed.ptr, &r.ptr, &b.ptr, &a.weight.ptr, &a.bias.ptr, &a.rows, &a.cols, &a.eps,
            &a.group, &a.flags);
        Ok([sum, normed])
    }

    /// The arguments a forward row kernel takes after its own pointers, and its grid: a group of
    /// threads per row of the non-empty `[spec.rows, spec.cols]`.
    fn row_args<'a>(
        &self,
        op: &'static str,
        src: &'a BufferRef,
        affine: LayerNormAffine<'a>,
        spec: &LayerNormSpec,
    ) -> Result<RowArgs<'a>> {
        to_u32(op, spec.rows * spec.cols)?;
        let group = group_for(spec.cols);
        Ok(RowArgs {
            // An absent part's pointer is the input's, which the kernel then never reads.
            weight: self.operand(op, affine.weight.unwrap_or(src), None)?,
            bias: self.operand(op, affine.bias.unwrap_or(src), None)?,
            rows: to_u32(op, spec.rows)?,
            cols: to_u32(op, spec.cols)?,
            eps: spec.eps as f32,
            group,
            flags: layer_norm_flags(&affine, false),
            cfg: self.gpu.blocks(spec.rows.div_ceil((BLOCK / group) as usize))?,
        })
    }

    /// `Backend::layer_norm_last_to_backward` (and `layer_norm_last_backward`, `input` empty): a
    /// half gradient of an f32 input's output widened in the same launch, `input`'s add and
    /// rounding to that half type there too; other pairs composed.
    pub(crate) fn layer_norm_backward(
        &self,
        grad: &BufferRef,
        src: &BufferRef,
        affine: LayerNormAffine<'_>,
        spec: &LayerNormSpec,
        input: InputGradient<'_>,
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
            _ => return mixed::layer_norm_last_to_backward(self, grad, src, affine, spec, input),
        };
        let (rows, cols) = (spec.rows, spec.cols);
        let layout = Layout::contiguous([rows, cols]);
        let s = self.operand(OP, src, Some(&layout))?;
        let g = self.operand(OP, grad, Some(&layout))?;
        let accumulated = match input.accumulated {
            Some(a) if a.dtype() == src.dtype() => Some(self.operand(OP, a, Some(&layout))?),
            _ => None,
        };
        // The kernel rounds to the gradient's own half type; another dtype is cast afterwards.
        let rounds = input.rounded == Some(grad.dtype()) && grad.dtype() != src.dtype();
        let sums_entry = entry_points::LAYER_NORM_COLUMN_SUMS.of(OP, s.dtype())?;
        let dx = self.output(s.dtype(), rows * cols)?;
        let sums = affine.any();
        if rows * cols == 0 {
            let mut grads = LayerNormGrads::of_empty(dx, &affine, || self.fill(s.dtype(), cols, 0.0))?;
            mixed::fold_input_gradient(self, &mut grads, spec, input)?;
            return Ok(grads);
        }
        to_u32(OP, rows * cols)?;
        let chunk_rows = layer_norm_chunk_rows(&affine, rows);
        let chunks = rows.div_ceil(chunk_rows);
        let parts = self.output(DType::F32, if sums { 2 * chunks * cols } else { 1 })?;
        let rounded = rounds.then(|| self.output(grad.dtype(), rows * cols)).transpose()?;
        // An absent operand's pointer is the input's, which the kernel then never reads.
        let weight = self.operand(OP, affine.weight.unwrap_or(src), None)?;
        let accumulated_ptr = accumulated.map_or(s.ptr, |a| a.ptr);
        let rounded_ptr = rounded.as_ref().map_or(dx.ptr, |r| r.ptr);
        let group = group_for(cols);
        let cfg = self.gpu.blocks(chunks.div_ceil((BLOCK / group) as usize))?;
        let (rows32, cols32, eps32) = (to_u32(OP, rows)?, to_u32(OP, cols)?, spec.eps as f32);
        let flags = layer_norm_flags(&affine, true)
            | if accumulated.is_some() { LN_ACCUMULATE } else { 0 }
            | if rounds { LN_ROUNDED } else { 0 };
        let (chunk_rows32, chunks32) = (to_u32(OP, chunk_rows)?, to_u32(OP, chunks)?);
        launch!(&self.gpu, entry, cfg;
            &dx.ptr, &rounded_ptr, &parts.ptr, &g.ptr, &s.ptr, &weight.ptr, &accumulated_ptr, &rows32, &cols32,
            &eps32, &group, &flags, &chunk_rows32, &chunks32);
        let mut grads = LayerNormGrads {
            input: dx,
            weight: None,
            bias: None,
            rounded_input: rounded.map(|r| r as BufferRef),
        };
        // What the kernel did not fold in: an accumulated gradient of another dtype, or a cast
        // to a dtype other than the gradient's.
        let rest = InputGradient {
            accumulated: input.accumulated.filter(|_| accumulated.is_none()),
            rounded: input.rounded.filter(|_| !rounds),
        };
        mixed::fold_input_gradient(self, &mut grads, spec, rest)?;
        if sums {
            let (dweight, dbias) = (self.output(s.dtype(), cols)?, self.output(s.dtype(), cols)?);
            let cfg = self.gpu.blocks(cols.div_ceil(BLOCK as usize))?;
            launch!(&self.gpu, sums_entry, cfg;
                &dweight.ptr, &dbias.ptr, &parts.ptr, &cols32, &chunks32);
            grads.weight = affine.weight.map(|_| dweight as BufferRef);
            grads.bias = affine.bias.map(|_| dbias as BufferRef);
        }
        Ok(grads)
    }
}

/// The arguments of a forward row kernel after its own pointers, and its grid.
struct RowArgs<'a> {
    weight: &'a CudaBuffer,
    bias: &'a CudaBuffer,
    rows: u32,
    cols: u32,
    eps: f32,
    group: u32,
    flags: u32,
    cfg: LaunchConfig,
}
