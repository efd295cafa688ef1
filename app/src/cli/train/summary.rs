//! The end-of-run summary, printed and optionally written as JSON (`--summary-out`).

use std::path::Path;

use anyhow::Context;
use lockstep_core::train::{EvalMetrics, FitReport};
use serde::Serialize;

use super::args::Args;

#[derive(Serialize)]
pub struct Summary {
    pub model: String,
    pub device: String,
    pub epochs: u64,
    pub steps: u64,
    pub test_accuracy: f64,
    pub test_loss: f64,
    pub train_seconds: f64,
    pub samples_per_sec: f64,
    pub data_wait_seconds: f64,
    pub stop_reason: String,
    /// A balanced run: each device's samples of the global batch at the end.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub shares: Vec<DeviceShare>,
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
    pub fn new(args: &Args, device: &str, report: &FitReport, test: &EvalMetrics) -> Summary {
        Summary {
            model: args.model.clone(),
            device: device.to_string(),
            epochs: report.epochs,
            steps: report.steps,
            test_accuracy: test.accuracy,
            test_loss: test.loss,
            train_seconds: report.train_seconds,
            samples_per_sec: report.samples_per_sec,
            data_wait_seconds: report.data_wait_seconds,
            stop_reason: report.stop_reason.clone(),
            shares: device_shares(args, &report.shares),
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
        println!(
            "{} on {}: test accuracy {:.2}%, test loss {:.4} | {} steps, {} epochs in {:.1} s ({:.0} samples/s, {:.2} s waiting for data; stopped: {}){shares}",
            self.model,
            self.device,
            self.test_accuracy * 100.0,
            self.test_loss,
            self.steps,
            self.epochs,
            self.train_seconds,
            self.samples_per_sec,
            self.data_wait_seconds,
            self.stop_reason
        );
    }
    pub fn write(&self, path: &Path) -> anyhow::Result<()> {
        let json = serde_json::to_string_pretty(self)?;
        std::fs::write(path, json + "\n").with_context(|| format!("cannot write the summary to {}", path.display()))
    }
}
