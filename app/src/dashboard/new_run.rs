//! Starting a run from the window: a small form whose fields become `lockstep train` flags, so
//! a run started here is the same run the command line would start (same defaults, same checks).

use egui::RichText;

/// Starts a run from `lockstep train` arguments (without the program name) and returns its source.
pub type Launcher = Box<dyn Fn(Vec<String>) -> anyhow::Result<super::Source>>;

pub struct NewRun {
    pub open: bool,
    model: String,
    data: String,
    download: bool,
    device: String,
    devices: Vec<String>,
    optimizer: String,
    lr: String,
    epochs: u64,
    batch_size: usize,
    max_steps: String,
    pub error: Option<String>,
}

impl Default for NewRun {
    fn default() -> NewRun {
        let mut devices = vec!["auto".to_string()];
        devices.extend(lockstep_core::device::list_devices().into_iter().map(|d| d.location));
        NewRun {
            open: false,
            model: "mlp".into(),
            data: std::env::var("LOCKSTEP_DATA").unwrap_or_else(|_| "data/mnist".into()),
            download: false,
            device: "auto".into(),
            devices,
            optimizer: "sgd".into(),
            lr: String::new(),
            epochs: 1,
            batch_size: 128,
            max_steps: String::new(),
            error: None,
        }
    }
}

impl NewRun {
    /// The `lockstep train` arguments the form describes.
    pub fn args(&self) -> Vec<String> {
        let mut a: Vec<String> = ["--model", &self.model, "--data", &self.data, "--device", &self.device]
            .iter()
            .map(|s| s.to_string())
            .collect();
        a.extend(["--optimizer".into(), self.optimizer.clone()]);
        a.extend(["--epochs".into(), self.epochs.to_string()]);
        a.extend(["--batch-size".into(), self.batch_size.to_string()]);
        if !self.lr.trim().is_empty() {
            a.extend(["--lr".into(), self.lr.trim().into()]);
        }
        if !self.max_steps.trim().is_empty() {
            a.extend(["--max-steps".into(), self.max_steps.trim().into()]);
        }
        if self.download {
            a.push("--download".into());
        }
        a
    }

    /// Shows the form while open; returns the arguments when Start is pressed.
    pub fn show(&mut self, ctx: &egui::Context) -> Option<Vec<String>> {
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
                    .show(ui, |ui| {
                        ui.label("model");
                        choice(ui, "model", &mut self.model, &["mlp", "lenet5"]);
                        ui.end_row();
                        ui.label("MNIST directory");
                        ui.text_edit_singleline(&mut self.data);
                        ui.end_row();
                        ui.label("");
                        ui.checkbox(&mut self.download, "download the files if missing");
                        ui.end_row();
                        ui.label("device");
                        let devices: Vec<&str> = self.devices.iter().map(String::as_str).collect();
                        choice(ui, "device", &mut self.device, &devices);
                        ui.end_row();
                        ui.label("optimizer");
                        choice(ui, "optimizer", &mut self.optimizer, &["sgd", "adam", "adamw"]);
                        ui.end_row();
                        ui.label("learning rate");
                        ui.add(egui::TextEdit::singleline(&mut self.lr).hint_text("default for the optimizer"));
                        ui.end_row();
                        ui.label("epochs");
                        ui.add(egui::DragValue::new(&mut self.epochs).range(1..=1000));
                        ui.end_row();
                        ui.label("batch size");
                        ui.add(egui::DragValue::new(&mut self.batch_size).range(1..=65536));
                        ui.end_row();
                        ui.label("max steps");
                        ui.add(egui::TextEdit::singleline(&mut self.max_steps).hint_text("no limit"));
                        ui.end_row();
                    });
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
                if ui.button("Start").clicked() {
                    start = Some(self.args());
                }
            });
        self.open = open;
        start
    }
}

fn choice(ui: &mut egui::Ui, id: &str, value: &mut String, options: &[&str]) {
    egui::ComboBox::from_id_salt(id)
        .selected_text(value.as_str())
        .show_ui(ui, |ui| {
            for option in options {
                ui.selectable_value(value, option.to_string(), *option);
            }
        });
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_form_becomes_train_flags() {
        let form = super::NewRun {
            lr: " 0.01 ".into(),
            max_steps: "300".into(),
            ..Default::default()
        };
        let args = form.args().join(" ");
        assert!(args.starts_with("--model mlp --data "), "{args}");
        assert!(
            args.contains("--lr 0.01") && args.contains("--max-steps 300") && args.contains("--epochs 1"),
            "{args}"
        );
        assert!(!args.contains("--download"), "{args}");
    }
}
