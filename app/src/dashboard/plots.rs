//! The metric plots: training loss (raw and smoothed), validation per epoch, learning rate and
//! throughput, every run overlaid in its own colour. Long series are smoothed incrementally and
//! decimated to the plot's width, so a million steps draw as fast as ten.

use egui::Color32;
use egui_plot::{Legend, Line, Plot, Points};

use super::series::{Point, Smoother, decimate};
use super::source::Source;

/// A colour per run, readable on the dark theme.
pub fn run_color(i: usize) -> Color32 {
    const PALETTE: [Color32; 6] = [
        Color32::from_rgb(86, 156, 255),
        Color32::from_rgb(255, 140, 66),
        Color32::from_rgb(92, 200, 120),
        Color32::from_rgb(230, 90, 120),
        Color32::from_rgb(190, 140, 255),
        Color32::from_rgb(240, 200, 80),
    ];
    PALETTE[i % PALETTE.len()]
}

/// The smoothed loss of one run, extended as points arrive and rebuilt when the weight changes
/// or the run restarts.
#[derive(Default)]
pub struct SmoothCache(Option<Smoother>);

impl SmoothCache {
    pub fn get(&mut self, points: &[Point], weight: f64) -> &[Point] {
        let stale = self
            .0
            .as_ref()
            .is_none_or(|s| s.weight() != weight.clamp(0.0, 0.999) || s.smoothed.len() > points.len());
        if stale {
            self.0 = Some(Smoother::new(weight));
        }
        let s = self.0.as_mut().expect("set above");
        let done = s.smoothed.len();
        s.extend(&points[done..]);
        &s.smoothed
    }
}

/// Plot points: at most two per pixel of width.
fn budget(ui: &egui::Ui) -> usize {
    (ui.available_width().max(100.0) as usize) * 2
}

pub fn loss_plot(ui: &mut egui::Ui, sources: &[Source], caches: &mut [SmoothCache], weight: f64, height: f32) {
    let n = budget(ui);
    Plot::new("loss")
        .height(height)
        .legend(Legend::default())
        .x_axis_label("step")
        .y_axis_label("training loss")
        .show(ui, |plot| {
            for (i, (s, cache)) in sources.iter().zip(caches.iter_mut()).enumerate() {
                let color = run_color(i);
                let raw = decimate(&s.run.loss, n);
                plot.line(Line::new(format!("{} (raw)", s.run.name), raw).color(color.gamma_multiply(0.3)));
                let smoothed = decimate(cache.get(&s.run.loss, weight), n);
                plot.line(Line::new(s.run.name.clone(), smoothed).color(color).width(2.0));
            }
        });
}

/// Validation accuracy, and training and validation loss, per epoch (two plots in `height`).
pub fn epoch_plots(ui: &mut egui::Ui, sources: &[Source], height: f32) {
    let half = (height - 20.0) / 2.0;
    ui.strong("Validation accuracy per epoch");
    if sources.iter().all(|s| s.run.epochs.is_empty()) {
        let size = egui::vec2(ui.available_width(), height - 20.0);
        ui.allocate_ui(size, |ui| {
            ui.set_min_size(size);
            ui.centered_and_justified(|ui| {
                ui.label(egui::RichText::new("No epoch has ended yet: validation runs at each epoch's end.").weak());
            });
        });
        return;
    }
    let per_epoch = |s: &Source, f: &dyn Fn(&super::runs::EpochPoint) -> Option<f64>| -> Vec<Point> {
        s.run
            .epochs
            .iter()
            .filter_map(|e| f(e).map(|v| [e.epoch as f64 + 1.0, v]))
            .collect()
    };
    Plot::new("accuracy")
        .height(half)
        .legend(Legend::default().position(egui_plot::Corner::RightBottom))
        .x_axis_label("epoch")
        .y_axis_label("accuracy %")
        .show(ui, |plot| {
            for (i, s) in sources.iter().enumerate() {
                let acc = per_epoch(s, &|e| e.val_accuracy.map(|a| a * 100.0));
                plot.line(
                    Line::new(s.run.name.clone(), acc.clone())
                        .color(run_color(i))
                        .width(2.0),
                );
                plot.points(Points::new(s.run.name.clone(), acc).color(run_color(i)).radius(3.5));
            }
        });
    ui.strong("Loss per epoch (solid: validation, dashed: training)");
    Plot::new("epoch-loss")
        .height(half)
        .legend(Legend::default())
        .x_axis_label("epoch")
        .y_axis_label("loss")
        .include_y(0.0)
        .show(ui, |plot| {
            for (i, s) in sources.iter().enumerate() {
                let color = run_color(i);
                let val = per_epoch(s, &|e| e.val_loss);
                let train = per_epoch(s, &|e| Some(e.train_loss));
                plot.line(Line::new(format!("{} val", s.run.name), val).color(color).width(2.0));
                plot.line(
                    Line::new(format!("{} train", s.run.name), train)
                        .color(color.gamma_multiply(0.6))
                        .style(egui_plot::LineStyle::dashed_loose()),
                );
            }
        });
}

/// One series per run against the step (learning rate, samples per second).
pub fn step_plot(
    ui: &mut egui::Ui,
    id: &str,
    label: &str,
    sources: &[Source],
    pick: fn(&Source) -> &[Point],
    height: f32,
) {
    let n = budget(ui);
    Plot::new(id)
        .height(height)
        .legend(Legend::default())
        .x_axis_label("step")
        .y_axis_label(label)
        .include_y(0.0)
        .show(ui, |plot| {
            for (i, s) in sources.iter().enumerate() {
                plot.line(
                    Line::new(s.run.name.clone(), decimate(pick(s), n))
                        .color(run_color(i))
                        .width(1.5),
                );
            }
        });
}
