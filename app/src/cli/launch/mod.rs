//! `lockstep launch`: starts the processes of a data-parallel job on this machine, torchrun's
//! way: N copies of this executable running the command after `--`, each told its place by
//! RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT and the job token
//! (LOCKSTEP_RDZV_TOKEN). When one fails or is killed, the others are stopped and the launcher
//! fails naming it. CPU and wgpu devices talk through MPI, whose processes only an MPI
//! launcher can start: for them `launch` hands the job to mpirun (`plan.rs`).

mod mpirun;
mod nodes;
mod plan;
mod supervise;

use std::hash::{BuildHasher, Hasher, RandomState};
use std::sync::atomic::Ordering;

use anyhow::Context;
use lockstep_flags::launch::Args;

/// Runs a launch whose flags `lockstep_flags::validate` accepted.
pub fn run(args: Args) -> anyhow::Result<()> {
    let exe = std::env::current_exe().context("cannot find this executable to start its processes")?;
    let engine = plan::engine(&args.command)?;
    // Ctrl-C reaches every rank (one process group): they stop after their step and end well,
    // and the launcher waits for them instead of dying first (and does not restart them).
    let interrupted = match engine {
        plan::Engine::Processes => Some(super::interrupt::stop_on_signal(
            "the ranks stop after their step and save the checkpoint",
        )?),
        plan::Engine::Mpirun => None,
    };
    if args.max_restarts > 0 && !args.command.iter().any(|a| a == "--resume") {
        eprintln_whole!(
            "lockstep launch: --max-restarts without `--resume last` (and --checkpoint-dir) in the command: a \
             restarted job trains from the beginning"
        );
    }
    // An MPI job on several machines: node 0's mpirun starts every rank; the others wait.
    let several = engine == plan::Engine::Mpirun && args.nnodes > 1;
    let silence = plan::collective_timeout(&args.command);
    if several && args.node_rank > 0 {
        return nodes::follow(&args, silence);
    }
    let cluster = several.then(|| nodes::Cluster::gather(&args)).transpose()?;
    let ended = run_with_restarts(&args, engine, &exe, cluster.as_ref().map(|c| (c, silence)), interrupted);
    if let Some(cluster) = &cluster {
        cluster.finish(&ended);
    }
    ended
}

/// Runs the job, and again after a failure while --max-restarts allows (not after Ctrl-C, and
/// not without a machine that is gone).
fn run_with_restarts(
    args: &Args,
    engine: plan::Engine,
    exe: &std::path::Path,
    cluster: Option<(&nodes::Cluster, std::time::Duration)>,
    interrupted: Option<std::sync::Arc<std::sync::atomic::AtomicBool>>,
) -> anyhow::Result<()> {
    let mut restarts = 0;
    loop {
        let ended = match engine {
            plan::Engine::Mpirun => mpirun::run(exe, args, cluster),
            plan::Engine::Processes => {
                let token = args.token.clone().unwrap_or_else(random_token);
                let ranks = (0..args.nproc_per_node)
                    .map(|local| {
                        (
                            args.node_rank * args.nproc_per_node + local,
                            args.rank_env(local, &token),
                        )
                    })
                    .collect();
                supervise::run_ranks(exe, &args.command, ranks)
            }
        };
        let stopped_by_user = interrupted.as_ref().is_some_and(|flag| flag.load(Ordering::SeqCst));
        let gone = match (&ended, cluster) {
            (Err(_), Some((cluster, _))) => cluster.gone_after_failure(),
            _ => None,
        };
        match ended {
            Err(failure) if let Some(gone) = gone => {
                return Err(failure.context(format!("{gone}; the job is not restarted without it")));
            }
            Err(failure) if restarts < args.max_restarts && !stopped_by_user => {
                restarts += 1;
                let note = format!(
                    "{failure}; restarting the job ({restarts} of --max-restarts {})",
                    args.max_restarts
                );
                eprintln_whole!("lockstep launch: {note}");
                if let Some((cluster, _)) = cluster {
                    cluster.tell(&note);
                }
            }
            Err(failure) if restarts > 0 => return Err(failure.context(format!("after {restarts} restart(s)"))),
            ended => return ended,
        }
    }
}

/// A token no other job on this machine presents (RandomState is seeded by the OS).
fn random_token() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    (0..2)
        .map(|_| {
            let mut hasher = RandomState::new().build_hasher();
            hasher.write_u128(nanos);
            hasher.write_u32(std::process::id());
            format!("{:016x}", hasher.finish())
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_random_and_32_hex_digits() {
        assert_ne!(random_token(), random_token());
        assert_eq!(random_token().len(), 32);
    }
}
