//! Training-mode batch normalisation and its gradient (batch_norm.wgsl) over a contiguous
//! `[outer, channels, inner]` with f32 weight, bias and statistics: three dispatches each way,
//! where the composed ops take about twenty and read the input as many times. A bf16 input and
//! its result stay in their packed words. The input may come channel-major (a convolution's
//! product), read where it lies; the running statistics are blended in one more dispatch.

use lockstep_core::backend::gpu_plan::chunk_len;
use lockstep_core::backend::{BatchNormSpec, BufferRef, RunningStatsSpec};
use lockstep_core::shape::Layout;
use lockstep_core::{DType, Result};

use crate::backend::{WgpuBackend, to_u32};
use crate::pipelines::Variant;

/// How the dispatches see a batch norm: the shape, each channel's values cut into chunks (from
/// the shape alone, so every device sums in the same order), and eps.
struct Plan {
    params: [u32; 10],
    elements: usize,
    channels: usize,
    chunks: usize,
}

impl Plan {
    /// One workgroup per (channel, chunk).
    fn per_chunk(&self, backend: &WgpuBackend, op: &'static str) -> Result<[u32; 3]> {
        backend.groups(op, self.channels * self.chunks)
    }

    fn new(op: &'static str, spec: &BatchNormSpec) -> Result<Plan> {
        let count = spec.outer * spec.inner;
        let len = chunk_len(spec.channels, count);
        let chunks = count.div_ceil(len).max(1);
        let elements = count * spec.channels;
        let params = [
            to_u32(op, elements)?,
            to_u32(op, spec.channels)?,
            to_u32(op, spec.inner)?,
            to_u32(op, count)?,
            to_u32(op, len)?,
            to_u32(op, chunks)?,
            (spec.eps as f32).to_bits(),
            spec.channel_major as u32,
            spec.relu as u32,
            // Whether a residual is added: `batch_norm_fused` sets it.
            0,
        ];
        Ok(Plan {
            params,
            elements,
            channels: spec.channels,
            chunks,
        })
    }
}

impl WgpuBackend {
    /// `[y, mean, var]` (`y` in the input's dtype), or `None` where the kernels do not apply (an
    /// empty input, a per-channel operand that is not f32): the caller composes those.
    pub(crate) fn batch_norm_fused(
        &self,
        x: &BufferRef,
        [weight, bias]: [&BufferRef; 2],
        residual: Option<&BufferRef>,
        spec: &BatchNormSpec,
    ) -> Result<Option<[BufferRef; 3]>> {
        const OP: &str = "batch_norm";
        let Some((dtype, t)) = self.norm_types(OP, spec, [x], [weight, bias])? else {
            return Ok(None);
        };
        let mut plan = Plan::new(OP, spec)?;
        // Without a residual the shader never reads one, but its layout holds the binding: the
        // input fills it.
        let residual = match residual {
            Some(r) if r.dtype() == dtype => {
                plan.params[9] = 1;
                self.operand(OP, r, Some(&Layout::contiguous([plan.elements])))?
            }
            Some(_) => return Ok(None),
            None => self.operand(OP, x, None)?,
        };
        let (x, weight, bias) = (
            self.operand(OP, x, None)?,
            self.operand(OP, weight, None)?,
            self.operand(OP, bias, None)?,
        );
        let parts = self.alloc("batch_norm", DType::F32, 2 * plan.channels * plan.chunks)?;
        let (mean, var) = (
            self.alloc("batch_norm", DType::F32, plan.channels)?,
            self.alloc("batch_norm", DType::F32, plan.channels)?,
        );
        let y = self.alloc("batch_norm", x.dtype(), plan.elements)?;
        let entry = |name| Variant::new("batch_norm", name, &[t]);
        let p = &plan.params;
        self.launch(&entry("moments"), p, &[(1, x), (2, &parts)], plan.per_chunk(self, OP)?)?;
        let stats = [(2, &*parts), (3, &mean), (4, &var)];
        self.launch(&entry("statistics"), p, &stats, self.grid(OP, plan.channels)?)?;
        let bindings = [
            (1, x),
            (3, &mean),
            (4, &var),
            (5, weight),
            (6, bias),
            (7, &y),
            (16, residual),
        ];
        self.launch(
            &entry("normalize"),
            p,
            &bindings,
            self.word_grid(OP, dtype, plan.elements)?,
        )?;
        Ok(Some([y, mean, var]))
    }

    /// `[dx, dweight, dbias]` (`dx` in the input's dtype), or `None` as for `batch_norm_fused`.
    pub(crate) fn batch_norm_backward_fused(
        &self,
        [grad, x]: [&BufferRef; 2],
        [weight, mean, var]: [&BufferRef; 3],
        out: Option<&BufferRef>,
        spec: &BatchNormSpec,
    ) -> Result<Option<[BufferRef; 3]>> {
        const OP: &str = "batch_norm_backward";
        let Some((dtype, t)) = self.norm_types(OP, spec, [grad, x], [weight, mean, var])? else {
            return Ok(None);
        };
        // A fused ReLU's mask: the forward pass's output, as long as the gradient. Without
        // one the shaders never read it, but their layout holds the binding: the gradient fills it.
        let saved_y = match (spec.relu, out) {
            (false, _) => grad,
            (true, Some(out)) if out.dtype() == dtype => out,
            (true, _) => {
                return Err(lockstep_core::Error::invalid(
                    OP,
                    "a fused ReLU's gradient needs the forward pass's output, in the input's dtype",
                ));
            }
        };
        let plan = Plan::new(OP, spec)?;
        let saved_y = self.operand(OP, saved_y, Some(&Layout::contiguous([grad.len()])))?;
        let (grad, x, weight, mean, var) = (
            self.operand(OP, grad, None)?,
            self.operand(OP, x, None)?,
            self.operand(OP, weight, None)?,
            self.operand(OP, mean, None)?,
            self.operand(OP, var, None)?,
        );
        let parts = self.alloc("batch_norm_backward", DType::F32, 2 * plan.channels * plan.chunks)?;
        let (dweight, dbias, coef) = (
            self.alloc("batch_norm_backward", DType::F32, plan.channels)?,
            self.alloc("batch_norm_backward", DType::F32, plan.channels)?,
            self.alloc("batch_norm_backward", DType::F32, 5 * plan.channels)?,
        );
        let dx = self.alloc("batch_norm_backward", x.dtype(), plan.elements)?;
        let entry = |name| Variant::new("batch_norm", name, &[t]);
        let p = &plan.params;
        let sums = [(1, x), (8, grad), (3, mean), (4, var), (2, &parts), (15, saved_y)];
        self.launch(&entry("grad_sums"), p, &sums, plan.per_chunk(self, OP)?)?;
        let totals = [
            (2, &*parts),
            (3, mean),
            (4, var),
            (5, weight),
            (9, &dweight),
            (10, &dbias),
            (11, &coef),
        ];
        self.launch(&entry("grad_totals"), p, &totals, self.grid(OP, plan.channels)?)?;
        let input = [(1, x), (8, grad), (11, &coef), (7, &dx), (15, saved_y)];
        self.launch(
            &entry("input_grad"),
            p,
            &input,
            self.word_grid(OP, dtype, plan.elements)?,
        )?;
        Ok(Some([dx, dweight, dbias]))
    }

    /// `Backend::batch_norm_running` in one dispatch; `None` where an operand is not f32 (the
    /// statistics) or I64 (the count): the caller composes those.
    pub(crate) fn batch_norm_running_pass(
        &self,
        running: [&BufferRef; 2],
        batch: [&BufferRef; 2],
        batches: Option<&BufferRef>,
        spec: &RunningStatsSpec,
    ) -> Result<Option<()>> {
        const OP: &str = "batch_norm_running";
        let Some([keep, take, unbias]) = spec.fused_factors(OP, running, batch, batches)? else {
            return Ok(None);
        };
        let [running_mean, running_var, mean, var] =
            [running[0], running[1], batch[0], batch[1]].map(|b| self.operand(OP, b, None));
        let [running_mean, running_var, mean, var] = [running_mean?, running_var?, mean?, var?];
        let batches = batches.map(|b| self.operand(OP, b, None)).transpose()?;
        let params = [
            to_u32(OP, spec.channels)?,
            keep.to_bits(),
            take.to_bits(),
            unbias.to_bits(),
        ];
        let mut bindings = vec![(3, mean), (4, var), (12, running_mean), (13, running_var)];
        let name = match batches {
            Some(batches) => {
                bindings.push((14, batches));
                "running_counted"
            }
            None => "running",
        };
        let variant = Variant::new("batch_norm", name, &["f32"]);
        self.launch(&variant, &params, &bindings, self.grid(OP, spec.channels)?)?;
        Ok(Some(()))
    }

    /// The whole-input operands' dtype (f32, f16 or bf16, one for all) and the shaders' element
    /// type for it, after checking every operand's extent and that the
    /// per-channel ones are f32; `None` where the kernels do not apply.
    fn norm_types<const E: usize, const C: usize>(
        &self,
        op: &'static str,
        spec: &BatchNormSpec,
        whole: [&BufferRef; E],
        per_channel: [&BufferRef; C],
    ) -> Result<Option<(DType, &'static str)>> {
        let elements = spec.outer * spec.channels * spec.inner;
        let (all, channels) = (Layout::contiguous([elements]), Layout::contiguous([spec.channels]));
        for b in whole {
            self.operand(op, b, Some(&all))?;
        }
        for b in per_channel {
            self.operand(op, b, Some(&channels))?;
        }
        let dtype = whole[0].dtype();
        let t = match dtype {
            DType::F32 => "f32",
            DType::BF16 => "bf16",
            DType::F16 if self.gpu.has_f16() => "f16",
            _ => return Ok(None),
        };
        let applies = elements > 0
            && whole.iter().all(|b| b.dtype() == dtype)
            && per_channel.iter().all(|b| b.dtype() == DType::F32);
        Ok(applies.then_some((dtype, t)))
    }
}
