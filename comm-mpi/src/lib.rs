//! Collectives across processes on MPI, for CPU and wgpu devices (CUDA devices use NCCL, in
//! lockstep-cuda). Everything is behind the `mpi` feature, which links libmpi; without it the
//! crate is empty.

#[cfg(feature = "mpi")]
mod communicator;
#[cfg(feature = "mpi")]
mod header;
#[cfg(feature = "mpi")]
mod host;
#[cfg(feature = "mpi")]
mod point_to_point;
#[cfg(feature = "mpi")]
mod watchdog;

#[cfg(feature = "mpi")]
pub use communicator::{MpiCommunicator, MpiSession};
