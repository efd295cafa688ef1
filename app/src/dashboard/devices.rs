//! The device panel: one row per device of each run, with utilization over time and memory.
//! What a backend cannot measure reads "unknown", never 0.

use egui::{Color32, RichText};
use egui_plot::{Line, Plot};

use super::plots::run_color;
use super::runs::DeviceSeries;
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

/// Colours of the step phases (data, forward, backward, communication, optimizer).
const PHASE_COLORS: [Color32; 5] = [
    Color32::from_rgb(150, 150, 160),
    Color32::from_rgb(86, 156, 255),
    Color32::from_rgb(255, 140, 66),
    Color32::from_rgb(230, 90, 120),
    Color32::from_rgb(92, 200, 120),
];

/// One stacked bar per run: where its steps' time goes (rank 0's host time).
fn step_split(ui: &mut egui::Ui, sources: &[Source]) {
    for (i, s) in sources.iter().enumerate() {
        let Some(times) = s.run.step_times else { continue };
        let phases = times.phases();
        let total: f64 = phases.iter().map(|(_, t)| t).sum();
        if total <= 0.0 {
            continue;
        }
        ui.horizontal(|ui| {
            let label = if sources.len() > 1 {
                format!("step time · {}", s.run.name)
            } else {
                "step time".into()
            };
            fixed(ui, 110.0, RichText::new(label).color(run_color(i)).strong());
            let (rect, _) = ui.allocate_exact_size(egui::vec2(260.0, 18.0), egui::Sense::hover());
            let mut x = rect.left();
            for ((_, t), color) in phases.iter().zip(PHASE_COLORS) {
                let w = (t / total) as f32 * rect.width();
                let part = egui::Rect::from_min_size(egui::pos2(x, rect.top()), egui::vec2(w, rect.height()));
                ui.painter().rect_filled(part, 0.0, color);
                x += w;
            }
            fixed(ui, 100.0, RichText::new(format!("{:.1} ms/step", total * 1e3)).strong());
            for ((name, t), color) in phases.iter().zip(PHASE_COLORS) {
                ui.label(RichText::new(format!("{name} {:.1} ms", t * 1e3)).color(color));
            }
        });
    }
}

pub fn device_panel(ui: &mut egui::Ui, sources: &[Source]) {
    let any = sources.iter().any(|s| !s.run.devices.is_empty());
    if !any {
        ui.label(RichText::new("No device reports yet (they arrive with the first logged step).").weak());
        return;
    }
    for (i, s) in sources.iter().enumerate() {
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
            ui.separator();
        }
    }
    step_split(ui, sources);
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
    #[test]
    fn bytes_read_in_binary_units() {
        assert_eq!(super::bytes(512), "512 B");
        assert_eq!(super::bytes(1536), "1.5 KiB");
        assert_eq!(super::bytes(3 << 30), "3.0 GiB");
    }
}
