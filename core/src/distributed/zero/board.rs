//! How the replicas of one process find each other's shares of the optimizer state: each
//! registers its shard under a number rank 0 chose, and rank 0 keeps them all.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, Weak};

use super::{Shard, lock};
use crate::backend::Communicator;
use crate::device::Device;
use crate::distributed::all_gather_values;
use crate::error::Result;
use crate::optim::Optimizer;

/// A rank and its shard, held weakly: a board does not keep a dropped replica's state alive.
type Entry = (usize, Weak<Mutex<Option<Box<dyn Optimizer>>>>);

/// Replicas of one process find each other's shards here, under a number rank 0 chose.
static BOARDS: Mutex<BTreeMap<u32, Vec<Entry>>> = Mutex::new(BTreeMap::new());
static NEXT_BOARD: AtomicU32 = AtomicU32::new(0);

/// Registers `own` on a board every rank of `comm` joins. Rank 0 gets every rank's shard, by
/// rank, where all are in this process; `None` on every rank where some are elsewhere (and on
/// the other ranks, an empty board).
pub(super) fn join(own: &Shard, comm: &dyn Communicator, device: &Device) -> Result<Option<Vec<Shard>>> {
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
        return Ok(None);
    }
    Ok(Some(board))
}
