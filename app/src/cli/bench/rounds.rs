//! `--rounds N`: Lockstep and the peer measured in turn N times, so that a machine whose speed
//! drifts over minutes (a shared VM moved one run's ratio by ±0.1) slows both sides alike. Each
//! round's ratios are printed; the table shows the median round of each side.

use super::report::Results;
use super::steps::StepResult;
use super::timing::median;

/// One line per round: each model step's time on both sides and the ratio (peer / ours, the
/// images or tokens per second ratio of the table).
pub fn describe(round: usize, ours: &Results, peer: &Results) -> String {
    let pairs = [("resnet18", &ours.resnet, &peer.resnet), ("gpt", &ours.gpt, &peer.gpt)];
    let cells: Vec<String> = pairs
        .into_iter()
        .flat_map(|(model, ours, peer)| {
            ours.iter().filter_map(move |o| {
                let p = peer.iter().find(|p| p.precision == o.precision)?;
                Some(format!(
                    "{model} {} {:.0} / {:.0} ms ({:.2})",
                    o.precision,
                    o.median_step_s * 1e3,
                    p.median_step_s * 1e3,
                    p.median_step_s / o.median_step_s
                ))
            })
        })
        .collect();
    format!("round {}: {}", round + 1, cells.join(", "))
}

/// The rounds of one engine as one result: each model step's median round (step time and items
/// per second taken apart), the peak memory of all rounds, the last round's loss. The GEMM and
/// MLP rows, which `--rounds` does not repeat, come from the first round.
pub fn median_round(rounds: &[Results]) -> Option<Results> {
    let first = rounds.first()?;
    let steps = |pick: fn(&Results) -> &Vec<StepResult>| -> Vec<StepResult> {
        pick(first)
            .iter()
            .enumerate()
            .map(|(row, head)| {
                let same: Vec<&StepResult> = rounds.iter().filter_map(|r| pick(r).get(row)).collect();
                StepResult {
                    steps: same.iter().map(|s| s.steps).sum(),
                    median_step_s: median(&mut same.iter().map(|s| s.median_step_s).collect::<Vec<_>>()),
                    items_per_s: median(&mut same.iter().map(|s| s.items_per_s).collect::<Vec<_>>()),
                    final_loss: same.last().map_or(head.final_loss, |s| s.final_loss),
                    peak_rss_bytes: same.iter().filter_map(|s| s.peak_rss_bytes).max(),
                    peak_device_bytes: same.iter().filter_map(|s| s.peak_device_bytes).max(),
                    ..head.clone()
                }
            })
            .collect()
    };
    Some(Results {
        resnet: steps(|r| &r.resnet),
        gpt: steps(|r| &r.gpt),
        ..first.clone()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round(engine: &str, step_ms: [f64; 2], rss_mib: u64) -> Results {
        let row = |precision: &str, ms: f64| StepResult {
            precision: precision.into(),
            batch: 64,
            steps: 10,
            median_step_s: ms / 1e3,
            items_per_s: 64.0 / (ms / 1e3),
            final_loss: ms,
            peak_rss_bytes: Some(rss_mib << 20),
            peak_device_bytes: None,
            kernels_per_step: None,
            host_waits_per_step: None,
        };
        Results {
            engine: engine.into(),
            resnet: vec![row("32", step_ms[0]), row("bf16-mixed", step_ms[1])],
            ..Results::default()
        }
    }

    #[test]
    fn the_median_round_is_taken_row_by_row() {
        let rounds = [
            round("Lockstep", [1400.0, 700.0], 900),
            round("Lockstep", [1500.0, 900.0], 950),
            round("Lockstep", [1300.0, 800.0], 940),
        ];
        let m = median_round(&rounds).expect("three rounds");
        assert_eq!(m.engine, "Lockstep");
        let ms: Vec<f64> = m.resnet.iter().map(|r| (r.median_step_s * 1e3).round()).collect();
        assert_eq!(ms, [1400.0, 800.0]);
        assert_eq!(m.resnet[1].items_per_s, 80.0);
        assert_eq!(m.resnet[0].steps, 30);
        assert_eq!(m.resnet[0].peak_rss_bytes, Some(950 << 20));
        assert_eq!(m.resnet[0].final_loss, 1300.0);
        assert!(median_round(&[]).is_none());
    }

    #[test]
    fn a_round_reads_as_both_step_times_and_their_ratio() {
        let line = describe(
            1,
            &round("Lockstep", [1400.0, 800.0], 900),
            &round("PyTorch", [1190.0, 600.0], 1300),
        );
        assert_eq!(
            line,
            "round 2: resnet18 32 1400 / 1190 ms (0.85), resnet18 bf16-mixed 800 / 600 ms (0.75)"
        );
    }
}
