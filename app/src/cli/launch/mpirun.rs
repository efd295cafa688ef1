//! The job of CPU and wgpu devices: `mpirun -np N` on this executable, whose processes then find
//! their MPI world (`train/process_group/mpi.rs`). mpirun watches them: when one dies it ends
//! the others and names the rank.

use std::path::Path;
use std::process::Command;

use super::Args;
use super::supervise::describe;
use crate::cli::train;
use lockstep_flags::world;

pub fn run(exe: &Path, args: &Args) -> anyhow::Result<()> {
    anyhow::ensure!(
        cfg!(feature = "mpi"),
        "CPU and wgpu devices talk across processes through MPI, but {}",
        train::NO_MPI
    );
    anyhow::ensure!(
        args.nnodes == 1,
        "CPU and wgpu devices talk across processes through MPI, and across machines MPI's own launcher must start \
         every process: run `mpirun -np {} --host … lockstep {}` (or srun) instead of `lockstep launch`",
        args.world_size(),
        args.command.join(" ")
    );
    let mut mpirun = command(exe, args);
    eprintln_whole!(
        "lockstep launch: CPU and wgpu devices talk through MPI, so mpirun starts the processes: {}",
        shown(&mpirun)
    );
    let status = mpirun.status().map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => anyhow::anyhow!(
            "CPU and wgpu devices talk across processes through MPI, and its launcher `mpirun` is not on PATH: \
             install OpenMPI (Debian/Ubuntu: apt-get install openmpi-bin), or use CUDA devices (NCCL)"
        ),
        _ => anyhow::anyhow!("cannot start mpirun: {e}"),
    })?;
    anyhow::ensure!(
        status.success(),
        "mpirun {}: its messages above name the rank that failed",
        describe(status)
    );
    Ok(())
}

fn command(exe: &Path, args: &Args) -> Command {
    let mut cmd = Command::new("mpirun");
    // More ranks than cores is allowed, and each rank runs its own threads: no pinning.
    cmd.args([
        "-np",
        &args.nproc_per_node.to_string(),
        "--oversubscribe",
        "--bind-to",
        "none",
    ])
    .arg(exe)
    .args(&args.command);
    // torchrun's variables (from a launcher around this one) would outrank MPI's in the children.
    for name in [
        world::RANK,
        world::LOCAL_RANK,
        world::WORLD_SIZE,
        world::LOCAL_WORLD_SIZE,
        world::GROUP_RANK,
    ] {
        cmd.env_remove(name);
    }
    cmd
}

fn shown(cmd: &Command) -> String {
    std::iter::once(cmd.get_program())
        .chain(cmd.get_args())
        .map(|a| a.to_string_lossy().into_owned())
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[test]
    fn mpirun_runs_this_executable_once_per_process() {
        let args = Args::parse_from(["launch", "--nproc-per-node", "3", "--", "train", "--device", "cpu"]);
        let cmd = command(Path::new("/bin/lockstep"), &args);
        assert_eq!(
            shown(&cmd),
            "mpirun -np 3 --oversubscribe --bind-to none /bin/lockstep train --device cpu"
        );
        let removed: Vec<_> = cmd.get_envs().filter(|(_, v)| v.is_none()).map(|(k, _)| k).collect();
        assert!(removed.iter().any(|k| *k == "RANK"), "{removed:?}");
    }

    #[test]
    fn several_machines_are_refused_with_what_to_do() {
        let args = Args::parse_from([
            "launch",
            "--nproc-per-node",
            "2",
            "--nnodes",
            "2",
            "--token",
            "T",
            "--",
            "train",
            "--device",
            "cpu",
        ]);
        let msg = run(Path::new("/bin/lockstep"), &args).unwrap_err().to_string();
        let expected = if cfg!(feature = "mpi") {
            "mpirun -np 4 --host"
        } else {
            "built without MPI"
        };
        assert!(msg.contains(expected), "{msg}");
    }
}
