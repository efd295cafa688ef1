//! Data loading: datasets, samplers (sequential, random, distributed), a multi-worker loader
//! that delivers batches in order, and the MNIST IDX reader.

mod batch;
mod dataset;
mod loader;
pub mod mnist;
mod sampler;

pub use batch::{Batch, HostTensor, collate};
pub use dataset::{Dataset, Sample};
pub use loader::{BatchIter, DataLoader, DataLoaderConfig};
pub use sampler::{DistributedSampler, RandomSampler, Sampler, SequentialSampler};
