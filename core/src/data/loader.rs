//! The DataLoader: batches from a sampler's order, built by worker threads ahead of time.
//!
//! Worker w builds batches w, w+W, w+2W, … and hands each over on its own bounded channel of
//! `prefetch_factor` slots; the consumer takes batch b from worker b mod W. So batches arrive in
//! sampler order whatever the number of workers, at most `prefetch_factor` per worker wait in
//! memory, and a failed or vanished worker is reported at the batch it owed, never a hang.

use std::sync::Arc;
use std::sync::mpsc::{Receiver, SyncSender, sync_channel};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::batch::Batch;
use super::batch_sampler::BatchSampler;
use super::dataset::Dataset;
use super::sampler::{RandomSampler, Sampler, SequentialSampler};
use crate::error::{Error, Result};

/// How a `DataLoader` batches and prefetches, with PyTorch's `DataLoader` argument names.
#[derive(Clone, Debug, PartialEq)]
pub struct DataLoaderConfig {
    /// Samples per batch of this loader (at least 1): a data-parallel rank's loader gets its share
    /// of the global batch.
    pub batch_size: usize,
    /// Drop each epoch's last batch when it is short (default false).
    pub drop_last: bool,
    /// 0 loads in the consumer's thread.
    pub num_workers: usize,
    /// Batches each worker may have ready ahead of the consumer (PyTorch's default 2).
    pub prefetch_factor: usize,
}

impl Default for DataLoaderConfig {
    fn default() -> Self {
        DataLoaderConfig {
            batch_size: 1,
            drop_last: false,
            num_workers: 0,
            prefetch_factor: 2,
        }
    }
}

/// Where a loader's batches come from.
enum Order {
    /// Chunks of `batch_size` of one order per epoch.
    Sampler(Arc<dyn Sampler>),
    /// Batches given whole, one list per epoch (`batch_size` and `drop_last` unused).
    Batches(Arc<dyn BatchSampler>),
}

/// PyTorch's `DataLoader`: batches of a `Dataset` in a sampler's order, optionally built ahead by
/// worker threads; indexed by epoch, so a run resumes mid-epoch.
pub struct DataLoader {
    dataset: Arc<dyn Dataset>,
    order: Order,
    config: DataLoaderConfig,
}

impl DataLoader {
    /// Batches of `config.batch_size` in `sampler`'s order; an error for a batch size of 0,
    /// workers with a `prefetch_factor` of 0, or more workers or prefetched batches than
    /// `limits` allows.
    pub fn new(dataset: Arc<dyn Dataset>, sampler: Arc<dyn Sampler>, config: DataLoaderConfig) -> Result<DataLoader> {
        if config.batch_size == 0 {
            return Err(Error::invalid("DataLoader", "batch_size must be at least 1"));
        }
        DataLoader::build(dataset, Order::Sampler(sampler), config)
    }
    /// A loader over the batches `batches` lists each epoch; of `config` only the worker
    /// settings apply.
    pub fn with_batch_sampler(
        dataset: Arc<dyn Dataset>,
        batches: Arc<dyn BatchSampler>,
        config: DataLoaderConfig,
    ) -> Result<DataLoader> {
        DataLoader::build(dataset, Order::Batches(batches), config)
    }
    fn build(dataset: Arc<dyn Dataset>, order: Order, config: DataLoaderConfig) -> Result<DataLoader> {
        if config.num_workers > 0 && config.prefetch_factor == 0 {
            return Err(Error::invalid(
                "DataLoader",
                "prefetch_factor must be at least 1 when using workers",
            ));
        }
        crate::limits::threads("DataLoader num_workers", config.num_workers)?;
        if config.prefetch_factor > crate::limits::MOST_PREFETCHED {
            return Err(Error::invalid(
                "DataLoader",
                format!(
                    "prefetch_factor {} holds that many batches per worker in memory; use at most {}",
                    config.prefetch_factor,
                    crate::limits::MOST_PREFETCHED
                ),
            ));
        }
        Ok(DataLoader { dataset, order, config })
    }
    /// A loader over the whole dataset, shuffled each epoch with `seed` (or in order).
    pub fn simple(dataset: Arc<dyn Dataset>, shuffle: bool, seed: u64, config: DataLoaderConfig) -> Result<DataLoader> {
        let len = dataset.len();
        let sampler: Arc<dyn Sampler> = if shuffle {
            Arc::new(RandomSampler { len, seed })
        } else {
            Arc::new(SequentialSampler { len })
        };
        DataLoader::new(dataset, sampler, config)
    }
    /// The sampler whose order it batches; None for a loader given its batches whole.
    pub fn sampler(&self) -> Option<&Arc<dyn Sampler>> {
        match &self.order {
            Order::Sampler(sampler) => Some(sampler),
            Order::Batches(_) => None,
        }
    }
    /// The batching and worker settings.
    pub fn config(&self) -> &DataLoaderConfig {
        &self.config
    }
    /// The data set it reads.
    pub fn dataset(&self) -> &Arc<dyn Dataset> {
        &self.dataset
    }
    /// Batches per epoch.
    pub fn len(&self) -> usize {
        let sampler = match &self.order {
            Order::Sampler(s) => s,
            Order::Batches(b) => return b.len(),
        };
        let n = sampler.len();
        if self.config.drop_last {
            n / self.config.batch_size
        } else {
            n.div_ceil(self.config.batch_size)
        }
    }
    /// True when an epoch has no batches.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Iterates over the batches of `epoch`.
    pub fn iter(&self, epoch: u64) -> BatchIter {
        self.iter_from(epoch, 0)
    }
    /// Iterates over the batches of `epoch` starting at batch `start` (to resume mid-epoch).
    pub fn iter_from(&self, epoch: u64, start: usize) -> BatchIter {
        let batches = match &self.order {
            Order::Sampler(sampler) => {
                let order = sampler.indices(epoch);
                let bs = self.config.batch_size;
                order
                    .chunks(bs)
                    .filter(|c| !self.config.drop_last || c.len() == bs)
                    .skip(start)
                    .map(<[usize]>::to_vec)
                    .collect()
            }
            Order::Batches(b) => b.batches(epoch).into_iter().skip(start).collect(),
        };
        BatchIter::new(self.dataset.clone(), epoch, batches, &self.config)
    }
}

type Delivery = Result<Batch>;

/// One epoch's batches in sampler order, from `DataLoader::iter`; dropping it stops and joins its
/// workers.
pub struct BatchIter {
    dataset: Arc<dyn Dataset>,
    epoch: u64,
    batches: Arc<Vec<Vec<usize>>>,
    next: usize,
    workers: Vec<(Receiver<Delivery>, Option<JoinHandle<()>>)>,
    waited: Duration,
}

impl BatchIter {
    fn new(dataset: Arc<dyn Dataset>, epoch: u64, batches: Vec<Vec<usize>>, config: &DataLoaderConfig) -> BatchIter {
        let batches = Arc::new(batches);
        let workers = (0..config.num_workers)
            .map(|w| {
                let (tx, rx) = sync_channel(config.prefetch_factor);
                let (dataset, batches) = (dataset.clone(), batches.clone());
                let stride = config.num_workers;
                let handle = std::thread::Builder::new()
                    .name(format!("lockstep-loader-{w}"))
                    .spawn(move || work(dataset, epoch, batches, w, stride, tx));
                (rx, handle.ok())
            })
            .collect();
        BatchIter {
            dataset,
            epoch,
            batches,
            next: 0,
            workers,
            waited: Duration::ZERO,
        }
    }
    /// Batches left in this epoch.
    pub fn remaining(&self) -> usize {
        self.batches.len() - self.next
    }
    /// Total time the consumer has spent waiting for batches.
    pub fn wait_time(&self) -> Duration {
        self.waited
    }
}

/// A worker's loop: build its share of batches in order until done or the consumer is gone.
fn work(
    dataset: Arc<dyn Dataset>,
    epoch: u64,
    batches: Arc<Vec<Vec<usize>>>,
    worker: usize,
    stride: usize,
    tx: SyncSender<Delivery>,
) {
    for indices in batches.iter().skip(worker).step_by(stride) {
        let result = dataset
            .get_batch_at(epoch, indices)
            .map_err(|e| Error::data(format!("data loader worker {worker}"), e.to_string()));
        let failed = result.is_err();
        if tx.send(result).is_err() || failed {
            return;
        }
    }
}

impl Iterator for BatchIter {
    type Item = Result<Batch>;
    fn next(&mut self) -> Option<Result<Batch>> {
        let b = self.next;
        let indices = self.batches.get(b)?;
        self.next += 1;
        let started = Instant::now();
        let result = if self.workers.is_empty() {
            self.dataset.get_batch_at(self.epoch, indices)
        } else {
            let w = b % self.workers.len();
            self.workers[w].0.recv().unwrap_or_else(|_| {
                // The channel closed before delivering: the worker died (a panic in the dataset).
                Err(Error::data(
                    format!("data loader worker {w}"),
                    format!("exited unexpectedly before delivering batch {b}"),
                ))
            })
        };
        self.waited += started.elapsed();
        Some(result)
    }
}

impl Drop for BatchIter {
    fn drop(&mut self) {
        // Dropping the receivers makes blocked workers' sends fail, so they exit; then join them.
        let handles: Vec<JoinHandle<()>> = self
            .workers
            .drain(..)
            .filter_map(|(rx, h)| {
                drop(rx);
                h
            })
            .collect();
        for h in handles {
            let _ = h.join();
        }
    }
}
