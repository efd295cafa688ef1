//! Which process of which job this is, from the variables its launcher set: `lockstep launch`
//! and torchrun (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT),
//! OpenMPI's mpirun (OMPI_COMM_WORLD_*), MPICH/Intel MPI (PMI_RANK, PMI_SIZE) or Slurm's srun
//! (SLURM_PROCID, SLURM_NTASKS, …). Read through a lookup function, so tests inject variables.

use std::time::Duration;

use anyhow::{Context, bail};

/// torchrun's names, which `lockstep launch` sets for each process.
pub const RANK: &str = "RANK";
pub const LOCAL_RANK: &str = "LOCAL_RANK";
pub const WORLD_SIZE: &str = "WORLD_SIZE";
pub const LOCAL_WORLD_SIZE: &str = "LOCAL_WORLD_SIZE";
pub const GROUP_RANK: &str = "GROUP_RANK";
pub const MASTER_ADDR: &str = "MASTER_ADDR";
pub const MASTER_PORT: &str = "MASTER_PORT";
/// The job token every rank presents at the rendezvous.
pub const TOKEN: &str = "LOCKSTEP_RDZV_TOKEN";
/// Seconds a rank waits at the rendezvous.
pub const TIMEOUT: &str = "LOCKSTEP_RDZV_TIMEOUT";

pub const DEFAULT_MASTER_ADDR: &str = "127.0.0.1";
pub const DEFAULT_MASTER_PORT: u16 = 29500;
/// The most processes in one job: each holds a connection at the rendezvous.
pub const MOST_RANKS: usize = 1 << 16;

/// The launcher that started this process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Launcher {
    /// `lockstep launch` or torchrun: no MPI runtime behind the processes.
    Torchrun,
    /// mpirun or mpiexec (OpenMPI, MPICH, Intel MPI).
    Mpirun,
    /// Slurm's srun.
    Srun,
}

#[derive(Clone, Debug, PartialEq)]
pub struct WorldEnv {
    pub rank: usize,
    pub local_rank: usize,
    pub world_size: usize,
    pub local_world_size: usize,
    /// Rank 0's host for the rendezvous (default 127.0.0.1: one machine).
    pub master_addr: String,
    pub master_port: u16,
    /// Where rank 0's rendezvous listens: MASTER_PORT, or the port after it under torchrun,
    /// whose agent serves its own store on MASTER_PORT (TORCHELASTIC_USE_AGENT_STORE=True).
    pub rdzv_port: u16,
    /// LOCKSTEP_RDZV_TOKEN, else the launcher's job id, else empty.
    pub token: String,
    pub rdzv_timeout: Duration,
    pub source: Launcher,
}

/// The ranks as one launcher names them.
struct Ranks {
    source: Launcher,
    rank: usize,
    world_size: usize,
    local_rank: usize,
    local_world_size: usize,
    job_id: Option<String>,
}

impl WorldEnv {
    /// This process's place in a job, or `None` when no launcher started it (or a world of one).
    pub fn from_env() -> anyhow::Result<Option<WorldEnv>> {
        WorldEnv::from_vars(|name| std::env::var(name).ok())
    }

    /// As `from_env`, with `var` in place of the environment. Precedence: torchrun's variables
    /// (set for each process by the innermost launcher), then MPI's, then Slurm's (which a job
    /// step inherits around mpirun or torchrun).
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> anyhow::Result<Option<WorldEnv>> {
        let detectors: [Detector; 4] = [torchrun, open_mpi, pmi, slurm];
        let ranks = detectors
            .into_iter()
            .find_map(|detect| detect(&var).transpose())
            .transpose()?;
        let Some(ranks) = ranks.filter(|r| r.world_size > 1) else {
            return Ok(None);
        };
        let token = var(TOKEN).or(ranks.job_id).unwrap_or_default();
        let master_port = number::<u16>(&var, MASTER_PORT)?.unwrap_or(DEFAULT_MASTER_PORT);
        let rdzv_port = if var("TORCHELASTIC_USE_AGENT_STORE").as_deref() == Some("True") {
            master_port
                .checked_add(1)
                .with_context(|| format!("{MASTER_PORT}={master_port} leaves no port beside torchrun's store"))?
        } else {
            master_port
        };
        let rdzv_timeout = match var(TIMEOUT) {
            None => lockstep_core::distributed::rendezvous::DEFAULT_TIMEOUT,
            Some(text) => text
                .trim()
                .parse::<f64>()
                .ok()
                .filter(|s| *s > 0.0 && *s <= crate::bounds::MOST_SECONDS as f64)
                .map(Duration::from_secs_f64)
                .with_context(|| {
                    format!(
                        "{TIMEOUT}={text} is not a number of seconds from 0 (excluded) to {}",
                        crate::bounds::MOST_SECONDS
                    )
                })?,
        };
        Ok(Some(WorldEnv {
            rank: ranks.rank,
            local_rank: ranks.local_rank,
            world_size: ranks.world_size,
            local_world_size: ranks.local_world_size,
            master_addr: var(MASTER_ADDR).unwrap_or_else(|| DEFAULT_MASTER_ADDR.into()),
            master_port,
            rdzv_port,
            token,
            rdzv_timeout,
            source: ranks.source,
        }))
    }
}

type Var<'a> = &'a dyn Fn(&str) -> Option<String>;
type Detector = fn(Var) -> anyhow::Result<Option<Ranks>>;

/// The variable `name` as a number; an error naming it when it is not one.
fn number<T: std::str::FromStr>(var: Var, name: &str) -> anyhow::Result<Option<T>> {
    match var(name) {
        None => Ok(None),
        Some(text) => match text.trim().parse() {
            Ok(n) => Ok(Some(n)),
            Err(_) => bail!("{name}={text} is not a valid number; the launcher (or you) set it wrongly"),
        },
    }
}

/// Rank and world from the named variables, checked against each other; `None` when the world
/// size variable is absent (this launcher did not start us).
fn ranks(
    var: Var,
    source: Launcher,
    [rank_var, world_var, local_rank_var, local_world_var]: [&str; 4],
    local_world_fallback: Option<usize>,
    job_id: Option<String>,
) -> anyhow::Result<Option<Ranks>> {
    let Some(world_size) = number::<usize>(var, world_var)? else {
        return Ok(None);
    };
    let Some(rank) = number::<usize>(var, rank_var)? else {
        bail!("{world_var} is set but {rank_var} is not: the launcher must set both");
    };
    if world_size > MOST_RANKS {
        bail!("{world_var}={world_size} is more ranks than a job may have ({MOST_RANKS})");
    }
    if world_size == 0 || rank >= world_size {
        bail!("{rank_var}={rank} is out of range for {world_var}={world_size}");
    }
    let local_rank = number::<usize>(var, local_rank_var)?.unwrap_or(rank);
    // Unknown: assume one machine, which only makes the default thread count conservative.
    let local_world_size = number::<usize>(var, local_world_var)?
        .or(local_world_fallback)
        .unwrap_or(world_size);
    if local_rank >= local_world_size {
        bail!("{local_rank_var}={local_rank} is out of range for {local_world_var}={local_world_size}");
    }
    Ok(Some(Ranks {
        source,
        rank,
        world_size,
        local_rank,
        local_world_size,
        job_id,
    }))
}

fn torchrun(var: Var) -> anyhow::Result<Option<Ranks>> {
    ranks(
        var,
        Launcher::Torchrun,
        [RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE],
        None,
        var("TORCHELASTIC_RUN_ID"),
    )
}

fn open_mpi(var: Var) -> anyhow::Result<Option<Ranks>> {
    ranks(
        var,
        Launcher::Mpirun,
        [
            "OMPI_COMM_WORLD_RANK",
            "OMPI_COMM_WORLD_SIZE",
            "OMPI_COMM_WORLD_LOCAL_RANK",
            "OMPI_COMM_WORLD_LOCAL_SIZE",
        ],
        None,
        var("PMIX_NAMESPACE").or_else(|| var("OMPI_MCA_ess_base_jobid")),
    )
}

/// MPICH's and Intel MPI's Hydra launcher.
fn pmi(var: Var) -> anyhow::Result<Option<Ranks>> {
    ranks(
        var,
        Launcher::Mpirun,
        ["PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"],
        None,
        var("PMI_KVS_NAME"),
    )
}

/// srun's job step (SLURM_STEP_ID): an sbatch script itself also sees SLURM_NTASKS and
/// SLURM_PROCID, but is no rank.
fn slurm(var: Var) -> anyhow::Result<Option<Ranks>> {
    if var("SLURM_STEP_ID").is_none() {
        return Ok(None);
    }
    let world_var = if var("SLURM_STEP_NUM_TASKS").is_some() {
        "SLURM_STEP_NUM_TASKS"
    } else {
        "SLURM_NTASKS"
    };
    let node = number::<usize>(var, "SLURM_NODEID")?.unwrap_or(0);
    let tasks_here = ["SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"]
        .into_iter()
        .find_map(|name| var(name).map(|v| (name, v)))
        .map(|(name, value)| {
            tasks_on_node(&value, node)
                .with_context(|| format!("{name}={value} does not give a task count for node {node}"))
        })
        .transpose()?;
    let job = var("SLURM_JOB_ID").map(|job| format!("{job}.{}", var("SLURM_STEP_ID").unwrap_or_default()));
    ranks(
        var,
        Launcher::Srun,
        ["SLURM_PROCID", world_var, "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE"],
        tasks_here,
        job,
    )
}

/// Slurm's compressed tasks-per-node list, e.g. `2(x3),1`: node 0..2 run 2 tasks, node 3 runs 1.
fn tasks_on_node(list: &str, node: usize) -> Option<usize> {
    let mut first: usize = 0;
    for part in list.split(',') {
        let (count, repeat) = match part.trim().split_once("(x") {
            Some((count, rest)) => (count, rest.strip_suffix(')')?.parse::<usize>().ok()?),
            None => (part.trim(), 1),
        };
        let count = count.parse::<usize>().ok()?;
        // Checked: the counts are the launcher's text, and a sum past usize is no node's.
        let next = first.checked_add(repeat)?;
        if node < next {
            return Some(count);
        }
        first = next;
    }
    None
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn world(vars: &[(&str, &str)]) -> anyhow::Result<Option<WorldEnv>> {
        let map: HashMap<String, String> = vars.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        WorldEnv::from_vars(|name| map.get(name).cloned())
    }

    fn error(vars: &[(&str, &str)]) -> String {
        match world(vars) {
            Ok(w) => panic!("expected an error, got {w:?}"),
            Err(e) => format!("{e:#}"),
        }
    }

    #[test]
    fn torchrun_variables_give_the_whole_picture() {
        let w = world(&[
            ("RANK", "3"),
            ("LOCAL_RANK", "1"),
            ("WORLD_SIZE", "4"),
            ("LOCAL_WORLD_SIZE", "2"),
            ("MASTER_ADDR", "10.0.0.7"),
            ("MASTER_PORT", "29512"),
            ("LOCKSTEP_RDZV_TOKEN", "abc"),
            ("LOCKSTEP_RDZV_TIMEOUT", "2.5"),
        ])
        .unwrap()
        .unwrap();
        assert_eq!(
            w,
            WorldEnv {
                rank: 3,
                local_rank: 1,
                world_size: 4,
                local_world_size: 2,
                master_addr: "10.0.0.7".into(),
                master_port: 29512,
                rdzv_port: 29512,
                token: "abc".into(),
                rdzv_timeout: Duration::from_millis(2500),
                source: Launcher::Torchrun,
            }
        );
    }

    #[test]
    fn defaults_are_one_machine_on_port_29500() {
        let w = world(&[("RANK", "1"), ("WORLD_SIZE", "2")]).unwrap().unwrap();
        assert_eq!((w.master_addr.as_str(), w.master_port), ("127.0.0.1", 29500));
        assert_eq!((w.local_rank, w.local_world_size), (1, 2));
        assert_eq!(w.token, "");
        assert_eq!(w.rdzv_timeout, Duration::from_secs(300));
        let w = world(&[("RANK", "0"), ("WORLD_SIZE", "2"), ("TORCHELASTIC_RUN_ID", "job7")])
            .unwrap()
            .unwrap();
        assert_eq!(w.token, "job7");
    }

    #[test]
    fn under_torchrun_the_rendezvous_leaves_master_port_to_its_agent() {
        let w = world(&[
            ("RANK", "0"),
            ("WORLD_SIZE", "2"),
            ("TORCHELASTIC_USE_AGENT_STORE", "True"),
        ])
        .unwrap()
        .unwrap();
        assert_eq!((w.master_port, w.rdzv_port), (29500, 29501));
    }

    #[test]
    fn no_launcher_or_a_world_of_one_is_no_process_group() {
        assert_eq!(world(&[]).unwrap(), None);
        assert_eq!(world(&[("RANK", "0"), ("WORLD_SIZE", "1")]).unwrap(), None);
        assert_eq!(
            world(&[("OMPI_COMM_WORLD_RANK", "0"), ("OMPI_COMM_WORLD_SIZE", "1")]).unwrap(),
            None
        );
        // An sbatch script sees the allocation's variables but is not an srun task.
        assert_eq!(world(&[("SLURM_PROCID", "0"), ("SLURM_NTASKS", "4")]).unwrap(), None);
    }

    #[test]
    fn open_mpi_and_pmi_variables_are_read() {
        let w = world(&[
            ("OMPI_COMM_WORLD_RANK", "2"),
            ("OMPI_COMM_WORLD_SIZE", "4"),
            ("OMPI_COMM_WORLD_LOCAL_RANK", "0"),
            ("OMPI_COMM_WORLD_LOCAL_SIZE", "2"),
            ("PMIX_NAMESPACE", "prterun-host-99@1"),
        ])
        .unwrap()
        .unwrap();
        assert_eq!((w.rank, w.world_size, w.local_rank, w.local_world_size), (2, 4, 0, 2));
        assert_eq!((w.source, w.token.as_str()), (Launcher::Mpirun, "prterun-host-99@1"));
        let w = world(&[
            ("PMI_RANK", "1"),
            ("PMI_SIZE", "3"),
            ("MPI_LOCALRANKID", "1"),
            ("MPI_LOCALNRANKS", "3"),
        ])
        .unwrap()
        .unwrap();
        assert_eq!(
            (w.rank, w.world_size, w.local_rank, w.source),
            (1, 3, 1, Launcher::Mpirun)
        );
    }

    #[test]
    fn slurm_steps_are_read_with_their_compressed_task_counts() {
        let w = world(&[
            ("SLURM_STEP_ID", "0"),
            ("SLURM_JOB_ID", "1234"),
            ("SLURM_PROCID", "5"),
            ("SLURM_NTASKS", "7"),
            ("SLURM_LOCALID", "0"),
            ("SLURM_NODEID", "3"),
            ("SLURM_TASKS_PER_NODE", "2(x2),1(x1),2"),
        ])
        .unwrap()
        .unwrap();
        assert_eq!((w.rank, w.world_size, w.local_rank, w.local_world_size), (5, 7, 0, 2));
        assert_eq!((w.source, w.token.as_str()), (Launcher::Srun, "1234.0"));
        assert_eq!(tasks_on_node("2(x3),1", 2), Some(2));
        assert_eq!(tasks_on_node("2(x3),1", 3), Some(1));
        assert_eq!(tasks_on_node("2(x3),1", 4), None);
        assert_eq!(tasks_on_node("two", 0), None);
    }

    #[test]
    fn torchrun_variables_win_over_the_mpi_and_slurm_ones_around_them() {
        let w = world(&[
            ("RANK", "1"),
            ("WORLD_SIZE", "2"),
            ("OMPI_COMM_WORLD_RANK", "0"),
            ("OMPI_COMM_WORLD_SIZE", "3"),
            ("SLURM_STEP_ID", "0"),
            ("SLURM_PROCID", "0"),
            ("SLURM_NTASKS", "1"),
        ])
        .unwrap()
        .unwrap();
        assert_eq!((w.rank, w.world_size, w.source), (1, 2, Launcher::Torchrun));
    }

    #[test]
    fn malformed_values_are_errors_naming_the_variable() {
        let msg = error(&[("RANK", "one"), ("WORLD_SIZE", "2")]);
        assert!(msg.contains("RANK=one is not a valid number"), "{msg}");
        let msg = error(&[("RANK", "2"), ("WORLD_SIZE", "2")]);
        assert!(msg.contains("RANK=2 is out of range for WORLD_SIZE=2"), "{msg}");
        let msg = error(&[("WORLD_SIZE", "2")]);
        assert!(msg.contains("WORLD_SIZE is set but RANK is not"), "{msg}");
        let msg = error(&[("RANK", "0"), ("WORLD_SIZE", "2"), ("MASTER_PORT", "70000")]);
        assert!(msg.contains("MASTER_PORT=70000"), "{msg}");
        let msg = error(&[("RANK", "0"), ("WORLD_SIZE", "2"), ("LOCKSTEP_RDZV_TIMEOUT", "-1")]);
        assert!(
            msg.contains("LOCKSTEP_RDZV_TIMEOUT=-1 is not a number of seconds from 0 (excluded) to 604800"),
            "{msg}"
        );
        let msg = error(&[
            ("RANK", "0"),
            ("WORLD_SIZE", "4"),
            ("LOCAL_RANK", "2"),
            ("LOCAL_WORLD_SIZE", "2"),
        ]);
        assert!(
            msg.contains("LOCAL_RANK=2 is out of range for LOCAL_WORLD_SIZE=2"),
            "{msg}"
        );
        let msg = error(&[
            ("SLURM_STEP_ID", "0"),
            ("SLURM_PROCID", "0"),
            ("SLURM_NTASKS", "2"),
            ("SLURM_TASKS_PER_NODE", "x"),
        ]);
        assert!(msg.contains("SLURM_TASKS_PER_NODE=x"), "{msg}");
    }
}
