//! The dashboard window: a top bar, the run panel on the left, the device panel at the bottom,
//! and the metric plots in the middle. It draws whatever its sources delivered since the last
//! frame and never waits on training.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use egui::RichText;

use super::new_run::{Launcher, NewRun};
use super::plots::{self, SmoothCache};
use super::screenshot::Screenshot;
use super::source::Source;
use super::{devices, run_panel};

pub struct Dashboard {
    pub(super) sources: Vec<Source>,
    caches: Vec<SmoothCache>,
    smoothing: f64,
    screenshot: Option<Screenshot>,
    /// Starts runs from the window (absent where the caller offers none).
    launcher: Option<Launcher>,
    pub(super) new_run: NewRun,
    /// The error that ended the window (a screenshot that could not be written), for the caller.
    error: Arc<Mutex<Option<String>>>,
}

impl Dashboard {
    pub fn new(
        sources: Vec<Source>,
        screenshot: Option<Screenshot>,
        launcher: Option<Launcher>,
        error: Arc<Mutex<Option<String>>>,
    ) -> Dashboard {
        let caches = sources.iter().map(|_| SmoothCache::default()).collect();
        let mut new_run = NewRun::default();
        // A window with nothing to show and the means to start a run opens on the form (Enter
        // starts it), so the first thing a new user meets is the way in.
        if sources.is_empty() && launcher.is_some() {
            new_run.open();
        }
        Dashboard {
            sources,
            caches,
            smoothing: 0.9,
            screenshot,
            launcher,
            new_run,
            error,
        }
    }

    fn top_bar(&mut self, ui: &mut egui::Ui) {
        ui.horizontal(|ui| {
            ui.heading(RichText::new("Lockstep").strong());
            ui.label(RichText::new("training dashboard").weak());
            ui.separator();
            let label = ui.label("loss smoothing");
            ui.add(egui::Slider::new(&mut self.smoothing, 0.0..=0.99).fixed_decimals(2))
                .labelled_by(label.id);
            ui.separator();
            let live = self.sources.iter().filter(|s| s.is_live()).count();
            ui.label(format!("{} run(s), {live} live", self.sources.len()));
            if self.launcher.is_some() {
                ui.separator();
                if ui.button("+ New run").clicked() {
                    self.new_run.open();
                }
            }
        });
    }

    fn no_run_yet(&self, ui: &mut egui::Ui) {
        ui.add_space(40.0);
        ui.vertical_centered(|ui| {
            ui.heading("No run to show yet");
            if self.launcher.is_some() {
                ui.label("Start one with  + New run  above, or:");
            }
            ui.label("Train with the window open:  lockstep train --dashboard");
            ui.label("Watch a run started elsewhere:  lockstep dashboard --follow runs/a/metrics.jsonl");
            ui.label("Compare finished runs:  lockstep dashboard --open runs/");
        });
    }

    /// The New run form, and starting what it describes.
    fn new_run(&mut self, ctx: &egui::Context) {
        let Some(launcher) = &self.launcher else { return };
        if let Some(args) = self.new_run.show(ctx) {
            match launcher(args) {
                Ok(source) => {
                    self.sources.push(source);
                    self.caches.push(SmoothCache::default());
                    self.new_run.close();
                    self.new_run.error = None;
                }
                Err(e) => self.new_run.error = Some(format!("{e:#}")),
            }
        }
    }
}

impl eframe::App for Dashboard {
    fn ui(&mut self, ui: &mut egui::Ui, _frame: &mut eframe::Frame) {
        self.show(ui);
    }
}

impl Dashboard {
    /// One frame of the whole window (also driven by the tests, without a window).
    pub fn show(&mut self, ui: &mut egui::Ui) {
        let ctx = ui.ctx().clone();
        for s in &mut self.sources {
            s.poll();
        }
        if ctx.input(|i| i.viewport().close_requested()) {
            // Closing the window stops the runs it launched; they save their checkpoints.
            for c in self.sources.iter().filter_map(|s| s.control.as_ref()) {
                c.stop.store(true, std::sync::atomic::Ordering::Relaxed);
            }
        }
        if let Some(shot) = &mut self.screenshot {
            match shot.tick(&ctx) {
                Ok(false) => {}
                Ok(true) => ctx.send_viewport_cmd(egui::ViewportCommand::Close),
                Err(e) => {
                    *self.error.lock().unwrap_or_else(|p| p.into_inner()) = Some(format!("{e:#}"));
                    ctx.send_viewport_cmd(egui::ViewportCommand::Close);
                }
            }
        }
        egui::Panel::top("top").show(ui, |ui| self.top_bar(ui));
        self.new_run(&ctx);
        egui::Panel::left("runs")
            .default_size(320.0)
            .size_range(220.0..=480.0)
            .resizable(true)
            .show(ui, |ui| {
                egui::ScrollArea::vertical().show(ui, |ui| run_panel::run_panel(ui, &mut self.sources));
            });
        egui::Panel::bottom("devices")
            .default_size(220.0)
            .min_size(130.0)
            .resizable(true)
            .show(ui, |ui| {
                ui.add_space(4.0);
                ui.heading("Devices");
                // Not shrunk to its first frame's content (no device yet): the panel keeps its size.
                egui::ScrollArea::vertical()
                    .auto_shrink([false, false])
                    .show(ui, |ui| devices::device_panel(ui, &self.sources));
            });
        egui::CentralPanel::default().show(ui, |ui| {
            if self.sources.is_empty() {
                self.no_run_yet(ui);
                return;
            }
            if !self.sources.iter().any(|s| s.run.has_points()) {
                // No empty plots: what the runs are doing instead (downloading, or failed).
                waiting(ui, &self.sources);
                return;
            }
            let half = (ui.available_height() / 2.0 - 28.0).max(120.0);
            ui.columns(2, |cols| {
                cols[0].strong("Training loss");
                plots::loss_plot(&mut cols[0], &self.sources, &mut self.caches, self.smoothing, half);
                plots::epoch_plots(&mut cols[1], &self.sources, half);
            });
            ui.columns(2, |cols| {
                cols[0].strong("Learning rate");
                plots::step_plot(&mut cols[0], "lr", "learning rate", &self.sources, |s| &s.run.lr, half);
                cols[1].strong("Throughput");
                plots::step_plot(
                    &mut cols[1],
                    "throughput",
                    "samples/s",
                    &self.sources,
                    |s| &s.run.samples_per_sec,
                    half,
                );
            });
        });
        // Live data and the screenshot timer need frames even without input.
        ctx.request_repaint_after(Duration::from_millis(100));
    }
}

/// Where the plots go while no run has a point to plot: each run's state in one line.
fn waiting(ui: &mut egui::Ui, sources: &[Source]) {
    ui.add_space(40.0);
    ui.vertical_centered(|ui| {
        let headlines: Vec<(String, bool)> = sources.iter().map(run_panel::headline).collect();
        for (source, (line, failed)) in sources.iter().zip(&headlines) {
            let text = if *failed {
                RichText::new(format!("{}: {line}", source.run.name)).color(ui.visuals().error_fg_color)
            } else {
                RichText::new(format!("{}: {line}…", source.run.name))
            };
            ui.label(text.size(15.0));
        }
        ui.add_space(6.0);
        let any_live = headlines.iter().any(|(_, failed)| !failed);
        ui.label(
            RichText::new(if any_live {
                "The plots appear with the first logged step."
            } else {
                "The run ended before its first step; the whole message is under “details” on the left."
            })
            .weak(),
        );
    });
}
