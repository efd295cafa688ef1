//! NCCL across processes, one GPU each: rank 0 makes the NCCL ids and the rendezvous on
//! MASTER_ADDR:MASTER_PORT hands them to the other ranks (the ids only: the tensors move on NCCL).

use std::sync::Arc;

use lockstep_core::Device;
use lockstep_core::backend::Communicator;
use lockstep_core::distributed::{Rendezvous, RendezvousConfig};
use lockstep_cuda::{NcclCommunicator, NcclId};

use crate::cli::train::Collectives;
use lockstep_flags::train::Args;
use lockstep_flags::world::WorldEnv;

pub fn collectives(args: &Args, world: &WorldEnv, device: &Device) -> anyhow::Result<Collectives> {
    let config = RendezvousConfig::new(
        &world.master_addr,
        world.rdzv_port,
        world.rank,
        world.world_size,
        &world.token,
    )
    .timeout(world.rdzv_timeout);
    let mut rendezvous = Rendezvous::join(config)?;
    let gradients_id = share_id(&mut rendezvous, "nccl-id/gradients")?;
    let batchnorm_id = if args.sync_batchnorm {
        Some(share_id(&mut rendezvous, "nccl-id/batchnorm")?)
    } else {
        None
    };
    // Every rank holds the ids before rank 0's rendezvous closes; a missing rank is named here.
    rendezvous.barrier("nccl-ids")?;
    drop(rendezvous);
    let join = |id: &NcclId| {
        // The join itself is bounded too: a rank that never starts is named, not waited for.
        let timeout = args.collective_timeout();
        anyhow::Ok(NcclCommunicator::from_rank_with_timeout(
            device,
            world.rank,
            world.world_size,
            id,
            timeout,
        )?)
    };
    let gradients = join(&gradients_id)?;
    let batchnorm = match batchnorm_id {
        Some(id) => Some(Arc::new(join(&id)?) as Arc<dyn Communicator>),
        None => None,
    };
    Ok(Collectives {
        gradients: Some(Box::new(gradients)),
        batchnorm,
        ..Collectives::default()
    })
}

/// Rank 0 makes a fresh id and publishes it under `key`; the others wait for it.
fn share_id(rendezvous: &mut Rendezvous, key: &str) -> anyhow::Result<NcclId> {
    if rendezvous.rank() == 0 {
        let id = NcclId::new()?;
        rendezvous.set(key, &id.to_bytes())?;
        Ok(id)
    } else {
        Ok(NcclId::from_bytes(&rendezvous.get(key)?)?)
    }
}
