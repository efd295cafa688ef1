//! Data-parallel training pieces: the gradient reducer that averages gradients across replicas
//! in buckets as backward produces them (PyTorch DDP's semantics), over any `Communicator`.

mod consistency;
mod reducer;

pub use consistency::verify_same_model;
pub use reducer::{Reducer, ReducerConfig};
