//! How much memory each rank of a run will hold at its peak, before the run: parameters,
//! gradients, optimizer state, the data-parallel reducer's buckets and activations, for a
//! model, batch, precision, world size and ZeRO stage.
//!
//! Method: the parts that follow from the parameters are counted from the model itself, built
//! on a CPU device of its own: each parameter's bytes (its gradient has as many), and the
//! optimizer's state after one step (whatever the optimizer keeps). The activations are
//! measured, not modelled, so any model is covered: one forward and backward at each of two
//! small batches on a fresh CPU device, under the run's precision (the autocast casts and what
//! autograd saves in the autocast dtype included), records the peak bytes live above the
//! model (the batch, what is saved for backward, the largest transient), gradients dropped as
//! they become ready so they are not counted twice. Activation memory is linear in the batch
//! for these models (a constant part, such as the weights' autocast casts, plus a part per
//! sample), so the line through the two probes gives the run's batch.
//!
//! Gradients and activations overlap in time: backward frees activations as it makes
//! gradients, so their sum overstates the peak. Where the run keeps every gradient (all but
//! ZeRO stage 2, which drops them as backward goes), one more probe at the larger batch keeps
//! them, and what its peak falls short of activations plus gradients is taken off the
//! activations. That overlap only grows with the batch (the peak moves towards the start of
//! backward, where fewer gradients are live), so the estimate still errs high. Measured on the
//! CPU: another backend's kernels may keep workspaces of their own.

mod probe;

use probe::Gradients;

use crate::data::Dataset;
use crate::distributed::{ZeroStage, owners};
use crate::error::{Error, Result};
use crate::train::config::Precision;

pub use probe::BuildSetup;

/// The run an estimate is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemoryEstimateConfig {
    /// Samples each rank computes per micro-batch (the global batch over the world size).
    pub batch_per_rank: usize,
    /// The run's precision: mixed precision keeps activations in the autocast dtype.
    pub precision: Precision,
    /// Data-parallel replicas; above 1 each rank also holds the reducer's buckets.
    pub world_size: usize,
    /// ZeRO's partition of optimizer state (stage 1) and gradients (stage 2) over the replicas.
    pub zero: Option<ZeroStage>,
    /// Whether the model recomputes activations in backward instead of keeping them. The
    /// probe measures the model as `build` makes it, so this says what was assumed; `build`
    /// must make the model so.
    pub activation_checkpointing: bool,
}

impl Default for MemoryEstimateConfig {
    fn default() -> Self {
        MemoryEstimateConfig {
            batch_per_rank: 1,
            precision: Precision::Full,
            world_size: 1,
            zero: None,
            activation_checkpointing: false,
        }
    }
}

/// One rank's bytes at its peak, by what holds them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RankMemory {
    /// The weights and the model's buffers (running statistics).
    pub parameters: u64,
    /// The gradients this rank keeps for the optimizer step (its share under ZeRO stage 2).
    pub gradients: u64,
    /// The optimizer's state (momentum, Adam's moments; its share under ZeRO).
    pub optimizer_state: u64,
    /// The reducer's flat buffers: a copy of every gradient, kept for the run (data parallel);
    /// under ZeRO stage 2 those of the rank's own share, until the step (the others' are let
    /// go as they are reduced).
    pub buckets: u64,
    /// The batch, what autograd saves for backward and the largest transient, at this batch;
    /// less, where every gradient is kept, what of the gradients is not yet live at that peak.
    pub activations: u64,
}

impl RankMemory {
    /// Every part together.
    pub fn total(&self) -> u64 {
        self.parameters + self.gradients + self.optimizer_state + self.buckets + self.activations
    }
}

/// The estimate for every rank of a run, and the run it assumed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemoryEstimate {
    /// The model's name, as its setup gives it.
    pub model: String,
    /// The run assumed.
    pub config: MemoryEstimateConfig,
    /// Each rank's bytes, by rank; ranks differ only in their ZeRO shares.
    pub ranks: Vec<RankMemory>,
}

impl MemoryEstimate {
    /// The rank that needs the most: what each device must hold.
    pub fn largest(&self) -> RankMemory {
        self.ranks
            .iter()
            .copied()
            .max_by_key(RankMemory::total)
            .unwrap_or_default()
    }
}

/// Estimates each rank's peak memory for training the setup `build` makes (on the device it is
/// given) on batches from `data` as `config` says; see the module's documentation for the
/// method. Runs two or three small forward and backward passes and one optimizer step on the
/// CPU.
pub fn estimate_memory(
    build: BuildSetup<'_>,
    data: &dyn Dataset,
    config: MemoryEstimateConfig,
) -> Result<MemoryEstimate> {
    if config.batch_per_rank == 0 || config.world_size == 0 {
        return Err(Error::invalid(
            "memory estimate",
            "the batch per rank and the world size must be at least 1",
        ));
    }
    let model = probe::model_bytes(build)?;
    let world = config.world_size;
    // ZeRO partitions only where there are replicas, as `DataParallel` does.
    let zero = config.zero.filter(|_| world > 1);
    let every_gradient_kept = zero < Some(ZeroStage::Gradients);
    let peak = |batch, gradients| probe::step_peak(build, data, batch, config.precision, gradients);
    let (small, large) = probe_batches(config.batch_per_rank);
    let dropped = (peak(small, Gradients::Dropped)?, peak(large, Gradients::Dropped)?);
    let mut activations = activations_at(config.batch_per_rank, (small, dropped.0), (large, dropped.1));
    if every_gradient_kept {
        let gradients: u64 = model.parameters.iter().sum();
        let overlap = (dropped.1 + gradients).saturating_sub(peak(large, Gradients::Kept)?);
        activations = activations.saturating_sub(overlap.min(gradients));
    }
    let owner = owners(&model.elements, world);
    let share = |rank: usize, bytes: &[u64], partitioned: bool| -> u64 {
        let mine = |i: &usize| !partitioned || owner[*i] == rank;
        (0..bytes.len()).filter(mine).map(|i| bytes[i]).sum()
    };
    let all_parameters: u64 = model.parameters.iter().sum();
    let ranks = (0..world)
        .map(|rank| RankMemory {
            parameters: all_parameters + model.buffers,
            gradients: share(rank, &model.parameters, zero >= Some(ZeroStage::Gradients)),
            optimizer_state: share(rank, &model.optimizer_state, zero.is_some()),
            buckets: match zero {
                _ if world == 1 => 0,
                Some(ZeroStage::Gradients) => share(rank, &model.parameters, true),
                _ => all_parameters,
            },
            activations,
        })
        .collect();
    Ok(MemoryEstimate {
        model: model.model_name,
        config,
        ranks,
    })
}

/// The batches the activations are measured at: two small ones (the run's own where it is
/// small), so the line through them gives the run's batch.
fn probe_batches(batch: usize) -> (usize, usize) {
    const LARGER_PROBE: usize = 8;
    let larger = batch.min(LARGER_PROBE);
    ((larger / 2).max(1), larger)
}

/// Activation bytes at `batch`, on the line through two probes' (batch, bytes).
fn activations_at(batch: usize, small: (usize, u64), large: (usize, u64)) -> u64 {
    if small.0 == large.0 {
        return large.1;
    }
    let per_sample = (large.1 as f64 - small.1 as f64) / (large.0 - small.0) as f64;
    (large.1 as f64 + per_sample * (batch as f64 - large.0 as f64)).max(0.0) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probes_are_small_and_the_runs_own_batch_where_small() {
        assert_eq!(probe_batches(1), (1, 1));
        assert_eq!(probe_batches(6), (3, 6));
        assert_eq!(probe_batches(512), (4, 8));
    }

    #[test]
    fn activations_extend_the_line_through_the_probes() {
        // 100 bytes fixed plus 10 per sample.
        assert_eq!(activations_at(128, (4, 140), (8, 180)), 100 + 10 * 128);
        assert_eq!(activations_at(1, (1, 7), (1, 7)), 7);
    }
}
