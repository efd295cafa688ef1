//! Starting a run from the window: a small form whose fields become `lockstep train` flags, so
//! a run started here is the same run the command line would start (same defaults, same checks).
//! The data directory starts at MNIST's per-user home; the form says whether the files are
//! there and, when they are not, offers (and ticks) the download.

use std::path::Path;

use egui::RichText;
use lockstep_core::data::mnist;

/// Starts a run from `lockstep train` arguments (without the program name) and returns its source.
pub type Launcher = Box<dyn Fn(Vec<String>) -> anyhow::Result<super::Source>>;

/// The model that trains on generated data rather than MNIST.
const GENERATED: &str = "seq2seq";

pub struct NewRun {
    open: bool,
    /// Set when the form opens: Start takes the keyboard focus, so Enter starts the run.
    focus_start: bool,
    model: String,
    pub data: String,
    download: bool,
    /// The directory last checked, and which MNIST files it lacks.
    checked: Option<(String, Vec<&'static str>)>,
    device: String,
    devices: Vec<String>,
    optimizer: String,
    lr: String,
    epochs: u64,
    batch_size: usize,
    pub max_steps: String,
    pub error: Option<String>,
}

impl Default for NewRun {
    fn default() -> NewRun {
        let data = lockstep_core::data::data_home("mnist").map_or(String::new(), |d| d.display().to_string());
        NewRun::with_data_dir(data)
    }
}

impl NewRun {
    /// A closed form whose data directory starts at `data`.
    pub fn with_data_dir(data: String) -> NewRun {
        let mut devices = vec!["auto".to_string()];
        devices.extend(lockstep_core::device::list_devices().into_iter().map(|d| d.location));
        let mut form = NewRun {
            open: false,
            focus_start: false,
            model: "mlp".into(),
            data,
            download: false,
            checked: None,
            device: "auto".into(),
            devices,
            optimizer: "sgd".into(),
            lr: String::new(),
            epochs: 1,
            batch_size: 128,
            max_steps: String::new(),
            error: None,
        };
        form.check_data();
        form
    }

    /// Shows the form, Start focused, having looked for the files afresh (a run since the
    /// last time may have downloaded them).
    pub fn open(&mut self) {
        self.open = true;
        self.focus_start = true;
        self.checked = None;
    }

    pub fn close(&mut self) {
        self.open = false;
    }

    /// Looks for the files again when the directory changed; a directory that lacks them gets
    /// the download ticked (the user may untick it).
    fn check_data(&mut self) {
        if self.checked.as_ref().is_some_and(|(dir, _)| *dir == self.data) {
            return;
        }
        let missing = mnist::missing(Path::new(self.data.trim()));
        self.download = !missing.is_empty();
        self.checked = Some((self.data.clone(), missing));
    }

    fn missing(&self) -> &[&'static str] {
        self.checked.as_ref().map_or(&[], |(_, m)| m)
    }

    /// The `lockstep train` arguments the form describes.
    pub fn args(&self) -> Vec<String> {
        let mut a: Vec<String> = vec!["--model".into(), self.model.clone()];
        if self.model != GENERATED {
            a.extend(["--data".into(), self.data.trim().into()]);
            if self.download && !self.missing().is_empty() {
                a.push("--download".into());
            }
        }
        a.extend(["--device".into(), self.device.clone()]);
        a.extend(["--optimizer".into(), self.optimizer.clone()]);
        a.extend(["--epochs".into(), self.epochs.to_string()]);
        a.extend(["--batch-size".into(), self.batch_size.to_string()]);
        if !self.lr.trim().is_empty() {
            a.extend(["--lr".into(), self.lr.trim().into()]);
        }
        if !self.max_steps.trim().is_empty() {
            a.extend(["--max-steps".into(), self.max_steps.trim().into()]);
        }
        a
    }

    /// Shows the form while open; returns the arguments when Start is pressed.
    pub fn show(&mut self, ctx: &egui::Context) -> Option<Vec<String>> {
        self.check_data();
        let mut start = None;
        let mut open = self.open;
        egui::Window::new("New run")
            .open(&mut open)
            .resizable(false)
            .collapsible(false)
            .show(ctx, |ui| {
                egui::Grid::new("new-run")
                    .num_columns(2)
                    .spacing([12.0, 6.0])
                    .show(ui, |ui| self.fields(ui));
                if let Some(e) = &self.error {
                    ui.label(RichText::new(e).color(ui.visuals().error_fg_color));
                }
                ui.add_space(4.0);
                ui.label(
                    RichText::new(format!("lockstep train {}", self.args().join(" ")))
                        .monospace()
                        .small()
                        .weak(),
                );
                let button = ui.button("Start");
                if std::mem::take(&mut self.focus_start) {
                    button.request_focus();
                }
                if button.clicked() {
                    start = Some(self.args());
                }
            });
        self.open = open;
        start
    }

    fn fields(&mut self, ui: &mut egui::Ui) {
        let names: Vec<&str> = lockstep_core::models::NAMES.to_vec();
        choice(ui, "model", &mut self.model, &names);
        let label = ui.label("data set");
        if self.model == GENERATED {
            ui.label("digit reversal (generated; no files)").labelled_by(label.id);
            ui.end_row();
        } else {
            ui.label("MNIST").labelled_by(label.id);
            ui.end_row();
            let label = ui.label("MNIST directory");
            ui.text_edit_singleline(&mut self.data).labelled_by(label.id);
            ui.end_row();
            ui.label("");
            self.data_status(ui);
            ui.end_row();
        }
        let devices: Vec<&str> = self.devices.iter().map(String::as_str).collect();
        choice(ui, "device", &mut self.device, &devices);
        choice(ui, "optimizer", &mut self.optimizer, &["sgd", "adam", "adamw"]);
        let label = ui.label("learning rate");
        ui.add(egui::TextEdit::singleline(&mut self.lr).hint_text("default for the optimizer"))
            .labelled_by(label.id);
        ui.end_row();
        let label = ui.label("epochs");
        ui.add(egui::DragValue::new(&mut self.epochs).range(1..=1000))
            .labelled_by(label.id);
        ui.end_row();
        let label = ui.label("batch size");
        ui.add(egui::DragValue::new(&mut self.batch_size).range(1..=65536))
            .labelled_by(label.id);
        ui.end_row();
        let label = ui.label("max steps");
        ui.add(egui::TextEdit::singleline(&mut self.max_steps).hint_text("no limit"))
            .labelled_by(label.id);
        ui.end_row();
    }

    /// Whether the four files are there; if not, the download offer.
    fn data_status(&mut self, ui: &mut egui::Ui) {
        let missing = self.missing().len();
        ui.vertical(|ui| {
            if missing == 0 {
                ui.label(RichText::new("✔ the four MNIST files are there").color(ui.visuals().weak_text_color()));
                return;
            }
            let what = if missing == mnist::FILES.len() {
                "MNIST is not there yet".to_string()
            } else {
                format!("{missing} of the four MNIST files are missing")
            };
            ui.label(RichText::new(what).color(ui.visuals().warn_fg_color));
            ui.checkbox(&mut self.download, "download it there (about 11 MB)");
        });
    }
}

/// A labelled drop-down row of the form.
fn choice(ui: &mut egui::Ui, name: &str, value: &mut String, options: &[&str]) {
    let label = ui.label(name);
    egui::ComboBox::from_id_salt(name)
        .selected_text(value.as_str())
        .show_ui(ui, |ui| {
            for option in options {
                ui.selectable_value(value, option.to_string(), *option);
            }
        })
        .response
        .labelled_by(label.id);
    ui.end_row();
}

#[cfg(test)]
mod tests {
    use super::NewRun;

    #[test]
    fn the_form_becomes_train_flags() {
        let form = NewRun {
            lr: " 0.01 ".into(),
            max_steps: "300".into(),
            ..NewRun::with_data_dir("/nonexistent/mnist".into())
        };
        let args = form.args().join(" ");
        assert!(
            args.starts_with("--model mlp --data /nonexistent/mnist --download "),
            "{args}"
        );
        assert!(
            args.contains("--lr 0.01") && args.contains("--max-steps 300") && args.contains("--epochs 1"),
            "{args}"
        );
    }

    #[test]
    fn the_download_is_offered_only_where_files_are_missing() {
        let mut form = NewRun::with_data_dir("/nonexistent/mnist".into());
        assert!(form.download, "missing files: the download is ticked");
        let here = concat!(env!("CARGO_MANIFEST_DIR"), "/../testdata/mnist-subset");
        form.data = here.into();
        form.check_data();
        assert!(!form.download && form.missing().is_empty());
        assert!(!form.args().contains(&"--download".to_string()));
        // The generated task takes no data flags at all.
        form.model = "seq2seq".into();
        assert!(!form.args().iter().any(|a| a == "--data"), "{:?}", form.args());
    }
}
