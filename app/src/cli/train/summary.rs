//! The end-of-run summary, printed and optionally written as JSON (`--summary-out`).

use std::path::Path;

use anyhow::Context;
use lockstep_core::Device;
use lockstep_core::train::{EvalMetrics, FitReport};
use serde::Serialize;

use lockstep_flags::train::Args;

#[derive(Serialize)]
pub struct Summary {
    pub model: String,
    pub device: String,
    pub epochs: u64,
    pub steps: u64,
    pub test_accuracy: f64,
    pub test_loss: f64,
    pub train_seconds: f64,
    /// Each epoch's seconds (the first holds the warm-up).
    pub epoch_seconds: Vec<f64>,
    pub samples_per_sec: f64,
    pub data_wait_seconds: f64,
    pub stop_reason: String,
    /// Steps skipped for inf/NaN gradients (--on-nan skip, or 16-mixed's loss scaler).
    pub skipped_steps: u64,
    /// A balanced run: each device's samples of the global batch at the end.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub shares: Vec<DeviceShare>,
    /// The bytes of optimizer state each replica held at the end, by rank as far as this
    /// process knows them (with --zero each holds its share).
    pub optimizer_state_bytes: Vec<u64>,
    /// Each of this process's devices' peak allocation over the run.
    pub peak_memory: Vec<DevicePeak>,
}

#[derive(Serialize)]
pub struct DevicePeak {
    pub device: String,
    /// The most bytes live tensors held at once (the allocator's peak since the device opened).
    pub bytes: u64,
}

/// The peak allocation of each of `devices`, as their allocators count it.
pub fn peaks(devices: &[Device]) -> Vec<DevicePeak> {
    devices
        .iter()
        .map(|d| DevicePeak {
            device: d.to_string(),
            bytes: d.backend().memory_stats().peak_allocated_bytes,
        })
        .collect()
}

#[derive(Serialize)]
pub struct DeviceShare {
    pub device: String,
    pub samples: usize,
}

/// Names each rank's share by its device (--devices, in rank order), else by its rank.
fn device_shares(args: &Args, shares: &[usize]) -> Vec<DeviceShare> {
    shares
        .iter()
        .enumerate()
        .map(|(rank, &samples)| DeviceShare {
            device: args
                .devices
                .get(rank)
                .cloned()
                .unwrap_or_else(|| format!("rank {rank}")),
            samples,
        })
        .collect()
}

impl Summary {
    pub fn new(
        args: &Args,
        device: &str,
        report: &FitReport,
        test: &EvalMetrics,
        peak_memory: Vec<DevicePeak>,
    ) -> Summary {
        Summary {
            model: args.model.clone(),
            device: device.to_string(),
            epochs: report.epochs,
            steps: report.steps,
            test_accuracy: test.accuracy,
            test_loss: test.loss,
            train_seconds: report.train_seconds,
            epoch_seconds: report.epoch_seconds.clone(),
            samples_per_sec: report.samples_per_sec,
            data_wait_seconds: report.data_wait_seconds,
            stop_reason: report.stop_reason.clone(),
            skipped_steps: report.skipped_steps,
            shares: device_shares(args, &report.shares),
            optimizer_state_bytes: report.optimizer_state_bytes.clone(),
            peak_memory,
        }
    }
    pub fn print(&self) {
        let shares = match self.shares.as_slice() {
            [] => String::new(),
            some => {
                let each: Vec<String> = some.iter().map(|s| format!("{} {}", s.device, s.samples)).collect();
                format!(" | shares: {}", each.join(", "))
            }
        };
        let peaks: Vec<String> = self
            .peak_memory
            .iter()
            .map(|p| format!("{} {:.1} MiB", p.device, p.bytes as f64 / (1u64 << 20) as f64))
            .collect();
        let skipped = match self.skipped_steps {
            0 => String::new(),
            n => format!(", {n} skipped for inf/NaN"),
        };
        println!(
            "{} on {}: test accuracy {:.2}%, test loss {:.4} | {} steps{skipped}, {} epochs in {:.1} s ({:.0} samples/s, {:.2} s waiting for data; stopped: {}) | peak memory: {}{shares}",
            self.model,
            self.device,
            self.test_accuracy * 100.0,
            self.test_loss,
            self.steps,
            self.epochs,
            self.train_seconds,
            self.samples_per_sec,
            self.data_wait_seconds,
            self.stop_reason,
            peaks.join(", ")
        );
        if let Some(line) = self.optimizer_state_line() {
            println!("{line}");
        }
        if let Some(hint) = self.starved_hint() {
            println!("{hint}");
        }
    }

    /// Each replica's optimizer state, where there are several (with --zero each holds its
    /// share).
    fn optimizer_state_line(&self) -> Option<String> {
        let [_, _, ..] = self.optimizer_state_bytes.as_slice() else {
            return None;
        };
        let mib: Vec<String> = self
            .optimizer_state_bytes
            .iter()
            .map(|&b| format!("{:.2}", b as f64 / f64::from(1 << 20)))
            .collect();
        Some(format!("optimizer state per rank (MiB): {}", mib.join(", ")))
    }

    /// A balanced run that left a device the least it can take (one sample per step) would
    /// have given it less: its fixed cost per step may hold the others back.
    fn starved_hint(&self) -> Option<String> {
        let global: usize = self.shares.iter().map(|s| s.samples).sum();
        let starved: Vec<&str> = self
            .shares
            .iter()
            .filter(|s| s.samples == 1 && global > self.shares.len())
            .map(|s| s.device.as_str())
            .collect();
        (!starved.is_empty()).then(|| {
            format!(
                "note: {} ended with 1 of {global} samples per step, the least a device can take: too slow to help here, \
                 it may hold the others back each step; compare with a run without it in --devices",
                starved.join(", ")
            )
        })
    }
    pub fn write(&self, path: &Path) -> anyhow::Result<()> {
        let json = serde_json::to_string_pretty(self)?;
        std::fs::write(path, json + "\n").with_context(|| format!("cannot write the summary to {}", path.display()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn summary(shares: &[(&str, usize)]) -> Summary {
        Summary {
            model: "mlp".into(),
            device: "cpu:0,wgpu:0".into(),
            epochs: 1,
            steps: 1,
            test_accuracy: 0.9,
            test_loss: 0.3,
            train_seconds: 1.0,
            epoch_seconds: vec![1.0],
            samples_per_sec: 1.0,
            data_wait_seconds: 0.0,
            stop_reason: "max_epochs".into(),
            skipped_steps: 0,
            peak_memory: Vec::new(),
            shares: shares
                .iter()
                .map(|&(device, samples)| DeviceShare {
                    device: device.into(),
                    samples,
                })
                .collect(),
            optimizer_state_bytes: Vec::new(),
        }
    }

    #[test]
    fn each_ranks_optimizer_state_is_shown_where_there_are_several() {
        let mut s = summary(&[]);
        assert_eq!(s.optimizer_state_line(), None);
        s.optimizer_state_bytes = vec![3 << 20, 1 << 19];
        assert_eq!(
            s.optimizer_state_line().as_deref(),
            Some("optimizer state per rank (MiB): 3.00, 0.50")
        );
    }

    #[test]
    fn a_device_left_one_sample_is_pointed_out() {
        let hint = summary(&[("cpu:0", 127), ("wgpu:0", 1)]).starved_hint().unwrap();
        assert!(
            hint.starts_with("note: wgpu:0 ended with 1 of 128 samples per step"),
            "{hint}"
        );
        assert_eq!(summary(&[("cpu:0", 100), ("wgpu:0", 28)]).starved_hint(), None);
        assert_eq!(summary(&[]).starved_hint(), None, "not a balanced run");
        assert_eq!(
            summary(&[("cpu:0", 1), ("cpu:1", 1)]).starved_hint(),
            None,
            "a global batch of one sample per device leaves no choice"
        );
    }
}
