use std::io::Write;

use super::*;

fn log() -> String {
    [
        r#"{"t":0.0,"event":"run_start","run":{"model":"mlp","devices":["cpu:0"],"max_epochs":2,"max_steps":null,"steps_per_epoch":10,"hparams":{"lr":"0.05"}}}"#,
        r#"{"t":0.5,"event":"step","epoch":0,"step":5,"batch":5,"loss":2.0,"lr":0.05,"samples_per_sec":1000.0}"#,
        r#"{"t":0.6,"event":"device","device":"cpu:0","utilization":null,"memory_allocated":10,"memory_reserved":20,"memory_peak":15,"memory_total":null}"#,
        r#"{"t":0.7,"event":"device","device":"wgpu:0","utilization":0.25,"memory_allocated":1,"memory_reserved":2,"memory_peak":2,"memory_total":null}"#,
        r#"{"t":1.0,"event":"step","epoch":0,"step":10,"batch":10,"loss":1.0,"lr":0.05,"samples_per_sec":1200.0}"#,
        r#"{"t":1.1,"event":"epoch","epoch":0,"train_loss":1.5,"val_loss":0.9,"val_accuracy":0.8,"lr":0.05,"seconds":1.1}"#,
        r#"{"t":1.2,"event":"checkpoint","path":"runs/a/last.safetensors","reason":"last"}"#,
    ]
    .join("\n")
        + "\n"
}

#[test]
fn a_log_folds_into_series_and_facts() {
    let run = RunData::from_jsonl("a", &log());
    assert!(run.warnings.is_empty(), "{:?}", run.warnings);
    assert_eq!(run.info.as_ref().unwrap().model, "mlp");
    assert_eq!(run.loss, vec![[5.0, 2.0], [10.0, 1.0]]);
    assert_eq!(run.samples_per_sec[1], [10.0, 1200.0]);
    assert_eq!((run.step, run.epoch), (10, 0));
    assert_eq!(run.best_val_accuracy(), Some((0, 0.8)));
    assert_eq!(run.checkpoint.as_ref().unwrap().1, "last");
    // Unknown utilization stays unknown: no point is invented.
    assert!(run.devices["cpu:0"].utilization.is_empty());
    assert_eq!(run.devices["cpu:0"].latest.memory_peak, 15);
    assert_eq!(run.devices["wgpu:0"].utilization, vec![[0.7, 25.0]]);
    assert_eq!(run.total_steps(), Some(20));
    let left = run.remaining_seconds().unwrap();
    assert!((left - 1.2).abs() < 1e-9, "{left}");
}

#[test]
fn a_truncated_last_line_and_unknown_events_load_with_warnings() {
    let mut text = log();
    text.push_str("{\"t\":2.0,\"event\":\"gpu_temperature\",\"celsius\":70}\n");
    text.push_str("not json at all\n");
    text.push_str("{\"t\":2.5,\"event\":\"step\",\"epoch\":1,\"ste");
    let run = RunData::from_jsonl("a", &text);
    assert_eq!(run.loss.len(), 2, "the good lines still count");
    assert_eq!(run.warnings.len(), 3, "{:?}", run.warnings);
    assert!(
        run.warnings[0].contains("unknown event kind `gpu_temperature`"),
        "{:?}",
        run.warnings
    );
    assert!(run.warnings[1].contains("line 9 is not JSON"), "{:?}", run.warnings);
    assert!(run.warnings[2].contains("line 10 is incomplete"), "{:?}", run.warnings);
}

#[test]
fn a_follower_reads_completed_lines_and_starts_over_when_the_log_restarts() {
    let dir = std::env::temp_dir().join(format!("lockstep-follow-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("metrics.jsonl");
    let _ = std::fs::remove_file(&path);
    let mut f = Follower::new(&path);
    assert!(f.poll().unwrap().records.is_empty(), "no file yet is not an error");
    let text = log();
    let (head, tail) = text.split_at(text.len() / 2);
    std::fs::write(&path, head).unwrap();
    let first = f.poll().unwrap();
    let mut file = std::fs::OpenOptions::new().append(true).open(&path).unwrap();
    file.write_all(tail.as_bytes()).unwrap();
    let second = f.poll().unwrap();
    assert_eq!(first.records.len() + second.records.len(), 7);
    assert!(first.warnings.is_empty() && second.warnings.is_empty());
    std::fs::write(&path, text.lines().next().unwrap().to_string() + "\n").unwrap();
    let third = f.poll().unwrap();
    assert!(third.restarted);
    assert_eq!(third.records.len(), 1);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn runs_are_found_in_a_file_a_directory_or_run_subdirectories() {
    let dir = std::env::temp_dir().join(format!("lockstep-open-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("run-b")).unwrap();
    std::fs::write(dir.join("a.jsonl"), log()).unwrap();
    std::fs::write(dir.join("run-b/metrics.jsonl"), log()).unwrap();
    std::fs::write(dir.join("notes.txt"), "x").unwrap();
    let logs = find_logs(&dir).unwrap();
    assert_eq!(logs.len(), 2, "{logs:?}");
    assert_eq!(run_name(&logs[1]), "run-b/metrics");
    assert_eq!(find_logs(&dir.join("a.jsonl")).unwrap().len(), 1);
    assert!(find_logs(&dir.join("run-b/missing")).is_err());
    std::fs::remove_dir_all(&dir).unwrap();
}
