//! The device panel: one row per device of each run, with utilization over time and memory.
//! What a backend cannot measure reads "unknown", never 0.

use std::collections::BTreeMap;

use egui::{Color32, RichText};
use egui_plot::{Line, Plot};
use lockstep_core::train::StepTimes;

use super::plots::run_color;
use super::runs::{DeviceSeries, RunData};
use super::source::Source;

pub fn bytes(b: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b as f64;
    let mut unit = 0;
    while v >= 1024.0 && unit < UNITS.len() - 1 {
        v /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{b} B")
    } else {
        format!("{v:.1} {}", UNITS[unit])
    }
}

/// Colours of the step phases (data, forward, backward, communication, optimizer, a pipeline
/// stage's waiting).
const PHASE_COLORS: [Color32; 6] = [
    Color32::from_rgb(150, 150, 160),
    Color32::from_rgb(86, 156, 255),
    Color32::from_rgb(255, 140, 66),
    Color32::from_rgb(230, 90, 120),
    Color32::from_rgb(92, 200, 120),
    Color32::from_rgb(90, 90, 100),
];

/// Where a device's steps' time goes, and its share of a balanced run's global batch.
#[derive(Clone, Debug, PartialEq)]
pub struct DeviceStep {
    pub times: StepTimes,
    /// (this rank's samples, the global batch).
    pub share: Option<(usize, usize)>,
}

/// Each device's `DeviceStep`, by device name: every rank's in a data-parallel run, else the
/// run's own (rank 0's host time).
pub fn device_steps(run: &RunData) -> BTreeMap<String, DeviceStep> {
    let devices = run.info.as_ref().map(|info| info.devices.clone()).unwrap_or_default();
    if run.rank_times.is_empty() {
        let (Some(times), [device]) = (run.step_times, devices.as_slice()) else {
            return BTreeMap::new();
        };
        return BTreeMap::from([(device.clone(), DeviceStep { times, share: None })]);
    }
    let global: usize = run.shares.iter().sum();
    devices
        .into_iter()
        .zip(&run.rank_times)
        .enumerate()
        .map(|(rank, (device, &times))| {
            let share = run.shares.get(rank).map(|&s| (s, global));
            (device, DeviceStep { times, share })
        })
        .collect()
}

fn phases_total(times: &StepTimes) -> f64 {
    times.phases().iter().map(|(_, t)| t).sum()
}

/// The phases' colours, named: the key to every step bar.
fn phase_legend(ui: &mut egui::Ui) {
    ui.horizontal(|ui| {
        ui.label(RichText::new("step time:").weak());
        for ((name, _), color) in StepTimes::default().phases().iter().zip(PHASE_COLORS) {
            let (swatch, _) = ui.allocate_exact_size(egui::vec2(10.0, 10.0), egui::Sense::hover());
            ui.painter().rect_filled(swatch, 2.0, color);
            ui.label(RichText::new(*name).color(color));
        }
    });
}

/// A device's step, under its utilization: its phases as a bar whose full width is `scale`
/// seconds (the slowest device's, so a straggler stands out), the milliseconds per step and the
/// share; hovering gives each phase.
fn step_bar(ui: &mut egui::Ui, step: &DeviceStep, scale: f64) {
    let phases = step.times.phases();
    ui.horizontal(|ui| {
        ui.add_space(110.0 + ui.spacing().item_spacing.x);
        let (rect, response) = ui.allocate_exact_size(egui::vec2(260.0, 14.0), egui::Sense::hover());
        let mut x = rect.left();
        for ((_, t), color) in phases.iter().zip(PHASE_COLORS) {
            let w = (t / scale) as f32 * rect.width();
            let part = egui::Rect::from_min_size(egui::pos2(x, rect.top()), egui::vec2(w, rect.height()));
            ui.painter().rect_filled(part, 0.0, color);
            x += w;
        }
        let each: Vec<String> = phases
            .iter()
            .map(|(name, t)| format!("{name} {:.1} ms", t * 1e3))
            .collect();
        response.on_hover_text(each.join("\n"));
        let mut text = format!("{:.1} ms/step", phases_total(&step.times) * 1e3);
        if let Some((share, global)) = step.share {
            text += &format!(" · share {share} of {global}");
        }
        ui.label(text);
    });
}

pub fn device_panel(ui: &mut egui::Ui, sources: &[Source]) {
    let any = sources.iter().any(|s| !s.run.devices.is_empty());
    if !any {
        ui.label(RichText::new("No device reports yet (they arrive with the first logged step).").weak());
        return;
    }
    let steps: Vec<BTreeMap<String, DeviceStep>> = sources.iter().map(|s| device_steps(&s.run)).collect();
    if steps.iter().any(|s| !s.is_empty()) {
        phase_legend(ui);
    }
    for (i, (s, steps)) in sources.iter().zip(&steps).enumerate() {
        let scale = steps.values().map(|d| phases_total(&d.times)).fold(0.0, f64::max);
        for (name, series) in &s.run.devices {
            ui.horizontal(|ui| {
                let label = if sources.len() > 1 {
                    format!("{name}\n{}", s.run.name)
                } else {
                    name.clone()
                };
                fixed(ui, 110.0, RichText::new(label).color(run_color(i)).strong());
                sparkline(ui, &format!("util-{i}-{name}"), series, run_color(i));
                let now = match series.latest.utilization {
                    Some(u) => RichText::new(format!("{:.0}% busy", u * 100.0)).strong(),
                    None => RichText::new("busy: unknown").weak(),
                };
                fixed(ui, 100.0, now);
                memory(ui, series);
            });
            if let Some(step) = steps.get(name).filter(|_| scale > 0.0) {
                step_bar(ui, step, scale);
            }
            ui.separator();
        }
    }
}

/// A label in a column of fixed width, so rows line up.
fn fixed(ui: &mut egui::Ui, width: f32, text: RichText) {
    ui.allocate_ui_with_layout(
        egui::vec2(width, 44.0),
        egui::Layout::left_to_right(egui::Align::Center),
        |ui| {
            ui.set_min_width(width);
            ui.label(text);
        },
    );
}

fn sparkline(ui: &mut egui::Ui, id: &str, series: &DeviceSeries, color: Color32) {
    if series.utilization.is_empty() {
        fixed(ui, 260.0, RichText::new("utilization unknown (no busy counter)").weak());
        return;
    }
    Plot::new(id)
        .width(260.0)
        .height(44.0)
        .show_axes(false)
        .show_grid(false)
        .allow_drag(false)
        .allow_zoom(false)
        .allow_scroll(false)
        .include_y(0.0)
        .include_y(100.0)
        .show(ui, |plot| {
            let points = super::series::decimate(&series.utilization, 520);
            plot.line(Line::new("busy %", points).color(color).fill(0.0));
        });
}

fn memory(ui: &mut egui::Ui, series: &DeviceSeries) {
    let m = &series.latest;
    ui.vertical(|ui| {
        let total = m.memory_total.map_or_else(|| "unknown".to_string(), bytes);
        ui.label(format!(
            "{} in use · peak {} · pool {} · total {total}",
            bytes(m.memory_allocated),
            bytes(m.memory_peak),
            bytes(m.memory_reserved)
        ));
        // Against the device's total where known, else against what the pool holds.
        let (of, what) = match m.memory_total {
            Some(t) if t > 0 => (t, "of total"),
            _ => (m.memory_reserved.max(1), "of pool"),
        };
        let fraction = m.memory_allocated as f32 / of as f32;
        ui.add(
            egui::ProgressBar::new(fraction.clamp(0.0, 1.0))
                .desired_width(260.0)
                .text(format!("{:.0}% {what}", fraction * 100.0)),
        );
    });
}

#[cfg(test)]
mod tests {
    use lockstep_core::train::{RunInfo, StepTimes};

    use crate::dashboard::runs::RunData;

    fn times(backward: f64) -> StepTimes {
        StepTimes {
            backward,
            ..StepTimes::default()
        }
    }

    #[test]
    fn a_data_parallel_run_has_a_step_per_replica_with_its_share() {
        let mut run = RunData::new("r");
        run.info = Some(RunInfo {
            devices: vec!["cpu:0".into(), "wgpu:0".into()],
            ..RunInfo::default()
        });
        run.step_times = Some(times(1.0));
        run.rank_times = vec![times(1.0), times(2.0)];
        run.shares = vec![96, 32];
        let steps = super::device_steps(&run);
        assert_eq!(steps.len(), 2);
        assert_eq!(steps["cpu:0"].times, times(1.0));
        assert_eq!(steps["cpu:0"].share, Some((96, 128)));
        assert_eq!(steps["wgpu:0"].times, times(2.0));
        assert_eq!(steps["wgpu:0"].share, Some((32, 128)));

        run.shares.clear();
        assert_eq!(
            super::device_steps(&run)["wgpu:0"].share,
            None,
            "an unbalanced run has no shares"
        );
    }

    #[test]
    fn a_single_device_run_has_its_own_step() {
        let mut run = RunData::new("r");
        run.info = Some(RunInfo {
            devices: vec!["cuda:0".into()],
            ..RunInfo::default()
        });
        assert!(super::device_steps(&run).is_empty(), "no step logged yet");
        run.step_times = Some(times(1.0));
        let steps = super::device_steps(&run);
        assert_eq!(steps["cuda:0"].times, times(1.0));
        assert_eq!(steps["cuda:0"].share, None);
    }

    #[test]
    fn bytes_read_in_binary_units() {
        assert_eq!(super::bytes(512), "512 B");
        assert_eq!(super::bytes(1536), "1.5 KiB");
        assert_eq!(super::bytes(3 << 30), "3.0 GiB");
    }
}
