//! Two machines for real (the `mpi` feature; `cargo test -p lockstep --features lockstep/mpi,
//! lockstep-mpi/mpi --test two_machines`): two network namespaces joined by a veth pair, each
//! with its own address on a private test subnet (10.213.N.0/24; no other address is
//! contacted), and one `lockstep launch --nnodes 2 --node-rank N --master-addr <node 0>` in
//! each. Node 0's mpirun reaches the other namespace through an rsh agent that enters it (and
//! gives it a hostname of its own) where ssh would log in to another machine, so the ranks of
//! node 1 talk to node 0's over TCP across the veth link. The namespaces share the file system,
//! as machines sharing a network file system for their checkpoints would.
//!
//! A job on the two machines ends with the weights of the same job on one, bit for bit; a
//! node's ranks killed end the job, named, and `--max-restarts` resumes it from the last
//! checkpoint; a cut link ends the job at the collective timeout, naming the machine lost.
//!
//! Needs root (network namespaces), iproute2 and OpenMPI. Without root or `ip` the tests say
//! SKIPPED; LOCKSTEP_EXPECT_NETNS=1 (CI) makes that a failure.
#![cfg(feature = "mpi")]

mod support;

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, PoisonError};
use std::thread;
use std::time::{Duration, Instant};

use support::mpi::{
    ROOT_ENV, bits, logged_losses, make_restartable, mpirun, mpirun_available, path_str, set_flag, train_args,
    wait_at_most, weights,
};
use support::{TempDir, checkpoint_step, mnist_dir};

/// One job at a time: two jobs' ranks fighting for 2 cores turn seconds into minutes.
static ONE_JOB: Mutex<()> = Mutex::new(());

/// How long a launcher may take before the test gives up on it.
const JOB_LIMIT: Duration = Duration::from_secs(240);

/// Two network namespaces joined by a veth pair, removed (with every process in them) when
/// dropped.
struct Machines {
    namespaces: [String; 2],
    addresses: [String; 2],
    /// The device of node 1's end of the link (cut to cut the link).
    link: String,
    /// The rsh agent node 0's mpirun starts node 1's daemon with.
    agent: PathBuf,
    dir: TempDir,
}

impl Machines {
    /// Two machines on subnet 10.213.`subnet`.0/24; None (said loudly) where this test cannot
    /// make them and LOCKSTEP_EXPECT_NETNS is unset.
    fn new(subnet: u8) -> Option<Machines> {
        if !mpirun_available() {
            return None;
        }
        let id = std::process::id() % 100_000;
        let namespaces = [format!("lockstep-{id}-{subnet}-0"), format!("lockstep-{id}-{subnet}-1")];
        let addresses = [format!("10.213.{subnet}.1"), format!("10.213.{subnet}.2")];
        let ends = [format!("ls{subnet}a{id}"), format!("ls{subnet}b{id}")];
        let dir = TempDir::new("two-machines");
        let machines = Machines {
            namespaces: namespaces.clone(),
            addresses: addresses.clone(),
            link: ends[1].clone(),
            agent: dir.join("rsh-agent"),
            dir,
        };
        let mut steps = vec![
            vec!["netns", "add", &namespaces[0]],
            vec!["netns", "add", &namespaces[1]],
            vec!["link", "add", &ends[0], "type", "veth", "peer", "name", &ends[1]],
        ];
        let addressed: Vec<String> = addresses.iter().map(|a| format!("{a}/24")).collect();
        for node in 0..2 {
            steps.push(vec!["link", "set", &ends[node], "netns", &namespaces[node]]);
            steps.push(vec![
                "-n",
                &namespaces[node],
                "addr",
                "add",
                &addressed[node],
                "dev",
                &ends[node],
            ]);
            steps.push(vec!["-n", &namespaces[node], "link", "set", &ends[node], "up"]);
            steps.push(vec!["-n", &namespaces[node], "link", "set", "lo", "up"]);
        }
        for step in &steps {
            if let Err(why) = ip(step) {
                drop(machines);
                let expected = std::env::var_os("LOCKSTEP_EXPECT_NETNS").is_some();
                assert!(
                    !expected,
                    "LOCKSTEP_EXPECT_NETNS is set but two network namespaces could not be made: {why}"
                );
                eprintln!(
                    "\n**** SKIPPED: cannot make network namespaces here (needs root and iproute2: {why}); set \
                     LOCKSTEP_EXPECT_NETNS=1 to fail instead ****\n"
                );
                return None;
            }
        }
        machines.write_agent();
        Some(machines)
    }

    /// What mpirun runs in place of `ssh HOST COMMAND`: the command in HOST's namespace, with
    /// that machine's own hostname.
    fn write_agent(&self) {
        let cases: String = (0..2)
            .map(|node| {
                format!(
                    "    {}) ns={}; name=node{node} ;;\n",
                    self.addresses[node], self.namespaces[node]
                )
            })
            .collect();
        let script = format!(
            "#!/bin/sh\n# rsh agent of the two-machines test: $1 is a host, the rest a remote shell's command.\n\
             host=$1; shift\ncase $host in\n{cases}    *) echo \"rsh agent: unknown host $host\" >&2; exit 1 ;;\nesac\n\
             exec ip netns exec \"$ns\" unshare --uts sh -c \"hostname $name; $*\"\n"
        );
        std::fs::write(&self.agent, script).expect("write the rsh agent");
        let made_executable = Command::new("chmod").arg("+x").arg(&self.agent).status();
        assert!(made_executable.is_ok_and(|s| s.success()), "chmod the rsh agent");
    }

    /// `lockstep launch --nnodes 2 --node-rank NODE … -- TRAIN` in node NODE's namespace, its
    /// output in DIR/NAME-nodeNODE.log (a file: mpirun's daemons inherit it, and a pipe would
    /// stay open as long as they live).
    fn launch(&self, node: usize, name: &str, launch: &[&str], train: &[String]) -> Child {
        let log = self.dir.join(&format!("{name}-node{node}.log"));
        let out = File::create(&log).expect("create the launcher's log");
        let err = out.try_clone().expect("clone the log handle");
        Command::new("ip")
            .args(["netns", "exec", &self.namespaces[node], env!("CARGO_BIN_EXE_lockstep")])
            .args([
                "launch",
                "--nnodes",
                "2",
                "--nproc-per-node",
                "2",
                "--token",
                "two-machines",
            ])
            .args(["--node-rank", &node.to_string(), "--master-addr", &self.addresses[0]])
            .args(launch)
            .arg("--")
            .args(train)
            .envs(ROOT_ENV)
            .env("OMPI_MCA_plm_rsh_agent", &self.agent)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .expect("ip netns exec … lockstep launch starts")
    }

    /// What a launcher wrote.
    fn log(&self, name: &str, node: usize) -> String {
        std::fs::read_to_string(self.dir.join(&format!("{name}-node{node}.log"))).unwrap_or_default()
    }

    /// The processes in node NODE's namespace whose arguments pass `keep`.
    fn processes(&self, node: usize, keep: impl Fn(&[&str]) -> bool) -> Vec<u32> {
        let Ok(out) = Command::new("ip")
            .args(["netns", "pids", &self.namespaces[node]])
            .output()
        else {
            return Vec::new();
        };
        String::from_utf8_lossy(&out.stdout)
            .split_whitespace()
            .filter_map(|pid| pid.parse::<u32>().ok())
            .filter(|pid| {
                std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|cmd| {
                    let cmd = String::from_utf8_lossy(&cmd);
                    keep(&cmd.split('\0').collect::<Vec<_>>())
                })
            })
            .collect()
    }

    /// Node 1's ranks: its `lockstep train` processes (not its launcher, nor MPI's daemon).
    fn node_1_ranks(&self) -> Vec<u32> {
        self.processes(1, |args| args.get(1) == Some(&"train"))
    }
}

impl Drop for Machines {
    fn drop(&mut self) {
        for node in 0..2 {
            for pid in self.processes(node, |_| true) {
                let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
            }
            // Removing a namespace removes its end of the veth pair, and with it the other.
            let _ = ip(&["netns", "del", &self.namespaces[node]]);
        }
    }
}

fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip").args(args).output().map_err(|e| format!("ip: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// Both launchers of job `name`, node 1's started first (it waits for node 0's).
fn launch_both(machines: &Machines, name: &str, launch: &[&str], train: &[String]) -> [Child; 2] {
    let node1 = machines.launch(1, name, launch, train);
    let node0 = machines.launch(0, name, launch, train);
    [node0, node1]
}

/// Waits for both launchers; panics (with their logs) if one runs past JOB_LIMIT.
fn wait_for_both(machines: &Machines, name: &str, mut launchers: [Child; 2]) -> [bool; 2] {
    let ended = launchers.each_mut().map(|child| wait_at_most(child, JOB_LIMIT));
    for child in &mut launchers {
        let _ = child.kill();
        let _ = child.wait();
    }
    let logs = format!("node 0:\n{}\nnode 1:\n{}", machines.log(name, 0), machines.log(name, 1));
    println!("{name}: {ended:?}\n{logs}");
    assert!(
        ended.iter().all(Option::is_some),
        "a launcher still ran after {JOB_LIMIT:?}:\n{logs}"
    );
    ended.map(|status| status.is_some_and(|s| s.success()))
}

/// The small MLP job of the MPI tests, writing each rank's weights and rank 0's metrics to `dir`.
fn job(dir: &Path, extra: &[&str]) -> Vec<String> {
    let mut args = train_args(
        &mnist_dir(),
        &[
            "--dump-weights",
            path_str(dir),
            "--metrics-out",
            path_str(&dir.join("metrics.jsonl")),
            "--log-every",
            "1",
        ],
    );
    args.extend(extra.iter().map(|s| s.to_string()));
    args
}

#[test]
fn a_job_on_two_machines_ends_with_the_weights_of_the_same_job_on_one() {
    let _one = ONE_JOB.lock().unwrap_or_else(PoisonError::into_inner);
    let Some(machines) = Machines::new(21) else {
        return;
    };
    let (one, two) = (TempDir::new("one-machine"), TempDir::new("two-machines-job"));
    let out = mpirun(4, &job(one.path(), &[]));
    assert!(
        out.status.success(),
        "the one-machine job failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let launchers = launch_both(&machines, "job", &[], &job(two.path(), &[]));
    let [node0, node1] = wait_for_both(&machines, "job", launchers);
    let log = machines.log("job", 0);
    assert!(node0 && node1, "the two-machine job failed:\n{log}");
    assert!(
        log.contains(&format!(
            "--host {0}:2,{1}:2",
            machines.addresses[0], machines.addresses[1]
        )),
        "node 0's mpirun does not span both machines:\n{log}"
    );
    assert!(
        log.contains(&format!("node 1 joined from {}", machines.addresses[1])),
        "{log}"
    );

    let losses = logged_losses(&two.join("metrics.jsonl"));
    assert_eq!(losses.len(), 20, "{losses:?}");
    assert_eq!(
        losses.iter().map(|l| l.to_bits()).collect::<Vec<_>>(),
        logged_losses(&one.join("metrics.jsonl"))
            .iter()
            .map(|l| l.to_bits())
            .collect::<Vec<_>>(),
        "the losses differ from the one-machine job's"
    );
    for rank in 0..4 {
        assert!(
            bits(&weights(two.path(), rank)) == bits(&weights(one.path(), 0)),
            "rank {rank}'s weights differ from the one-machine job's"
        );
    }
}

#[test]
fn a_node_whose_ranks_are_killed_is_named_and_the_job_restarts_from_its_last_checkpoint() {
    let _one = ONE_JOB.lock().unwrap_or_else(PoisonError::into_inner);
    let Some(machines) = Machines::new(22) else {
        return;
    };
    let (calm, restarted) = (TempDir::new("uninterrupted"), TempDir::new("restarted"));
    let resumable = |dir: &TempDir| {
        let mut args = job(dir.path(), &[]);
        make_restartable(&mut args, dir.path());
        args
    };
    let out = mpirun(4, &resumable(&calm));
    assert!(
        out.status.success(),
        "the uninterrupted job failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let launchers = launch_both(&machines, "restart", &["--max-restarts", "1"], &resumable(&restarted));
    // Once the first checkpoint is whole, node 1 loses its ranks.
    let last = restarted.join("checkpoints").join("last.safetensors");
    let deadline = Instant::now() + JOB_LIMIT;
    let killed_after = loop {
        assert!(Instant::now() < deadline, "no checkpoint within {JOB_LIMIT:?}");
        if let Some(step) = checkpoint_step(&last) {
            let ranks = machines.node_1_ranks();
            assert_eq!(ranks.len(), 2, "node 1's ranks: {ranks:?}");
            for pid in ranks {
                let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
            }
            break step;
        }
        thread::sleep(Duration::from_millis(5));
    };
    let [node0, node1] = wait_for_both(&machines, "restart", launchers);
    let (log0, log1) = (machines.log("restart", 0), machines.log("restart", 1));
    assert!(
        killed_after < 48,
        "the job ended before the kill: nothing was restarted"
    );
    assert!(node0 && node1, "the restarted job failed:\n{log0}\n{log1}");
    assert!(
        log0.contains("on node node1") || log0.contains("process rank 2 ") || log0.contains("process rank 3 "),
        "node 0 does not name the ranks lost on node 1:\n{log0}"
    );
    assert!(log0.contains("restarting the job (1 of --max-restarts 1)"), "{log0}");
    assert!(
        log1.contains("restarting the job"),
        "node 1's launcher was not told of the restart:\n{log1}"
    );
    assert!(log0.contains("resumed from"), "the restart did not resume:\n{log0}");
    assert!(
        bits(&weights(restarted.path(), 0)) == bits(&weights(calm.path(), 0)),
        "the restarted job's weights differ from the uninterrupted one's"
    );
}

#[test]
fn a_cut_link_ends_the_job_at_the_collective_timeout_naming_the_machine_lost() {
    let _one = ONE_JOB.lock().unwrap_or_else(PoisonError::into_inner);
    let Some(machines) = Machines::new(23) else {
        return;
    };
    let dir = TempDir::new("cut");
    let mut train = job(dir.path(), &["--collective-timeout", "5"]);
    // Long enough that it still trains when the link is cut.
    set_flag(&mut train, "--max-steps", "100000");
    let mut launchers = launch_both(&machines, "cut", &["--max-restarts", "1"], &train);
    let metrics = dir.join("metrics.jsonl");
    let deadline = Instant::now() + JOB_LIMIT;
    while std::fs::read_to_string(&metrics).map_or(0, |m| m.lines().count()) < 5 {
        let ended = launchers.iter_mut().any(|child| !matches!(child.try_wait(), Ok(None)));
        assert!(
            Instant::now() < deadline && !ended,
            "the job did not train:\n{}",
            machines.log("cut", 0)
        );
        thread::sleep(Duration::from_millis(50));
    }
    ip(&["-n", &machines.namespaces[1], "link", "set", &machines.link, "down"]).expect("cut the link");
    let cut = Instant::now();
    let ended = launchers
        .each_mut()
        .map(|child| wait_at_most(child, Duration::from_secs(60)));
    let took = cut.elapsed();
    let (log0, log1) = (machines.log("cut", 0), machines.log("cut", 1));
    println!("cut link: {ended:?} in {took:?}\nnode 0:\n{log0}\nnode 1:\n{log1}");
    assert!(
        ended[0].is_some_and(|s| !s.success()),
        "node 0's launcher did not fail within 60 s of the cut:\n{log0}"
    );
    // The collective timeout (5 s), then mpirun's grace to end its ranks.
    assert!(took < Duration::from_secs(20), "took {took:?}:\n{log0}");
    assert!(
        log0.contains(&format!("lost node 1 ({})", machines.addresses[1])),
        "node 0 does not name the machine lost:\n{log0}"
    );
    assert!(
        !log0.contains("restarting the job"),
        "node 0 restarted without node 1:\n{log0}"
    );
    assert!(
        ended[1].is_some_and(|s| !s.success()) && log1.contains("lost node 0"),
        "node 1's launcher did not notice the cut:\n{log1}"
    );
    // Node 1's ranks cannot reach mpirun to be ended: their collective timeout ends them.
    let deadline = Instant::now() + Duration::from_secs(30);
    while !machines.node_1_ranks().is_empty() {
        assert!(Instant::now() < deadline, "node 1's ranks outlived the cut by 30 s");
        thread::sleep(Duration::from_millis(200));
    }
}
