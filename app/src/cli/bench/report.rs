//! The results of one engine (Lockstep or a peer), the JSON report, and the side-by-side table.

use serde::{Deserialize, Serialize};

use super::gemm::GemmResult;
use super::mlp::MlpResult;
use super::plan::Plan;
use super::steps::StepResult;
use crate::cli::table;

/// One engine's numbers. The PyTorch peer prints this same schema as JSON.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Results {
    /// `Lockstep 0.1.0`, `PyTorch 2.15.0`.
    pub engine: String,
    #[serde(default)]
    pub gemm: Vec<GemmResult>,
    #[serde(default)]
    pub mlp: Option<MlpResult>,
    #[serde(default)]
    pub resnet: Vec<StepResult>,
    #[serde(default)]
    pub gpt: Vec<StepResult>,
}

/// What `--json` writes.
#[derive(Serialize)]
pub struct Report<'a> {
    pub plan: &'a Plan,
    pub ours: &'a Results,
    pub peer: Option<&'a Results>,
    /// Why the peer has no numbers, when it has none.
    pub peer_note: Option<&'a str>,
    /// /proc/loadavg before and after the run.
    pub load_before: &'a str,
    pub load_after: &'a str,
    pub others_cpu_percent: &'a Busy,
}

/// Other processes' share of the machine's CPU while each side ran (None: not measurable).
#[derive(Serialize)]
pub struct Busy {
    pub during_ours: Option<f64>,
    pub during_peer: Option<f64>,
}

impl Busy {
    pub fn describe(&self) -> String {
        let show = |p: Option<f64>| p.map_or("unknown".into(), |p| format!("{p:.1}%"));
        let mut line = format!(
            "other processes' share of the CPU: {} during Lockstep",
            show(self.during_ours)
        );
        if self.during_peer.is_some() {
            line += &format!(", {} during the peer", show(self.during_peer));
        }
        line
    }
}

/// One row: label, value, decimals (None: scientific notation), whether a ratio makes sense.
struct Metric {
    label: String,
    value: f64,
    decimals: Option<usize>,
    ratio: bool,
}

impl Metric {
    fn show(&self) -> String {
        match self.decimals {
            Some(d) => format!("{:.*}", d, self.value),
            None => format!("{:.2e}", self.value),
        }
    }
}

fn metrics(r: &Results) -> Vec<Metric> {
    let mut out: Vec<Metric> = r
        .gemm
        .iter()
        .map(|g| Metric {
            label: format!("gemm {0}x{0} GFLOP/s", g.n),
            value: g.gflops,
            decimals: Some(1),
            ratio: true,
        })
        .collect();
    if let Some(m) = &r.mlp {
        out.push(Metric {
            label: format!("mlp steps/s (batch {})", m.batch),
            value: m.steps_per_s,
            decimals: Some(1),
            ratio: true,
        });
        out.push(Metric {
            label: "mlp samples/s".into(),
            value: m.samples_per_s,
            decimals: Some(0),
            ratio: true,
        });
        // Not a speed: shows both sides really trained (the loss falls on the fixed batch).
        out.push(Metric {
            label: "mlp final loss".into(),
            value: m.final_loss,
            decimals: None,
            ratio: false,
        });
        for (label, count) in [
            ("kernel launches per step", m.kernels_per_step),
            ("  of which cuBLAS products", m.library_calls_per_step),
            ("bind groups per step", m.bind_groups_per_step),
        ] {
            if let Some(value) = count {
                out.push(Metric {
                    label: label.into(),
                    value,
                    decimals: Some(1),
                    ratio: false,
                });
            }
        }
        if let Some(bytes) = m.peak_rss_bytes {
            out.push(Metric {
                label: "peak resident memory (MiB)".into(),
                value: bytes as f64 / (1u64 << 20) as f64,
                decimals: Some(0),
                ratio: false,
            });
        }
    }
    step_rows(&mut out, "resnet18", "images", &r.resnet);
    step_rows(&mut out, "gpt", "tokens", &r.gpt);
    out
}

/// Rows of a model's training steps: items per second, step time and peak memory per precision.
fn step_rows(out: &mut Vec<Metric>, model: &str, items: &str, results: &[StepResult]) {
    for r in results {
        let name = if r.precision == "32" {
            "f32"
        } else {
            r.precision.as_str()
        };
        out.push(Metric {
            label: format!("{model} {name} {items}/s (batch {})", r.batch),
            value: r.items_per_s,
            decimals: Some(1),
            ratio: true,
        });
        out.push(Metric {
            label: format!("{model} {name} step ms"),
            value: r.median_step_s * 1e3,
            decimals: Some(0),
            ratio: false,
        });
        for (what, bytes) in [("resident", r.peak_rss_bytes), ("device", r.peak_device_bytes)] {
            if let Some(bytes) = bytes {
                out.push(Metric {
                    label: format!("{model} {name} peak {what} memory (MiB)"),
                    value: bytes as f64 / (1u64 << 20) as f64,
                    decimals: Some(0),
                    ratio: false,
                });
            }
        }
        for (what, count) in [
            ("kernel launches", r.kernels_per_step),
            ("host waits", r.host_waits_per_step),
        ] {
            if let Some(count) = count {
                out.push(Metric {
                    label: format!("{model} {name} {what} per step"),
                    value: count,
                    decimals: Some(1),
                    ratio: false,
                });
            }
        }
    }
}

/// `ours / theirs` where the metric is a speed both sides measured, else "-".
fn ratio(ours: Option<&Metric>, theirs: Option<&Metric>) -> String {
    match (ours, theirs) {
        (Some(m), Some(t)) if m.ratio && t.value > 0.0 => format!("{:.2}", m.value / t.value),
        _ => "-".into(),
    }
}

/// Our numbers, and beside them the peer's and the ratio ours / peer (higher is better for us).
pub fn table(ours: &Results, peer: Option<&Results>) -> String {
    let theirs = peer.map(metrics).unwrap_or_default();
    let mine = metrics(ours);
    let mut rows: Vec<Vec<String>> = mine
        .iter()
        .map(|m| {
            let mut row = vec![m.label.clone(), m.show()];
            if peer.is_some() {
                let other = theirs.iter().find(|t| t.label == m.label);
                row.push(other.map_or("-".into(), |t| t.show()));
                row.push(ratio(Some(m), other));
            }
            row
        })
        .collect();
    // What only the peer measured: its compiled variant (`gpt bf16-mixed compiled …`), with the
    // ratio of our row of the same name less "compiled".
    rows.extend(
        theirs
            .iter()
            .filter(|t| !mine.iter().any(|m| m.label == t.label))
            .map(|t| {
                let plain = t.label.replace(" compiled", "");
                let ours = mine.iter().find(|m| m.label == plain);
                vec![t.label.clone(), "-".into(), t.show(), ratio(ours, Some(t))]
            }),
    );
    let mut header = vec!["BENCHMARK", ours.engine.as_str()];
    if let Some(p) = peer {
        header.extend([p.engine.as_str(), "RATIO"]);
    }
    table::render(&header, &rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gemm(n: usize, gflops: f64) -> GemmResult {
        GemmResult {
            n,
            median_s: 1.0,
            gflops,
            reps: 1,
        }
    }

    #[test]
    fn ratio_is_ours_over_peer_and_missing_rows_show_a_dash() {
        let ours = Results {
            engine: "Lockstep".into(),
            gemm: vec![gemm(512, 100.0), gemm(1024, 50.0)],
            mlp: None,
            ..Results::default()
        };
        let peer = Results {
            engine: "PyTorch".into(),
            gemm: vec![gemm(512, 200.0)],
            mlp: None,
            ..Results::default()
        };
        let t = table(&ours, Some(&peer));
        let lines: Vec<&str> = t.lines().collect();
        assert!(lines[0].starts_with("BENCHMARK") && lines[0].ends_with("RATIO"));
        assert!(lines[1].ends_with("100.0     200.0    0.50"), "{t}");
        assert!(lines[2].ends_with("50.0      -        -"), "{t}");
    }

    #[test]
    fn the_peer_schema_parses() {
        let json = r#"{"engine": "PyTorch 2.15.0", "gemm": [{"n": 512, "median_s": 0.001, "gflops": 268.4, "reps": 900}],
            "mlp": {"batch": 128, "steps_per_window": 25, "windows": 40, "median_window_s": 0.08, "steps_per_s": 312.5,
                    "samples_per_s": 40000.0, "final_loss": 0.01}}"#;
        let r: Results = serde_json::from_str(json).expect("parses");
        assert_eq!(r.gemm[0].n, 512);
        assert_eq!(r.mlp.map(|m| m.batch), Some(128));
    }
}
