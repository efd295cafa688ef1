//! Faults during a run: `lockstep train` killed with SIGKILL at random instants while it writes
//! its checkpoint. Afterwards `last.safetensors` is always a whole checkpoint (the previous one
//! or the new one, never a part), the run resumes from it, and the temporary file the killed
//! writer left behind is removed by the next run over the same directory. And a disk that fills
//! up: the run stops (or warns and goes on, as told) with the previous checkpoint intact.

mod support;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use lockstep_core::train::checkpoint::{FORMAT, FORMAT_KEY, load_tensors};
use support::{TempDir, assert_succeeds, checkpoint_step, run, train_on_mnist};

/// Kills; the number. Each is a short process (about a second on 2 cores).
const KILLS: u64 = 50;

fn path_str(p: &Path) -> &str {
    p.to_str().expect("a UTF-8 temp path")
}

/// A run that writes a ~46 MB checkpoint (a 2048-wide MLP and its momentum) to `dir` after
/// every one-step epoch, for as long as it is let (or `extra` says).
fn big_run(dir: &Path, extra: &[&str]) -> Command {
    let mut args = vec![
        "--hidden",
        "2048,2048",
        "--limit-train-batches",
        "1",
        "--epochs",
        "100000",
        "--no-val",
        "--test-samples",
        "100",
        "--checkpoint-dir",
        path_str(dir),
    ];
    args.extend_from_slice(extra);
    train_on_mnist(&args)
}

fn start(dir: &Path, resume: bool) -> Child {
    let last = dir.join("last.safetensors");
    let extra: &[&str] = if resume { &["--resume", path_str(&last)] } else { &[] };
    big_run(dir, extra)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("lockstep starts")
}

/// The temporary files of writers in `dir`.
fn temporaries(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .flatten()
                .filter_map(|e| e.file_name().to_str().map(str::to_string))
                .filter(|n| n.contains(".tmp-"))
                .collect()
        })
        .unwrap_or_default()
}

/// Waits for the `nth` checkpoint write of `child` to begin (its temporary file appears), then lets it run
/// for `delay` and kills the process; false when the process ended first.
fn kill_during_write(child: &mut Child, dir: &Path, nth: u32, delay: Duration) -> bool {
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut seen = 0;
    let mut writing = false;
    while seen < nth {
        assert!(Instant::now() < deadline, "no checkpoint write began in 120 s");
        if child.try_wait().expect("wait").is_some() {
            return false;
        }
        let mine = format!(".tmp-{}", child.id());
        let now = temporaries(dir).iter().any(|name| name.ends_with(&mine));
        if now && !writing {
            seen += 1;
        }
        writing = now;
        std::thread::sleep(Duration::from_micros(300));
    }
    std::thread::sleep(delay);
    child.kill().expect("SIGKILL");
    child.wait().expect("reaped");
    true
}

#[test]
fn a_checkpoint_killed_mid_write_is_the_old_or_the_new_one_and_resumes() {
    let dir = TempDir::new("kill-checkpoint");
    let mut killed_mid_write = 0;
    for i in 0..KILLS {
        // A random instant: one of the first three writes, 0-40 ms into it (a write takes tens
        // of milliseconds: 46 MB, fsync, rename).
        let draw = |j| lockstep_core::rng::uniform_at(7, i, j);
        let nth = 1 + (draw(0) * 3.0) as u32;
        let delay = Duration::from_micros((draw(1) * 40_000.0) as u64);
        let resume = dir.join("last.safetensors").exists();
        let mut child = start(dir.path(), resume);
        if !kill_during_write(&mut child, dir.path(), nth, delay) {
            panic!("run {i} ended by itself before its write {nth}");
        }
        let pid = format!(".tmp-{}", child.id());
        killed_mid_write += u64::from(temporaries(dir.path()).iter().any(|name| name.ends_with(&pid)));
        let last = dir.join("last.safetensors");
        if last.exists() {
            let file = load_tensors(&last).unwrap_or_else(|e| panic!("kill {i}: last.safetensors is broken: {e}"));
            assert_eq!(
                file.metadata.get(FORMAT_KEY).map(String::as_str),
                Some(FORMAT),
                "kill {i}"
            );
        }
    }
    assert!(
        killed_mid_write > 0,
        "no kill landed inside a write: the test did not test"
    );
    eprintln!("{killed_mid_write} of {KILLS} kills left a half-written temporary file");

    // The last complete checkpoint resumes, and the run clears the killed writers' leftovers.
    let last = dir.join("last.safetensors");
    let out = run(&mut big_run(
        dir.path(),
        &["--max-steps", "1", "--resume", path_str(&last)],
    ));
    assert_succeeds(&out);
    assert!(
        temporaries(dir.path()).is_empty(),
        "left behind: {:?}",
        temporaries(dir.path())
    );
}

/// Runs `lockstep train` with its checkpoint directory on a tmpfs of `bytes` (mounted in a
/// private mount namespace, so nothing outlives the test); afterwards copies what the run left
/// there to `out`. `None` when this machine cannot mount one (no user namespaces).
fn train_on_a_small_disk(bytes: u64, out: &Path, extra: &[&str]) -> Option<std::process::Output> {
    let disk = out.join("disk");
    std::fs::create_dir_all(&disk).expect("mount point");
    let left = out.join("left");
    let script = format!(
        "mount -t tmpfs -o size={bytes} lockstep-full-disk '{disk}' || exit 97; \"$@\"; rc=$?; cp -a '{disk}' '{left}'; exit $rc",
        disk = disk.display(),
        left = left.display()
    );
    let mut args = small_run(&disk, "3");
    args.extend_from_slice(extra);
    let trainer = train_on_mnist(&args);
    let mut cmd = Command::new("unshare");
    cmd.args(["--user", "--map-root-user", "--mount", "sh", "-c", &script, "sh"]);
    cmd.arg(trainer.get_program()).args(trainer.get_args());
    for (key, value) in trainer.get_envs() {
        match value {
            Some(value) => cmd.env(key, value),
            None => cmd.env_remove(key),
        };
    }
    let output = run(&mut cmd);
    if output.status.code() == Some(97) || !left.exists() {
        let why = String::from_utf8_lossy(&output.stderr);
        assert!(
            std::env::var_os("LOCKSTEP_EXPECT_TMPFS").is_none(),
            "LOCKSTEP_EXPECT_TMPFS is set but no tmpfs could be mounted: {why}"
        );
        eprintln!(
            "SKIPPED: cannot mount a small tmpfs here (unshare/mount: {why}); set LOCKSTEP_EXPECT_TMPFS=1 to fail instead"
        );
        return None;
    }
    Some(output)
}

/// The full-disk test's run: a 256-wide MLP, two steps an epoch for `epochs`, checkpoints in
/// `dir`.
fn small_run<'a>(dir: &'a Path, epochs: &'a str) -> Vec<&'a str> {
    vec![
        "--hidden",
        "256",
        "--epochs",
        epochs,
        "--limit-train-batches",
        "2",
        "--no-val",
        "--test-samples",
        "100",
        "--checkpoint-dir",
        path_str(dir),
    ]
}

/// The size of one checkpoint of the run above, written to a roomy directory.
fn checkpoint_size(dir: &Path) -> u64 {
    let roomy = dir.join("roomy");
    let out = run(&mut train_on_mnist(&small_run(&roomy, "1")));
    assert_succeeds(&out);
    std::fs::metadata(roomy.join("last.safetensors"))
        .expect("a checkpoint")
        .len()
}

#[test]
fn a_full_disk_stops_the_run_or_warns_and_keeps_the_previous_checkpoint() {
    let dir = TempDir::new("full-disk");
    // Room for one checkpoint and half of the next: the second write (a temporary file beside
    // the first) runs out of space.
    let size = checkpoint_size(dir.path());
    let disk = size * 3 / 2;

    let stop = dir.join("stop");
    let Some(out) = train_on_a_small_disk(disk, &stop, &[]) else {
        return;
    };
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "a run whose checkpoint cannot be written went on: {stderr}"
    );
    for needle in ["No space left on device", "intact", "--on-checkpoint-error warn"] {
        assert!(stderr.contains(needle), "`{needle}` missing from: {stderr}");
    }
    let left = stop.join("left");
    assert_eq!(
        checkpoint_step(&left.join("last.safetensors")),
        Some(2),
        "not epoch 0's checkpoint"
    );
    assert!(temporaries(&left).is_empty(), "left behind: {:?}", temporaries(&left));

    let warn = dir.join("warn");
    let out = train_on_a_small_disk(disk, &warn, &["--on-checkpoint-error", "warn"]).expect("mounted before");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "--on-checkpoint-error warn stopped: {stderr}");
    assert!(stderr.contains("No space left on device"), "no warning in: {stderr}");
    assert!(String::from_utf8_lossy(&out.stdout).contains("test accuracy"));
    let left = warn.join("left");
    assert_eq!(
        checkpoint_step(&left.join("last.safetensors")),
        Some(2),
        "not epoch 0's checkpoint"
    );
    assert!(temporaries(&left).is_empty(), "left behind: {:?}", temporaries(&left));
}
