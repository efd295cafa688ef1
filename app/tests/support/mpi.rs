//! Running `lockstep` under MPI: mpirun as the tests on 2 cores run it, the small MLP job they
//! train, and reading back what the ranks wrote.

use std::io::Write;
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Output};
use std::thread;
use std::time::{Duration, Instant};

use lockstep_core::train::checkpoint::load_tensors;

/// OpenMPI refuses to run as root without both (containers, CI).
pub const ROOT_ENV: [(&str, &str); 2] = [("OMPI_ALLOW_RUN_AS_ROOT", "1"), ("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")];

/// 20 steps of a small MLP, global batch 64, one compute thread per process.
pub fn train_args(data: &Path, extra: &[&str]) -> Vec<String> {
    let mut args: Vec<String> = [
        "train",
        "--data",
        data.to_str().expect("a UTF-8 path"),
        "--device",
        "cpu",
        "--hidden",
        "32",
        "--batch-size",
        "64",
        "--max-steps",
        "20",
        "--seed",
        "3",
        "--threads",
        "1",
        "--workers",
        "1",
        "--no-val",
        "--headless",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    args.extend(extra.iter().map(|s| s.to_string()));
    args
}

/// Makes `args` a job that can be killed and restarted: 48 steps in 6 epochs of 8, a checkpoint
/// at each epoch's end in DIR/checkpoints, resumed from the last one when there is one.
pub fn make_restartable(args: &mut Vec<String>, dir: &Path) {
    let checkpoints = dir.join("checkpoints");
    for flag in [
        "--limit-train-batches",
        "8",
        "--epochs",
        "6",
        "--checkpoint-dir",
        path_str(&checkpoints),
        "--resume",
        "last",
    ] {
        args.push(flag.to_string());
    }
    set_flag(args, "--max-steps", "48");
}

/// Sets `flag`'s value in `args`, replacing the one there (clap refuses a flag given twice).
pub fn set_flag(args: &mut Vec<String>, flag: &str, value: &str) {
    match args.iter().position(|a| a == flag) {
        Some(i) => args[i + 1] = value.to_string(),
        None => args.extend([flag.to_string(), value.to_string()]),
    }
}

pub fn mpirun_available() -> bool {
    if Command::new("mpirun").arg("--version").output().is_ok() {
        return true;
    }
    if std::env::var("LOCKSTEP_SKIP_MPI").as_deref() == Ok("1") {
        let _ = writeln!(
            std::io::stderr(),
            "\n**** SKIPPED: mpirun not found and LOCKSTEP_SKIP_MPI=1: the process tests did not run ****\n"
        );
        return false;
    }
    panic!(
        "mpirun not found on PATH: install OpenMPI (Debian/Ubuntu: apt-get install openmpi-bin libopenmpi-dev), \
         or set LOCKSTEP_SKIP_MPI=1 to skip these tests"
    );
}

/// `mpirun -np <ranks> lockstep <args>`, as a test on 2 cores must run it (more ranks than cores,
/// no pinning, as root in containers), ended by mpirun itself if it hangs.
pub fn mpirun(ranks: usize, args: &[String]) -> Output {
    Command::new("mpirun")
        .args([
            "-np",
            &ranks.to_string(),
            "--oversubscribe",
            "--bind-to",
            "none",
            "--timeout",
            "240",
        ])
        .arg(env!("CARGO_BIN_EXE_lockstep"))
        .args(args)
        .envs(ROOT_ENV)
        .output()
        .expect("mpirun starts")
}

pub fn path_str(p: &Path) -> &str {
    p.to_str().expect("a UTF-8 temp path")
}

/// Every tensor of DIR/rank<R>.safetensors by name, as f64 (exact for f32 and the i64 counters).
pub fn weights(dir: &Path, rank: usize) -> Vec<(String, Vec<f64>)> {
    checkpoint_tensors(&dir.join(format!("rank{rank}.safetensors")))
}

pub fn bits(w: &[(String, Vec<f64>)]) -> Vec<(String, Vec<u64>)> {
    w.iter()
        .map(|(n, v)| (n.clone(), v.iter().map(|x| x.to_bits()).collect()))
        .collect()
}

/// Every tensor of a safetensors file by name, as f64, sorted by name.
pub fn checkpoint_tensors(path: &Path) -> Vec<(String, Vec<f64>)> {
    let file = load_tensors(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut tensors: Vec<(String, Vec<f64>)> = file
        .tensors
        .into_iter()
        .map(|(name, t)| (name, t.data.to_f64_vec()))
        .collect();
    tensors.sort_by(|a, b| a.0.cmp(&b.0));
    tensors
}

/// The step losses a run's metrics log recorded, in order.
pub fn logged_losses(path: &Path) -> Vec<f64> {
    std::fs::read_to_string(path)
        .expect("rank 0 wrote the metrics log")
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).expect("JSON lines"))
        .filter(|v| v["event"] == "step")
        .map(|v| v["loss"].as_f64().expect("a step's loss"))
        .collect()
}

/// The processes whose environment holds every one of `vars` (NAME=value).
pub fn pids_with(vars: &[&str]) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            let Ok(environ) = std::fs::read(format!("/proc/{pid}/environ")) else {
                return false;
            };
            let environ: Vec<&[u8]> = environ.split(|&b| b == 0).collect();
            vars.iter().all(|v| environ.contains(&v.as_bytes()))
        })
        .collect()
}

pub fn wait_at_most(child: &mut Child, limit: Duration) -> Option<ExitStatus> {
    let start = Instant::now();
    while start.elapsed() < limit {
        if let Ok(Some(status)) = child.try_wait() {
            return Some(status);
        }
        thread::sleep(Duration::from_millis(50));
    }
    None
}
