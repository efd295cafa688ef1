//! A pre-norm transformer's residual add and the LayerNorm that reads its result, in one pass
//! over the rows: `(x + branch, layer_norm(x + branch))`, the f32 residual stream `x` plus a
//! branch in f32 or (under autocast) a 16-bit dtype. Backward, the LayerNorm's call adds the
//! gradient that the sum's other use (the next residual add) delivered first and rounds the
//! total for the 16-bit branch, which the add's own backward then hands on instead of casting.

use std::sync::{Arc, Mutex};

use super::Tensor;
use super::layer_norm::{affine, track_layer_norm};
use crate::backend::LayerNormSpec;
use crate::dtype::DType;
use crate::error::Result;

impl Tensor {
    /// `self + branch` and the LayerNorm of that sum over its last axis (`layer_norm`, its
    /// result in `out` as `layer_norm_to` rounds it; None: the dtype it computes in): the bits
    /// of `self.add(branch)` then that LayerNorm, in one pass where the backend fuses them (an
    /// f32 `self` of `branch`'s shape, `branch` f32, or f16/bf16 where autocast's mixed-dtype
    /// fusions are on). Returns `(sum, normed)`.
    pub fn add_layer_norm(
        &self,
        branch: &Tensor,
        weight: Option<&Tensor>,
        bias: Option<&Tensor>,
        eps: f64,
        out: Option<DType>,
    ) -> Result<(Tensor, Tensor)> {
        let features = match self.layer_norm_features(weight, bias) {
            Ok(features) if self.fuses_residual_add(branch, out) => features,
            _ => {
                let sum = self.add(branch)?;
                let normed = sum.layer_norm_into(weight, bias, eps, out)?;
                return Ok((sum, normed));
            }
        };
        let (x, branch) = (self.contiguous()?, branch.contiguous()?);
        let (weight, bias) = (
            weight.map(Tensor::contiguous).transpose()?,
            bias.map(Tensor::contiguous).transpose()?,
        );
        let spec = LayerNormSpec {
            rows: x.elem_count() / features,
            cols: features,
            eps,
        };
        let [sum, normed] = x.backend().add_layer_norm_last_to(
            x.buffer(),
            branch.buffer(),
            affine(&weight, &bias),
            &spec,
            out.unwrap_or(DType::F32),
        )?;
        let (shape, device) = (x.shape().clone(), x.device());
        let rounded = (branch.dtype() != DType::F32).then(|| RoundedBranch::new(branch.dtype()));
        let held = rounded.clone();
        let branch_dtype = branch.dtype();
        let sum = Tensor::from_buffer(sum, shape.clone(), device).track("add", &[&x, &branch], move |g| {
            let for_branch = match held.and_then(|r| r.take(g)) {
                Some(rounded) => rounded,
                None => g.to_dtype(branch_dtype)?,
            };
            Ok(vec![Some(g.clone()), Some(for_branch)])
        });
        let normed = Tensor::from_buffer(normed, shape, device);
        Ok((sum.clone(), track_layer_norm(normed, &sum, weight, bias, spec, rounded)))
    }

    /// Whether `add_layer_norm` of these operands (its parameters checked apart) is one backend
    /// call: the operands and the output in dtypes the backends fuse (others compose, and report
    /// what is wrong), unless `LOCKSTEP_AUTOCAST_FUSIONS=off` composes every fusion.
    fn fuses_residual_add(&self, branch: &Tensor, out: Option<DType>) -> bool {
        let branch_dtype_fuses = match branch.dtype() {
            DType::F32 => !crate::autocast::fusions_switched_off(),
            DType::F16 | DType::BF16 => crate::autocast::widens_in_place(self, branch),
            _ => false,
        };
        self.dtype() == DType::F32
            && branch_dtype_fuses
            && self.shape() == branch.shape()
            && self.device() == branch.device()
            && self.elem_count() > 0
            && matches!(out, None | Some(DType::F32 | DType::F16 | DType::BF16))
    }
}

/// The 16-bit branch's gradient that the LayerNorm's backward rounded, kept for the residual
/// add's backward, which runs next: it takes it when its output gradient is the very tensor it
/// was rounded from (nothing else reached the sum after the LayerNorm), and casts otherwise.
#[derive(Clone)]
pub(super) struct RoundedBranch {
    pub dtype: DType,
    kept: Arc<Mutex<Option<(u64, Tensor)>>>,
}

impl RoundedBranch {
    fn new(dtype: DType) -> RoundedBranch {
        RoundedBranch {
            dtype,
            kept: Arc::new(Mutex::new(None)),
        }
    }

    /// Keeps `rounded`, the cast of `from` to `dtype`.
    pub fn keep(&self, from: &Tensor, rounded: Tensor) {
        *self.kept.lock().unwrap_or_else(|e| e.into_inner()) = Some((from.id(), rounded));
    }

    /// The kept rounding of `grad`, if `grad` is what it was rounded from.
    fn take(&self, grad: &Tensor) -> Option<Tensor> {
        let kept = self.kept.lock().unwrap_or_else(|e| e.into_inner()).take()?;
        (kept.0 == grad.id()).then_some(kept.1)
    }
}
