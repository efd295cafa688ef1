//! Orders of the dataset's indices per epoch. A sampler is a pure function of the epoch, so
//! resuming a run mid-epoch only needs the epoch number and the batch position.

use crate::error::{Error, Result};
use crate::rng::Generator;

/// An order of dataset indices for each epoch (PyTorch's `Sampler`), a pure function of the epoch.
pub trait Sampler: Send + Sync {
    /// Number of indices one epoch yields.
    fn len(&self) -> usize;
    /// True when an epoch yields no indices.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The indices of `epoch`, in order.
    fn indices(&self, epoch: u64) -> Vec<usize>;
}

/// 0, 1, …, n-1 every epoch.
pub struct SequentialSampler {
    /// Samples in the data set: the indices are `0..len`.
    pub len: usize,
}

impl Sampler for SequentialSampler {
    fn len(&self) -> usize {
        self.len
    }
    fn indices(&self, _epoch: u64) -> Vec<usize> {
        (0..self.len).collect()
    }
}

/// A fresh permutation each epoch from a generator seeded with `seed + epoch`.
pub struct RandomSampler {
    /// Samples in the data set, permuted each epoch.
    pub len: usize,
    /// The base seed: epoch `e` shuffles with `seed + e`.
    pub seed: u64,
}

/// Fisher–Yates shuffle of 0..n driven by the counter-based generator.
fn permutation(n: usize, seed: u64) -> Vec<usize> {
    let generator = Generator::new(seed);
    let mut order: Vec<usize> = (0..n).collect();
    for i in (1..n).rev() {
        let j = generator.next_below(i as u64 + 1) as usize;
        order.swap(i, j);
    }
    order
}

/// The one global order of an epoch that every rank of a data-parallel run cuts its part from.
pub(super) fn epoch_order(len: usize, shuffle: bool, seed: u64, epoch: u64) -> Vec<usize> {
    if shuffle {
        permutation(len, seed.wrapping_add(epoch))
    } else {
        (0..len).collect()
    }
}

impl Sampler for RandomSampler {
    fn len(&self) -> usize {
        self.len
    }
    fn indices(&self, epoch: u64) -> Vec<usize> {
        permutation(self.len, self.seed.wrapping_add(epoch))
    }
}

/// PyTorch's DistributedSampler: one global order per epoch (shuffled with `seed + epoch`), padded
/// by wrapping around to a multiple of the replica count (or truncated with `drop_last`), then
/// interleaved: rank r takes positions r, r+R, r+2R, … The permutation differs from PyTorch's
/// (a different generator) but has the same structure.
pub struct DistributedSampler {
    dataset_len: usize,
    replicas: usize,
    rank: usize,
    shuffle: bool,
    seed: u64,
    drop_last: bool,
}

impl DistributedSampler {
    /// Rank `rank`'s part of `dataset_len` samples split over `replicas` (PyTorch's
    /// `num_replicas`), shuffled by `seed` + epoch when `shuffle`; `drop_last` truncates instead of
    /// padding; an error unless `rank < replicas`.
    pub fn new(
        dataset_len: usize,
        replicas: usize,
        rank: usize,
        shuffle: bool,
        seed: u64,
        drop_last: bool,
    ) -> Result<Self> {
        if replicas == 0 || rank >= replicas {
            return Err(Error::invalid(
                "DistributedSampler",
                format!(
                    "invalid rank {rank}, rank should be in the interval [0, {}]",
                    replicas as i64 - 1
                ),
            ));
        }
        Ok(DistributedSampler {
            dataset_len,
            replicas,
            rank,
            shuffle,
            seed,
            drop_last,
        })
    }
    fn total_size(&self) -> usize {
        self.len() * self.replicas
    }
}

impl Sampler for DistributedSampler {
    fn len(&self) -> usize {
        let (l, r) = (self.dataset_len, self.replicas);
        if self.drop_last && l % r != 0 {
            (l.saturating_sub(r)).div_ceil(r)
        } else {
            l.div_ceil(r)
        }
    }
    fn indices(&self, epoch: u64) -> Vec<usize> {
        let mut order = epoch_order(self.dataset_len, self.shuffle, self.seed, epoch);
        let total = self.total_size();
        if order.is_empty() {
            return Vec::new();
        }
        while order.len() < total {
            let need = (total - order.len()).min(self.dataset_len);
            order.extend_from_within(..need);
        }
        order.truncate(total);
        order.into_iter().skip(self.rank).step_by(self.replicas).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn distributed_sampler_pads_and_interleaves_like_pytorch() {
        // L=10, R=4: num_samples=3, total=12, padded with indices 0,1; rank r takes r::4.
        let s: Vec<Vec<usize>> = (0..4)
            .map(|r| DistributedSampler::new(10, 4, r, false, 0, false).unwrap().indices(0))
            .collect();
        assert_eq!(s, vec![vec![0, 4, 8], vec![1, 5, 9], vec![2, 6, 0], vec![3, 7, 1]]);
        // drop_last: num_samples = ceil((10-4)/4) = 2, total 8.
        let d = DistributedSampler::new(10, 4, 1, false, 0, true).unwrap();
        assert_eq!((d.len(), d.indices(0)), (2, vec![1, 5]));
        // Padding larger than the data set cycles: L=2, R=5 -> [0,1,0,1,0].
        let tiny: Vec<usize> = (0..5)
            .flat_map(|r| DistributedSampler::new(2, 5, r, false, 0, false).unwrap().indices(0))
            .collect();
        assert_eq!(tiny, vec![0, 1, 0, 1, 0]);
        assert!(DistributedSampler::new(10, 2, 2, false, 0, false).is_err());
    }

    #[test]
    fn shuffles_are_permutations_that_change_with_the_epoch() {
        let s = RandomSampler { len: 100, seed: 3 };
        let (a, b) = (s.indices(0), s.indices(1));
        assert_ne!(a, b);
        assert_eq!(a, s.indices(0));
        let mut sorted = a.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, (0..100).collect::<Vec<_>>());
        // Every rank sees one global permutation: together they cover it exactly.
        let mut all: Vec<usize> = (0..4)
            .flat_map(|r| DistributedSampler::new(100, 4, r, true, 3, false).unwrap().indices(1))
            .collect();
        all.sort_unstable();
        assert_eq!(all, (0..100).collect::<Vec<_>>());
    }
}
