//! ZeRO beside plain data parallel: the same `lockstep train` run over `--devices`, without
//! ZeRO and with stages 1 and 2, each in a process of its own (so each device's peak memory
//! counts that run alone): seconds per step, and each rank's peak memory and optimizer state,
//! with ratios to plain data parallel.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::Context;
use serde::Serialize;

#[derive(Clone, Debug, Serialize)]
pub struct ZeroPlan {
    pub devices: Vec<String>,
    /// A GPT preset (`gpt-tiny`, `gpt-char`, `gpt2`).
    pub model: String,
    /// The UTF-8 text it trains on.
    pub text: PathBuf,
    /// The global batch, split evenly over the devices.
    pub batch: usize,
    pub steps: usize,
    pub threads: usize,
}

/// One variant's run.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Variant {
    /// The ZeRO stage; `None` for plain data parallel.
    pub zero: Option<u8>,
    /// Wall seconds of the run over its steps (the first step's warm-up included).
    pub seconds_per_step: f64,
    /// Each rank's peak of live tensor bytes on its device.
    pub peak_bytes: Vec<u64>,
    /// Each rank's optimizer state at the end.
    pub optimizer_state_bytes: Vec<u64>,
}

pub fn run(plan: &ZeroPlan) -> anyhow::Result<Vec<Variant>> {
    [None, Some(1), Some(2)]
        .into_iter()
        .map(|zero| variant(plan, zero))
        .collect()
}

fn variant(plan: &ZeroPlan, zero: Option<u8>) -> anyhow::Result<Variant> {
    let dir = std::env::temp_dir().join(format!(
        "lockstep-bench-zero-{}-{}",
        std::process::id(),
        zero.unwrap_or(0)
    ));
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot make {}", dir.display()))?;
    let (summary, metrics) = (dir.join("summary.json"), dir.join("metrics.jsonl"));
    let exe = std::env::current_exe().context("cannot find this program to run the variants")?;
    let mut train = Command::new(exe);
    train
        .args([
            "train",
            "--model",
            &plan.model,
            "--dataset",
            "text",
            "--headless",
            "--log-every",
            "1",
        ])
        .arg("--data")
        .arg(&plan.text)
        .args(["--devices", &plan.devices.join(",")])
        .args(["--batch-size", &plan.batch.to_string()])
        .args(["--max-steps", &plan.steps.to_string()])
        .args(["--threads", &plan.threads.to_string()])
        .arg("--summary-out")
        .arg(&summary)
        .arg("--metrics-out")
        .arg(&metrics);
    if let Some(stage) = zero {
        train.args(["--zero", &stage.to_string()]);
    }
    let name = zero.map_or("plain data parallel".to_string(), |s| format!("ZeRO-{s}"));
    eprintln!("running {} steps of {} with {name} …", plan.steps, plan.model);
    let out = train.output().context("cannot start `lockstep train`")?;
    anyhow::ensure!(
        out.status.success(),
        "`lockstep train` with {name} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let result = read_variant(zero, &summary, &metrics, plan.devices.len());
    let _ = std::fs::remove_dir_all(&dir);
    result
}

fn read_variant(zero: Option<u8>, summary: &Path, metrics: &Path, ranks: usize) -> anyhow::Result<Variant> {
    let read = |p: &Path| std::fs::read_to_string(p).with_context(|| format!("cannot read {}", p.display()));
    let summary: serde_json::Value = serde_json::from_str(&read(summary)?).context("the run's summary")?;
    let number = |key: &str| {
        summary[key]
            .as_f64()
            .with_context(|| format!("no {key} in the run's summary"))
    };
    let optimizer_state_bytes = summary["optimizer_state_bytes"]
        .as_array()
        .context("no optimizer_state_bytes in the run's summary")?
        .iter()
        .filter_map(serde_json::Value::as_u64)
        .collect();
    Ok(Variant {
        zero,
        seconds_per_step: number("train_seconds")? / number("steps")?.max(1.0),
        peak_bytes: peaks(&read(metrics)?, ranks),
        optimizer_state_bytes,
    })
}

/// The highest `memory_peak` of each device's events, in the order the devices first report.
fn peaks(metrics: &str, ranks: usize) -> Vec<u64> {
    let mut by_device: Vec<(String, u64)> = Vec::new();
    for line in metrics.lines() {
        let Ok(record) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        let (Some(device), Some(peak)) = (record["device"].as_str(), record["memory_peak"].as_u64()) else {
            continue;
        };
        match by_device.iter_mut().find(|(d, _)| d == device) {
            Some((_, p)) => *p = (*p).max(peak),
            None => by_device.push((device.to_string(), peak)),
        }
    }
    by_device.into_iter().take(ranks).map(|(_, p)| p).collect()
}

fn mib(bytes: &[u64]) -> String {
    let each: Vec<String> = bytes
        .iter()
        .map(|&b| format!("{:.1}", b as f64 / f64::from(1 << 20)))
        .collect();
    each.join(" / ")
}

/// Each variant beside plain data parallel (the first).
pub fn table(variants: &[Variant]) -> String {
    let Some(plain) = variants.first() else {
        return String::new();
    };
    let most = |v: &[u64]| v.iter().copied().max().unwrap_or(0) as f64;
    let mut out = String::from(
        "variant              s/step  vs DDP   peak MiB by rank          max vs DDP  optimizer state MiB by rank\n",
    );
    for v in variants {
        let name = v.zero.map_or("plain data parallel".into(), |s| format!("ZeRO-{s}"));
        out += &format!(
            "{name:<20} {:>6.3}  {:>5.2}x  {:<25} {:>9.2}x  {}\n",
            v.seconds_per_step,
            v.seconds_per_step / plain.seconds_per_step.max(1e-12),
            mib(&v.peak_bytes),
            most(&v.peak_bytes) / most(&plain.peak_bytes).max(1.0),
            mib(&v.optimizer_state_bytes)
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_devices_peak_is_its_highest_report() {
        let log = r#"{"t":0.1,"event":"device","device":"cpu:0","memory_peak":10}
{"t":0.1,"event":"device","device":"cpu:1","memory_peak":7}
{"t":0.2,"event":"step","loss":1.0}
{"t":0.3,"event":"device","device":"cpu:0","memory_peak":12}"#;
        assert_eq!(peaks(log, 2), vec![12, 7]);
    }
}
