//! Data loading: datasets, samplers (sequential, random, distributed), batch samplers (a
//! heterogeneous run's per-rank shares of each global batch), a multi-worker loader that
//! delivers batches in order, the MNIST IDX and CIFAR readers, folders of images, image
//! classification with augmentation, text for language models (characters, GPT-2's BPE, token
//! files memory-mapped), and the generated digit-reversal task.

pub mod augment;
mod batch;
mod batch_sampler;
pub mod cifar;
mod dataset;
#[cfg(feature = "gpt2")]
pub mod gpt2;
#[cfg(feature = "gpt2")]
pub mod gpt2_text;
pub mod home;
mod image;
pub mod image_folder;
mod loader;
pub mod mnist;
pub mod reversal;
mod sampler;
mod sharded_batches;
mod tensor_dataset;
pub mod text;
pub mod token_file;

pub use batch::{Batch, HostTensor, collate};
pub use batch_sampler::BatchSampler;
pub use dataset::{Dataset, Head, Sample};
pub use home::data_home;
pub use image::{ImageClassification, ImageSource};
pub use loader::{BatchIter, DataLoader, DataLoaderConfig};
pub use sampler::{DistributedSampler, RandomSampler, Sampler, SequentialSampler};
pub use sharded_batches::{BatchShares, ShardedBatches};
pub use tensor_dataset::TensorDataset;
