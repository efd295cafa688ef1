//! `causal_attention` and its backward pass (attention.cu): flash attention on tensor cores for
//! bf16 and f16, head dims of `ATTENTION_HEAD_DIMS`. f32 keeps the composed path (cuBLAS
//! products and `causal_softmax`), as do other head dims and `LOCKSTEP_CUDA_ATTENTION=composed`.
//!
//! Backward: one pre-pass for each row's statistics (`lse` in base 2 and `dot = sum(dy · y)`),
//! then one kernel over query blocks for dQ and one over key blocks for dK and dV, each writing
//! its slots of the one dqkv buffer: no atomics, so the sums run in one order and a resumed run
//! stays bit-exact.
//!
//! Each kernel comes in two builds (`AttentionKernels`): one stage, or pipelined (two).

use cudarc::driver::LaunchConfig;
use lockstep_core::backend::{BackendBuffer, BufferRef, CausalAttention};
use lockstep_core::shape::Layout;
use lockstep_core::{DType, Result};

use crate::backend::CudaBackend;
use crate::entry_points::{self, ATTENTION_HEAD_DIMS, HalfHeads};
use crate::gpu::launch;
use crate::views::to_u32;

/// Rows a block owns and its threads (attention.cu's ATTENTION_ROWS, ATTENTION_WARPS · 32).
const BLOCK_ROWS: usize = 64;
const BLOCK_THREADS: u32 = 128;

/// How the backend runs attention, from `LOCKSTEP_CUDA_ATTENTION`, read once: `composed` (the
/// products and `causal_softmax`, to compare), `fused` (the kernels without their start-up
/// check, so the conformance suite sees them even where they are wrong), else the kernels once
/// their check passes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum AttentionMode {
    Composed,
    Fused,
    Checked,
}

fn attention_mode() -> AttentionMode {
    static MODE: std::sync::OnceLock<AttentionMode> = std::sync::OnceLock::new();
    *MODE.get_or_init(|| match std::env::var("LOCKSTEP_CUDA_ATTENTION").as_deref() {
        Ok("composed") => AttentionMode::Composed,
        Ok("fused") => AttentionMode::Fused,
        Ok(other) => {
            eprintln!("lockstep: LOCKSTEP_CUDA_ATTENTION={other:?} is neither \"composed\" nor \"fused\"; ignored");
            AttentionMode::Checked
        }
        Err(_) => AttentionMode::Checked,
    })
}

/// One build of the fused kernels (attention.cu): each streamed tile copied, then used (one
/// stage), or the next tile's copies in flight while the block works on this one (two stages,
/// `_pipelined`, in half-height tiles where two stages of full ones do not fit).
#[derive(Clone, Copy, Debug)]
struct AttentionKernels {
    stages: usize,
    forward: HalfHeads,
    dq: HalfHeads,
    dkdv: HalfHeads,
}

impl AttentionKernels {
    const ONE_STAGE: Self = Self {
        stages: 1,
        forward: entry_points::CAUSAL_ATTENTION,
        dq: entry_points::CAUSAL_ATTENTION_DQ,
        dkdv: entry_points::CAUSAL_ATTENTION_DKDV,
    };
    const PIPELINED: Self = Self {
        stages: 2,
        forward: entry_points::CAUSAL_ATTENTION_PIPELINED,
        dq: entry_points::CAUSAL_ATTENTION_DQ_PIPELINED,
        dkdv: entry_points::CAUSAL_ATTENTION_DKDV_PIPELINED,
    };

    /// The build `LOCKSTEP_CUDA_ATTENTION_STAGES` (1 or 2) names, read once; one stage, the
    /// build a GPU has timed, where it is unset.
    fn chosen() -> Self {
        static CHOSEN: std::sync::OnceLock<AttentionKernels> = std::sync::OnceLock::new();
        *CHOSEN.get_or_init(|| match std::env::var("LOCKSTEP_CUDA_ATTENTION_STAGES").as_deref() {
            Ok("2") => Self::PIPELINED,
            Ok("1") | Err(_) => Self::ONE_STAGE,
            Ok(other) => {
                eprintln!("lockstep: LOCKSTEP_CUDA_ATTENTION_STAGES={other:?} is neither 1 nor 2; one stage it is");
                Self::ONE_STAGE
            }
        })
    }
}

/// The attention plan as `devices --details` prints it.
pub(crate) fn attention_plan() -> String {
    let stages = match AttentionKernels::chosen().stages {
        1 => "one stage",
        _ => "two stages, LOCKSTEP_CUDA_ATTENTION_STAGES=2",
    };
    match attention_mode() {
        AttentionMode::Composed => "composed (LOCKSTEP_CUDA_ATTENTION=composed)".to_string(),
        AttentionMode::Fused => format!("fused for bf16/f16 ({stages}), unchecked (LOCKSTEP_CUDA_ATTENTION=fused)"),
        AttentionMode::Checked => format!(
            "fused for bf16/f16 ({stages}) once checked at first use (LOCKSTEP_CUDA_ATTENTION=composed turns it off)"
        ),
    }
}

/// Whether the fused kernels take `dtype` and `spec` at all (before any start-up check).
fn fused_attention_applies(dtype: DType, spec: &CausalAttention) -> bool {
    matches!(dtype, DType::BF16 | DType::F16)
        && ATTENTION_HEAD_DIMS.contains(&spec.head_dim)
        && spec.batch * spec.heads <= u16::MAX as usize
        && spec.t <= u32::MAX as usize
}

/// A block per 64 rows (x) of each sequence's head (y).
fn head_blocks(spec: &CausalAttention) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (spec.t.div_ceil(BLOCK_ROWS) as u32, (spec.batch * spec.heads) as u32, 1),
        block_dim: (BLOCK_THREADS, 1, 1),
        shared_mem_bytes: 0,
    }
}

impl CudaBackend {
    /// `Backend::causal_attention`, or `None` where the fused kernels do not apply or stepped aside.
    pub(crate) fn causal_attention_fused(
        &self,
        qkv: &BufferRef,
        spec: &CausalAttention,
    ) -> Option<Result<(BufferRef, BufferRef)>> {
        self.fused_attention_ready(qkv.dtype(), spec)
            .then(|| self.attention_forward(qkv, spec))
    }

    /// `Backend::causal_attention_backward`, fused wherever the forward pass was.
    pub(crate) fn causal_attention_backward_fused(
        &self,
        [qkv, y, lse, dy]: [&BufferRef; 4],
        spec: &CausalAttention,
    ) -> Option<Result<BufferRef>> {
        self.fused_attention_ready(qkv.dtype(), spec)
            .then(|| self.attention_backward([qkv, y, lse, dy], spec))
    }

    /// Whether this call runs the fused kernels: they apply, the mode allows them, and (by
    /// default) they passed their start-up check for this dtype and head dim.
    fn fused_attention_ready(&self, dtype: DType, spec: &CausalAttention) -> bool {
        fused_attention_applies(dtype, spec)
            && match attention_mode() {
                AttentionMode::Composed => false,
                AttentionMode::Fused => true,
                AttentionMode::Checked => self.attention_passes_check(dtype, spec.head_dim),
            }
    }

    /// `y` `[batch, t, heads, d]` and `lse` f32 `[batch, heads, t]` from `qkv`.
    pub(crate) fn attention_forward(&self, qkv: &BufferRef, spec: &CausalAttention) -> Result<(BufferRef, BufferRef)> {
        let op = CausalAttention::name(false);
        let x = self.operand(op, qkv, Some(&Layout::contiguous([spec.qkv_len()])))?;
        let forward = AttentionKernels::chosen().forward.of(op, x.dtype(), spec.head_dim)?;
        let y = self.output(x.dtype(), spec.out_len())?;
        let lse = self.output(DType::F32, spec.rows())?;
        if spec.rows() > 0 {
            let (heads, t, scale) = (to_u32(op, spec.heads)?, to_u32(op, spec.t)?, spec.scale as f32);
            launch!(&self.gpu, forward, head_blocks(spec); &y.ptr, &lse.ptr, &x.ptr, &heads, &t, &scale);
        }
        Ok((y, lse))
    }

    /// dqkv `[batch, t, 3, heads, d]` from the forward pass's inputs and outputs and `dy`.
    pub(crate) fn attention_backward(
        &self,
        [qkv, y, lse, dy]: [&BufferRef; 4],
        spec: &CausalAttention,
    ) -> Result<BufferRef> {
        let op = CausalAttention::name(true);
        let out_layout = Layout::contiguous([spec.out_len()]);
        let x = self.operand(op, qkv, Some(&Layout::contiguous([spec.qkv_len()])))?;
        let (y, dy) = (
            self.operand(op, y, Some(&out_layout))?,
            self.operand(op, dy, Some(&out_layout))?,
        );
        let lse = self.operand(op, lse, Some(&Layout::contiguous([spec.rows()])))?;
        let row_stats = entry_points::CAUSAL_ATTENTION_ROW_STATS.of(op, x.dtype())?;
        let kernels = AttentionKernels::chosen();
        let dq = kernels.dq.of(op, x.dtype(), spec.head_dim)?;
        let dkdv = kernels.dkdv.of(op, x.dtype(), spec.head_dim)?;
        let dqkv = self.output(x.dtype(), spec.qkv_len())?;
        if spec.rows() == 0 {
            return Ok(dqkv);
        }
        // (lse · log2(e), dot) for each row, f32 pairs.
        let stats = self.output(DType::F32, 2 * spec.rows())?;
        let (rows, heads, t) = (to_u32(op, spec.rows())?, to_u32(op, spec.heads)?, to_u32(op, spec.t)?);
        let (d, scale) = (to_u32(op, spec.head_dim)?, spec.scale as f32);
        // One warp a row.
        launch!(&self.gpu, row_stats, self.gpu.grid(spec.rows() * 32);
            &stats.ptr, &lse.ptr, &y.ptr, &dy.ptr, &rows, &heads, &t, &d);
        let cfg = head_blocks(spec);
        for pass in [dq, dkdv] {
            launch!(&self.gpu, pass, cfg; &dqkv.ptr, &x.ptr, &dy.ptr, &stats.ptr, &heads, &t, &scale);
        }
        Ok(dqkv)
    }
}
