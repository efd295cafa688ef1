//! Starting the ranks of this machine and watching them, as torchrun's agent does: every rank
//! that ends well is done; the first that fails or is killed stops the others at once, and the
//! launcher fails naming it. The others get SIGTERM (a rank of `lockstep train` then stops after
//! its step and saves its checkpoint), and SIGKILL after a grace period: a rank blocked in a
//! collective with the dead one cannot finish its step, and checkpoints are written atomically.

use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::thread;
use std::time::Duration;

/// How often the children are looked at (torchrun's monitor interval is 0.1 s too).
const POLL: Duration = Duration::from_millis(100);

/// How long the other ranks have between SIGTERM and SIGKILL.
const GRACE: Duration = Duration::from_secs(10);

pub struct RankProcess {
    pub rank: usize,
    pub child: Child,
}

/// Starts `exe command…` once per (rank, variables), output passed through, then watches them.
pub fn run_ranks(
    exe: &Path,
    command: &[String],
    ranks: Vec<(usize, Vec<(&'static str, String)>)>,
) -> anyhow::Result<()> {
    let mut started = Vec::new();
    for (rank, env) in ranks {
        let spawned = Command::new(exe).args(command).envs(env).stdin(Stdio::null()).spawn();
        match spawned {
            Ok(child) => started.push(RankProcess { rank, child }),
            Err(e) => {
                stop(&mut started, GRACE);
                anyhow::bail!("cannot start rank {rank} ({}): {e}", exe.display());
            }
        }
    }
    supervise(started)
}

/// Waits until every rank has ended well, or until one fails: then stops the rest and returns
/// an error naming the rank, its pid and how it ended.
pub fn supervise(ranks: Vec<RankProcess>) -> anyhow::Result<()> {
    supervise_with_grace(ranks, GRACE)
}

/// `supervise` with `grace` between the other ranks' SIGTERM and their SIGKILL.
fn supervise_with_grace(mut ranks: Vec<RankProcess>, grace: Duration) -> anyhow::Result<()> {
    while !ranks.is_empty() {
        let mut failure = None;
        ranks.retain_mut(|r| {
            let pid = r.child.id();
            let ended = match r.child.try_wait() {
                Ok(None) => return true,
                Ok(Some(status)) if status.success() => return false,
                Ok(Some(status)) => describe(status),
                Err(e) => format!("could not be watched ({e})"),
            };
            failure.get_or_insert(format!("rank {} (pid {pid}) {ended}", r.rank));
            false
        });
        if let Some(failure) = failure {
            eprintln_whole!("lockstep launch: {failure}; stopping the other ranks");
            stop(&mut ranks, grace);
            anyhow::bail!("{failure}");
        }
        thread::sleep(POLL);
    }
    Ok(())
}

/// SIGTERM to every rank, up to `grace` for them to end, then SIGKILL to the rest; all reaped.
fn stop(ranks: &mut [RankProcess], grace: Duration) {
    for r in ranks.iter() {
        terminate(&r.child);
    }
    let deadline = std::time::Instant::now() + grace;
    while std::time::Instant::now() < deadline && ranks.iter_mut().any(|r| matches!(r.child.try_wait(), Ok(None))) {
        thread::sleep(Duration::from_millis(20));
    }
    for r in ranks.iter_mut() {
        let _ = r.child.kill();
        let _ = r.child.wait();
    }
}

/// Asks `child` to stop (SIGTERM); where there is no such signal, the grace period passes and
/// SIGKILL follows.
fn terminate(child: &Child) {
    #[cfg(unix)]
    if let Ok(pid) = i32::try_from(child.id()) {
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGTERM);
    }
}

/// "exited with status 1", "was killed by signal 9 (SIGKILL)".
pub fn describe(status: ExitStatus) -> String {
    if let Some(code) = status.code() {
        return format!("exited with status {code}");
    }
    #[cfg(unix)]
    if let Some(signal) = std::os::unix::process::ExitStatusExt::signal(&status) {
        let name = match signal {
            2 => " (SIGINT)",
            6 => " (SIGABRT)",
            7 => " (SIGBUS)",
            9 => " (SIGKILL)",
            11 => " (SIGSEGV)",
            15 => " (SIGTERM)",
            _ => "",
        };
        return format!("was killed by signal {signal}{name}");
    }
    format!("ended: {status}")
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::*;

    fn shell(rank: usize, script: &str) -> RankProcess {
        let child = Command::new("sh").args(["-c", script]).spawn().expect("sh runs");
        RankProcess { rank, child }
    }

    #[test]
    fn ranks_that_all_succeed_end_the_launch_well() {
        supervise(vec![shell(0, "exit 0"), shell(1, "sleep 0.2")]).unwrap();
    }

    #[test]
    fn a_killed_rank_stops_the_others_and_is_named() {
        let survivor = shell(0, "sleep 60");
        let survivor_pid = survivor.child.id();
        let start = Instant::now();
        let err = supervise(vec![survivor, shell(1, "sleep 0.3; kill -9 $$")]).unwrap_err();
        let msg = err.to_string();
        assert!(msg.starts_with("rank 1 (pid "), "{msg}");
        assert!(msg.ends_with("was killed by signal 9 (SIGKILL)"), "{msg}");
        assert!(start.elapsed() < Duration::from_secs(30), "took {:?}", start.elapsed());
        // Reaped, so no trace of it remains.
        assert!(
            !Path::new(&format!("/proc/{survivor_pid}")).exists(),
            "rank 0 still runs"
        );
    }

    #[test]
    fn the_others_get_sigterm_and_a_grace_period_before_sigkill() {
        let marker = std::env::temp_dir().join(format!("lockstep-sigterm-{}", std::process::id()));
        let _ = std::fs::remove_file(&marker);
        let polite = shell(
            0,
            &format!(
                "trap 'touch {}; exit 0' TERM; while :; do sleep 0.05; done",
                marker.display()
            ),
        );
        // Ignores SIGTERM (as a rank blocked in a collective would not get to act on it).
        let stubborn = shell(1, "trap '' TERM; exec sleep 30");
        let stubborn_pid = stubborn.child.id();
        let start = Instant::now();
        let grace = Duration::from_millis(800);
        let err = supervise_with_grace(vec![polite, stubborn, shell(2, "sleep 0.3; exit 3")], grace).unwrap_err();
        assert!(err.to_string().starts_with("rank 2 "), "{err}");
        assert!(marker.exists(), "rank 0 never saw SIGTERM");
        let took = start.elapsed();
        assert!(took >= grace && took < Duration::from_secs(10), "took {took:?}");
        assert!(
            !Path::new(&format!("/proc/{stubborn_pid}")).exists(),
            "rank 1 outlived its SIGKILL"
        );
        let _ = std::fs::remove_file(&marker);
    }

    #[test]
    fn a_failing_rank_is_named_with_its_status() {
        let err = supervise(vec![shell(0, "sleep 60"), shell(1, "sleep 60"), shell(2, "exit 3")]).unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.starts_with("rank 2 (pid ") && msg.ends_with("exited with status 3"),
            "{msg}"
        );
    }
}
