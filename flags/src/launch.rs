//! `lockstep launch`'s flags: how many processes on this machine and where rank 0 is. The
//! command after `--` is checked as a command line of its own before any process starts.

use clap::Parser;

use crate::world;

/// Restarts of a failing job: each costs a whole start; past this a job is failing for good.
pub const MOST_RESTARTS: usize = 1000;
/// The rendezvous refuses longer tokens.
pub const MOST_TOKEN_BYTES: usize = lockstep_core::distributed::rendezvous::wire::MAX_TOKEN;

#[derive(Parser, Debug)]
#[command(after_help = "Examples:\n  \
    lockstep launch --nproc-per-node 4 -- train --device cuda --batch-size 512\n  \
    lockstep launch --nproc-per-node 2 -- train --device cpu        (runs mpirun -np 2 …)\n\n\
    Two machines, four GPUs each (the same --token on both; rank 0 lives on node 0):\n  \
    node0$ lockstep launch --nnodes 2 --node-rank 0 --nproc-per-node 4 --master-addr node0 --token T -- train …\n  \
    node1$ lockstep launch --nnodes 2 --node-rank 1 --nproc-per-node 4 --master-addr node0 --token T -- train …\n\n\
    For CPU and wgpu devices node 0's launcher runs one mpirun over every machine, which starts\n\
    their ranks through ssh (or OMPI_MCA_plm_rsh_agent); the others' launchers wait for the end.")]
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
    pub fn validate(&self) -> anyhow::Result<()> {
        use crate::bounds::{MOST_PARTS, threads, within};
        threads("--nproc-per-node", self.nproc_per_node, 1)?;
        within("--nnodes", self.nnodes, 1..=MOST_PARTS)?;
        within("--master-port", self.master_port, 1..=u16::MAX)?;
        within("--max-restarts", self.max_restarts, 0..=MOST_RESTARTS)?;
        if let Some(token) = &self.token {
            anyhow::ensure!(
                (1..=MOST_TOKEN_BYTES).contains(&token.len()),
                "--token is {} bytes long: give 1 to {MOST_TOKEN_BYTES}",
                token.len()
            );
        }
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

    pub fn world_size(&self) -> usize {
        self.nnodes * self.nproc_per_node
    }

    /// The variables of the process with `local_rank` on this machine.
    pub fn rank_env(&self, local_rank: usize, token: &str) -> Vec<(&'static str, String)> {
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
        assert!(msg.contains("--nproc-per-node 0 is out of range"), "{msg}");
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
