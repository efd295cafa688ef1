//! The dataset contract: a length and random access to samples.

use super::batch::{Batch, HostTensor, collate};
use crate::error::Result;

/// One sample: its fields, e.g. `[image [1, 28, 28] f32, label [] u32]`.
pub type Sample = Vec<HostTensor>;

/// A map-style data set (PyTorch's `Dataset`): a length and each sample by index, shared by the
/// loader's worker threads.
pub trait Dataset: Send + Sync {
    /// Number of samples; valid indices are `0..len()`.
    fn len(&self) -> usize;
    /// True when there are no samples.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The sample at `index` (< len). Errors should say what is wrong with that sample.
    fn get(&self, index: usize) -> Result<Sample>;
    /// A whole batch; datasets may override it to build the batch in one pass.
    fn get_batch(&self, indices: &[usize]) -> Result<Batch> {
        let samples = indices.iter().map(|&i| self.get(i)).collect::<Result<Vec<_>>>()?;
        collate(samples, indices.to_vec())
    }
    /// The batch as epoch `epoch` sees it: datasets that augment draw from (seed, epoch, index)
    /// here, so every worker and a resumed run build the same batch. The loader calls this.
    fn get_batch_at(&self, _epoch: u64, indices: &[usize]) -> Result<Batch> {
        self.get_batch(indices)
    }
}

/// The first `len` samples of another dataset (all of them when it has fewer).
pub struct Head {
    inner: std::sync::Arc<dyn Dataset>,
    len: usize,
}

impl Head {
    /// The first `len` samples of `inner` (all of them if it has fewer), e.g. for a quick run on
    /// part of a data set.
    pub fn new(inner: std::sync::Arc<dyn Dataset>, len: usize) -> Head {
        let len = len.min(inner.len());
        Head { inner, len }
    }
}

impl Dataset for Head {
    fn len(&self) -> usize {
        self.len
    }
    fn get(&self, index: usize) -> Result<Sample> {
        self.inner.get(index)
    }
    fn get_batch(&self, indices: &[usize]) -> Result<Batch> {
        self.inner.get_batch(indices)
    }
    fn get_batch_at(&self, epoch: u64, indices: &[usize]) -> Result<Batch> {
        self.inner.get_batch_at(epoch, indices)
    }
}
