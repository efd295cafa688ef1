//! Data-parallel training pieces: the gradient reducer that averages gradients across replicas
//! in buckets as backward produces them (PyTorch DDP's semantics), over any `Communicator`.
//! SyncBatchNorm's batch statistics are summed across replicas here too (`all_reduce_sum`).

mod buckets;
mod comm_worker;
mod consistency;
mod gather;
mod reducer;
mod sync_batchnorm;

pub use consistency::verify_same_model;
pub use gather::all_gather_values;
pub use reducer::{CommTimes, Reducer, ReducerConfig};
pub use sync_batchnorm::all_reduce_sum;
pub(crate) use sync_batchnorm::synced_batch_stats;
