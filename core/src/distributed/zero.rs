//! ZeRO (Rajbhandari et al., 2020) as an option of data parallel: each replica keeps the
//! optimizer state of only its share of the parameters (stage 1), and with stage 2 keeps only
//! that share's gradients once they are averaged. Every replica still computes every gradient
//! and holds every weight; after the step each parameter is broadcast from the replica that
//! updated it, so the weights end as plain data parallel's, bit for bit.
//!
//! The shares are whole parameters, balanced by size (PyTorch's `ZeroRedundancyOptimizer`
//! partitions so too): an optimizer's per-parameter state keeps its PyTorch names and shapes,
//! so a checkpoint is the one a single device writes, and it resumes on any number of
//! replicas, or on one device. The replicas of one process share a board through which rank 0
//! reads every share's state when it saves; replicas in separate processes have none yet.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use crate::backend::Communicator;
use crate::device::Device;
use crate::distributed::all_gather_values;
use crate::error::{Error, Result};
use crate::optim::{Optimizer, OptimizerState};
use crate::tensor::Tensor;

/// What ZeRO partitions across the data-parallel replicas (DeepSpeed's stages).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum ZeroStage {
    /// Stage 1: the optimizer state (Adam's moments, SGD's momentum).
    OptimizerState,
    /// Stage 2: the optimizer state and the averaged gradients.
    Gradients,
}

impl ZeroStage {
    /// The stage by DeepSpeed's number: 1 or 2 (stage 3, sharded parameters, is not built).
    pub fn from_number(stage: u8) -> Result<ZeroStage> {
        match stage {
            1 => Ok(ZeroStage::OptimizerState),
            2 => Ok(ZeroStage::Gradients),
            _ => Err(Error::invalid(
                "ZeRO",
                format!("stage {stage} is not one of 1 (optimizer state) or 2 (and gradients)"),
            )),
        }
    }
    /// DeepSpeed's number for the stage.
    pub fn number(self) -> u8 {
        match self {
            ZeroStage::OptimizerState => 1,
            ZeroStage::Gradients => 2,
        }
    }
}

/// Which rank updates each parameter: the largest first, each to the rank holding the fewest
/// elements so far (the lowest such rank), so every rank computes the same assignment.
pub(crate) fn owners(sizes: &[usize], world: usize) -> Vec<usize> {
    let world = world.max(1);
    let mut order: Vec<usize> = (0..sizes.len()).collect();
    order.sort_by(|&a, &b| sizes[b].cmp(&sizes[a]).then(a.cmp(&b)));
    let mut load = vec![0usize; world];
    let mut owner = vec![0; sizes.len()];
    for i in order {
        let rank = (0..world).min_by_key(|&r| (load[r], r)).unwrap_or(0);
        owner[i] = rank;
        load[rank] += sizes[i];
    }
    owner
}

/// The bytes of an optimizer state's tensors: what a replica holds for it.
pub fn state_bytes(state: &OptimizerState) -> u64 {
    state
        .tensors
        .iter()
        .map(|(_, t)| (t.elem_count() * t.dtype().size_in_bytes()) as u64)
        .sum()
}

/// One replica's optimizer, over every parameter but stepping only its own share. Shared with
/// rank 0's board (same process) and handed back by `unshard` after the run.
type Shard = Arc<Mutex<Option<Box<dyn Optimizer>>>>;

/// Replicas of one process find each other's shards here, under a number rank 0 chose.
static BOARDS: Mutex<BTreeMap<u32, Vec<(usize, Weak<Mutex<Option<Box<dyn Optimizer>>>>)>>> =
    Mutex::new(BTreeMap::new());
static NEXT_BOARD: AtomicU32 = AtomicU32::new(0);

/// An optimizer whose state is partitioned over data-parallel replicas (ZeRO stage 1; the
/// gradients of stage 2 are the reducer's part): each rank's inner optimizer steps its share of
/// the parameters, and then every parameter is broadcast from its owner. Every rank must call
/// `step` together. Rank 0's `state` is the whole optimizer's, read from every replica of this
/// process; another rank's holds its share.
#[derive(Clone)]
pub struct ShardedOptimizer {
    params: Vec<Tensor>,
    owners: Vec<usize>,
    comm: Arc<dyn Communicator>,
    own: Shard,
    /// Rank 0: every rank's shard, by rank (this one's included).
    board: Vec<Shard>,
    name: &'static str,
}

impl ShardedOptimizer {
    /// Partitions the optimizer in `slot` (already holding any resumed state, of which it then
    /// keeps only its share) over the ranks of `comm`, and puts a handle to the partitioned one
    /// in its place; `unshard` puts the optimizer back. A collective: every rank calls it, with
    /// the same parameters. Replicas in separate processes are refused (the slot unchanged),
    /// naming what works.
    pub fn shard(slot: &mut Box<dyn Optimizer>, comm: Arc<dyn Communicator>) -> Result<ShardedOptimizer> {
        let params = slot.parameters().to_vec();
        let Some(first) = params.first() else {
            return Err(Error::invalid("ZeRO", "the optimizer has no parameters"));
        };
        let device = first.device().clone();
        let sizes: Vec<usize> = params.iter().map(Tensor::elem_count).collect();
        let own: Shard = Arc::new(Mutex::new(None));
        let board = join_board(&own, comm.as_ref(), &device)?;
        let sharded = ShardedOptimizer {
            owners: owners(&sizes, comm.world_size()),
            params,
            comm,
            own,
            board,
            name: slot.name(),
        };
        let mut inner = std::mem::replace(slot, Box::new(sharded.clone()));
        // Resumed moments of other ranks' parameters are dropped here: that is the saving.
        let whole = inner.state();
        inner.load_state(&sharded.share_of(&whole, sharded.rank()))?;
        *lock(&sharded.own) = Some(inner);
        Ok(sharded)
    }

    /// Puts the partitioned optimizer back into `slot`, holding the whole state on rank 0
    /// (read from every replica of this process) and its share on the others. Call it once,
    /// on every rank together, when the run is over.
    pub fn unshard(self, slot: &mut Box<dyn Optimizer>) -> Result<()> {
        let whole = (self.rank() == 0).then(|| self.state());
        // Rank 0 has read every share before any rank takes its own away.
        self.comm.barrier()?;
        let mut inner = lock(&self.own)
            .take()
            .ok_or_else(|| Error::invalid("ZeRO", "this replica's optimizer was already handed back"))?;
        if let Some(whole) = whole {
            inner.load_state(&whole)?;
        }
        *slot = inner;
        Ok(())
    }

    fn rank(&self) -> usize {
        self.comm.rank()
    }

    /// Whether this rank updates parameter `i`.
    pub fn owns(&self, i: usize) -> bool {
        self.owners[i] == self.rank()
    }

    /// Which rank updates each parameter, in the optimizer's order.
    pub fn owners(&self) -> &[usize] {
        &self.owners
    }

    /// The bytes of this rank's share of the optimizer state.
    pub fn own_state_bytes(&self) -> u64 {
        lock(&self.own).as_ref().map_or(0, |o| state_bytes(&o.state()))
    }

    fn inner(&self) -> Result<MutexGuard<'_, Option<Box<dyn Optimizer>>>> {
        let guard = lock(&self.own);
        if guard.is_none() {
            return Err(Error::invalid(
                "ZeRO",
                "this replica's optimizer was already handed back",
            ));
        }
        Ok(guard)
    }

    /// The entries of `state` that rank `rank` keeps: its parameters' state and every
    /// hyper-parameter.
    fn share_of(&self, state: &OptimizerState, rank: usize) -> OptimizerState {
        let keeps = |name: &str| parameter_index(name).is_none_or(|i| self.owners.get(i) == Some(&rank));
        OptimizerState {
            tensors: state.tensors.iter().filter(|(n, _)| keeps(n)).cloned().collect(),
            scalars: state.scalars.iter().filter(|(n, _)| keeps(n)).cloned().collect(),
        }
    }
}

/// The parameter a `state.{i}.…` entry belongs to; `None` for hyper-parameters.
pub(crate) fn parameter_index(name: &str) -> Option<usize> {
    name.strip_prefix("state.")?.split('.').next()?.parse().ok()
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Registers `own` on a board every rank of `comm` joins; rank 0 gets every rank's shard. An
/// error on every rank when the ranks are not all in this process.
fn join_board(own: &Shard, comm: &dyn Communicator, device: &Device) -> Result<Vec<Shard>> {
    let (rank, world) = (comm.rank(), comm.world_size());
    let proposed = if rank == 0 {
        NEXT_BOARD.fetch_add(1, Ordering::Relaxed)
    } else {
        0
    };
    let number = all_gather_values(comm, device, vec![proposed])?[0];
    lock(&BOARDS)
        .entry(number)
        .or_default()
        .push((rank, Arc::downgrade(own)));
    comm.barrier()?;
    let mut board = Vec::new();
    if rank == 0 {
        let mut shards: Vec<(usize, Shard)> = lock(&BOARDS)
            .remove(&number)
            .unwrap_or_default()
            .into_iter()
            .filter_map(|(r, w)| Some((r, w.upgrade()?)))
            .collect();
        shards.sort_by_key(|(r, _)| *r);
        if shards.iter().map(|(r, _)| *r).eq(0..world) {
            board = shards.into_iter().map(|(_, s)| s).collect();
        }
    }
    let complete = all_gather_values(comm, device, vec![u32::from(!board.is_empty())])?[0] == 1;
    if !complete {
        // Replicas elsewhere registered on their own process's board under the same number.
        lock(&BOARDS).remove(&number);
        return Err(Error::invalid(
            "ZeRO",
            "the replicas are in separate processes, where rank 0 cannot yet read the others' optimizer state for \
             its checkpoints; run them in one process (--devices cpu:0,cpu:1,…) or train without --zero",
        ));
    }
    Ok(board)
}

impl Optimizer for ShardedOptimizer {
    fn name(&self) -> &'static str {
        self.name
    }

    /// Steps this rank's share (the other parameters' gradients are set aside), then brings
    /// every parameter to its owner's values.
    fn step(&mut self) -> Result<()> {
        {
            let mut guard = self.inner()?;
            for (i, p) in self.params.iter().enumerate() {
                if self.owners[i] != self.comm.rank() {
                    p.set_grad(None);
                }
            }
            if let Some(inner) = guard.as_mut() {
                inner.step()?;
            }
        }
        for (p, &owner) in self.params.iter().zip(&self.owners) {
            self.comm.broadcast(p.buffer(), owner)?;
        }
        Ok(())
    }

    fn parameters(&self) -> &[Tensor] {
        &self.params
    }

    fn lr(&self) -> f64 {
        lock(&self.own).as_ref().map_or(0.0, |o| o.lr())
    }

    fn set_lr(&mut self, lr: f64) {
        if let Some(o) = lock(&self.own).as_mut() {
            o.set_lr(lr);
        }
    }

    /// Rank 0: the whole optimizer's state, each parameter's from its owner (replicas wait in
    /// their next collective while rank 0 saves, so every share is at the same step). Other
    /// ranks: their own share.
    fn state(&self) -> OptimizerState {
        let own = lock(&self.own).as_ref().map(|o| o.state()).unwrap_or_default();
        if self.board.is_empty() {
            return own;
        }
        let mut whole = OptimizerState {
            tensors: Vec::new(),
            scalars: own
                .scalars
                .iter()
                .filter(|(n, _)| parameter_index(n).is_none())
                .cloned()
                .collect(),
        };
        for (rank, shard) in self.board.iter().enumerate() {
            let state = if Arc::ptr_eq(shard, &self.own) {
                own.clone()
            } else {
                lock(shard).as_ref().map(|o| o.state()).unwrap_or_default()
            };
            let share = self.share_of(&state, rank);
            whole.tensors.extend(share.tensors);
            whole
                .scalars
                .extend(share.scalars.into_iter().filter(|(n, _)| parameter_index(n).is_some()));
        }
        whole
    }

    /// Keeps this rank's share of `state` (a whole optimizer's, from any number of replicas).
    fn load_state(&mut self, state: &OptimizerState) -> Result<()> {
        let share = self.share_of(state, self.rank());
        match self.inner()?.as_mut() {
            Some(inner) => inner.load_state(&share),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owners_balance_the_elements_largest_first() {
        assert_eq!(owners(&[10, 1, 8, 3, 2], 2), vec![0, 1, 1, 1, 0]);
        assert_eq!(owners(&[5, 5, 5, 5], 4), vec![0, 1, 2, 3]);
        assert_eq!(owners(&[7], 3), vec![0]);
    }

    #[test]
    fn state_entries_name_their_parameter() {
        assert_eq!(parameter_index("state.12.exp_avg"), Some(12));
        assert_eq!(parameter_index("param_groups.0.lr"), None);
    }
}
