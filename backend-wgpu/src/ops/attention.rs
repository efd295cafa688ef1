//! `causal_attention` and its backward pass fused (attention.wgsl): one dispatch forward, two
//! backward (dq with each row's `dy·y`, then dk and dv), nothing `t × t` in memory, f32, f16
//! and bf16 (read and written in its packed words), head dims up to 128.
//!
//! Where it applies is decided in one place, `fused_attention_applies`: the dtype and head dim,
//! and the backend's attention path (`LOCKSTEP_WGPU_ATTENTION=composed`, read once, or
//! `WgpuBackend::set_attention_fused` for one device) so tests and benchmarks can compare with
//! the composed products and `causal_softmax`.

use std::sync::OnceLock;

use lockstep_core::backend::{BufferRef, CausalAttention};
use lockstep_core::shape::Layout;
use lockstep_core::{DType, Result};

use crate::backend::{WgpuBackend, to_u32};
use crate::pipelines::Variant;

/// Rows a workgroup takes (`ROWS` in attention.wgsl).
const ROWS: usize = 64;
/// The largest head dim the shader's per-row arrays hold (`MAX_DIM`).
const MAX_HEAD_DIM: usize = 128;

/// Whether attention fuses by default, from `LOCKSTEP_WGPU_ATTENTION` (read once): `composed`
/// turns it off, `fused` or unset leaves it on.
pub(crate) fn fused_by_default() -> bool {
    static FUSED: OnceLock<bool> = OnceLock::new();
    *FUSED.get_or_init(|| match std::env::var("LOCKSTEP_WGPU_ATTENTION").as_deref() {
        Ok("composed") => false,
        Ok("fused") | Err(_) => true,
        Ok(other) => {
            eprintln!("lockstep: LOCKSTEP_WGPU_ATTENTION={other:?} is neither \"composed\" nor \"fused\"; ignored");
            true
        }
    })
}

/// The attention path as `devices --details` prints it.
pub(crate) fn attention_plan(fused: bool) -> &'static str {
    if fused {
        "fused for head dims up to 128 (LOCKSTEP_WGPU_ATTENTION=composed turns it off)"
    } else {
        "composed from products and causal_softmax"
    }
}

impl WgpuBackend {
    /// Whether the fused kernels serve `dtype` and `spec` on this device: the path is on, the
    /// head dim even (bf16 rows then start on a word) and at most 128, f16 only with SHADER_F16.
    fn fused_attention_applies(&self, dtype: DType, spec: &CausalAttention) -> bool {
        self.attention_fused()
            && (2..=MAX_HEAD_DIM).contains(&spec.head_dim)
            && spec.head_dim.is_multiple_of(2)
            && self.element_type(CausalAttention::name(false), dtype).is_ok()
            && u32::try_from(spec.qkv_len()).is_ok()
    }

    /// `Backend::causal_attention`, or `None` where the fused kernels do not apply.
    pub(crate) fn causal_attention_fused(
        &self,
        qkv: &BufferRef,
        spec: &CausalAttention,
    ) -> Option<Result<(BufferRef, BufferRef)>> {
        self.fused_attention_applies(qkv.dtype(), spec)
            .then(|| self.attention_forward(qkv, spec))
    }

    /// `Backend::causal_attention_backward`, fused wherever the forward pass was.
    pub(crate) fn causal_attention_backward_fused(
        &self,
        [qkv, y, lse, dy]: [&BufferRef; 4],
        spec: &CausalAttention,
    ) -> Option<Result<BufferRef>> {
        self.fused_attention_applies(qkv.dtype(), spec)
            .then(|| self.attention_backward([qkv, y, lse, dy], spec))
    }

    /// `y` `[batch, t, heads, d]` in qkv's dtype and `lse` f32 `[batch, heads, t]`.
    fn attention_forward(&self, qkv: &BufferRef, spec: &CausalAttention) -> Result<(BufferRef, BufferRef)> {
        let op = CausalAttention::name(false);
        let x = self.operand(op, qkv, Some(&Layout::contiguous([spec.qkv_len()])))?;
        let ty = self.element_type(op, x.dtype())?;
        let y = self.alloc(op, x.dtype(), spec.out_len())?;
        let lse = self.alloc(op, DType::F32, spec.rows())?;
        if spec.rows() > 0 {
            let (params, groups) = self.attention_grid(op, spec)?;
            self.launch(
                &attention_variant(op, ty, spec),
                &params,
                &[(1, x), (2, &y), (3, &lse)],
                groups,
            )?;
        }
        Ok((y, lse))
    }

    /// dqkv `[batch, t, 3, heads, d]` from the forward pass's input and outputs and `dy`.
    fn attention_backward(&self, [qkv, y, lse, dy]: [&BufferRef; 4], spec: &CausalAttention) -> Result<BufferRef> {
        let op = CausalAttention::name(true);
        let out_layout = Layout::contiguous([spec.out_len()]);
        let x = self.operand(op, qkv, Some(&Layout::contiguous([spec.qkv_len()])))?;
        let (y, dy) = (
            self.operand(op, y, Some(&out_layout))?,
            self.operand(op, dy, Some(&out_layout))?,
        );
        let lse = self.operand(op, lse, Some(&Layout::contiguous([spec.rows()])))?;
        let ty = self.element_type(op, x.dtype())?;
        // Every element is written once, by the dq pass or the dk/dv pass.
        let dqkv = self.alloc(op, x.dtype(), spec.qkv_len())?;
        if spec.rows() == 0 {
            return Ok(dqkv);
        }
        let dots = self.alloc(op, DType::F32, spec.rows())?;
        let (params, groups) = self.attention_grid(op, spec)?;
        self.launch(
            &attention_variant("causal_attention_dq", ty, spec),
            &params,
            &[(1, x), (2, y), (3, lse), (4, dy), (5, &dots), (6, &dqkv)],
            groups,
        )?;
        self.launch(
            &attention_variant("causal_attention_dkdv", ty, spec),
            &params,
            &[(1, x), (3, lse), (4, dy), (5, &dots), (6, &dqkv)],
            groups,
        )?;
        Ok(dqkv)
    }

    /// The shader's parameters and a workgroup per `ROWS` rows of each sequence's head.
    fn attention_grid(&self, op: &'static str, spec: &CausalAttention) -> Result<([u32; 5], [u32; 3])> {
        let tiles = spec.t.div_ceil(ROWS);
        let heads = spec.batch * spec.heads;
        let params = [
            to_u32(op, spec.t)?,
            to_u32(op, spec.heads)?,
            to_u32(op, tiles)?,
            (spec.scale as f32).to_bits(),
            to_u32(op, heads)?,
        ];
        Ok((params, self.groups(op, tiles * heads)?))
    }
}

fn attention_variant(entry: &'static str, ty: &'static str, spec: &CausalAttention) -> Variant {
    Variant::new("attention", entry, &[ty]).constant("HEAD_DIM", spec.head_dim as f64)
}
