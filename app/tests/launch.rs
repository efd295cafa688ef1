//! `lockstep launch` and `lockstep train` under a launcher's variables, from the outside, in any
//! build: a failing rank stops the job and is named; a process group that cannot form says why
//! and what to do, without hanging. (Training across processes is in processes.rs: it needs the
//! `mpi` feature.)

mod support;

use std::time::{Duration, Instant};

use support::{assert_fails_with, lockstep, mnist_dir, run};

/// `lockstep train --device cpu` with torchrun's variables for rank 0 of 2, plus `extra_env`.
fn train_as_rank_0_of_2(extra_env: &[(&str, &str)], extra_args: &[&str]) -> std::process::Output {
    let data = mnist_dir();
    let mut cmd = lockstep(&[
        "train",
        "--data",
        data.to_str().expect("a UTF-8 path"),
        "--device",
        "cpu",
        "--headless",
        "--max-steps",
        "1",
    ]);
    cmd.args(extra_args);
    cmd.envs([("RANK", "0"), ("WORLD_SIZE", "2"), ("LOCKSTEP_RDZV_TIMEOUT", "5")])
        .envs(extra_env.iter().copied());
    run(&mut cmd)
}

#[test]
fn cpu_processes_started_with_torchrun_variables_say_how_to_start_them() {
    let start = Instant::now();
    let out = train_as_rank_0_of_2(&[], &[]);
    if cfg!(feature = "mpi") {
        assert_fails_with(&out, &["cpu:0 across processes", "mpirun -np 2 lockstep train"]);
    } else {
        assert_fails_with(&out, &["built without MPI", "--features mpi", "CUDA devices (NCCL)"]);
    }
    assert!(start.elapsed() < Duration::from_secs(60), "took {:?}", start.elapsed());
}

#[test]
fn a_malformed_launcher_variable_is_named() {
    let out = train_as_rank_0_of_2(&[("RANK", "first")], &[]);
    assert_fails_with(&out, &["RANK=first is not a valid number"]);
    let out = train_as_rank_0_of_2(&[("MASTER_PORT", "http")], &[]);
    assert_fails_with(&out, &["MASTER_PORT=http"]);
}

#[test]
fn a_pipeline_under_a_launcher_runs_one_stage_per_process() {
    let out = train_as_rank_0_of_2(&[], &["--pipeline-stages", "3"]);
    assert_fails_with(
        &out,
        &[
            "--pipeline-stages 3 under a launcher runs one stage per process",
            "has 2 processes",
        ],
    );
    let out = train_as_rank_0_of_2(&[], &["--pipeline-stages", "2", "--balance-stages", "time"]);
    assert_fails_with(&out, &["balanced by parameter count"]);
    let out = train_as_rank_0_of_2(&[], &["--split", "0-1@cpu:0,2-3@cpu:1"]);
    assert_fails_with(
        &out,
        &[
            "--split and --place put stages on the devices of one process",
            "--pipeline-stages 2",
        ],
    );
}

#[test]
fn a_failing_rank_stops_the_launch_and_is_named() {
    // Every process fails (no such device); the launcher reports the first and stops the rest.
    let out = run(&mut lockstep(&[
        "launch",
        "--nproc-per-node",
        "2",
        "--",
        "check",
        "--device",
        "nosuch:0",
    ]));
    let err = assert_fails_with(&out, &["unknown device `nosuch:0`", "exited with status 1"]);
    assert!(
        err.contains("lockstep launch: rank 0 (pid") || err.contains("lockstep launch: rank 1 (pid"),
        "{err}"
    );
    assert!(err.contains("stopping the other ranks"), "{err}");
}

#[test]
fn launch_refuses_what_it_cannot_run() {
    let out = run(&mut lockstep(&[
        "launch",
        "--nproc-per-node",
        "2",
        "--",
        "train",
        "--devices",
        "cpu:0,cpu:1",
    ]));
    assert_fails_with(&out, &["--devices", "one --device"]);
    let out = run(&mut lockstep(&[
        "launch",
        "--nproc-per-node",
        "2",
        "--nnodes",
        "2",
        "--",
        "devices",
    ]));
    assert_fails_with(&out, &["--token"]);
}

#[cfg(not(feature = "mpi"))]
#[test]
fn launch_with_cpu_devices_needs_an_mpi_build() {
    let out = run(&mut lockstep(&[
        "launch",
        "--nproc-per-node",
        "2",
        "--",
        "train",
        "--device",
        "cpu",
    ]));
    assert_fails_with(&out, &["through MPI", "built without MPI", "--features mpi"]);
}
