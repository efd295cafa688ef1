//! ZeRO (Rajbhandari et al., 2020) as an option of data parallel: each replica keeps the
//! optimizer state of only its share of the parameters (stage 1), and with stage 2 keeps only
//! that share's gradients: the reducer's buckets each hold one owner's parameters and are
//! reduced to that owner alone, and the other ranks let them go once sent (no lasting copy of
//! gradients they do not step). Every replica still computes every gradient and holds every
//! weight; after the step each parameter is broadcast from the replica that
//! updated it, so the weights end as plain data parallel's, bit for bit.
//!
//! The shares are whole parameters, balanced by size (PyTorch's `ZeroRedundancyOptimizer`
//! partitions so too): an optimizer's per-parameter state keeps its PyTorch names and shapes,
//! so a checkpoint is the one a single device writes, and it resumes on any number of
//! replicas, or on one device. Rank 0 reads every share when it saves: from a board the
//! replicas of one process share, or from replicas in other processes, which send their
//! shares while rank 0's callbacks run (`open_window` and `close_window` bracket them).

mod board;
mod transfer;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::backend::Communicator;
use crate::device::Device;
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

/// How rank 0 reads the other ranks' shares of the state.
#[derive(Clone)]
enum Peers {
    /// Replicas of this process: rank 0 holds every rank's shard, by rank (the others none).
    Board(Vec<Shard>),
    /// Replicas in other processes send their shares when rank 0 asks, inside the window its
    /// callbacks run in; set while rank 0's window is open.
    Remote(Arc<AtomicBool>),
}

/// An optimizer whose state is partitioned over data-parallel replicas (ZeRO stage 1; the
/// gradients of stage 2 are the reducer's part): each rank's inner optimizer steps its share of
/// the parameters, and then every parameter is broadcast from its owner. Every rank must call
/// `step` together. Rank 0's `state` is the whole optimizer's (replicas in other processes
/// only inside `open_window`/`close_window`); another rank's holds its share.
#[derive(Clone)]
pub struct ShardedOptimizer {
    params: Vec<Tensor>,
    owners: Vec<usize>,
    comm: Arc<dyn Communicator>,
    device: Device,
    own: Shard,
    peers: Peers,
    name: &'static str,
}

impl ShardedOptimizer {
    /// Partitions the optimizer in `slot` (already holding any resumed state, of which it then
    /// keeps only its share) over the ranks of `comm`, and puts a handle to the partitioned one
    /// in its place; `unshard` puts the optimizer back. A collective: every rank calls it, with
    /// the same parameters. Replicas in separate processes over a communicator without
    /// point-to-point messages are refused (the slot unchanged), naming what works.
    pub fn shard(slot: &mut Box<dyn Optimizer>, comm: Arc<dyn Communicator>) -> Result<ShardedOptimizer> {
        let params = slot.parameters().to_vec();
        let Some(first) = params.first() else {
            return Err(Error::invalid("ZeRO", "the optimizer has no parameters"));
        };
        let device = first.device().clone();
        let sizes: Vec<usize> = params.iter().map(Tensor::elem_count).collect();
        let own: Shard = Arc::new(Mutex::new(None));
        let peers = match board::join(&own, comm.as_ref(), &device)? {
            Some(board) => Peers::Board(board),
            None => {
                transfer::check_messages(comm.as_ref(), &device)?;
                Peers::Remote(Arc::new(AtomicBool::new(false)))
            }
        };
        let sharded = ShardedOptimizer {
            owners: owners(&sizes, comm.world_size()),
            params,
            comm,
            device,
            own,
            peers,
            name: slot.name(),
        };
        let mut inner = std::mem::replace(slot, Box::new(sharded.clone()));
        // Resumed moments of other ranks' parameters are dropped here: that is the saving.
        let whole = inner.state();
        inner.load_state(&sharded.share_of(&whole, sharded.rank()))?;
        *lock(&sharded.own) = Some(inner);
        Ok(sharded)
    }

    /// Puts the partitioned optimizer back into `slot`, holding the whole state on rank 0 and
    /// its share on the others. Call it once, on every rank together, when the run is over.
    pub fn unshard(self, slot: &mut Box<dyn Optimizer>) -> Result<()> {
        self.open_window()?;
        let whole = (self.rank() == 0).then(|| self.try_state());
        self.close_window()?;
        let whole = whole.transpose()?;
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

    /// Every rank calls it before rank 0's callbacks, which may save checkpoints: rank 0 may
    /// then ask for the shares of replicas in other processes, which send them here until rank
    /// 0's `close_window`. Nothing to do for replicas of one process.
    pub fn open_window(&self) -> Result<()> {
        let Peers::Remote(open) = &self.peers else {
            return Ok(());
        };
        if self.rank() == 0 {
            open.store(true, Ordering::Relaxed);
            return Ok(());
        }
        let comm = self.comm.as_ref();
        while transfer::rank_0_asks(comm, &self.device, false)? {
            let own = lock(&self.own).as_ref().map(|o| o.state()).unwrap_or_default();
            transfer::send_state(comm, &self.device, &own, 0)?;
        }
        Ok(())
    }

    /// After rank 0's callbacks (every rank calls it): rank 0 tells the others it needs no more.
    pub fn close_window(&self) -> Result<()> {
        match &self.peers {
            Peers::Remote(open) if self.rank() == 0 => {
                open.store(false, Ordering::Relaxed);
                transfer::rank_0_asks(self.comm.as_ref(), &self.device, false).map(drop)
            }
            _ => Ok(()),
        }
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
        state_bytes(&self.own_state())
    }

    fn own_state(&self) -> OptimizerState {
        lock(&self.own).as_ref().map(|o| o.state()).unwrap_or_default()
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

    /// Every rank's share as rank 0 reads it, by rank; `None` where it cannot read them now
    /// (another rank, or replicas in other processes outside the window).
    fn every_share(&self) -> Result<Option<Vec<OptimizerState>>> {
        if self.rank() != 0 {
            return Ok(None);
        }
        let own = self.own_state();
        match &self.peers {
            Peers::Board(board) => Ok(Some(
                board
                    .iter()
                    .map(|shard| match Arc::ptr_eq(shard, &self.own) {
                        true => own.clone(),
                        false => lock(shard).as_ref().map(|o| o.state()).unwrap_or_default(),
                    })
                    .collect(),
            )),
            Peers::Remote(open) if open.load(Ordering::Relaxed) => {
                let comm = self.comm.as_ref();
                transfer::rank_0_asks(comm, &self.device, true)?;
                let mut shares = vec![own];
                for from in 1..comm.world_size() {
                    shares.push(transfer::recv_state(comm, &self.device, from)?);
                }
                Ok(Some(shares))
            }
            Peers::Remote(_) => Ok(None),
        }
    }

    /// The whole state from every rank's share (by rank): each parameter's from its owner.
    fn whole(&self, shares: Vec<OptimizerState>) -> OptimizerState {
        let mut whole = OptimizerState::default();
        for (rank, state) in shares.into_iter().enumerate() {
            if rank == 0 {
                whole.scalars = state
                    .scalars
                    .iter()
                    .filter(|(n, _)| parameter_index(n).is_none())
                    .cloned()
                    .collect();
            }
            let share = self.share_of(&state, rank);
            whole.tensors.extend(share.tensors);
            whole
                .scalars
                .extend(share.scalars.into_iter().filter(|(n, _)| parameter_index(n).is_some()));
        }
        whole
    }
}

/// The parameter a `state.{i}.…` entry belongs to; `None` for hyper-parameters.
pub(crate) fn parameter_index(name: &str) -> Option<usize> {
    name.strip_prefix("state.")?.split('.').next()?.parse().ok()
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
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
    /// a collective while rank 0 saves, so every share is at the same step; replicas in other
    /// processes send theirs inside the window, and outside it rank 0's share is all there is).
    /// Other ranks: their own share.
    fn state(&self) -> OptimizerState {
        self.try_state().unwrap_or_else(|_| self.own_state())
    }

    /// As `state`, failing where rank 0 cannot gather the other processes' shares (a
    /// checkpoint is then not written, so the previous one stays whole).
    fn try_state(&self) -> Result<OptimizerState> {
        Ok(match self.every_share()? {
            Some(shares) => self.whole(shares),
            None => self.own_state(),
        })
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
