//! How `launch` starts the job, from the device the command trains on. CUDA devices with NCCL:
//! this launcher starts the processes itself (NCCL's id goes through the rendezvous). Every
//! other device talks through MPI, and MPI's processes must be started by an MPI launcher (a
//! process started otherwise is an MPI world of one), so `launch` hands those jobs to mpirun
//! rather than ship a collective engine of its own.

use clap::Parser;

use crate::cli::train;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Engine {
    /// Start the processes here, with torchrun's variables.
    Processes,
    /// Run the job under `mpirun -np N`.
    Mpirun,
}

/// The engine for `command` (the arguments after `--`): subcommands other than `train` form no
/// process group and simply run N times.
pub fn engine(command: &[String]) -> anyhow::Result<Engine> {
    if command.first().map(String::as_str) != Some("train") {
        return Ok(Engine::Processes);
    }
    // Checked once here rather than reported by every process.
    let args = train::Args::try_parse_from(command)
        .map_err(|e| anyhow::anyhow!("the command after -- is not a valid `lockstep train`:\n{e}"))?;
    anyhow::ensure!(
        args.devices.is_empty(),
        "--devices runs several replicas as threads of one process; under `lockstep launch` each process trains on \
         one --device (e.g. --device cuda: process i uses cuda:LOCAL_RANK)"
    );
    let cuda_gpus = || lockstep_cuda::probe::device_count().is_ok_and(|n| n > 0);
    Ok(choose(&args.device, cuda_gpus, lockstep_cuda::probe::nccl_present()))
}

/// How long a rank of `command` waits in a collective before it ends the job: node 0's
/// launcher waits as long on a machine gone silent. A command that is not `train` gets
/// train's default.
pub fn collective_timeout(command: &[String]) -> std::time::Duration {
    train::Args::try_parse_from(command)
        .unwrap_or_else(|_| train::Args::parse_from(["train"]))
        .collective_timeout()
}

/// `auto` finds out whether there is a CUDA GPU only when it has to.
fn choose(device: &str, cuda_gpus: impl FnOnce() -> bool, nccl: bool) -> Engine {
    let cuda = device == "cuda" || device.starts_with("cuda:") || (device == "auto" && cuda_gpus());
    if cuda && nccl {
        Engine::Processes
    } else {
        Engine::Mpirun
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn command(args: &[&str]) -> Vec<String> {
        args.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn cuda_with_nccl_runs_here_and_everything_else_under_mpirun() {
        assert_eq!(choose("cuda", || false, true), Engine::Processes);
        assert_eq!(choose("cuda:1", || false, true), Engine::Processes);
        assert_eq!(choose("auto", || true, true), Engine::Processes);
        assert_eq!(choose("auto", || false, true), Engine::Mpirun);
        assert_eq!(
            choose("cuda", || true, false),
            Engine::Mpirun,
            "no NCCL: MPI, host-staged"
        );
        assert_eq!(choose("cpu", || panic!("not asked"), true), Engine::Mpirun);
        assert_eq!(choose("wgpu:0", || true, true), Engine::Mpirun);
    }

    #[test]
    fn the_collective_timeout_comes_from_the_train_command() {
        let timeout = collective_timeout(&command(&["train", "--collective-timeout", "7"]));
        assert_eq!(timeout.as_secs(), 7);
        assert_eq!(collective_timeout(&command(&["devices"])).as_secs(), 600);
    }

    #[test]
    fn other_subcommands_run_as_given() {
        assert_eq!(engine(&command(&["devices"])).unwrap(), Engine::Processes);
        assert_eq!(engine(&command(&["train", "--device", "cpu"])).unwrap(), Engine::Mpirun);
    }

    #[test]
    fn a_bad_train_command_is_refused_once_by_the_launcher() {
        let msg = engine(&command(&["train", "--no-such-flag"])).unwrap_err().to_string();
        assert!(
            msg.contains("not a valid `lockstep train`") && msg.contains("--no-such-flag"),
            "{msg}"
        );
        let msg = engine(&command(&["train", "--devices", "cpu:0,cpu:1"]))
            .unwrap_err()
            .to_string();
        assert!(msg.contains("--devices") && msg.contains("one --device"), "{msg}");
    }
}
