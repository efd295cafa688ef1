//! `lockstep train` as one process of a job that a launcher started (`lockstep launch`,
//! torchrun, mpirun, srun): this process's one device, its collectives across the processes,
//! then the same `replica` as a thread of a `--devices` run. CUDA devices talk through NCCL (its
//! id handed over by the rendezvous on rank 0); CPU and wgpu devices (and CUDA without NCCL)
//! through MPI, which only a job started by mpirun or srun has.

mod mpi;
mod nccl;

use std::sync::Arc;

use anyhow::Context;
use lockstep_core::Device;
use lockstep_core::data::Dataset;

use super::{Finished, Hooks, Placement, replica};
use lockstep_flags::train::{Args, StageBalance};
use lockstep_flags::world::{Launcher, WorldEnv};

pub use mpi::NO_MPI;

/// Trains this process's replica; rank 0 returns what the summary reports, the others `None`.
pub fn train(
    args: &Args,
    world: &WorldEnv,
    train_set: Arc<dyn Dataset>,
    test_set: Arc<dyn Dataset>,
    hooks: &Hooks,
) -> anyhow::Result<Option<Finished>> {
    let (rank, size) = (world.rank, world.world_size);
    check_flags(args, world)?;
    let device = device(&args.device, world)?;
    let finished = if uses_nccl(&device) {
        anyhow::ensure!(
            args.pipeline_stages.is_none(),
            "stages across processes pass activations as MPI messages, and NCCL's communicators here have none yet: \
             run the stages as threads of one process (`train --pipeline-stages {} --devices cuda:0,…`)",
            size
        );
        let collectives = nccl::collectives(args, world, &device).with_context(|| format!("rank {rank} of {size}"))?;
        replica(args, Placement::Device(device), collectives, train_set, test_set, hooks)
    } else {
        // The MPI session stays on this (the main) thread until training returns.
        let (job, collectives) = mpi::MpiJob::start(args, world, &device)?;
        job.finish(replica(
            args,
            Placement::Device(device),
            collectives,
            train_set,
            test_set,
            hooks,
        ))
    };
    let (location, report, result) = finished.with_context(|| format!("rank {rank} of {size}"))?;
    let (device, samples_per_sec) = if args.pipeline_stages.is_some() {
        // Every stage sees every sample: the first stage's rate is the pipeline's.
        (
            format!("{location} (stage 1 of {size}, one per process)"),
            report.samples_per_sec,
        )
    } else {
        // Every process takes an equal share of each global batch, as rank 0 did.
        (
            format!("{location} (x{size} processes)"),
            report.samples_per_sec * size as f64,
        )
    };
    Ok((rank == 0).then_some(Finished {
        device,
        samples_per_sec,
        report,
        result,
    }))
}

/// Flags that cannot work with one replica (or one pipeline stage) per process, refused before
/// anything starts.
fn check_flags(args: &Args, world: &WorldEnv) -> anyhow::Result<()> {
    anyhow::ensure!(
        args.split.is_none() && args.place.is_none(),
        "--split and --place put stages on the devices of one process: start it without a launcher, or give \
         --pipeline-stages {} to run one stage in each of the {} processes",
        world.world_size,
        world.world_size
    );
    if let Some(stages) = args.pipeline_stages {
        anyhow::ensure!(
            stages == world.world_size,
            "--pipeline-stages {stages} under a launcher runs one stage per process, but this job has {} processes: \
             start {stages} (`lockstep launch --nproc-per-node {stages}`)",
            world.world_size
        );
        anyhow::ensure!(
            args.balance_stages == StageBalance::Params,
            "stages across processes are balanced by parameter count: --balance-stages time would measure on \
             each process and the processes could cut the model differently"
        );
        anyhow::ensure!(
            !args.sync_batchnorm,
            "--sync-batchnorm syncs data-parallel replicas; a pipeline's processes hold different layers"
        );
        return Ok(());
    }
    anyhow::ensure!(
        args.devices.is_empty(),
        "--devices runs several replicas as threads of one process, but a launcher started this one as rank {} of {}: \
         give each process one --device instead (e.g. --device cuda: process i uses cuda:LOCAL_RANK)",
        world.rank,
        world.world_size
    );
    anyhow::ensure!(
        args.batch_size.is_multiple_of(world.world_size),
        "--batch-size {} does not split evenly over {} processes; use a multiple of {}",
        args.batch_size,
        world.world_size,
        world.world_size
    );
    Ok(())
}

/// `--device` for this process: `auto` and `cuda` mean cuda:LOCAL_RANK (one GPU per process, as
/// torchrun's scripts do); everything else (cpu, cpu:N, wgpu:N, cuda:N) is taken as given.
fn device(name: &str, world: &WorldEnv) -> anyhow::Result<Device> {
    let per_rank = format!("cuda:{}", world.local_rank);
    let device = match name {
        "cuda" => Device::parse(&per_rank)?,
        "auto" => {
            let best = lockstep_core::device::best_available()?;
            if is_cuda(&best) {
                Device::parse(&per_rank)?
            } else {
                best
            }
        }
        other => Device::parse(other)?,
    };
    Ok(device)
}

fn is_cuda(device: &Device) -> bool {
    device.location().starts_with("cuda:")
}

fn uses_nccl(device: &Device) -> bool {
    is_cuda(device) && lockstep_cuda::probe::nccl_present()
}

/// Why this process has no cross-process engine, and what to do; `None` when MPI can serve.
fn without_engine(device: &Device, world: &WorldEnv, built_with_mpi: bool) -> Option<String> {
    let nccl_hint = if is_cuda(device) {
        format!(
            "{device} across processes uses NCCL, which did not load (libnccl.so; `lockstep devices` says how to \
             install it); without it "
        )
    } else {
        format!("{device} across processes ")
    };
    if !built_with_mpi {
        return Some(format!("{nccl_hint}needs MPI, but {NO_MPI}"));
    }
    (world.source == Launcher::Torchrun).then(|| {
        format!(
            "{nccl_hint}communicates through MPI, whose processes mpirun or srun must start, but this one has only \
             torchrun's variables (RANK={}, WORLD_SIZE={}): start the job with `mpirun -np {} lockstep train …` \
             (`lockstep launch` does that by itself for CPU and wgpu devices)",
            world.rank, world.world_size, world.world_size
        )
    })
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn world(source: Launcher) -> WorldEnv {
        WorldEnv {
            rank: 1,
            local_rank: 1,
            world_size: 2,
            local_world_size: 2,
            master_addr: "127.0.0.1".into(),
            master_port: 29500,
            rdzv_port: 29500,
            token: String::new(),
            rdzv_timeout: Duration::from_secs(1),
            source,
        }
    }

    #[test]
    fn cpu_processes_need_mpi_and_an_mpi_launcher() {
        let cpu = Device::cpu();
        let msg = without_engine(&cpu, &world(Launcher::Torchrun), false).unwrap();
        assert!(
            msg.contains("built without MPI") && msg.contains("--features mpi"),
            "{msg}"
        );
        let msg = without_engine(&cpu, &world(Launcher::Torchrun), true).unwrap();
        assert!(msg.contains("mpirun -np 2 lockstep train"), "{msg}");
        assert_eq!(without_engine(&cpu, &world(Launcher::Mpirun), true), None);
        assert_eq!(without_engine(&cpu, &world(Launcher::Srun), true), None);
    }

    #[test]
    fn cpu_and_explicit_devices_are_taken_as_given() {
        let w = world(Launcher::Mpirun);
        assert_eq!(device("cpu", &w).unwrap().location(), "cpu:0");
        assert_eq!(device("cpu:3", &w).unwrap().location(), "cpu:3");
    }

    #[test]
    fn flags_that_need_one_process_are_refused() {
        use clap::Parser;
        let w = world(Launcher::Mpirun);
        let args = Args::parse_from(["train", "--devices", "cpu:0,cpu:1"]);
        let msg = check_flags(&args, &w).unwrap_err().to_string();
        assert!(msg.contains("--devices") && msg.contains("one --device"), "{msg}");
        let args = Args::parse_from(["train", "--batch-size", "63"]);
        let msg = check_flags(&args, &w).unwrap_err().to_string();
        assert!(
            msg.contains("--batch-size 63 does not split evenly over 2 processes"),
            "{msg}"
        );
    }
}
