//! `lockstep train --tensorboard DIR` writes event files that TensorBoard's own reader (the
//! `tensorboard` Python package) reads back to the run's logged values. Without the package the
//! test says so loudly, and fails where `LOCKSTEP_EXPECT_TENSORBOARD=1` (CI installs it into
//! `$LOCKSTEP_TENSORBOARD_PYTHONPATH`).

mod support;

use std::collections::BTreeMap;
use std::process::Command;

use support::{TempDir, assert_succeeds, run, train_on_mnist};

/// `python3` with the tensorboard package importable, or None (after failing where it must be).
fn tensorboard_python() -> Option<Command> {
    let python = || {
        let mut cmd = Command::new("python3");
        if let Some(path) = std::env::var_os("LOCKSTEP_TENSORBOARD_PYTHONPATH") {
            cmd.env("PYTHONPATH", path);
        }
        cmd
    };
    let found = python()
        .args(["-c", "import tensorboard"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !found {
        assert!(
            std::env::var("LOCKSTEP_EXPECT_TENSORBOARD").as_deref() != Ok("1"),
            "LOCKSTEP_EXPECT_TENSORBOARD=1 but python3 cannot import tensorboard"
        );
        eprintln!("\n*** SKIPPED: no tensorboard Python package (pip install tensorboard) ***\n");
        return None;
    }
    Some(python())
}

fn path_str(p: &std::path::Path) -> &str {
    p.to_str().expect("a UTF-8 temp path")
}

#[test]
fn tensorboard_reads_back_the_losses_and_accuracies_the_run_logged() {
    let Some(mut python) = tensorboard_python() else { return };
    let dir = TempDir::new("tensorboard");
    let (logs, metrics) = (dir.join("tb"), dir.join("metrics.jsonl"));
    let out = run(&mut train_on_mnist(&[
        "--hidden",
        "32",
        "--epochs",
        "2",
        "--limit-train-batches",
        "20",
        "--log-every",
        "5",
        "--test-samples",
        "500",
        "--tensorboard",
        path_str(&logs),
        "--metrics-out",
        path_str(&metrics),
    ]));
    assert_succeeds(&out);

    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../scripts/read_tensorboard.py");
    let read = python.args([script, path_str(&logs)]).output().expect("python3 runs");
    assert!(read.status.success(), "{}", String::from_utf8_lossy(&read.stderr));
    let series: BTreeMap<String, Vec<(u64, f64)>> = serde_json::from_slice(&read.stdout).expect("JSON");

    // What the metrics log says, by tag, for the same steps.
    let mut expected: BTreeMap<String, Vec<(u64, f64)>> = BTreeMap::new();
    let mut last_step = 0;
    for line in std::fs::read_to_string(&metrics).unwrap().lines() {
        let e: serde_json::Value = serde_json::from_str(line).unwrap();
        let mut put = |tag: &str, step: u64, v: &serde_json::Value| {
            expected
                .entry(tag.into())
                .or_default()
                .push((step, v.as_f64().expect("a number")))
        };
        match e["event"].as_str() {
            Some("step") => {
                last_step = e["step"].as_u64().unwrap();
                put("train_loss", last_step, &e["loss"]);
                put("lr", last_step, &e["lr"]);
            }
            Some("epoch") => {
                put("epoch_train_loss", last_step, &e["train_loss"]);
                put("val_loss", last_step, &e["val_loss"]);
                put("val_acc", last_step, &e["val_accuracy"]);
            }
            _ => {}
        }
    }
    assert_eq!(
        expected["train_loss"].len(),
        8,
        "two epochs of 20 batches, logged every 5"
    );
    assert_eq!(expected["val_acc"].len(), 2);
    for (tag, want) in &expected {
        let got = series
            .get(tag)
            .unwrap_or_else(|| panic!("TensorBoard has no `{tag}`: {series:?}"));
        assert_eq!(got.len(), want.len(), "{tag}: {got:?} vs {want:?}");
        for ((gs, gv), (ws, wv)) in got.iter().zip(want) {
            // Scalars are f32 in the file.
            assert!(
                gs == ws && (gv - wv).abs() <= 1e-6 * wv.abs().max(1.0),
                "{tag}: {got:?} vs {want:?}"
            );
        }
    }
}
