//! SyncBatchNorm's statistics: per-channel batch statistics summed over every replica, so a batch
//! split across replicas is normalised as one batch on one device (PyTorch's SyncBatchNorm).
//!
//! The reductions are differentiable all-reduces: every replica's loss depends on the shared
//! statistics, so backward sums the statistics' gradients across replicas too. Counts are summed
//! with the sums, so unequal shards (and empty ones) weigh exactly as their rows do.

use std::sync::Arc;

use crate::backend::{Communicator, ReduceOp};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::tensor::{BatchStats, Tensor};

/// A copy of `x` summed over every rank of `comm`. Its backward sums the output gradient over
/// the ranks in the same way (the gradient of a sum that every rank consumes), so every rank
/// must run this forward, and the backward through it, in the same order.
pub fn all_reduce_sum(x: &Tensor, comm: &Arc<dyn Communicator>) -> Result<Tensor> {
    let out = x.deep_copy()?;
    comm.all_reduce(out.buffer(), ReduceOp::Sum)?;
    let comm = comm.clone();
    Ok(out.track("all_reduce_sum", &[x], move |g| {
        let summed = g.deep_copy()?;
        comm.all_reduce(summed.buffer(), ReduceOp::Sum)?;
        Ok(vec![Some(summed)])
    }))
}

/// Mean and biased variance of `x` over `axes` (every axis but 1) across all replicas, in two
/// passes (as accurate as one device's): the global sums and counts give the mean, then the
/// global sum of squared deviations from it gives the variance.
pub(crate) fn synced_batch_stats(x: &Tensor, axes: &[isize], comm: &Arc<dyn Communicator>) -> Result<BatchStats> {
    let c = x.dims()[1];
    let mut bshape = vec![1; x.rank()];
    bshape[1] = c;
    // Sums and count travel in one buffer, at least f32 so that counts stay exact (f16 is not).
    let wide = if x.dtype() == DType::F64 {
        DType::F64
    } else {
        DType::F32
    };
    let local_count = Tensor::full([1], (x.elem_count() / c.max(1)) as f64, wide, x.device())?;
    let packed = Tensor::concat(&[&x.sum(axes, false)?.to_dtype(wide)?, &local_count], 0)?;
    let totals = all_reduce_sum(&packed, comm).map_err(|e| explain(e, comm))?;
    // Reading the count back is a host sync, as in PyTorch (its count mask syncs too); every
    // rank reads the same total, so all go on (or fail below) together.
    let count = totals.narrow(0, c, 1)?.item()?.round() as usize;
    // With no values at all the shared check refuses the batch; until then avoid dividing by 0.
    let per_value = 1.0 / count.max(1) as f64;
    let mean = totals
        .narrow(0, 0, c)?
        .affine(per_value, 0.0)?
        .to_dtype(x.dtype())?
        .reshape(bshape.clone())?;
    let centered = x.sub(&mean)?;
    let squares = all_reduce_sum(&centered.mul(&centered)?.sum(axes, false)?, comm).map_err(|e| explain(e, comm))?;
    let var = squares.affine(per_value, 0.0)?.reshape(bshape)?;
    Ok(BatchStats { mean, var, count })
}

/// A collective failure inside SyncBatchNorm, with what usually causes it.
fn explain(e: Error, comm: &Arc<dyn Communicator>) -> Error {
    Error::invalid(
        "SyncBatchNorm",
        format!(
            "cannot synchronise batch statistics on rank {} of {}: {e}; every replica must run the same model \
             (equal num_features per BatchNorm layer, same dtype) in training mode, step for step",
            comm.rank(),
            comm.world_size()
        ),
    )
}
