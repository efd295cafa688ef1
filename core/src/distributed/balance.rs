//! Re-balancing a data-parallel run over devices of different speeds: every few hundred
//! optimizer steps each rank tells the others how many samples it processed and how long it
//! computed (data loading and waiting for other ranks left out), and all of them set the same
//! new shares of the global batch, proportional to those speeds. A rank's gradient is weighted
//! by its share, so the averaged gradient stays the mean over the global batch.

use std::sync::Arc;

use super::gather::all_gather_values;
use super::shares::rebalanced;
use crate::backend::Communicator;
use crate::data::BatchShares;
use crate::device::Device;
use crate::error::{Error, Result};

/// A rank's running totals, as the trainer counts them.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct WorkDone {
    /// Samples this rank has processed so far: a running total, of which only the growth between calls counts.
    pub samples: u64,
    /// Forward, backward (to the device's completion) and optimizer seconds.
    pub compute_seconds: f64,
}

/// Keeps the ranks' shares of the global batch proportional to their measured speed, re-balancing
/// every `every` optimizer steps (default 200); every rank holds one and calls it at the same steps.
pub struct Balancer {
    shares: BatchShares,
    comm: Arc<dyn Communicator>,
    every: u64,
    /// The totals where the current measurement began; none until the first step is over, so
    /// its warm-up (kernel compilation, first allocations) is never measured.
    window_start: Option<WorkDone>,
}

impl Balancer {
    /// Optimizer steps between re-balances, unless told otherwise.
    pub const DEFAULT_EVERY: u64 = 200;

    /// Re-balances `shares` (this rank's loader cuts its batches by them) every `every`
    /// optimizer steps (0: never, the shares stay as given) over `comm`, the gradients'.
    pub fn new(shares: BatchShares, comm: Arc<dyn Communicator>, every: u64) -> Result<Balancer> {
        let (ranks, world) = (shares.ranks(), comm.world_size());
        if ranks != world {
            return Err(Error::invalid(
                "Balancer",
                format!("the shares are for {ranks} ranks but the communicator joins {world}"),
            ));
        }
        Ok(Balancer {
            shares,
            comm,
            every,
            window_start: None,
        })
    }

    /// The shares now, by rank.
    pub fn shares(&self) -> Vec<usize> {
        self.shares.get()
    }

    /// Goes on from `saved`, the shares of a checkpoint, when they fit this run (as many ranks,
    /// the same global batch); otherwise, as for a checkpoint of an unbalanced run or of other
    /// devices, the shares stay as given. Returns whether `saved` was taken.
    pub fn restore(&mut self, saved: &[usize]) -> bool {
        !saved.is_empty() && self.shares.set(saved.to_vec()).is_ok()
    }

    /// The factor on this rank's loss (the mean over its share) that turns the replicas'
    /// averaged gradients into the global batch's mean: share * world / global batch.
    pub fn gradient_weight(&self) -> f64 {
        let shares = self.shares.get();
        let global: usize = shares.iter().sum();
        (shares[self.comm.rank()] * shares.len()) as f64 / global as f64
    }

    /// After each optimizer step (the same `step` on every rank), with this rank's totals:
    /// on a re-balancing step, gathers every rank's speed over the window and sets new shares.
    /// Returns whether they changed (the loader must then start a new iterator).
    pub fn after_step(&mut self, step: u64, totals: WorkDone, device: &Device) -> Result<bool> {
        let Some(start) = self.window_start else {
            self.window_start = Some(totals);
            return Ok(false);
        };
        if self.every == 0 || !step.is_multiple_of(self.every) {
            return Ok(false);
        }
        self.window_start = Some(totals);
        // f32: every collective engine carries it. A window that went backwards (totals of a
        // new fit or a resumed state) gives no usable rate, and the shares stay.
        let mine = vec![
            totals.samples.saturating_sub(start.samples) as f32,
            (totals.compute_seconds - start.compute_seconds) as f32,
        ];
        let all = all_gather_values(self.comm.as_ref(), device, mine)?;
        let rates: Vec<f64> = all.chunks_exact(2).map(|c| f64::from(c[0]) / f64::from(c[1])).collect();
        match rebalanced(&self.shares.get(), &rates)? {
            Some(new) => self.shares.set(new).map(|()| true),
            None => Ok(false),
        }
    }
}
