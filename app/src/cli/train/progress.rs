//! The terminal view of a run: an indicatif bar over optimizer steps with the latest loss and
//! throughput, and one line per epoch. Headless, only the lines.

use indicatif::{ProgressBar as Bar, ProgressDrawTarget, ProgressStyle};
use lockstep_core::Result;
use lockstep_core::train::{Event, EventListener, Record};

pub struct ProgressBar {
    bar: Option<Bar>,
    headless: bool,
}

impl ProgressBar {
    pub fn new(headless: bool) -> ProgressBar {
        ProgressBar { bar: None, headless }
    }
    fn line(&self, text: String) {
        match &self.bar {
            Some(bar) => bar.println(text),
            None => eprintln!("{text}"),
        }
    }
}

fn total_steps(max_epochs: u64, max_steps: Option<u64>, per_epoch: u64) -> u64 {
    let by_epochs = max_epochs.saturating_mul(per_epoch);
    max_steps.map_or(by_epochs, |m| m.min(by_epochs))
}

impl EventListener for ProgressBar {
    fn on_event(&mut self, record: &Record) -> Result<()> {
        match &record.event {
            Event::RunStart { run } => {
                self.line(format!(
                    "training {} on {} ({} steps per epoch)",
                    run.model,
                    run.devices.join(", "),
                    run.steps_per_epoch
                ));
                if !self.headless {
                    let bar = Bar::with_draw_target(
                        Some(total_steps(run.max_epochs, run.max_steps, run.steps_per_epoch)),
                        ProgressDrawTarget::stderr(),
                    );
                    let style = ProgressStyle::with_template(
                        "{bar:32.cyan/blue} {pos}/{len} steps [{elapsed_precise}<{eta_precise}] {msg}",
                    )
                    .unwrap_or_else(|_| ProgressStyle::default_bar());
                    bar.set_style(style);
                    self.bar = Some(bar);
                }
            }
            Event::Step {
                epoch,
                step,
                loss,
                samples_per_sec,
                ..
            } => {
                if let Some(bar) = &self.bar {
                    bar.set_position(*step);
                    bar.set_message(format!("epoch {epoch} loss {loss:.4} {samples_per_sec:.0} samples/s"));
                }
            }
            Event::Epoch {
                epoch,
                train_loss,
                val_loss,
                val_accuracy,
                seconds,
                ..
            } => {
                let val = match (val_loss, val_accuracy) {
                    (Some(l), Some(a)) => format!(", val loss {l:.4}, val acc {:.2}%", a * 100.0),
                    _ => String::new(),
                };
                self.line(format!(
                    "epoch {epoch}: train loss {train_loss:.4}{val} ({seconds:.1} s)"
                ));
            }
            Event::Checkpoint { path, reason } => self.line(format!("checkpoint ({reason}): {path}")),
            Event::RunEnd { .. } => {
                if let Some(bar) = self.bar.take() {
                    bar.finish_and_clear();
                }
            }
            _ => {}
        }
        Ok(())
    }
}
