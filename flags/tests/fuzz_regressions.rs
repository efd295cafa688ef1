//! Every input kept in fuzz/regressions/command_line/ goes through the `command_line` fuzz
//! target's own harness (fuzz/src/command_line.rs), which must return: a command line may be
//! refused with an error, never panic, abort, hang or allocate past the fuzzing bound, which this
//! test's allocator enforces as the fuzzer's does. (The other targets' regressions replay in
//! core/tests/fuzz_regressions.rs.) To add one: copy the input from
//! fuzz/artifacts/command_line/ to fuzz/regressions/command_line/<what-it-is>.

use std::alloc::System;
use std::path::Path;

use cap::Cap;

#[path = "../../fuzz/src/command_line.rs"]
mod harness;

/// The fuzzers' heap bound (`lockstep_fuzz::HEAP_LIMIT`).
#[global_allocator]
static ALLOCATOR: Cap<System> = Cap::new(System, 256 << 20);

#[test]
fn every_command_line_regression_input_is_parsed_without_panicking() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/regressions/command_line");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    let mut panicked = Vec::new();
    for file in &files {
        let data = std::fs::read(file).unwrap();
        if std::panic::catch_unwind(|| harness::run(&data)).is_err() {
            panicked.push(file.display().to_string());
        }
    }
    assert!(panicked.is_empty(), "the command line panicked on: {panicked:#?}");
    assert!(
        files.len() >= 3,
        "only {} regression inputs under {}",
        files.len(),
        dir.display()
    );
}

/// Writes the hand-made regressions and the seeds of the `command_line` target with the
/// harness's own encoder; run again only when the input format changes:
///
///     cargo test -p lockstep-flags --test fuzz_regressions -- --ignored
#[test]
#[ignore = "writes fuzz/regressions/command_line/ and fuzz/corpus/command_line/"]
fn write_hand_made_regressions_and_seeds() {
    use harness::Part::*;
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz");
    let write = |dir: &str, name: &str, subcommand: &str, parts: &[harness::Part]| {
        let bytes = harness::encode(subcommand, parts).unwrap_or_else(|| panic!("{name}: a name is not the program's"));
        let dir = root.join(dir);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(name), bytes).unwrap();
    };
    let regression = |name: &str, subcommand: &str, parts: &[harness::Part]| {
        write("regressions/command_line", name, subcommand, parts)
    };
    regression("train-workers-100000", "train", &[Flag("workers", Some("100000"))]);
    regression("train-threads-100000", "train", &[Flag("threads", Some("100000"))]);
    regression("train-hidden-1e9", "train", &[Flag("hidden", Some("1,1000000000"))]);
    regression(
        "train-collective-timeout-u64-max",
        "train",
        &[Flag("collective-timeout", Some("18446744073709551615"))],
    );
    regression(
        "dashboard-screenshot-after-1e308",
        "dashboard",
        &[Flag("screenshot-after", Some("1e308")), Raw("shot.png")],
    );
    regression(
        "rdzv-timeout-1e308",
        "train",
        &[
            Variable("RANK", "0"),
            Variable("WORLD_SIZE", "2"),
            Variable("LOCKSTEP_RDZV_TIMEOUT", "1e308"),
        ],
    );
    regression(
        "slurm-task-counts-overflow",
        "train",
        &[
            Variable("SLURM_STEP_ID", "0"),
            Variable("SLURM_PROCID", "0"),
            Variable("SLURM_NTASKS", "2"),
            Variable("SLURM_NODEID", "18446744073709551615"),
            Variable("SLURM_TASKS_PER_NODE", "2(x18446744073709551615),1"),
        ],
    );
    regression("config-workers-100000", "train", &[ConfigLine("workers", "100000")]);
    let seed = |name: &str, subcommand: &str, parts: &[harness::Part]| {
        write("corpus/command_line", &format!("{name}.seed"), subcommand, parts)
    };
    seed(
        "train-mlp",
        "train",
        &[
            Flag("batch-size", Some("64")),
            Flag("lr", Some("0.5")),
            Flag("headless", None),
        ],
    );
    seed(
        "train-gpt-config",
        "train",
        &[
            ConfigLine("model", "gpt2"),
            ConfigLine("dataset", "text"),
            Flag("devices", Some("cpu:0,cpu:1")),
            Flag("block-size", Some("65536")),
        ],
    );
    seed(
        "launch",
        "launch",
        &[
            Flag("nproc-per-node", Some("2")),
            Flag("nnodes", Some("2")),
            Raw("--"),
            Raw("train"),
        ],
    );
    seed(
        "sample",
        "sample",
        &[Flag("checkpoint", Some("last")), Flag("top-k", Some("65536"))],
    );
    seed(
        "bench",
        "bench",
        &[Raw("gpt"), Flag("sizes", Some("4096")), Flag("rounds", Some("2"))],
    );
    seed(
        "schedule",
        "schedule",
        &[Flag("stages", Some("4")), Flag("backward-cost", Some("2"))],
    );
    seed(
        "check",
        "check",
        &[Flag("device", Some("cpu:0,cpu:1")), Flag("all", None)],
    );
    seed(
        "world",
        "devices",
        &[
            Variable("RANK", "1"),
            Variable("WORLD_SIZE", "2"),
            Variable("MASTER_PORT", "65535"),
        ],
    );
}
