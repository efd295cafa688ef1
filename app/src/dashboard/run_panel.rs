//! The run panel: what each run is, how far it got, its best metrics and checkpoint, its
//! warnings, and for runs this window launched, pause / resume / stop.

use std::sync::atomic::Ordering;

use egui::RichText;

use super::plots::run_color;
use super::source::Source;

pub fn duration(seconds: f64) -> String {
    let s = seconds.max(0.0).round() as u64;
    match s {
        0..60 => format!("{s} s"),
        60..3600 => format!("{}m {:02}s", s / 60, s % 60),
        _ => format!("{}h {:02}m", s / 3600, s % 3600 / 60),
    }
}

fn status(source: &Source) -> String {
    let run = &source.run;
    if let Some(control) = &source.control {
        if let Some(outcome) = control.outcome() {
            return outcome;
        }
        if control.stopping() {
            return "stopping (saving a checkpoint)…".into();
        }
        if control.paused() {
            return "paused".into();
        }
    }
    match (&run.end, source.is_live()) {
        (Some(end), _) => format!("finished: {}", end.reason),
        (None, true) => "training".into(),
        (None, false) => "log ends without run_end (stopped early?)".into(),
    }
}

pub fn run_panel(ui: &mut egui::Ui, sources: &mut [Source]) {
    for (i, source) in sources.iter_mut().enumerate() {
        let title = RichText::new(&source.run.name).color(run_color(i)).strong().size(16.0);
        egui::CollapsingHeader::new(title)
            .id_salt(i)
            .default_open(true)
            .show(ui, |ui| {
                run_details(ui, source);
                controls(ui, source);
            });
        ui.add_space(8.0);
    }
}

/// The run's state in one short line (the first line of an error), and whether it failed.
pub fn headline(source: &Source) -> (String, bool) {
    headline_of(&status(source))
}

fn headline_of(status: &str) -> (String, bool) {
    let failed = status.starts_with("failed");
    let first = status.lines().next().unwrap_or_default();
    // An error's first part names what went wrong; what follows its next ": " is detail.
    let short = match first.split_once(": ") {
        Some((_, rest)) if failed => format!("failed: {}", rest.split(": ").next().unwrap_or(rest)),
        _ => first.to_string(),
    };
    (short, failed)
}

/// The state line; a failure shows its first words in red, the whole message on hover and
/// under "details".
fn status_line(ui: &mut egui::Ui, source: &Source) {
    let full = status(source);
    let (short, failed) = headline_of(&full);
    if !failed {
        ui.label(RichText::new(short).italics());
        return;
    }
    ui.add(egui::Label::new(RichText::new(&short).color(ui.visuals().error_fg_color)).truncate())
        .on_hover_text(&full);
    egui::CollapsingHeader::new("details")
        .id_salt(("failure", &source.run.name))
        .show(ui, |ui| {
            ui.label(RichText::new(full).small().monospace());
        });
}

fn run_details(ui: &mut egui::Ui, source: &Source) {
    let run = &source.run;
    status_line(ui, source);
    egui::Grid::new(("run", &run.name))
        .num_columns(2)
        .spacing([12.0, 4.0])
        .show(ui, |ui| {
            let mut row = |k: &str, v: String| {
                ui.label(RichText::new(k).weak());
                // Long values (checkpoint paths) are cut to the panel; hovering shows them whole.
                ui.add(egui::Label::new(&v).truncate()).on_hover_text(v);
                ui.end_row();
            };
            if let Some(info) = &run.info {
                row("model", info.model.clone());
                row("devices", info.devices.join(", "));
                for key in [
                    "optimizer",
                    "lr",
                    "momentum",
                    "batch_size",
                    "accumulate",
                    "precision",
                    "seed",
                ] {
                    if let Some(v) = info.hparams.get(key) {
                        row(key, v.clone());
                    }
                }
            }
            row("epoch · step", format!("{} · {}", run.epoch, run.step));
            row("elapsed", duration(run.end.as_ref().map_or(run.elapsed, |e| e.seconds)));
            if let Some(left) = run.remaining_seconds() {
                row("remaining", format!("≈ {}", duration(left)));
            }
            if let Some(&[_, loss]) = run.loss.last() {
                row("loss", format!("{loss:.4}"));
            }
            if let Some(&[_, rate]) = run.samples_per_sec.last() {
                row("samples/s", format!("{rate:.0}"));
            }
            if let Some((epoch, acc)) = run.best_val_accuracy() {
                // Counted from 1, as the plots' epoch axis counts.
                row("best val acc", format!("{:.2}% (epoch {})", acc * 100.0, epoch + 1));
            }
            if let Some((loss, acc)) = run.test {
                row("test", format!("{:.2}% · loss {loss:.4}", acc * 100.0));
            }
            if let Some((path, reason)) = &run.checkpoint {
                row("checkpoint", format!("{path} ({reason})"));
            }
        });
    if let Some(total) = run.total_steps().filter(|&t| t > 0) {
        let fraction = run.step as f32 / total as f32;
        ui.add(egui::ProgressBar::new(fraction.min(1.0)).text(format!("step {} of {total}", run.step)));
    }
    if !run.warnings.is_empty() {
        egui::CollapsingHeader::new(
            RichText::new(format!("{} warning(s)", run.warnings.len())).color(ui.visuals().warn_fg_color),
        )
        .id_salt(("warnings", &run.name))
        .show(ui, |ui| {
            for w in &run.warnings {
                ui.label(RichText::new(w).small());
            }
        });
    }
}

fn controls(ui: &mut egui::Ui, source: &Source) {
    let Some(control) = &source.control else { return };
    if control.outcome().is_some() {
        return;
    }
    ui.horizontal(|ui| {
        let paused = control.paused();
        if control.pausable && ui.button(if paused { "Resume" } else { "Pause" }).clicked() {
            control.pause.store(!paused, Ordering::Relaxed);
        }
        let stop = ui
            .add_enabled(!control.stopping(), egui::Button::new("Stop"))
            .on_hover_text("Stops after the current step; the run saves its checkpoint first.");
        if stop.clicked() {
            control.stop.store(true, Ordering::Relaxed);
        }
    });
}

#[cfg(test)]
mod tests {
    #[test]
    fn durations_read_at_a_glance() {
        assert_eq!(super::duration(42.4), "42 s");
        assert_eq!(super::duration(125.0), "2m 05s");
        assert_eq!(super::duration(7322.0), "2h 02m");
    }
}
