//! layer_norm_last with its affine part and its gradients (layer_norm.wgsl): a group of
//! invocations per row forward, one dispatch; backward a group per chunk of rows writes the
//! input's gradient and the chunk's column sums, and with a weight or bias a second dispatch sums
//! the chunks in order (`gpu_plan::layer_norm_chunk_rows`, so every GPU sums in the same order). bf16
//! runs on f32 copies.

use lockstep_core::backend::gpu_plan::{layer_norm_chunk_rows, layer_norm_flags};
use lockstep_core::backend::{BufferRef, InputGradient, LayerNormAffine, LayerNormGrads, LayerNormSpec, mixed};
use lockstep_core::shape::Layout;
use lockstep_core::{DType, Result};

use crate::backend::{WgpuBackend, to_u32};
use crate::pipelines::Variant;

/// The shader's flag for an output gradient in bf16 words (after `layer_norm_flags`' bits).
const GRAD_BF16: u32 = 8;

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
        let (rows, cols) = (spec.rows, spec.cols);
        let x = self.operand(OP, src, Some(&Layout::contiguous([rows, cols])))?;
        let t = self.float_type(OP, x.dtype())?;
        let out = self.alloc(OP, out, rows * cols)?;
        if rows * cols == 0 {
            return Ok(out);
        }
        let (group, workgroups) = self.row_groups(OP, rows, cols)?;
        let p = params(OP, spec, group, layer_norm_flags(&affine, false), 1)?;
        // An absent part's binding holds the input, which the shader then never reads.
        let weight = self.operand(OP, affine.weight.unwrap_or(src), None)?;
        let bias = self.operand(OP, affine.bias.unwrap_or(src), None)?;
        let (entry, out_binding) = if to_bf16 {
            ("layer_norm_to_bf16", 9)
        } else {
            ("layer_norm", 3)
        };
        let bindings = [(1, x), (4, weight), (5, bias), (out_binding, &out)];
        self.launch(&Variant::new("layer_norm", entry, &[t]), &p, &bindings, workgroups)?;
        Ok(out as BufferRef)
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
        let mut grads = self.layer_norm_own_backward(grad, src, affine, spec)?;
        mixed::fold_input_gradient(self, &mut grads, spec, input)?;
        Ok(grads)
    }

    /// LayerNorm's gradients: a bf16 output gradient of an f32 input widened in the same
    /// dispatch; other pairs composed.
    fn layer_norm_own_backward(
        &self,
        grad: &BufferRef,
        src: &BufferRef,
        affine: LayerNormAffine<'_>,
        spec: &LayerNormSpec,
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
                return mixed::layer_norm_last_to_backward(self, grad, src, affine, spec, InputGradient::default());
            }
        };
        if src.dtype() == DType::BF16 {
            let (src, weight, bias) = self.widened(OP, src, affine)?;
            let [grad] = self.widen_each(OP, [grad])?;
            let wide = LayerNormAffine {
                weight: weight.as_ref(),
                bias: bias.as_ref(),
            };
            let grads = self.layer_norm_own_backward(&grad, &src, wide, spec)?;
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
        let flags = layer_norm_flags(&affine, true) | if grad_bf16 { GRAD_BF16 } else { 0 };
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
