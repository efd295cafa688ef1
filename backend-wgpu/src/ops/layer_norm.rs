//! layer_norm_last with its affine part and its gradients (layer_norm.wgsl): a group of
//! invocations per row forward, one dispatch (also with the residual add before it:
//! add_layer_norm); backward a group per chunk of rows writes the input's gradient (the input's
//! other uses' gradient added, where given) and the chunk's column sums, and with a weight or
//! bias a second dispatch sums the chunks in order (`gpu_plan::layer_norm_chunk_rows`, so every
//! GPU sums in the same order). bf16 runs on f32 copies.

use lockstep_core::backend::gpu_plan::{layer_norm_chunk_rows, layer_norm_flags};
use lockstep_core::backend::{BufferRef, InputGradient, LayerNormAffine, LayerNormGrads, LayerNormSpec, mixed};
use lockstep_core::shape::Layout;
use lockstep_core::{DType, Result};

use crate::backend::{WgpuBackend, to_u32};
use crate::pipelines::Variant;

/// The shader's flags after `layer_norm_flags`' bits: the operand at the gradient's bindings
/// (the output gradient, or the residual branch) in bf16 words; a residual branch added before
/// the LayerNorm; an accumulated gradient added to the input's.
const GRAD_BF16: u32 = 8;
const ADDS_BRANCH: u32 = 16;
const ACCUMULATES: u32 = 32;

/// The shader's params: `[rows, cols, eps (f32 bits), group, flags, rows per chunk, chunks]`.
fn params(op: &'static str, spec: &LayerNormSpec, group: u32, flags: u32, chunk_rows: usize) -> Result<[u32; 7]> {
    Ok([
        to_u32(op, spec.rows)?,
        to_u32(op, spec.cols)?,
        (spec.eps as f32).to_bits(),
        group,
        flags,
        to_u32(op, chunk_rows)?,
        to_u32(op, spec.rows.div_ceil(chunk_rows))?,
    ])
}

impl WgpuBackend {
    /// `Backend::layer_norm_last_to` (and `layer_norm_last`, `out` the input's dtype): an f32
    /// input's output written as bf16 words by the same dispatch where rows are whole words (an
    /// even number of columns); other pairs composed.
    pub(crate) fn layer_norm_forward(
        &self,
        src: &BufferRef,
        affine: LayerNormAffine<'_>,
        spec: &LayerNormSpec,
        out: DType,
    ) -> Result<BufferRef> {
        const OP: &str = "layer_norm_last";
        affine.check(OP, src, spec)?;
        let to_bf16 = match (src.dtype(), out) {
            (from, to) if from == to => false,
            (DType::F32, DType::BF16) if spec.cols.is_multiple_of(2) => true,
            _ => return mixed::layer_norm_last_to(self, src, affine, spec, out),
        };
        if src.dtype() == DType::BF16 {
            let (src, weight, bias) = self.widened(OP, src, affine)?;
            let wide = LayerNormAffine {
                weight: weight.as_ref(),
                bias: bias.as_ref(),
            };
            let out = self.layer_norm_forward(&src, wide, spec, DType::F32)?;
            return self.rounded(OP, out);
        }
        self.normalize_rows(OP, src, None, affine, spec, out, to_bf16)
            .map(|(_, out)| out)
    }

    /// `Backend::add_layer_norm_last_to`: an f32 residual plus an f32 or bf16 branch (read as
    /// it is), the sum and its LayerNorm (f32, or bf16 words where rows are whole words) by one
    /// dispatch; other combinations composed.
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
        let to_bf16 = match out {
            DType::F32 => false,
            DType::BF16 if spec.cols.is_multiple_of(2) => true,
            _ => return mixed::add_layer_norm_last_to(self, residual, branch, affine, spec, out),
        };
        if residual.dtype() != DType::F32 || !matches!(branch.dtype(), DType::F32 | DType::BF16) {
            return mixed::add_layer_norm_last_to(self, residual, branch, affine, spec, out);
        }
        let (sum, normed) = self.normalize_rows(OP, residual, Some(branch), affine, spec, out, to_bf16)?;
        let sum = sum.ok_or_else(|| lockstep_core::Error::invalid(OP, "the dispatch wrote no sum"))?;
        Ok([sum, normed])
    }

    /// One forward dispatch over the rows of the f32 (or f16) `src`, plus `branch` where given
    /// (then also returning the sum), its output in `out` (as bf16 words with `to_bf16`).
    #[allow(clippy::too_many_arguments)] // the operands of the fused forward, each optional part apart
    fn normalize_rows(
        &self,
        op: &'static str,
        src: &BufferRef,
        branch: Option<&BufferRef>,
        affine: LayerNormAffine<'_>,
        spec: &LayerNormSpec,
        out: DType,
        to_bf16: bool,
    ) -> Result<(Option<BufferRef>, BufferRef)> {
        let (rows, cols) = (spec.rows, spec.cols);
        let layout = Layout::contiguous([rows, cols]);
        let x = self.operand(op, src, Some(&layout))?;
        let b = branch.map(|b| self.operand(op, b, Some(&layout))).transpose()?;
        let t = self.float_type(op, x.dtype())?;
        let out = self.alloc(op, out, rows * cols)?;
        let sum = b.map(|_| self.alloc(op, x.dtype(), rows * cols)).transpose()?;
        if rows * cols == 0 {
            return Ok((sum.map(|s| s as BufferRef), out as BufferRef));
        }
        let (group, workgroups) = self.row_groups(op, rows, cols)?;
        let branch_bf16 = b.is_some_and(|b| b.dtype() == DType::BF16);
        let flags = layer_norm_flags(&affine, false)
            | if b.is_some() { ADDS_BRANCH } else { 0 }
            | if branch_bf16 { GRAD_BF16 } else { 0 };
        let p = params(op, spec, group, flags, 1)?;
        // An absent part's binding holds the input, which the shader then never reads; the
        // branch sits at the gradient's bindings (its words, or its values), and an unwritten
        // sum's binding holds the output.
        let weight = self.operand(op, affine.weight.unwrap_or(src), None)?;
        let bias = self.operand(op, affine.bias.unwrap_or(src), None)?;
        let (values, words) = match b {
            Some(b) if branch_bf16 => (x, b),
            Some(b) => (b, b),
            None => (x, x),
        };
        let (entry, out_binding) = if to_bf16 {
            ("layer_norm_to_bf16", 9)
        } else {
            ("layer_norm", 3)
        };
        let written_sum = sum.as_deref().unwrap_or(&*out);
        let bindings = [
            (1, x),
            (2, values),
            (10, words),
            (4, weight),
            (5, bias),
            (out_binding, &*out),
            (11, written_sum),
        ];
        self.launch(&Variant::new("layer_norm", entry, &[t]), &p, &bindings, workgroups)?;
        Ok((sum.map(|s| s as BufferRef), out as BufferRef))
    }

    /// `Backend::layer_norm_last_to_backward` (and `layer_norm_last_backward`, `input` empty):
    /// LayerNorm's own gradients, then `input`'s add and cast composed.
    pub(crate) fn layer_norm_backward(
        &self,
        grad: &BufferRef,
        src: &BufferRef,
        affine: LayerNormAffine<'_>,
        spec: &LayerNormSpec,
        input: InputGradient<'_>,
    ) -> Result<LayerNormGrads> {
        // The dispatch adds an accumulated gradient to an f32 input's; the rest is composed.
        let folded = input
            .accumulated
            .filter(|a| a.dtype() == DType::F32 && src.dtype() == DType::F32);
        let mut grads = self.layer_norm_own_backward(grad, src, affine, spec, folded)?;
        let rest = InputGradient {
            accumulated: input.accumulated.filter(|_| folded.is_none()),
            rounded: input.rounded,
        };
        mixed::fold_input_gradient(self, &mut grads, spec, rest)?;
        Ok(grads)
    }

    /// LayerNorm's gradients, `accumulated` added to the input's: a bf16 output gradient of an
    /// f32 input widened in the same dispatch; other pairs composed.
    fn layer_norm_own_backward(
        &self,
        grad: &BufferRef,
        src: &BufferRef,
        affine: LayerNormAffine<'_>,
        spec: &LayerNormSpec,
        accumulated: Option<&BufferRef>,
    ) -> Result<LayerNormGrads> {
        const OP: &str = "layer_norm_last_backward";
        let grad_bf16 = match (src.dtype(), grad.dtype()) {
            (DType::F32, DType::BF16) => {
                affine.check(OP, src, spec)?;
                true
            }
            (from, to) if from == to => {
                affine.check_backward(OP, grad, src, spec)?;
                false
            }
            _ => {
                let input = InputGradient {
                    accumulated,
                    rounded: None,
                };
                return mixed::layer_norm_last_to_backward(self, grad, src, affine, spec, input);
            }
        };
        if src.dtype() == DType::BF16 {
            let (src, weight, bias) = self.widened(OP, src, affine)?;
            let [grad] = self.widen_each(OP, [grad])?;
            let wide = LayerNormAffine {
                weight: weight.as_ref(),
                bias: bias.as_ref(),
            };
            let grads = self.layer_norm_own_backward(&grad, &src, wide, spec, None)?;
            let round = |b: Option<BufferRef>| b.map(|b| self.rounded(OP, b)).transpose();
            return Ok(LayerNormGrads {
                input: self.rounded(OP, grads.input)?,
                weight: round(grads.weight)?,
                bias: round(grads.bias)?,
                rounded_input: None,
            });
        }
        let (rows, cols) = (spec.rows, spec.cols);
        let layout = Layout::contiguous([rows, cols]);
        let x = self.operand(OP, src, Some(&layout))?;
        let g = self.operand(OP, grad, Some(&layout))?;
        let t = self.float_type(OP, x.dtype())?;
        let dx = self.alloc(OP, x.dtype(), rows * cols)?;
        let sums = affine.any();
        let mut grads = LayerNormGrads {
            input: dx.clone(),
            weight: None,
            bias: None,
            rounded_input: None,
        };
        if rows * cols == 0 {
            return LayerNormGrads::of_empty(dx, &affine, || self.fill(x.dtype(), cols, 0.0));
        }
        let chunk_rows = layer_norm_chunk_rows(&affine, rows);
        let chunks = rows.div_ceil(chunk_rows);
        let (group, workgroups) = self.row_groups(OP, chunks, cols)?;
        let accumulated = accumulated.map(|a| self.operand(OP, a, Some(&layout))).transpose()?;
        let flags = layer_norm_flags(&affine, true)
            | if grad_bf16 { GRAD_BF16 } else { 0 }
            | if accumulated.is_some() { ACCUMULATES } else { 0 };
        let p = params(OP, spec, group, flags, chunk_rows)?;
        let parts = self.alloc(OP, DType::F32, if sums { 2 * chunks * cols } else { 1 })?;
        let weight = self.operand(OP, affine.weight.unwrap_or(src), None)?;
        let entry = |name| Variant::new("layer_norm", name, &[t]);
        // The gradient's binding the shader does not read holds another read-only operand.
        let (grad_binding, grad_words_binding) = if grad_bf16 { (x, g) } else { (g, g) };
        let bindings = [
            (1, x),
            (2, grad_binding),
            (10, grad_words_binding),
            (4, weight),
            (3, &*dx),
            (6, &*parts),
            (12, accumulated.unwrap_or(x)),
        ];
        self.launch(&entry("layer_norm_backward"), &p, &bindings, workgroups)?;
        if !sums {
            return Ok(grads);
        }
        let (dweight, dbias) = (self.alloc(OP, x.dtype(), cols)?, self.alloc(OP, x.dtype(), cols)?);
        let bindings = [(6, &*parts), (7, &*dweight), (8, &*dbias)];
        self.launch(&entry("layer_norm_column_sums"), &p, &bindings, self.grid(OP, cols)?)?;
        grads.weight = affine.weight.map(|_| dweight as BufferRef);
        grads.bias = affine.bias.map(|_| dbias as BufferRef);
        Ok(grads)
    }

    /// f32 copies of a bf16 input and its affine part.
    fn widened(
        &self,
        op: &'static str,
        src: &BufferRef,
        affine: LayerNormAffine<'_>,
    ) -> Result<(BufferRef, Option<BufferRef>, Option<BufferRef>)> {
        let widen = |b: Option<&BufferRef>| b.map(|b| self.widen_each(op, [b]).map(|[w]| w)).transpose();
        let [src] = self.widen_each(op, [src])?;
        Ok((src, widen(affine.weight)?, widen(affine.bias)?))
    }
}
