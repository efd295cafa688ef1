//! The multi-tensor ops on wgpu (SGD with momentum buffers only): up to `MAX_SLOTS` f32 tensors
//! a dispatch through shaders generated with a binding set per tensor
//! (lockstep_shaders::compose_multi_tensor), as many as the adapter's storage-buffer limit
//! allows. Other dtypes, adapters that cannot bind two tensors' buffers at once, and devices with the shaders turned off (software adapters by
//! default: see `WgpuBackend::set_multi_tensor`) take the trait's per-tensor defaults.

use std::sync::{Arc, OnceLock};

use lockstep_core::backend::multi_tensor::{
    adam_steps_one_by_one, cast_copies_one_by_one, check_adam_items, check_factor, check_sgd_items,
    non_finite_count_composed, scaled_copies_composed, sgd_steps_one_by_one, sum_of_squares_composed,
};
use lockstep_core::backend::{AdamOperands, Backend, BufferRef, ReduceKind, SgdOperands};
use lockstep_core::shape::Layout;
use lockstep_core::{DType, Result};
use lockstep_shaders::multi_tensor::{MULTI_TENSOR_OPS, SLOT_WORDS, SUM_CHUNK, extra_bindings};

use crate::backend::{Binding, WORKGROUP, WgpuBackend, to_u32};
use crate::buffer::WgpuBuffer;
use crate::pipelines::Variant;

/// The most tensors one dispatch takes (the shaders' `K`, a variant per count).
const MAX_SLOTS: usize = 8;
const SLOT_NAMES: [&str; MAX_SLOTS] = ["1", "2", "3", "4", "5", "6", "7", "8"];

/// Whether a new device runs the multi-tensor shaders: `LOCKSTEP_WGPU_MULTI_TENSOR` (`on`,
/// `off`, read once), else on for a GPU and off for a software adapter (see
/// `WgpuBackend::set_multi_tensor`).
pub(crate) fn by_default(software: bool) -> bool {
    static CHOSEN: OnceLock<Option<bool>> = OnceLock::new();
    let chosen = CHOSEN.get_or_init(|| match std::env::var("LOCKSTEP_WGPU_MULTI_TENSOR").as_deref() {
        Ok("on") => Some(true),
        Ok("off") => Some(false),
        Err(_) => None,
        Ok(other) => {
            eprintln!("lockstep: LOCKSTEP_WGPU_MULTI_TENSOR={other:?} is neither \"on\" nor \"off\"; ignored");
            None
        }
    });
    chosen.unwrap_or(!software)
}

/// The optimizer and clipping path as `devices --details` prints it.
pub(crate) fn plan(on: bool) -> &'static str {
    if on {
        "multi-tensor, up to 8 f32 tensors a dispatch (LOCKSTEP_WGPU_MULTI_TENSOR=off: one a dispatch)"
    } else {
        "one tensor a dispatch (LOCKSTEP_WGPU_MULTI_TENSOR=on: up to 8 f32 tensors a dispatch)"
    }
}

/// One tensor of a dispatch: its buffers (bound in order), length and constants.
struct Slot<'a> {
    buffers: Vec<&'a WgpuBuffer>,
    n: usize,
    consts: [f32; 9],
}

impl WgpuBackend {
    /// Tensors a dispatch of `op` can take on this adapter (below 2: not worth a dispatch).
    fn slots_for(&self, op: &str) -> usize {
        if !self.multi_tensor() {
            return 0;
        }
        let per_slot = MULTI_TENSOR_OPS
            .iter()
            .find(|(o, _)| *o == op)
            .map_or(usize::MAX, |o| o.1);
        let limit = self.gpu.limits.max_storage_buffers_per_shader_stage as usize;
        (limit.saturating_sub(1 + extra_bindings(op)) / per_slot).min(MAX_SLOTS)
    }

    /// Dispatches `op` over `slots` (none empty), `slots_for(op)` at a time, each tensor's
    /// workgroups after the previous one's (`per_group` elements a workgroup); `extra` is bound
    /// at 1, `first_params(dispatch_first_workgroup, dispatch_workgroups)` fill params 0 and 1.
    /// Returns the workgroups in all.
    fn dispatch_slots(
        &self,
        op: &'static str,
        slots: &[Slot<'_>],
        per_group: usize,
        extra: Option<&WgpuBuffer>,
    ) -> Result<usize> {
        // Callers send nothing here where a dispatch cannot take two tensors.
        let k_max = self.slots_for(op).max(1);
        let mut done = 0usize;
        for group in slots.chunks(k_max) {
            let mut params = vec![to_u32(op, done)?, 0];
            let mut bindings: Vec<Binding> = extra.map(|b| (1, b)).into_iter().collect();
            let mut next = 1 + extra_bindings(op) as u32;
            let mut workgroups = 0usize;
            for slot in group {
                params.extend([to_u32(op, workgroups)?, to_u32(op, slot.n)?]);
                params.extend(slot.consts.iter().map(|c| c.to_bits()));
                for b in &slot.buffers {
                    bindings.push((next, *b));
                    next += 1;
                }
                workgroups += slot.n.div_ceil(per_group);
            }
            debug_assert_eq!(params.len(), 2 + group.len() * SLOT_WORDS);
            params[1] = to_u32(op, workgroups)?;
            let variant = Variant::new(op, op, &[SLOT_NAMES[group.len() - 1]]);
            self.launch(&variant, &params, &bindings, self.groups(op, workgroups)?)?;
            done += workgroups;
        }
        Ok(done)
    }

    /// `Backend::adam_steps`: f32 parameters `slots_for` at a time, the rest one by one.
    pub(crate) fn adam_steps_batched(&self, items: &[AdamOperands<'_>]) -> Result<()> {
        const OP: &str = "adam_steps";
        check_adam_items(items)?;
        let all_f32 = |it: &AdamOperands| {
            [it.param, it.grad, it.exp_avg, it.exp_avg_sq]
                .iter()
                .all(|b| b.dtype() == DType::F32 && b.len() == it.param.len())
        };
        let (batched, single): (Vec<AdamOperands>, Vec<AdamOperands>) = items
            .iter()
            .filter(|it| !it.param.is_empty())
            .partition(|it| self.slots_for(OP) >= 2 && all_f32(it) && it.step.step > 0);
        adam_steps_one_by_one(self, &single)?;
        let slots = batched
            .iter()
            .map(|it| {
                let buffers = [it.param, it.grad, it.exp_avg, it.exp_avg_sq]
                    .iter()
                    .map(|b| self.operand(OP, b, None))
                    .collect::<Result<Vec<_>>>()?;
                Ok(Slot {
                    buffers,
                    n: it.param.len(),
                    consts: it.step.constants().in_kernel_order().map(|c| c as f32),
                })
            })
            .collect::<Result<Vec<_>>>()?;
        self.dispatch_slots(OP, &slots, WORKGROUP as usize, None)?;
        Ok(())
    }

    /// `Backend::sgd_steps`: f32 parameters with momentum `slots_for` at a time, the rest (no
    /// momentum, other dtypes) one by one.
    pub(crate) fn sgd_steps_batched(&self, items: &[SgdOperands<'_>]) -> Result<()> {
        const OP: &str = "sgd_steps";
        check_sgd_items(items)?;
        let batchable = |it: &SgdOperands| {
            it.momentum_buf.is_some_and(|b| {
                [it.param, it.grad, b]
                    .iter()
                    .all(|x| x.dtype() == DType::F32 && x.len() == it.param.len())
            })
        };
        let (batched, single): (Vec<SgdOperands>, Vec<SgdOperands>) = items
            .iter()
            .filter(|it| !it.param.is_empty())
            .partition(|it| self.slots_for(OP) >= 2 && batchable(it));
        sgd_steps_one_by_one(self, &single)?;
        let slots = batched
            .iter()
            .map(|it| {
                let momentum = it.momentum_buf.expect("partitioned on a momentum buffer");
                let buffers = [it.param, it.grad, momentum]
                    .iter()
                    .map(|b| self.operand(OP, b, None))
                    .collect::<Result<Vec<_>>>()?;
                let s = &it.step;
                // As `sgd` folds them for sgd_momentum_step (ops/optim.rs).
                let (keep, take) = if s.first_step {
                    (0.0, 1.0)
                } else {
                    (s.momentum, 1.0 - s.dampening)
                };
                let nesterov = f64::from(u8::from(s.nesterov));
                let mut consts = [0.0; 9];
                consts[..6]
                    .copy_from_slice(&[s.lr, s.weight_decay, keep, take, s.momentum, nesterov].map(|c| c as f32));
                Ok(Slot {
                    buffers,
                    n: it.param.len(),
                    consts,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        self.dispatch_slots(OP, &slots, WORKGROUP as usize, None)?;
        Ok(())
    }

    /// `Backend::sum_of_squares`: each workgroup's partial sum of 4096 f32 elements, then one
    /// `reduce` over the partials.
    pub(crate) fn sum_of_squares_batched(&self, bufs: &[&BufferRef]) -> Result<BufferRef> {
        const OP: &str = "sum_of_squares";
        if self.slots_for(OP) < 2 || bufs.iter().any(|b| b.dtype() != DType::F32) {
            return sum_of_squares_composed(self, bufs);
        }
        self.chunk_sums(OP, bufs)
    }

    /// `Backend::non_finite_count`: each workgroup's count over 4096 f32 elements, then one
    /// `reduce` over the counts.
    pub(crate) fn non_finite_count_batched(&self, bufs: &[&BufferRef]) -> Result<BufferRef> {
        const OP: &str = "non_finite_count";
        if self.slots_for(OP) < 2 || bufs.iter().any(|b| b.dtype() != DType::F32) {
            return non_finite_count_composed(self, bufs);
        }
        self.chunk_sums(OP, bufs)
    }

    /// The total of `op`'s per-element term over the f32 `bufs`: a partial per workgroup of
    /// `SUM_CHUNK` elements, the partials added by `reduce`.
    fn chunk_sums(&self, op: &'static str, bufs: &[&BufferRef]) -> Result<BufferRef> {
        let slots = bufs
            .iter()
            .filter(|b| !b.is_empty())
            .map(|b| {
                Ok(Slot {
                    buffers: vec![self.operand(op, b, None)?],
                    n: b.len(),
                    consts: [0.0; 9],
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let total: usize = slots.iter().map(|s| s.n.div_ceil(SUM_CHUNK)).sum();
        if total == 0 {
            return self.zeros(DType::F32, 1);
        }
        let partials = self.alloc(op, DType::F32, total)?;
        self.dispatch_slots(op, &slots, SUM_CHUNK, Some(&partials))?;
        let partials: BufferRef = partials;
        self.reduce(ReduceKind::Sum, &partials, &Layout::contiguous([total]), &[0])
    }

    /// `Backend::scaled_copies`: f32 buffers `slots_for` at a time.
    pub(crate) fn scaled_copies_batched(&self, bufs: &[&BufferRef], factor: &BufferRef) -> Result<Vec<BufferRef>> {
        const OP: &str = "scaled_copies";
        check_factor(OP, factor)?;
        if self.slots_for(OP) < 2 || bufs.iter().any(|b| b.dtype() != DType::F32) {
            return scaled_copies_composed(self, bufs, factor);
        }
        let factor = match factor.dtype() {
            DType::F32 => factor.clone(),
            _ => self.cast(factor, &Layout::contiguous([1]), DType::F32)?,
        };
        let outs = self.copies(OP, bufs, DType::F32)?;
        let slots = self.copy_slots(OP, bufs, &outs, |len| (len, [0.0; 9]))?;
        self.dispatch_slots(OP, &slots, WORKGROUP as usize, Some(self.operand(OP, &factor, None)?))?;
        Ok(outs.into_iter().map(|o| o as BufferRef).collect())
    }

    /// `Backend::cast_copies`: f32 buffers to bf16, `slots_for` at a time (a word of the copy an
    /// invocation); other dtypes one `cast` each.
    pub(crate) fn cast_copies_batched(&self, bufs: &[&BufferRef], dtype: DType) -> Result<Vec<BufferRef>> {
        const OP: &str = "cast_copies";
        if self.slots_for(OP) < 2 || dtype != DType::BF16 || bufs.iter().any(|b| b.dtype() != DType::F32) {
            return cast_copies_one_by_one(self, bufs, dtype);
        }
        let outs = self.copies(OP, bufs, DType::BF16)?;
        // A word (two elements) an invocation; constant 0: whether the length is odd.
        let slots = self.copy_slots(OP, bufs, &outs, |len| {
            let mut consts = [0.0; 9];
            consts[0] = if len % 2 == 1 { 1.0 } else { 0.0 };
            (len.div_ceil(2), consts)
        })?;
        self.dispatch_slots(OP, &slots, WORKGROUP as usize, None)?;
        Ok(outs.into_iter().map(|o| o as BufferRef).collect())
    }

    /// A new buffer of `dtype` as long as each of `bufs`: the copies' outputs.
    fn copies(&self, op: &'static str, bufs: &[&BufferRef], dtype: DType) -> Result<Vec<Arc<WgpuBuffer>>> {
        bufs.iter().map(|b| self.alloc(op, dtype, b.len())).collect()
    }

    /// A slot for each non-empty buffer and its copy; `shape` gives a length's invocations and
    /// constants.
    fn copy_slots<'a>(
        &self,
        op: &'static str,
        bufs: &[&'a BufferRef],
        outs: &'a [Arc<WgpuBuffer>],
        shape: impl Fn(usize) -> (usize, [f32; 9]),
    ) -> Result<Vec<Slot<'a>>> {
        bufs.iter()
            .zip(outs)
            .filter(|(b, _)| !b.is_empty())
            .map(|(b, out)| {
                let (n, consts) = shape(b.len());
                Ok(Slot {
                    buffers: vec![self.operand(op, b, None)?, out],
                    n,
                    consts,
                })
            })
            .collect()
    }
}
