//! `MpiCommunicator` across real processes: the `mpi_collectives` example under `mpirun` with 2
//! and 4 ranks (every rank checks every collective), and a rank that dies ending the job fast,
//! named by the launcher.
//!
//! Needs OpenMPI's `mpirun` (Debian/Ubuntu: `apt-get install openmpi-bin libopenmpi-dev`); where
//! it is missing these tests fail, or skip with LOCKSTEP_SKIP_MPI=1. The example is (re)built
//! by `cargo build` from here, into this test's own target directory and profile, so it is never
//! stale; that waits for cargo's lock if another build holds it.
#![cfg(feature = "mpi")]

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Mutex, OnceLock, PoisonError};
use std::thread;
use std::time::{Duration, Instant};

/// One job at a time: concurrent jobs' ranks would fight for the cores (and OpenMPI's ranks
/// spin while they wait), turning seconds into minutes.
static ONE_JOB: Mutex<()> = Mutex::new(());

/// OpenMPI refuses to run as root without both variables (containers, CI).
const ROOT_ENV: [(&str, &str); 2] = [("OMPI_ALLOW_RUN_AS_ROOT", "1"), ("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")];

/// More ranks than cores is fine (`--oversubscribe`); ranks run threads, so no pinning to one core.
const MPIRUN_FLAGS: [&str; 3] = ["--oversubscribe", "--bind-to", "none"];

/// True where mpirun runs; false (after saying so loudly) where it is missing and
/// LOCKSTEP_SKIP_MPI=1; a failure otherwise.
fn mpirun_available() -> bool {
    let found = Command::new("mpirun")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok();
    if found {
        return true;
    }
    if std::env::var("LOCKSTEP_SKIP_MPI").as_deref() == Ok("1") {
        // Straight to stderr: libtest captures eprintln! of passing tests.
        let _ = writeln!(
            std::io::stderr(),
            "\n**** SKIPPED: mpirun not found and LOCKSTEP_SKIP_MPI=1: the MPI tests did not run ****\n"
        );
        return false;
    }
    panic!(
        "mpirun not found on PATH: install OpenMPI (Debian/Ubuntu: apt-get install openmpi-bin libopenmpi-dev), \
         or set LOCKSTEP_SKIP_MPI=1 to skip the MPI tests"
    );
}

/// Builds the example with cargo (a no-op when fresh) once per test run and returns its path.
fn example() -> &'static Path {
    static BUILT: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    let built = BUILT.get_or_init(|| {
        // This test runs from <target>/<profile>/deps/; the example lands in <target>/<profile>/examples/.
        let exe = std::env::current_exe().map_err(|e| format!("current_exe: {e}"))?;
        let profile_dir = exe.parent().and_then(Path::parent).ok_or("unexpected test path")?;
        let target_dir = profile_dir.parent().ok_or("unexpected test path")?;
        let profile = match profile_dir.file_name().and_then(|n| n.to_str()) {
            Some("debug") => "dev",
            Some(other) => other,
            None => return Err("unexpected test path".into()),
        };
        let output = Command::new(env!("CARGO"))
            .args([
                "build",
                "-p",
                "lockstep-mpi",
                "--features",
                "mpi",
                "--example",
                "mpi_collectives",
            ])
            .args(["--profile", profile])
            .arg("--target-dir")
            .arg(target_dir)
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .output()
            .map_err(|e| format!("running cargo: {e}"))?;
        if !output.status.success() {
            return Err(format!(
                "building the mpi_collectives example failed:\n{}",
                String::from_utf8_lossy(&output.stderr)
            ));
        }
        let path = profile_dir.join("examples").join("mpi_collectives");
        if path.exists() {
            Ok(path)
        } else {
            Err(format!("cargo built the example but {} does not exist", path.display()))
        }
    });
    match built {
        Ok(path) => path,
        Err(e) => panic!("{e}"),
    }
}

/// Collects a child's stream on a thread, so a full pipe never blocks it.
fn drain(mut stream: impl Read + Send + 'static) -> thread::JoinHandle<String> {
    thread::spawn(move || {
        let mut bytes = Vec::new();
        let _ = stream.read_to_end(&mut bytes);
        String::from_utf8_lossy(&bytes).into_owned()
    })
}

/// Waits for `child` at most `limit`; kills it (and says so) past that.
fn wait_at_most(child: &mut Child, limit: Duration) -> Option<ExitStatus> {
    let start = Instant::now();
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            return Some(status);
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        thread::sleep(Duration::from_millis(50));
    }
}

struct Job {
    status: Option<ExitStatus>,
    output: String,
    elapsed: Duration,
}

/// `mpirun -np <ranks>` on the example with `args`; stdout and stderr together.
fn mpirun(ranks: usize, args: &[&str]) -> Job {
    let exe = example();
    let _one = ONE_JOB.lock().unwrap_or_else(PoisonError::into_inner);
    let start = Instant::now();
    let mut child = Command::new("mpirun")
        .args(["-np", &ranks.to_string()])
        .args(MPIRUN_FLAGS)
        // mpirun's own limit ends the ranks too; the wait below is the backstop.
        .args(["--timeout", "240"])
        .arg(exe)
        .args(args)
        .envs(ROOT_ENV)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("mpirun was found above");
    let stdout = drain(child.stdout.take().expect("piped"));
    let stderr = drain(child.stderr.take().expect("piped"));
    let status = wait_at_most(&mut child, Duration::from_secs(300));
    let elapsed = start.elapsed();
    let output = format!(
        "{}{}",
        stdout.join().unwrap_or_default(),
        stderr.join().unwrap_or_default()
    );
    Job {
        status,
        output,
        elapsed,
    }
}

fn every_rank_passes(ranks: usize) {
    if !mpirun_available() {
        return;
    }
    let job = mpirun(ranks, &[]);
    let Job {
        status,
        output,
        elapsed,
    } = &job;
    println!("mpirun -np {ranks}: {status:?} in {elapsed:?}\n{output}");
    assert!(
        status.is_some_and(|s| s.success()),
        "mpirun -np {ranks} ended with {status:?} after {elapsed:?}:\n{output}"
    );
    for r in 0..ranks {
        assert!(
            output.lines().any(|l| l.trim() == format!("rank {r} ok")),
            "rank {r} did not print ok:\n{output}"
        );
    }
}

#[test]
fn collectives_agree_on_2_ranks() {
    every_rank_passes(2);
}

#[test]
fn collectives_agree_on_4_ranks() {
    every_rank_passes(4);
}

/// OpenMPI names a rank killed by a signal as "process rank 1 with PID …", and one that exited
/// with an error code by its process name "[[job,app],rank]", e.g. "Process name: [[29269,1],1]".
fn names_rank_1(output: &str) -> bool {
    output.contains("process rank 1 ")
        || output
            .lines()
            .map(str::trim)
            .any(|l| l.starts_with("Process name:") && l.ends_with("],1]"))
}

/// Rank 1 dies (abort, then exit code 3) while the others wait in an all-reduce: mpirun must end
/// the job with a failure within 30 s and name rank 1 (the example itself prints no rank number
/// in this mode).
#[test]
fn a_dying_rank_ends_the_job_and_is_named() {
    if !mpirun_available() {
        return;
    }
    for (ranks, how) in [(4, "abort"), (2, "exit")] {
        let job = mpirun(ranks, &["--die-before-collective", how]);
        let Job {
            status,
            output,
            elapsed,
        } = &job;
        println!("mpirun -np {ranks}, rank 1 {how}s: {status:?} in {elapsed:?}\n{output}");
        assert!(
            status.is_some_and(|s| !s.success()),
            "rank 1 {how}ed but mpirun -np {ranks} ended with {status:?}:\n{output}"
        );
        assert!(
            *elapsed < Duration::from_secs(30),
            "mpirun took {elapsed:?} to notice:\n{output}"
        );
        assert!(names_rank_1(output), "mpirun's output does not name rank 1:\n{output}");
        assert!(!output.contains(" ok\n"), "a rank claimed success:\n{output}");
    }
}
