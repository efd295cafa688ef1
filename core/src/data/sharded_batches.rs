//! The batches of a data-parallel run whose devices differ in speed: every step's global batch
//! is the same set of samples whatever the devices, and each rank takes a contiguous slice of
//! it sized by its share. Shares can then follow the devices' speeds without changing what the
//! job learns (up to float rounding).

use std::ops::Range;
use std::sync::{Arc, RwLock};

use super::batch_sampler::BatchSampler;
use super::sampler::{RandomSampler, Sampler, SequentialSampler};
use crate::error::{Error, Result};

/// How many samples of each global batch every rank takes, shared by a rank's loader and the
/// balancer that changes it. Every share is at least 1 and the shares sum to the global batch.
#[derive(Clone, Debug)]
pub struct BatchShares {
    shares: Arc<RwLock<Vec<usize>>>,
}

impl BatchShares {
    /// `global_batch` split as evenly as possible over `ranks`, the remainder to the lowest ranks.
    pub fn equal(global_batch: usize, ranks: usize) -> Result<BatchShares> {
        if ranks == 0 || global_batch < ranks {
            return Err(Error::invalid(
                "BatchShares",
                format!(
                    "a global batch of {global_batch} cannot give each of {ranks} devices a sample; use a global batch of at least {}",
                    ranks.max(1)
                ),
            ));
        }
        let (base, extra) = (global_batch / ranks, global_batch % ranks);
        BatchShares::new((0..ranks).map(|r| base + usize::from(r < extra)).collect())
    }

    /// Given shares, by rank (each at least 1).
    pub fn new(shares: Vec<usize>) -> Result<BatchShares> {
        if shares.is_empty() || shares.contains(&0) {
            return Err(Error::invalid(
                "BatchShares",
                format!("shares {shares:?} must name at least one rank and give each at least one sample"),
            ));
        }
        Ok(BatchShares {
            shares: Arc::new(RwLock::new(shares)),
        })
    }

    /// The shares now, by rank.
    pub fn get(&self) -> Vec<usize> {
        self.shares.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The global batch: the sum of the shares.
    pub fn global_batch(&self) -> usize {
        self.get().iter().sum()
    }

    /// Number of ranks the shares are for.
    pub fn ranks(&self) -> usize {
        self.get().len()
    }

    /// Replaces the shares; the number of ranks and the global batch must stay the same.
    pub fn set(&self, shares: Vec<usize>) -> Result<()> {
        let mut current = self.shares.write().unwrap_or_else(|e| e.into_inner());
        let same_total = shares.iter().sum::<usize>() == current.iter().sum::<usize>();
        if shares.len() != current.len() || !same_total || shares.contains(&0) {
            return Err(Error::invalid(
                "BatchShares",
                format!(
                    "new shares {shares:?} must keep {} ranks, each with at least one sample, summing to the global batch {}",
                    current.len(),
                    current.iter().sum::<usize>()
                ),
            ));
        }
        *current = shares;
        Ok(())
    }
}

/// Where `rank`'s slice lies inside each global batch.
fn slice_of(shares: &[usize], rank: usize) -> Range<usize> {
    let start: usize = shares[..rank].iter().sum();
    start..start + shares[rank]
}

/// One rank's batches: the epoch's global order (a sampler's, the same on every rank),
/// padded by wrapping around to a whole number of global batches so every step has the
/// same global batch, cut into global batches; the rank takes its slice of each, by the shares
/// in force when the epoch's iterator is made (the trainer makes a new one when they change).
pub struct ShardedBatches {
    order: Arc<dyn Sampler>,
    rank: usize,
    shares: BatchShares,
}

impl ShardedBatches {
    /// Rank `rank`'s batches over `dataset_len` samples, shuffled by `seed` + epoch when `shuffle`,
    /// cut by `shares`; an error if `rank` is not one of the shares' ranks.
    pub fn new(dataset_len: usize, rank: usize, shuffle: bool, seed: u64, shares: BatchShares) -> Result<Self> {
        let order: Arc<dyn Sampler> = if shuffle {
            Arc::new(RandomSampler { len: dataset_len, seed })
        } else {
            Arc::new(SequentialSampler { len: dataset_len })
        };
        ShardedBatches::of_sampler(order, rank, shares)
    }

    /// Rank `rank`'s batches cut by `shares` from `order`'s epochs (a one-device loader's
    /// sampler: the replicas then take, together, the batches that loader gives).
    pub fn of_sampler(order: Arc<dyn Sampler>, rank: usize, shares: BatchShares) -> Result<Self> {
        let ranks = shares.ranks();
        if rank >= ranks {
            return Err(Error::invalid(
                "ShardedBatches",
                format!("rank {rank} is outside the {ranks} ranks the shares are for"),
            ));
        }
        Ok(ShardedBatches { order, rank, shares })
    }

    /// The shares it cuts by, shared with the balancer that changes them.
    pub fn shares(&self) -> &BatchShares {
        &self.shares
    }
}

impl BatchSampler for ShardedBatches {
    fn len(&self) -> usize {
        self.order.len().div_ceil(self.shares.global_batch())
    }
    fn batches(&self, epoch: u64) -> Vec<Vec<usize>> {
        let order = self.order.indices(epoch);
        let shares = self.shares.get();
        let global: usize = shares.iter().sum();
        let mine = slice_of(&shares, self.rank);
        (0..self.len())
            .map(|b| {
                let at = b * global;
                (at + mine.start..at + mine.end)
                    .map(|i| order[i % order.len()])
                    .collect()
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::{DistributedSampler, Sampler};

    fn all_ranks(len: usize, shares: &[usize], epoch: u64) -> Vec<Vec<Vec<usize>>> {
        let handle = BatchShares::new(shares.to_vec()).unwrap();
        (0..shares.len())
            .map(|r| {
                ShardedBatches::new(len, r, true, 7, handle.clone())
                    .unwrap()
                    .batches(epoch)
            })
            .collect()
    }

    #[test]
    fn the_ranks_slices_tile_every_global_batch_of_the_global_order() {
        // DistributedSampler with one replica yields the padded global order itself.
        let global = DistributedSampler::new(40, 1, 0, true, 7, false).unwrap().indices(3);
        for shares in [vec![12, 4], vec![1, 15], vec![5, 5, 6], vec![1, 1, 1, 13]] {
            let per_rank = all_ranks(40, &shares, 3);
            for (b, want) in global.chunks(16).enumerate() {
                let joined: Vec<usize> = per_rank.iter().flat_map(|batches| batches[b].clone()).collect();
                // The last global batch is padded by wrapping around to the order's start.
                let padded: Vec<usize> = want.iter().chain(global.iter()).copied().take(16).collect();
                assert_eq!(joined, padded, "shares {shares:?}, batch {b}");
            }
            for (r, batches) in per_rank.iter().enumerate() {
                assert_eq!(batches.len(), 3, "40 samples make 3 global batches of 16");
                assert!(batches.iter().all(|b| b.len() == shares[r]), "rank {r} takes its share");
            }
        }
    }

    #[test]
    fn padding_cycles_when_the_data_set_is_smaller_than_the_global_batch() {
        let handle = BatchShares::new(vec![3, 2]).unwrap();
        let rank1 = ShardedBatches::new(2, 1, false, 0, handle).unwrap();
        assert_eq!(rank1.batches(0), vec![vec![1, 0]]);
        let empty = ShardedBatches::new(0, 0, true, 0, BatchShares::equal(4, 2).unwrap()).unwrap();
        assert!(empty.batches(0).is_empty());
    }

    #[test]
    fn each_epoch_is_shuffled_and_a_change_of_shares_applies_to_the_next_iterator() {
        let handle = BatchShares::equal(8, 2).unwrap();
        let rank0 = ShardedBatches::new(32, 0, true, 1, handle.clone()).unwrap();
        assert_ne!(rank0.batches(0), rank0.batches(1));
        handle.set(vec![6, 2]).unwrap();
        assert!(rank0.batches(0).iter().all(|b| b.len() == 6));
    }

    #[test]
    fn shares_must_fit_the_global_batch_and_the_ranks() {
        assert_eq!(BatchShares::equal(10, 4).unwrap().get(), vec![3, 3, 2, 2]);
        let err = BatchShares::equal(2, 3).unwrap_err().to_string();
        assert!(err.contains("at least 3"), "{err}");
        assert!(BatchShares::new(vec![4, 0]).is_err());
        let handle = BatchShares::equal(8, 2).unwrap();
        assert!(handle.set(vec![7, 2]).is_err(), "the global batch is fixed");
        assert!(handle.set(vec![8, 0]).is_err(), "every rank keeps a sample");
        assert!(handle.set(vec![4, 2, 2]).is_err(), "the ranks are fixed");
        assert!(ShardedBatches::new(8, 2, false, 0, handle).is_err());
    }
}
