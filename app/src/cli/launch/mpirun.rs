//! The job of CPU and wgpu devices: `mpirun -np N` on this executable, whose processes then find
//! their MPI world (`train/process_group/mpi.rs`). mpirun watches them: when one dies it ends
//! the others and names the rank.

use std::path::Path;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use super::Args;
use super::nodes::Cluster;
use super::supervise::describe;
use crate::cli::train;
use lockstep_flags::world;

/// Runs the job under mpirun on this machine, or on every machine of `cluster` (node 0's
/// launcher, the others joined): then a machine that falls silent for `silence` stops mpirun,
/// which would otherwise wait on it.
pub fn run(exe: &Path, args: &Args, cluster: Option<(&Cluster, Duration)>) -> anyhow::Result<()> {
    anyhow::ensure!(
        cfg!(feature = "mpi"),
        "CPU and wgpu devices talk across processes through MPI, but {}",
        train::NO_MPI
    );
    let mut mpirun = command(exe, args, cluster.map(|(c, _)| c.hosts(args)));
    eprintln_whole!(
        "lockstep launch: CPU and wgpu devices talk through MPI, so mpirun starts the processes: {}",
        shown(&mpirun)
    );
    let mut child = mpirun.spawn().map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => anyhow::anyhow!(
            "CPU and wgpu devices talk across processes through MPI, and its launcher `mpirun` is not on PATH: \
             install OpenMPI (Debian/Ubuntu: apt-get install openmpi-bin), or use CUDA devices (NCCL)"
        ),
        _ => anyhow::anyhow!("cannot start mpirun: {e}"),
    })?;
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break status;
        }
        if cluster.is_some_and(|(c, silence)| c.lost(silence).is_some()) {
            stop(&mut child);
            anyhow::bail!("mpirun was stopped: a machine fell silent");
        }
        std::thread::sleep(POLL);
    };
    anyhow::ensure!(
        status.success(),
        "mpirun {}: its messages above name the rank that failed",
        describe(status)
    );
    Ok(())
}

/// How often mpirun and the other machines are looked at.
const POLL: Duration = Duration::from_millis(100);
/// How long mpirun has to end its ranks after SIGTERM.
const GRACE: Duration = Duration::from_secs(5);

/// SIGTERM (mpirun then ends the ranks it reaches), SIGKILL if it lingers.
fn stop(child: &mut Child) {
    if let Ok(pid) = i32::try_from(child.id()) {
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGTERM);
    }
    let deadline = Instant::now() + GRACE;
    while Instant::now() < deadline {
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        std::thread::sleep(POLL);
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// `mpirun -np N` on this executable; with `hosts` (`addr:slots,…`), over those machines.
fn command(exe: &Path, args: &Args, hosts: Option<String>) -> Command {
    let mut cmd = Command::new("mpirun");
    // More ranks than cores is allowed, and each rank runs its own threads: no pinning.
    cmd.args([
        "-np",
        &args.world_size().to_string(),
        "--oversubscribe",
        "--bind-to",
        "none",
    ]);
    if let Some(hosts) = hosts {
        cmd.args(["--host", &hosts]);
        // A remote shell carries no environment: Lockstep's own variables go along by name.
        let mut ours: Vec<String> = std::env::vars_os()
            .filter_map(|(name, _)| name.into_string().ok())
            .filter(|name| name.starts_with("LOCKSTEP_"))
            .collect();
        ours.sort();
        for name in ours {
            cmd.args(["-x", &name]);
        }
    }
    cmd.arg(exe).args(&args.command);
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
        let cmd = command(Path::new("/bin/lockstep"), &args, None);
        assert_eq!(
            shown(&cmd),
            "mpirun -np 3 --oversubscribe --bind-to none /bin/lockstep train --device cpu"
        );
        let removed: Vec<_> = cmd.get_envs().filter(|(_, v)| v.is_none()).map(|(k, _)| k).collect();
        assert!(removed.iter().any(|k| *k == "RANK"), "{removed:?}");
    }

    #[test]
    fn several_machines_run_under_one_mpirun_over_their_hosts() {
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
        let cmd = command(Path::new("/bin/lockstep"), &args, Some("10.0.0.1:2,10.0.0.2:2".into()));
        let shown = shown(&cmd);
        assert!(
            shown.starts_with("mpirun -np 4 --oversubscribe --bind-to none --host 10.0.0.1:2,10.0.0.2:2 "),
            "{shown}"
        );
        assert!(shown.ends_with(" /bin/lockstep train --device cpu"), "{shown}");
    }
}
