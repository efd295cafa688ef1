//! Training across processes on MPI (the `mpi` feature; run with
//! `cargo test -p lockstep --features mpi --test processes`): 2 and 4 ranks under mpirun end with
//! weights identical bit for bit and equal (to f32 rounding) to one device trained with the
//! global batch; only rank 0 reports; a rank killed with `kill -9` under `lockstep launch` ends
//! the job within 30 s, named, and one stopped (hung) ends it at the collective timeout; a job
//! restarted after a kill ends with the weights of an uninterrupted one.
//!
//! Needs OpenMPI's `mpirun`; where it is missing these tests fail, or skip with LOCKSTEP_SKIP_MPI=1.
#![cfg(feature = "mpi")]

mod support;

use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::sync::{Mutex, PoisonError};
use std::thread;
use std::time::{Duration, Instant};

use support::mpi::{
    ROOT_ENV, bits, checkpoint_tensors, logged_losses, make_restartable, mpirun, mpirun_available, path_str, pids_with,
    set_flag, train_args, wait_at_most, weights,
};
use support::{TempDir, assert_succeeds, checkpoint_step, lockstep, mnist_dir, run};

/// One job at a time: two jobs' ranks fighting for 2 cores turn seconds into minutes.
static ONE_JOB: Mutex<()> = Mutex::new(());

/// Equal to f32 rounding: the sums run in another order.
fn assert_close(ranks: &[(String, Vec<f64>)], one: &[(String, Vec<f64>)]) {
    assert_eq!(ranks.len(), one.len());
    for ((name, a), (other, b)) in ranks.iter().zip(one) {
        assert_eq!(name, other);
        for (x, y) in a.iter().zip(b) {
            assert!(
                (x - y).abs() <= 1e-5 + 1e-4 * y.abs(),
                "{name}: {x} across processes, {y} in one process"
            );
        }
    }
}

fn count_lines(text: &str, needle: &str) -> usize {
    text.lines().filter(|l| l.contains(needle)).count()
}

/// `mpirun -np <ranks> lockstep train …` matches one device with the same global batch.
fn processes_match_one_device(ranks: usize) {
    if !mpirun_available() {
        return;
    }
    let _one = ONE_JOB.lock().unwrap_or_else(PoisonError::into_inner);
    let data = mnist_dir();
    let (one_dir, many_dir) = (TempDir::new("one-device"), TempDir::new("processes"));
    let out = run(lockstep(&[]).args(train_args(&data, &["--dump-weights", path_str(one_dir.path())])));
    assert_succeeds(&out);

    let summary = many_dir.join("summary.json");
    let start = Instant::now();
    let out = mpirun(
        ranks,
        &train_args(
            &data,
            &[
                "--dump-weights",
                path_str(many_dir.path()),
                "--summary-out",
                path_str(&summary),
            ],
        ),
    );
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    println!(
        "mpirun -np {ranks}: {:?} in {:?}\n{stdout}{stderr}",
        out.status,
        start.elapsed()
    );
    assert!(out.status.success(), "mpirun -np {ranks} failed:\n{stdout}\n{stderr}");

    // Only rank 0 reports: one progress header, one summary.
    assert_eq!(count_lines(&stderr, "training mlp on"), 1, "{stderr}");
    assert_eq!(count_lines(&stdout, "test accuracy"), 1, "{stdout}");
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&summary).expect("rank 0 wrote the summary")).expect("JSON");
    assert_eq!(json["steps"], 20, "{json}");
    assert_eq!(json["device"], format!("cpu:0 (x{ranks} processes)"), "{json}");

    let rank0 = weights(many_dir.path(), 0);
    for rank in 1..ranks {
        assert!(
            bits(&weights(many_dir.path(), rank)) == bits(&rank0),
            "rank {rank}'s weights differ from rank 0's"
        );
    }
    assert_close(&rank0, &weights(one_dir.path(), 0));
}

/// ZeRO over `ranks` processes beside plain data parallel over as many: the weights end equal
/// (to the clipping norm's summation order), every rank's alike, and rank 0's checkpoint holds
/// the whole optimizer state, each share sent by its owner while rank 0 saves.
fn zero_across_processes_matches_data_parallel(ranks: usize, stage: &str, precision: &str, clip: bool) {
    if !mpirun_available() {
        return;
    }
    let _one = ONE_JOB.lock().unwrap_or_else(PoisonError::into_inner);
    let data = mnist_dir();
    let job = |zero: Option<&str>| {
        let dir = TempDir::new("zero");
        let (dumped, checkpoints) = (dir.join("weights"), dir.join("checkpoints"));
        let mut args = train_args(&data, &["--optimizer", "adamw", "--lr", "0.003"]);
        if clip {
            args.extend(["--clip-grad-norm".into(), "0.5".into()]);
        }
        args.extend(["--precision".into(), precision.into()]);
        args.extend(["--dump-weights".into(), path_str(&dumped).into()]);
        args.extend(["--checkpoint-dir".into(), path_str(&checkpoints).into()]);
        if let Some(stage) = zero {
            args.extend(["--zero".into(), stage.into()]);
        }
        let out = mpirun(ranks, &args);
        let (stdout, stderr) = (
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
        );
        assert!(
            out.status.success(),
            "mpirun -np {ranks} (--zero {zero:?}) failed:\n{stdout}\n{stderr}"
        );
        let rank0 = weights(&dumped, 0);
        for rank in 1..ranks {
            assert!(
                bits(&weights(&dumped, rank)) == bits(&rank0),
                "rank {rank}'s weights differ from rank 0's"
            );
        }
        (rank0, checkpoint_tensors(&checkpoints.join("last.safetensors")), dir)
    };
    let (plain, whole, _plain_dir) = job(None);
    let (sharded, gathered, _sharded_dir) = job(Some(stage));
    assert_close(&sharded, &plain);
    let moments = |t: &[(String, Vec<f64>)]| t.iter().filter(|(n, _)| n.starts_with("optimizer.")).count();
    assert!(moments(&whole) > 0, "AdamW keeps moments");
    assert_eq!(moments(&gathered), moments(&whole), "rank 0's checkpoint lacks a share");
    assert_close(&gathered, &whole);
}

#[test]
fn zero_2_over_two_processes_matches_data_parallel_and_checkpoints_the_whole_state() {
    zero_across_processes_matches_data_parallel(2, "2", "32", true);
}

#[test]
fn zero_1_over_four_processes_in_bf16_mixed_matches_data_parallel() {
    zero_across_processes_matches_data_parallel(4, "1", "bf16-mixed", true);
}

/// Unclipped: under ZeRO the clipping norm sums each rank's share first, another order than
/// data parallel's, and f16's rounding in the forward pass turns that last-bit difference into
/// more than the 1e-4 compared within 20 steps.
#[test]
fn zero_2_over_four_processes_in_16_mixed_matches_data_parallel() {
    zero_across_processes_matches_data_parallel(4, "2", "16-mixed", false);
}

#[test]
fn two_processes_match_one_device_with_the_global_batch() {
    processes_match_one_device(2);
}

#[test]
fn four_processes_match_one_device_with_the_global_batch() {
    processes_match_one_device(4);
}

/// The "test accuracy …" part of a run's summary line.
fn test_result(stdout: &str) -> &str {
    let line = stdout
        .lines()
        .find(|l| l.contains("test accuracy"))
        .expect("a summary line");
    let start = line.find("test accuracy").expect("found above");
    &line[start..line[start..].find(" |").map_or(line.len(), |end| start + end)]
}

/// Two stages in two processes (`mpirun -np 2 lockstep train --pipeline-stages 2`) log the
/// losses of the same pipeline as threads of one process bit for bit, end with its weights and
/// test result, and each stage checkpoints its own layers and resumes from them exactly.
#[test]
fn a_pipeline_of_two_processes_trains_as_the_same_pipeline_in_one_process() {
    if !mpirun_available() {
        return;
    }
    let _one = ONE_JOB.lock().unwrap_or_else(PoisonError::into_inner);
    let data = mnist_dir();
    let (one, many) = (TempDir::new("pipeline-one"), TempDir::new("pipeline-processes"));
    let args = |dir: &TempDir| {
        let (log, weights) = (dir.join("metrics.jsonl"), dir.join("weights"));
        let mut args = train_args(
            &data,
            &["--pipeline-stages", "2", "--micro-batches", "4", "--schedule", "1f1b"],
        );
        set_flag(&mut args, "--log-every", "1");
        set_flag(&mut args, "--metrics-out", path_str(&log));
        set_flag(&mut args, "--dump-weights", path_str(&weights));
        set_flag(&mut args, "--checkpoint-dir", path_str(&dir.join("checkpoints")));
        args
    };
    let mut in_one = args(&one);
    set_flag(&mut in_one, "--device", "cpu:0");
    in_one.extend(["--devices".to_string(), "cpu:0,cpu:1".to_string()]);
    let out_one = run(lockstep(&[]).args(&in_one));
    assert_succeeds(&out_one);
    let out = mpirun(2, &args(&many));
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    println!("mpirun -np 2 --pipeline-stages 2: {:?}\n{stdout}{stderr}", out.status);
    assert!(
        out.status.success(),
        "the pipeline of processes failed:\n{stdout}\n{stderr}"
    );

    let want = logged_losses(&one.join("metrics.jsonl"));
    assert_eq!(want.len(), 20, "one step event per step");
    assert!(
        logged_losses(&many.join("metrics.jsonl")) == want,
        "the processes logged other losses than one process"
    );
    assert_eq!(
        count_lines(&stdout, "test accuracy"),
        1,
        "only stage 0 reports:\n{stdout}"
    );
    assert_eq!(
        test_result(&stdout),
        test_result(&String::from_utf8_lossy(&out_one.stdout))
    );
    // Stage 0's process holds the first layers, stage 1's the rest: together, one process's.
    let mut stages = weights(&many.join("weights"), 0);
    stages.extend(weights(&many.join("weights"), 1));
    stages.sort_by(|a, b| a.0.cmp(&b.0));
    assert!(
        bits(&stages) == bits(&weights(&one.join("weights"), 0)),
        "the stages' weights differ"
    );
    for stage in 0..2 {
        let path = many.join(&format!("checkpoints/stage-{stage}/last.safetensors"));
        assert_eq!(checkpoint_step(&path), Some(20), "{}", path.display());
    }

    // Stopped after 10 steps and resumed, each stage from its own checkpoint (with its
    // momentum): the last 10 losses of the uninterrupted run.
    let part = TempDir::new("pipeline-resumed");
    let mut first_half = args(&part);
    set_flag(&mut first_half, "--max-steps", "10");
    let out = mpirun(2, &first_half);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let mut resumed = args(&part);
    set_flag(&mut resumed, "--resume", "last");
    let out = mpirun(2, &resumed);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(
        logged_losses(&part.join("metrics.jsonl")) == want[10..],
        "a resumed pipeline of processes went on other than the uninterrupted one"
    );
}

/// A GPT in two stages, one per process (`mpirun -np 2 … --pipeline-stages 2`): the head's
/// process holds a copy of the token embedding, their gradients are summed across the two
/// processes and the clipping norm totalled over them; 20 steps end with the weights of one
/// device, both copies equal. SGD: Adam would magnify the norm's summation order in the
/// attention's key bias, whose gradient is 0 but for rounding.
#[test]
fn a_gpt_in_two_processes_ends_with_one_device_s_weights() {
    if !mpirun_available() {
        return;
    }
    let _one = ONE_JOB.lock().unwrap_or_else(PoisonError::into_inner);
    let dir = TempDir::new("gpt-processes");
    let text = dir.join("story.txt");
    std::fs::write(
        &text,
        "All that glitters is not gold; all who wander are not lost.\n".repeat(20),
    )
    .unwrap();
    let args = |out: &Path, extra: &[&str]| -> Vec<String> {
        #[rustfmt::skip]
        let mut args = vec![
            "train", "--headless", "--threads", "1", "--workers", "1", "--no-val", "--device", "cpu",
            "--model", "gpt-tiny", "--dataset", "text", "--data", path_str(&text),
            "--block-size", "16", "--n-layer", "2", "--n-embd", "32", "--dropout", "0", "--batch-size", "8",
            "--optimizer", "sgd", "--lr", "0.5", "--max-steps", "20", "--clip-grad-norm", "0.5",
            "--dump-weights", path_str(out),
        ];
        args.extend_from_slice(extra);
        args.into_iter().map(String::from).collect()
    };
    let (one, many) = (dir.join("one"), dir.join("many"));
    assert_succeeds(&run(lockstep(&[]).args(args(&one, &[]))));
    let out = mpirun(2, &args(&many, &["--pipeline-stages", "2", "--micro-batches", "2"]));
    assert!(
        out.status.success(),
        "the GPT pipeline of processes failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let mut stages = weights(&many, 0);
    stages.extend(weights(&many, 1));
    stages.sort_by(|a, b| a.0.cmp(&b.0));
    assert_close(&stages, &weights(&one, 0));
    let tensor = |name: &str| stages.iter().find(|(n, _)| n == name).map(|(_, v)| v.clone()).unwrap();
    assert!(
        tensor("transformer.wte.weight") == tensor("lm_head.weight"),
        "the processes' copies of the tied weight differ"
    );
}

/// SyncBatchNorm across processes (its own MPI communicator, a duplicate of the gradients') ends
/// where the same run on two threads (in-process collectives) does: one code path either way.
#[test]
fn sync_batchnorm_across_processes_matches_two_threads() {
    if !mpirun_available() {
        return;
    }
    let _one = ONE_JOB.lock().unwrap_or_else(PoisonError::into_inner);
    let data = mnist_dir();
    let (threads_dir, processes_dir) = (TempDir::new("bn-threads"), TempDir::new("bn-processes"));
    let bn = |dir: &TempDir| {
        let mut args = train_args(&data, &["--model", "convnet-bn", "--sync-batchnorm"]);
        set_flag(&mut args, "--max-steps", "5");
        set_flag(&mut args, "--dump-weights", path_str(dir.path()));
        args
    };
    let mut on_threads = bn(&threads_dir);
    let device = on_threads.iter().position(|a| a == "--device").expect("--device");
    on_threads.drain(device..device + 2);
    set_flag(&mut on_threads, "--devices", "cpu:0,cpu:1");
    assert_succeeds(&run(lockstep(&[]).args(on_threads)));
    let out = mpirun(2, &bn(&processes_dir));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "mpirun failed:\n{stderr}");
    let rank0 = weights(processes_dir.path(), 0);
    assert!(
        bits(&weights(processes_dir.path(), 1)) == bits(&rank0),
        "the ranks' weights differ"
    );
    assert_close(&rank0, &weights(threads_dir.path(), 0));
}

/// Kills every process whose environment carries `marker` (this test's ranks) when dropped,
/// whatever happened.
struct Job {
    launcher: Child,
    marker: String,
}

impl Job {
    /// `lockstep launch --nproc-per-node 2 <launch…> -- <train…>`, its output piped, its ranks
    /// marked as this test's job `name`.
    fn launch(name: &str, launch: &[&str], train: &[String]) -> Job {
        let marker = format!("LOCKSTEP_TEST_JOB={name}-{}", std::process::id());
        let (marker_name, marker_value) = marker.split_once('=').expect("NAME=value");
        let launcher = lockstep(&["launch", "--nproc-per-node", "2"])
            .args(launch)
            .arg("--")
            .args(train)
            .envs(ROOT_ENV)
            .env(marker_name, marker_value)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("lockstep launch starts");
        Job { launcher, marker }
    }
}

impl Drop for Job {
    fn drop(&mut self) {
        let _ = self.launcher.kill();
        let _ = self.launcher.wait();
        for pid in pids_with(&[&self.marker]) {
            let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
        }
    }
}

/// Starts a long 2-rank job under `lockstep launch` with `extra` train flags, sends rank 1
/// `signal` once every rank trains, and waits up to 30 s for the launcher: its status (None
/// if it still ran), how long it took after the signal, and everything it printed.
fn signal_rank_1_while_training(signal: &str, extra: &[&str]) -> (Option<ExitStatus>, Duration, String) {
    let mut train = train_args(&mnist_dir(), &["--log-every", "1"]);
    train.extend(extra.iter().map(|s| s.to_string()));
    // Long enough that it is still training when signalled.
    set_flag(&mut train, "--max-steps", "100000");
    let mut job = Job::launch(&format!("rank-1-{signal}"), &[], &train);

    // Wait for rank 0's header: by then every rank is past MPI's start and training.
    let (started, on_start) = mpsc::channel();
    let stderr = job.launcher.stderr.take().expect("piped");
    let stderr = thread::spawn(move || {
        let mut text = String::new();
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if line.contains("training mlp on") {
                let _ = started.send(());
            }
            text.push_str(&line);
            text.push('\n');
        }
        text
    });
    let mut stdout = job.launcher.stdout.take().expect("piped");
    let stdout = thread::spawn(move || {
        let mut text = String::new();
        let _ = stdout.read_to_string(&mut text);
        text
    });
    let training = on_start.recv_timeout(Duration::from_secs(180)).is_ok();
    let rank1 = pids_with(&[&job.marker, "OMPI_COMM_WORLD_RANK=1"]);
    assert!(
        training && rank1.len() == 1,
        "rank 1 did not start training (pids {rank1:?})"
    );

    let signalled = Instant::now();
    let sent = Command::new("kill").args([signal, &rank1[0].to_string()]).status();
    assert!(sent.is_ok_and(|s| s.success()), "kill {signal} {} failed", rank1[0]);
    let status = wait_at_most(&mut job.launcher, Duration::from_secs(30));
    let elapsed = signalled.elapsed();
    drop(job);
    let output = format!(
        "{}{}",
        stdout.join().unwrap_or_default(),
        stderr.join().unwrap_or_default()
    );
    println!("launch after kill {signal} of rank 1: {status:?} in {elapsed:?}\n{output}");
    assert!(
        status.is_some(),
        "the launcher still ran 30 s after rank 1 got {signal}:\n{output}"
    );
    assert!(
        status.is_some_and(|s| !s.success()),
        "the launcher succeeded:\n{output}"
    );
    (status, elapsed, output)
}

#[test]
fn a_rank_killed_under_launch_ends_the_job_within_30_s_and_is_named() {
    if !mpirun_available() {
        return;
    }
    let _one = ONE_JOB.lock().unwrap_or_else(PoisonError::into_inner);
    let (_, _, output) = signal_rank_1_while_training("-KILL", &[]);
    // mpirun's words: "process rank 1 with PID … exited on signal 9 (Killed)".
    assert!(
        output.contains("process rank 1 "),
        "the output does not name rank 1:\n{output}"
    );
    assert!(
        output.contains("mpirun was killed by signal") || output.contains("mpirun exited with status"),
        "{output}"
    );
}

/// A rank that stops (SIGSTOP: hung, not dead) is invisible to mpirun; the collective timeout
/// of the rank waiting for it ends the job.
#[test]
fn a_stopped_rank_ends_the_job_at_the_collective_timeout() {
    if !mpirun_available() {
        return;
    }
    let _one = ONE_JOB.lock().unwrap_or_else(PoisonError::into_inner);
    let (_, elapsed, output) = signal_rank_1_while_training("-STOP", &["--collective-timeout", "3"]);
    assert!(
        output.contains("rank 0: ") && output.contains("has waited 3s for the other ranks"),
        "rank 0's watchdog did not speak:\n{output}"
    );
    assert!(output.contains("--collective-timeout 3s"), "{output}");
    assert!(
        elapsed >= Duration::from_secs(3),
        "ended before the timeout: {elapsed:?}"
    );
}

/// Where the restart tests kill a rank.
#[derive(Clone, Copy, PartialEq)]
enum KillAt {
    /// Rank 1, as soon as epoch 0's checkpoint is whole (in the next steps).
    Rank1AfterFirstCheckpoint,
    /// Rank 0, while it writes epoch 1's checkpoint (its temporary file is there).
    Rank0InSecondCheckpointWrite,
}

/// The temporary file of a checkpoint being written in `dir`, if one is.
fn writing_checkpoint(dir: &Path) -> bool {
    std::fs::read_dir(dir).is_ok_and(|entries| {
        entries
            .flatten()
            .any(|e| e.file_name().to_str().is_some_and(|n| n.contains(".tmp-")))
    })
}

/// torchrun's elastic restart: a rank killed once; `launch --max-restarts 1` starts the job
/// again, `--resume last` picks up the last whole checkpoint, and the job ends with the weights
/// of a run nobody interrupted, bit for bit.
#[test]
fn a_job_restarted_after_a_kill_ends_with_the_weights_of_an_uninterrupted_run() {
    restarted_job_matches_an_uninterrupted_one(KillAt::Rank1AfterFirstCheckpoint, "512");
}

#[test]
fn a_job_restarted_after_rank_0_dies_writing_a_checkpoint_resumes_the_previous_one() {
    // Wide enough that a write (13 MB and an fsync) lasts long enough to be caught in.
    restarted_job_matches_an_uninterrupted_one(KillAt::Rank0InSecondCheckpointWrite, "2048");
}

fn restarted_job_matches_an_uninterrupted_one(kill_at: KillAt, hidden: &str) {
    if !mpirun_available() {
        return;
    }
    let _one = ONE_JOB.lock().unwrap_or_else(PoisonError::into_inner);
    let data = mnist_dir();
    let job_args = |dir: &TempDir| {
        let mut args = train_args(&data, &["--dump-weights", path_str(dir.path())]);
        set_flag(&mut args, "--hidden", hidden);
        make_restartable(&mut args, dir.path());
        args
    };
    let (calm, restarted) = (TempDir::new("uninterrupted"), TempDir::new("restarted"));
    let out = mpirun(2, &job_args(&calm));
    assert!(
        out.status.success(),
        "the uninterrupted job failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let mut job = Job::launch("restarted", &["--max-restarts", "1"], &job_args(&restarted));
    let stderr = job.launcher.stderr.take().expect("piped");
    let stderr = thread::spawn(move || {
        let mut text = String::new();
        let _ = BufReader::new(stderr).read_to_string(&mut text);
        text
    });

    let checkpoints = restarted.join("checkpoints");
    let last = checkpoints.join("last.safetensors");
    let deadline = Instant::now() + Duration::from_secs(180);
    let rank = match kill_at {
        KillAt::Rank1AfterFirstCheckpoint => 1,
        KillAt::Rank0InSecondCheckpointWrite => 0,
    };
    // Looked up once the job runs, so that the kill follows the moment it waits for at once.
    let mut pid = None;
    let killed_at = loop {
        assert!(
            Instant::now() < deadline,
            "no checkpoint (or no second write) within 180 s"
        );
        let step = checkpoint_step(&last);
        if pid.is_none() && step.is_some() {
            let pids = pids_with(&[&job.marker, &format!("OMPI_COMM_WORLD_RANK={rank}")]);
            assert_eq!(pids.len(), 1, "rank {rank}'s process: {pids:?}");
            pid = Some(nix::unistd::Pid::from_raw(pids[0] as i32));
        }
        let now = match kill_at {
            KillAt::Rank1AfterFirstCheckpoint => step,
            KillAt::Rank0InSecondCheckpointWrite => step.filter(|_| writing_checkpoint(&checkpoints)),
        };
        if let (Some(step), Some(pid)) = (now, pid) {
            nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL).expect("kill -9 the rank");
            break step;
        }
        thread::sleep(Duration::from_millis(1));
    };
    let status = wait_at_most(&mut job.launcher, Duration::from_secs(240));
    drop(job);
    let stderr = stderr.join().unwrap_or_default();
    println!("killed rank {rank} after step {killed_at}; launch: {status:?}\n{stderr}");
    assert!(
        status.is_some_and(|s| s.success()),
        "the restarted job failed:\n{stderr}"
    );
    assert!(
        stderr.contains(&format!("process rank {rank} ")),
        "the kill is not named:\n{stderr}"
    );
    if kill_at == KillAt::Rank0InSecondCheckpointWrite {
        assert!(
            stderr.contains(&format!("at step {killed_at}")),
            "the restart did not resume the whole checkpoint of step {killed_at}:\n{stderr}"
        );
    }
    assert!(
        stderr.contains("restarting the job (1 of --max-restarts 1)"),
        "{stderr}"
    );
    assert!(stderr.contains("resumed from"), "the restart did not resume:\n{stderr}");
    assert!(killed_at < 48, "the job ended before the kill: nothing was restarted");
    assert!(
        bits(&weights(restarted.path(), 0)) == bits(&weights(calm.path(), 0)),
        "the restarted job's weights differ from the uninterrupted job's"
    );
}
