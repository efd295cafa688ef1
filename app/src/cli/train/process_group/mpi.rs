//! MPI for a process group of CPU or wgpu devices (the `mpi` cargo feature): the world
//! communicator for the gradients, a duplicate for SyncBatchNorm, or a pipeline's
//! communicators (one stage per process), and the session that must end on the main thread.
//! Without the feature, a clear refusal.

use crate::cli::train::Collectives;
use lockstep_core::Device;
use lockstep_flags::train::Args;
use lockstep_flags::world::WorldEnv;

pub const NO_MPI: &str = "this binary was built without MPI; rebuild with `cargo build --release --features mpi` \
                          (needs OpenMPI and libclang), or use CUDA devices (NCCL)";

#[cfg(feature = "mpi")]
pub use with_mpi::MpiJob;

#[cfg(feature = "mpi")]
mod with_mpi {
    use std::sync::Arc;

    use anyhow::Context;
    use lockstep_core::backend::Communicator;
    use lockstep_core::train::pipeline::ProcessStages;
    use lockstep_mpi::{MpiCommunicator, MpiSession};

    use super::{Args, Collectives, Device, WorldEnv};

    /// MPI for this process; keep it on the main thread until training returns.
    pub struct MpiJob {
        session: MpiSession,
        rank: usize,
        size: usize,
    }

    impl MpiJob {
        pub fn start(args: &Args, world: &WorldEnv, device: &Device) -> anyhow::Result<(MpiJob, Collectives)> {
            if let Some(why) = super::super::without_engine(device, world, true) {
                anyhow::bail!(why);
            }
            let (session, comm) = MpiCommunicator::init(device.backend().clone()).context("cannot start MPI")?;
            let comm = comm.with_timeout(args.collective_timeout());
            let (rank, size) = (comm.rank(), comm.world_size());
            if (rank, size) != (world.rank, world.world_size) {
                drop(comm);
                drop(session);
                anyhow::bail!(
                    "MPI counts {size} process(es) with this one as rank {rank}, but the launcher's variables say rank \
                     {} of {}: start the job with `mpirun -np {}` (or srun) and no RANK/WORLD_SIZE of another launcher",
                    world.rank,
                    world.world_size,
                    world.world_size
                );
            }
            if args.pipeline_stages.is_some() {
                let comm = Arc::new(comm);
                let more = || Ok(Box::new(comm.duplicate()?) as Box<dyn Communicator>);
                let stages =
                    ProcessStages::new(comm.clone(), more).context("cannot make the pipeline's MPI communicators")?;
                let collectives = Collectives {
                    pipeline: Some(stages),
                    ..Collectives::default()
                };
                return Ok((MpiJob { session, rank, size }, collectives));
            }
            let batchnorm = if args.sync_batchnorm {
                let dup = comm
                    .duplicate()
                    .context("cannot make SyncBatchNorm's MPI communicator")?;
                Some(Arc::new(dup) as Arc<dyn Communicator>)
            } else {
                None
            };
            let collectives = Collectives {
                gradients: Some(Box::new(comm)),
                batchnorm,
                ..Collectives::default()
            };
            Ok((MpiJob { session, rank, size }, collectives))
        }

        /// Finalises MPI after a successful run. After a failure the other ranks may be waiting in
        /// a collective for this one (and would wait in MPI_Finalize too), so this rank says why
        /// and aborts the job: mpirun then ends every rank and names this one.
        pub fn finish<T>(self, result: anyhow::Result<T>) -> anyhow::Result<T> {
            match result {
                Ok(value) => Ok(value),
                Err(e) => {
                    eprintln_whole!("error: rank {} of {}: {e:#}", self.rank, self.size);
                    self.session.abort(1)
                }
            }
        }
    }
}

/// Never made in a build without MPI: `start` refuses.
#[cfg(not(feature = "mpi"))]
pub enum MpiJob {}

#[cfg(not(feature = "mpi"))]
impl MpiJob {
    pub fn start(_args: &Args, world: &WorldEnv, device: &Device) -> anyhow::Result<(MpiJob, Collectives)> {
        let why = super::without_engine(device, world, false).unwrap_or_else(|| NO_MPI.to_string());
        anyhow::bail!(why)
    }

    pub fn finish<T>(self, _result: anyhow::Result<T>) -> anyhow::Result<T> {
        match self {}
    }
}
