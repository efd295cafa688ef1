//! Hostile values a user (or a config file, or a launcher) can give, each refused before
//! anything starts with one line that names the flag and its range, never a panic, abort or
//! hang. The first three once aborted, hung, or got the process killed.

use std::ffi::OsString;
use std::path::Path;

use lockstep_flags::Invocation;
use lockstep_flags::world::WorldEnv;

fn no_config(_: &Path) -> anyhow::Result<String> {
    anyhow::bail!("no config file in this test")
}

/// The one-line refusal of `lockstep <args>`, or a panic naming what was accepted.
fn refusal_with_config(args: &[&str], config: &str) -> String {
    let argv: Vec<OsString> = ["lockstep"].iter().chain(args).map(OsString::from).collect();
    let config = config.to_string();
    let read = move |_: &Path| anyhow::Ok(config.clone());
    let read: lockstep_flags::config_file::Reader = if args.contains(&"--config") { &read } else { &no_config };
    match lockstep_flags::parse(argv, read) {
        Ok(Invocation::Run(cli)) => panic!("`lockstep {}` was accepted: {cli:?}", args.join(" ")),
        Ok(Invocation::PrintConfig(_)) => panic!("`lockstep {}` printed a config", args.join(" ")),
        Err(e) => {
            let msg = format!("{e:#}");
            assert!(!msg.trim_end().contains('\n'), "not one line: {msg}");
            msg
        }
    }
}

fn refusal(args: &[&str]) -> String {
    refusal_with_config(args, "")
}

#[test]
fn a_typos_thread_and_worker_counts_are_refused_naming_the_flag_and_range() {
    let msg = refusal(&["train", "--workers", "100000"]);
    assert!(msg.starts_with("--workers 100000 is out of range: give 0 to "), "{msg}");
    let msg = refusal(&["train", "--threads", "100000"]);
    assert!(msg.starts_with("--threads 100000 is out of range: give 1 to "), "{msg}");
    let msg = refusal(&["launch", "--nproc-per-node", "100000", "--", "train"]);
    assert!(msg.starts_with("--nproc-per-node 100000 is out of range"), "{msg}");
    let msg = refusal(&["bench", "--threads", "60000"]);
    assert!(msg.starts_with("--threads 60000 is out of range"), "{msg}");
}

#[test]
fn a_width_no_machine_could_hold_is_refused() {
    let msg = refusal(&["train", "--hidden", "1000000000"]);
    assert_eq!(msg, "--hidden 1000000000 is out of range: give 1 to 1048576");
    let msg = refusal(&[
        "train",
        "--model",
        "gpt-tiny",
        "--dataset",
        "text",
        "--n-embd",
        "4294967296",
    ]);
    assert!(msg.starts_with("--n-embd 4294967296 is out of range"), "{msg}");
    let msg = refusal(&["bench", "gemm", "--sizes", "512,1000000"]);
    assert!(msg.starts_with("--sizes 1000000 is out of range"), "{msg}");
}

#[test]
fn numbers_that_overflow_a_deadline_or_are_not_numbers_are_refused() {
    let msg = refusal(&["train", "--collective-timeout", "18446744073709551615"]);
    assert!(
        msg.starts_with("--collective-timeout 18446744073709551615 is out of range"),
        "{msg}"
    );
    for lr in ["NaN", "inf", "-1", "0", "1e308"] {
        let msg = refusal(&["train", &format!("--lr={lr}")]);
        assert!(msg.starts_with(&format!("--lr {lr} is out of range")), "{msg}");
    }
    let msg = refusal(&["train", "--bucket-cap-mb", "1e308"]);
    assert!(msg.starts_with("--bucket-cap-mb 1e308 is out of range"), "{msg}");
    let msg = refusal(&["train", "--momentum", "NaN"]);
    assert!(msg.starts_with("--momentum NaN is out of range"), "{msg}");
    let msg = refusal(&["dashboard", "--screenshot-after", "1e300", "shot.png"]);
    assert!(
        msg.contains("--screenshot-after: `1e300` is not a number of seconds"),
        "{msg}"
    );
    let msg = refusal(&["sample", "--checkpoint", "x", "--temperature", "NaN"]);
    assert!(msg.starts_with("--temperature NaN is out of range"), "{msg}");
    let msg = refusal(&["schedule", "--stages", "100000"]);
    assert!(msg.starts_with("--stages 100000 is out of range"), "{msg}");
    let msg = refusal(&["launch", "--nproc-per-node", "1", "--master-port", "0", "--", "train"]);
    assert!(msg.starts_with("--master-port 0 is out of range"), "{msg}");
}

#[test]
fn a_config_file_gets_the_same_bounds_as_the_command_line() {
    let msg = refusal_with_config(&["train", "--config", "run.toml"], "workers = 100000\n");
    assert!(msg.starts_with("--workers 100000 is out of range"), "{msg}");
    let msg = refusal_with_config(&["train", "--config", "run.toml"], "hidden = [512, 1000000000]\n");
    assert!(msg.starts_with("--hidden 1000000000 is out of range"), "{msg}");
}

#[test]
fn a_config_file_past_a_mebibyte_is_refused_unread() {
    let dir = std::env::temp_dir().join(format!("lockstep-flags-config-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let big = dir.join("big.toml");
    std::fs::write(&big, vec![b'#'; (lockstep_flags::config_file::MAX_BYTES + 1) as usize]).unwrap();
    let msg = format!("{:#}", lockstep_flags::config_file::read(&big).unwrap_err());
    assert!(msg.contains("is over 1024 KiB"), "{msg}");
    let small = dir.join("small.toml");
    std::fs::write(&small, "batch_size = 64\n").unwrap();
    assert_eq!(lockstep_flags::config_file::read(&small).unwrap(), "batch_size = 64\n");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn launcher_variables_past_their_bounds_are_errors_naming_the_variable() {
    let world = |vars: &[(&str, &str)]| {
        WorldEnv::from_vars(|name| vars.iter().find(|(n, _)| *n == name).map(|(_, v)| v.to_string()))
    };
    let msg = world(&[("RANK", "0"), ("WORLD_SIZE", "2"), ("LOCKSTEP_RDZV_TIMEOUT", "1e308")])
        .unwrap_err()
        .to_string();
    assert!(
        msg.starts_with("LOCKSTEP_RDZV_TIMEOUT=1e308 is not a number of seconds"),
        "{msg}"
    );
    let msg = world(&[("RANK", "0"), ("WORLD_SIZE", "18446744073709551615")])
        .unwrap_err()
        .to_string();
    assert!(msg.contains("more ranks than a job may have"), "{msg}");
    // A task list whose counts overflow when summed names no node: an error, not a panic.
    let slurm = [
        ("SLURM_STEP_ID", "0"),
        ("SLURM_PROCID", "0"),
        ("SLURM_NTASKS", "2"),
        ("SLURM_NODEID", "18446744073709551615"),
        ("SLURM_TASKS_PER_NODE", "2(x18446744073709551615),1"),
    ];
    assert!(world(&slurm).is_err());
}

#[test]
fn sensible_command_lines_are_still_accepted() {
    for args in [
        &["train", "--workers", "4", "--threads", "2", "--hidden", "512,512"][..],
        &[
            "train",
            "--model",
            "gpt-tiny",
            "--dataset",
            "text",
            "--lr",
            "3e-4",
            "--dropout",
            "0.1",
        ],
        &["launch", "--nproc-per-node", "2", "--", "train", "--device", "cpu"],
        &["bench", "gemm", "--sizes", "4096,8192"],
        &["schedule", "--stages", "4", "--micro-batches", "8"],
    ] {
        let argv: Vec<OsString> = ["lockstep"].iter().chain(args).map(OsString::from).collect();
        if let Err(e) = lockstep_flags::parse(argv, &no_config) {
            panic!("`lockstep {}` was refused: {e:#}", args.join(" "));
        }
    }
}
