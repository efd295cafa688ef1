//! `lockstep train --devices cpu:0,cpu:1` follows `--device cpu`: a gpt-tiny with dropout 0.1
//! logs the one-device run's losses (the global batch's loss, both replicas' dropout masks being
//! the ones one device draws for the same samples), within 1e-5 for its first 5 steps and 1e-3
//! for 30 (AdamW magnifies the summation order's rounding after that).

mod support;

use std::path::Path;

use support::{TempDir, assert_succeeds, lockstep, run};

fn path_str(p: &Path) -> &str {
    p.to_str().expect("scratch paths are UTF-8")
}

/// The step losses of 30 steps of a one-layer gpt-tiny with dropout on `devices`.
fn losses(dir: &TempDir, text: &Path, devices: &[&str]) -> Vec<f64> {
    let log = dir.join(&format!("{}.jsonl", devices.join("-").replace(':', "")));
    #[rustfmt::skip]
    let mut args = vec![
        "train", "--headless", "--threads", "1", "--no-val",
        "--model", "gpt-tiny", "--dataset", "text", "--data", path_str(text),
        "--block-size", "16", "--n-layer", "1", "--dropout", "0.1", "--batch-size", "8",
        // Whole batches only: a one-device epoch ends in a short batch where the replicas'
        // is padded to the global batch.
        "--limit-train-batches", "8",
        "--max-steps", "30", "--log-every", "1", "--metrics-out", path_str(&log),
    ];
    args.extend_from_slice(devices);
    assert_succeeds(&run(&mut lockstep(&args)));
    std::fs::read_to_string(&log)
        .expect("a metrics log")
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).expect("JSON lines"))
        .filter(|v| v["event"] == "step")
        .map(|v| v["loss"].as_f64().expect("a step's loss"))
        .collect()
}

#[test]
fn a_gpt_with_dropout_on_two_devices_logs_the_one_device_runs_losses() {
    let dir = TempDir::new("devices-follow");
    let text = dir.join("story.txt");
    let line = "All that glitters is not gold; all who wander are not lost.\n";
    std::fs::write(&text, line.repeat(20)).unwrap();
    let one = losses(&dir, &text, &["--device", "cpu"]);
    let two = losses(&dir, &text, &["--devices", "cpu:0,cpu:1"]);
    assert_eq!(one.len(), 30, "a step event per step");
    assert_eq!(two.len(), one.len());
    for (step, (got, want)) in two.iter().zip(&one).enumerate() {
        let tolerance = if step < 5 { 1e-5 } else { 1e-3 };
        let difference = (got - want).abs() / want.abs();
        assert!(
            difference < tolerance,
            "step {}: two devices logged {got}, one device {want} ({difference:.1e} relative)",
            step + 1
        );
    }
}
