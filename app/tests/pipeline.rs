//! `lockstep schedule` (a pipeline schedule simulated without devices) and `lockstep bench
//! pipeline` (naive model parallel against GPipe and 1F1B); `train` with a pipeline is in cli.rs.

mod support;

use support::{assert_fails_with, assert_succeeds, lockstep, run};

fn stdout_of(args: &[&str]) -> String {
    let out = run(&mut lockstep(args));
    assert_succeeds(&out);
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn the_simulated_bubble_is_the_textbook_one() {
    // P=2, M=8: (P-1)/(M+P-1) = 1/9 = 11.1%; 1F1B's first stage holds 2 micro-batches.
    let text = stdout_of(&["schedule", "--stages", "2", "--micro-batches", "8"]);
    assert!(
        text.contains("bubble: 11.1% of stage time idle (theory (P-1)/(M+P-1) = 11.1%)"),
        "{text}"
    );
    assert!(text.contains("by stage: 2, 1"), "{text}");
    assert!(text.contains("stage 1 |  . F0 B0 B0 F1"), "{text}");
    let gpipe = stdout_of(&[
        "schedule",
        "--stages",
        "2",
        "--micro-batches",
        "8",
        "--schedule",
        "gpipe",
    ]);
    assert!(gpipe.contains("by stage: 8, 8"), "{gpipe}");
}

#[test]
fn an_unknown_schedule_is_named() {
    let out = run(&mut lockstep(&["schedule", "--schedule", "zigzag"]));
    assert_fails_with(&out, &["unknown schedule `zigzag`", "gpipe or 1f1b"]);
    let out = run(&mut lockstep(&["schedule", "--micro-batches", "0"]));
    assert_fails_with(&out, &["--micro-batches 0 is out of range: give 1 to"]);
}

#[test]
fn the_pipeline_bench_compares_each_schedule_with_naive_model_parallel() {
    let text = stdout_of(&[
        "bench",
        "pipeline",
        "--depth",
        "2",
        "--width",
        "64",
        "--batch",
        "32",
        "--micro-batches",
        "4",
        "--steps",
        "1",
    ]);
    assert!(text.contains("2 stages on cpu:0,cpu:1"), "{text}");
    for row in ["naive     1", "gpipe     4", "1f1b      4"] {
        assert!(text.contains(row), "no `{row}` row:\n{text}");
    }
    // Theory for P=2: 1/2 with one micro-batch, 1/5 with four.
    assert!(
        text.contains("1.00x") && text.contains("50.0%") && text.contains("20.0%"),
        "{text}"
    );
}
