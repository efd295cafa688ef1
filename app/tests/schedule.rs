//! `lockstep schedule`: a pipeline schedule simulated without devices.

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
    assert_fails_with(&out, &["at least 1"]);
}
