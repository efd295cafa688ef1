//! Data-parallel training pieces: the gradient reducer that averages gradients across replicas
//! in buckets as backward produces them (PyTorch DDP's semantics), over any `Communicator`.
//! SyncBatchNorm's batch statistics are summed across replicas here too (`all_reduce_sum`), and
//! the processes of a job find each other through the launcher's `rendezvous`. Devices of
//! different speeds get shares of the global batch that follow their throughput (`Balancer`),
//! and ZeRO partitions the optimizer state and gradients over the replicas (`ShardedOptimizer`).

mod balance;
mod buckets;
mod comm_worker;
mod consistency;
mod gather;
mod random_streams;
mod reducer;
pub mod rendezvous;
mod replica_check;
mod shares;
mod sync_batchnorm;
mod zero;

pub use balance::{Balancer, WorkDone};
pub(crate) use consistency::verify_same_model;
pub(crate) use gather::{all_gather_strings, all_gather_values};
pub(crate) use random_streams::adopt_rank0_streams;
pub use reducer::{CommTimes, Reducer, ReducerConfig};
pub use rendezvous::{Rendezvous, RendezvousConfig};
pub(crate) use replica_check::check_replicas;
pub use replica_check::{OnDrift, ReplicaCheck};

pub use sync_batchnorm::all_reduce_sum;
pub(crate) use sync_batchnorm::synced_batch_stats;
pub use zero::{ShardedOptimizer, ZeroStage, state_bytes};
pub(crate) use zero::{owners, parameter_index};
