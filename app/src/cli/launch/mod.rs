//! `lockstep launch`: starts the processes of a data-parallel job on this machine, torchrun's
//! way: N copies of this executable running the command after `--`, each told its place by
//! RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT and the job token
//! (LOCKSTEP_RDZV_TOKEN). When one fails or is killed, the others are stopped and the launcher
//! fails naming it. CPU and wgpu devices talk through MPI, whose processes only an MPI
//! launcher can start: for them `launch` hands the job to mpirun (`plan.rs`).

mod mpirun;
mod plan;
mod supervise;

use std::hash::{BuildHasher, Hasher, RandomState};
use std::sync::atomic::Ordering;

use anyhow::Context;
use clap::Parser;

use crate::cli::world;

#[derive(Parser, Debug)]
#[command(after_help = "Examples:\n  \
    lockstep launch --nproc-per-node 4 -- train --device cuda --batch-size 512\n  \
    lockstep launch --nproc-per-node 2 -- train --device cpu        (runs mpirun -np 2 …)\n\n\
    Two machines, four GPUs each (the same --token on both; rank 0 lives on node 0):\n  \
    node0$ lockstep launch --nnodes 2 --node-rank 0 --nproc-per-node 4 --master-addr node0 --token T -- train …\n  \
    node1$ lockstep launch --nnodes 2 --node-rank 1 --nproc-per-node 4 --master-addr node0 --token T -- train …")]
pub struct Args {
    /// Processes to start on this machine: one per GPU for CUDA devices (process i uses
    /// cuda:LOCAL_RANK with `--device cuda`).
    #[arg(long, value_name = "N")]
    pub nproc_per_node: usize,
    /// Machines in the job, each running its own `lockstep launch`.
    #[arg(long, default_value_t = 1, value_name = "M")]
    pub nnodes: usize,
    /// This machine's index among the --nnodes (0 hosts rank 0).
    #[arg(long, default_value_t = 0, value_name = "R")]
    pub node_rank: usize,
    /// Rank 0's machine: where its rendezvous listens (loopback suits one machine).
    #[arg(long, default_value = world::DEFAULT_MASTER_ADDR, value_name = "ADDR")]
    pub master_addr: String,
    /// The rendezvous port on rank 0's machine.
    #[arg(long, default_value_t = world::DEFAULT_MASTER_PORT, value_name = "PORT")]
    pub master_port: u16,
    /// The job token every process presents at the rendezvous, so a process of another job is
    /// refused. Default: random, which works on one machine; with --nnodes > 1 pass the same
    /// token to every machine's launcher.
    #[arg(long, value_name = "TOKEN")]
    pub token: Option<String>,
    /// When a rank fails, stop them all and start the whole job again, up to N times
    /// (torchrun's --max-restarts): with `train --checkpoint-dir DIR --resume last` each start
    /// resumes from the last checkpoint.
    #[arg(long, default_value_t = 0, value_name = "N")]
    pub max_restarts: usize,
    /// The lockstep subcommand and its arguments that every process runs, after `--`.
    #[arg(last = true, required = true, value_name = "COMMAND")]
    pub command: Vec<String>,
}

impl Args {
    fn validate(&self) -> anyhow::Result<()> {
        anyhow::ensure!(self.nproc_per_node > 0, "--nproc-per-node must be at least 1");
        anyhow::ensure!(self.nnodes > 0, "--nnodes must be at least 1");
        anyhow::ensure!(
            self.node_rank < self.nnodes,
            "--node-rank {} is out of range for --nnodes {}: number the machines 0 to {}",
            self.node_rank,
            self.nnodes,
            self.nnodes - 1
        );
        anyhow::ensure!(
            self.nnodes == 1 || self.token.is_some(),
            "with --nnodes {} every machine's launcher must present the same job token: pass --token T (the same T \
             on every machine)",
            self.nnodes
        );
        anyhow::ensure!(
            self.command.first().is_some_and(|c| c != "launch"),
            "the command after -- is what each process runs (e.g. `-- train --device cuda`), not another launch"
        );
        Ok(())
    }

    fn world_size(&self) -> usize {
        self.nnodes * self.nproc_per_node
    }

    /// The variables of the process with `local_rank` on this machine.
    fn rank_env(&self, local_rank: usize, token: &str) -> Vec<(&'static str, String)> {
        vec![
            (
                world::RANK,
                (self.node_rank * self.nproc_per_node + local_rank).to_string(),
            ),
            (world::LOCAL_RANK, local_rank.to_string()),
            (world::WORLD_SIZE, self.world_size().to_string()),
            (world::LOCAL_WORLD_SIZE, self.nproc_per_node.to_string()),
            (world::GROUP_RANK, self.node_rank.to_string()),
            (world::MASTER_ADDR, self.master_addr.clone()),
            (world::MASTER_PORT, self.master_port.to_string()),
            (world::TOKEN, token.to_string()),
        ]
    }
}

pub fn run(args: Args) -> anyhow::Result<()> {
    args.validate()?;
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
    let mut restarts = 0;
    loop {
        let ended = match engine {
            plan::Engine::Mpirun => mpirun::run(&exe, &args),
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
                supervise::run_ranks(&exe, &args.command, ranks)
            }
        };
        let stopped_by_user = interrupted.as_ref().is_some_and(|flag| flag.load(Ordering::SeqCst));
        match ended {
            Err(failure) if restarts < args.max_restarts && !stopped_by_user => {
                restarts += 1;
                eprintln_whole!(
                    "lockstep launch: {failure}; restarting the job ({restarts} of --max-restarts {})",
                    args.max_restarts
                );
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

    fn parse(args: &[&str]) -> Result<Args, clap::Error> {
        Args::try_parse_from(std::iter::once("launch").chain(args.iter().copied()))
    }

    #[test]
    fn every_process_gets_torchruns_variables() {
        let args = parse(&[
            "--nproc-per-node",
            "2",
            "--nnodes",
            "3",
            "--node-rank",
            "1",
            "--master-addr",
            "node0",
            "--master-port",
            "29600",
            "--token",
            "T",
            "--",
            "train",
            "--device",
            "cuda",
        ])
        .unwrap();
        args.validate().unwrap();
        assert_eq!(args.command, ["train", "--device", "cuda"]);
        let env = args.rank_env(1, "T");
        let get = |name: &str| env.iter().find(|(k, _)| *k == name).map(|(_, v)| v.as_str());
        assert_eq!(get("RANK"), Some("3"));
        assert_eq!(get("LOCAL_RANK"), Some("1"));
        assert_eq!(get("WORLD_SIZE"), Some("6"));
        assert_eq!(get("LOCAL_WORLD_SIZE"), Some("2"));
        assert_eq!(get("GROUP_RANK"), Some("1"));
        assert_eq!(get("MASTER_ADDR"), Some("node0"));
        assert_eq!(get("MASTER_PORT"), Some("29600"));
        assert_eq!(get("LOCKSTEP_RDZV_TOKEN"), Some("T"));
        // What a child reads back is what the launcher meant.
        let child = world::WorldEnv::from_vars(|name| get(name).map(String::from))
            .unwrap()
            .unwrap();
        assert_eq!((child.rank, child.local_rank, child.world_size), (3, 1, 6));
    }

    #[test]
    fn defaults_are_one_machine_on_loopback() {
        let args = parse(&["--nproc-per-node", "4", "--", "train"]).unwrap();
        args.validate().unwrap();
        assert_eq!((args.nnodes, args.node_rank), (1, 0));
        assert_eq!((args.master_addr.as_str(), args.master_port), ("127.0.0.1", 29500));
        assert_ne!(random_token(), random_token());
        assert_eq!(random_token().len(), 32);
    }

    #[test]
    fn bad_arguments_are_refused_with_what_to_do() {
        assert!(parse(&["--nproc-per-node", "2"]).is_err(), "a command is required");
        assert!(
            parse(&["--nproc-per-node", "2", "train"]).is_err(),
            "the command comes after --"
        );
        let refusal = |a: &[&str]| parse(a).unwrap().validate().unwrap_err().to_string();
        let msg = refusal(&["--nproc-per-node", "0", "--", "train"]);
        assert!(msg.contains("--nproc-per-node must be at least 1"), "{msg}");
        let msg = refusal(&[
            "--nproc-per-node",
            "2",
            "--nnodes",
            "2",
            "--node-rank",
            "2",
            "--token",
            "T",
            "--",
            "train",
        ]);
        assert!(msg.contains("--node-rank 2 is out of range"), "{msg}");
        let msg = refusal(&["--nproc-per-node", "2", "--nnodes", "2", "--", "train"]);
        assert!(msg.contains("pass --token"), "{msg}");
        let msg = refusal(&["--nproc-per-node", "2", "--", "launch"]);
        assert!(msg.contains("not another launch"), "{msg}");
    }
}
