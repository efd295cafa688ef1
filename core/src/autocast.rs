//! Autocast: mixed precision by op class, PyTorch AMP's semantics (spec AMP-1..6).
//!
//! Inside an `AutocastGuard` region on this thread, matrix products (matmul, linear, the GEMM of
//! a convolution, and a layer's fused bias + activation) take f16/bf16 inputs: f32 operands are
//! cast down, and the casts of parameters (leaves that require grad) are cached so each weight
//! is cast once per region. Softmax, log-softmax, losses, sums, layer norm and exp/log/pow/
//! reciprocal run in f32: low-precision operands are cast up. Batch norm computes in f32 but
//! keeps its input's dtype (it is on neither of PyTorch's lists). Binary ops on mixed float
//! dtypes promote to the wider one. Everything else follows its inputs. Casts are differentiable, so
//! f32 parameters receive f32 gradients (master weights stay f32), and backward, run outside the
//! region, uses each op's forward dtype.

use std::cell::RefCell;
use std::collections::{HashMap, HashSet};

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::tensor::Tensor;

struct Region {
    dtype: DType,
    /// Parameter id -> (the parameter, kept alive so its id stays unique; its cast).
    cache: HashMap<u64, (Tensor, Tensor)>,
    /// The parameters `lower` was asked for, where the region learns them for the next
    /// `prefetch` (a training step's region; not a checkpoint's recompute or a user's own).
    lowered: Option<HashSet<u64>>,
}

thread_local! {
    static REGION: RefCell<Option<Region>> = const { RefCell::new(None) };
    /// The parameters the last training step's region lowered on this thread, by id: what the
    /// next `prefetch` casts ahead.
    static LOWERED_LAST: RefCell<HashSet<u64>> = RefCell::new(HashSet::new());
}

/// The low-precision dtype of the autocast region this thread is in, if any.
pub fn active() -> Option<DType> {
    REGION.with(|r| r.borrow().as_ref().map(|r| r.dtype))
}

/// Autocasts to `dtype` (f16 or bf16) until dropped; regions nest (the inner one wins).
pub struct AutocastGuard {
    previous: Option<Region>,
}

impl AutocastGuard {
    /// Enters an autocast region on this thread (as `torch.autocast(dtype=...)`); an
    /// `InvalidArgument` error unless `dtype` is F16 or BF16.
    pub fn new(dtype: DType) -> Result<AutocastGuard> {
        if !matches!(dtype, DType::F16 | DType::BF16) {
            return Err(Error::invalid(
                "autocast",
                format!("autocast lowers to f16 or bf16, not {dtype}"),
            ));
        }
        let region = Region {
            dtype,
            cache: HashMap::new(),
            lowered: None,
        };
        Ok(AutocastGuard {
            previous: REGION.with(|r| r.borrow_mut().replace(region)),
        })
    }
}

impl Drop for AutocastGuard {
    fn drop(&mut self) {
        let previous = self.previous.take();
        let ended = REGION.with(|r| std::mem::replace(&mut *r.borrow_mut(), previous));
        if let Some(lowered) = ended.and_then(|r| r.lowered) {
            LOWERED_LAST.with(|l| *l.borrow_mut() = lowered);
        }
    }
}

/// Puts this thread in the autocast state `dtype` (None: off) until dropped, with a cache of
/// its own: a checkpoint's recompute runs in the state its first forward ran in.
pub(crate) fn enter(dtype: Option<DType>) -> AutocastGuard {
    let region = dtype.map(|dtype| Region {
        dtype,
        cache: HashMap::new(),
        lowered: None,
    });
    AutocastGuard {
        previous: REGION.with(|r| std::mem::replace(&mut *r.borrow_mut(), region)),
    }
}

/// Runs `f` with autocast to `dtype`.
pub fn autocast<R>(dtype: DType, f: impl FnOnce() -> Result<R>) -> Result<R> {
    let _guard = AutocastGuard::new(dtype)?;
    f()
}

/// Whether `t`'s cast is kept for the rest of the region: a parameter (a leaf that requires
/// grad), outside a graph capture.
fn cacheable(t: &Tensor) -> bool {
    t.is_leaf() && t.tracks_grad() && !crate::autograd::capture::is_capturing()
}

/// Casts the f32 parameters among `params` that the last training step's region on this thread
/// lowered, now, all of a device in one `Backend::cast_copies` call, instead of one cast launch
/// each as the forward pass reaches them: the same casts, so the same results. Makes this
/// region the one the next call learns from. The training step calls it with the model's
/// parameters at the start of each forward pass (the first step learns, casting one at a time);
/// a training loop of your own can do the same right after entering its region. Nothing
/// happens outside a region.
pub fn prefetch(params: &[Tensor]) -> Result<()> {
    let Some(dtype) = active() else { return Ok(()) };
    let mut wanted: Vec<Tensor> = Vec::new();
    REGION.with(|r| {
        let mut region = r.borrow_mut();
        let Some(r) = region.as_mut() else { return };
        r.lowered.get_or_insert_with(HashSet::new);
        LOWERED_LAST.with(|last| {
            let last = last.borrow();
            for p in params {
                let new = !r.cache.contains_key(&p.id()) && !wanted.iter().any(|w| w.id() == p.id());
                if last.contains(&p.id()) && p.dtype() == DType::F32 && cacheable(p) && new {
                    wanted.push(p.clone());
                }
            }
        });
    });
    let cast = Tensor::to_dtype_all(&wanted, dtype)?;
    REGION.with(|r| {
        if let Some(r) = r.borrow_mut().as_mut() {
            for (p, c) in wanted.into_iter().zip(cast) {
                r.cache.insert(p.id(), (p, c));
            }
        }
    });
    Ok(())
}

/// `t` as a matrix-product input: cast down to the region's dtype when it is f32.
pub(crate) fn lower(t: &Tensor) -> Result<Tensor> {
    let Some(dtype) = active() else { return Ok(t.clone()) };
    if t.dtype() != DType::F32 {
        return Ok(t.clone());
    }
    let cacheable = cacheable(t);
    if cacheable {
        REGION.with(|r| {
            if let Some(lowered) = r.borrow_mut().as_mut().and_then(|r| r.lowered.as_mut()) {
                lowered.insert(t.id());
            }
        });
    }
    if cacheable
        && let Some(cast) = REGION.with(|r| {
            r.borrow()
                .as_ref()
                .and_then(|r| r.cache.get(&t.id()).map(|c| c.1.clone()))
        })
    {
        return Ok(cast);
    }
    let cast = t.to_dtype(dtype)?;
    if cacheable {
        REGION.with(|r| {
            if let Some(r) = r.borrow_mut().as_mut() {
                r.cache.insert(t.id(), (t.clone(), cast.clone()));
            }
        });
    }
    Ok(cast)
}

/// `t` as the input of an op that runs in f32 under autocast: cast up from f16/bf16.
pub(crate) fn full(t: &Tensor) -> Result<Tensor> {
    t.to_dtype(full_dtype(t.dtype()))
}

/// The dtype `full` gives a tensor of `dtype`: for an op that reads 16-bit values itself and
/// only needs to know what it would have run in.
pub(crate) fn full_dtype(dtype: DType) -> DType {
    if active().is_some() && matches!(dtype, DType::F16 | DType::BF16) {
        DType::F32
    } else {
        dtype
    }
}

/// The operands of an op cast by its class's rule (`lower` or `full`) when autocast changes
/// any of them; None when it changes none, and the op runs as called.
pub(crate) fn recast(operands: &[&Tensor], rule: fn(&Tensor) -> Result<Tensor>) -> Result<Option<Vec<Tensor>>> {
    if active().is_none() {
        return Ok(None);
    }
    let cast: Vec<Tensor> = operands.iter().map(|t| rule(t)).collect::<Result<_>>()?;
    let changed = cast.iter().zip(operands).any(|(c, t)| c.dtype() != t.dtype());
    Ok(changed.then_some(cast))
}

/// Both operands in the wider of their float dtypes, when autocast is on and they differ;
/// None when nothing changes.
pub(crate) fn promote(a: &Tensor, b: &Tensor) -> Result<Option<(Tensor, Tensor)>> {
    let (da, db) = (a.dtype(), b.dtype());
    if active().is_none() || da == db || !da.is_float() || !db.is_float() {
        return Ok(None);
    }
    let wider = if rank(da) >= rank(db) { da } else { db };
    Ok(Some((a.to_dtype(wider)?, b.to_dtype(wider)?)))
}

/// Whether autocast promotes `a` and `b` from one f32 operand and one f16/bf16 operand, on a
/// device whose `binary_mixed` reads the 16-bit one without a widening cast first (`fusions`).
pub(crate) fn widens_in_place(a: &Tensor, b: &Tensor) -> bool {
    let Some(half) = crate::backend::mixed::half_beside_f32(a.dtype(), b.dtype()) else {
        return false;
    };
    active().is_some() && a.device() == b.device() && fusions::fusions_on(a.device(), half)
}

/// The dtype a LayerNorm feeding a matrix product on `device` writes: the region's, where the
/// device's fused `layer_norm_last_to` may take it (`fusions`); None outside a region or where
/// the LayerNorm keeps f32 and the product casts.
pub(crate) fn product_input_dtype(device: &crate::device::Device) -> Option<DType> {
    active().filter(|&dtype| fusions::fusions_on(device, dtype))
}

fn rank(d: DType) -> u8 {
    match d {
        DType::F64 => 3,
        DType::F32 => 2,
        _ => 1,
    }
}

mod fusions;
pub(crate) use fusions::switched_off as fusions_switched_off;
#[cfg(test)]
mod tests;
