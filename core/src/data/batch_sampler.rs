//! Explicit batches per epoch, for loaders whose batches are not equal chunks of one order (a
//! heterogeneous run's per-rank shares of each global batch). Like a `Sampler`, a function of
//! the epoch, so resuming mid-epoch only needs the epoch number and the batch position.

/// Hands a loader its batches whole, epoch by epoch (PyTorch's `batch_sampler` argument); used by
/// `DataLoader::with_batch_sampler`.
pub trait BatchSampler: Send + Sync {
    /// Batches per epoch.
    fn len(&self) -> usize;
    /// True when an epoch has no batches.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The batches of `epoch`, in order, each a list of dataset indices.
    fn batches(&self, epoch: u64) -> Vec<Vec<usize>>;
}
