//! The terminal view of a run, Lightning's progress bar: an indicatif bar over optimizer steps
//! with the latest loss and throughput where stderr is a terminal, and one line per epoch.
//! The Trainer adds it itself (`TrainerConfig::progress`); it needs the `console` feature (on by
//! default).

use std::io::{IsTerminal, Write};

use indicatif::{ProgressBar as Bar, ProgressDrawTarget, ProgressStyle};

use super::config::Progress;
use super::events::{Event, EventListener, Record};
use crate::error::Result;

/// Prints a run's start, its epochs and its checkpoints to stderr, under a step bar when the
/// progress setting is `Progress::Bar` and stderr is a terminal (else the lines alone).
pub struct ConsoleProgress {
    bar: Option<Bar>,
    with_bar: bool,
    out: Box<dyn Write + Send>,
}

impl ConsoleProgress {
    /// A console view as `progress` asks: `Bar` draws the step bar, `Lines` (headless runs,
    /// logs) prints only the lines, `Off` prints nothing.
    pub fn new(progress: Progress) -> ConsoleProgress {
        // A bar on a stderr that is not a terminal draws nothing, and would swallow the lines.
        let with_bar = progress == Progress::Bar && std::io::stderr().is_terminal();
        let out: Box<dyn Write + Send> = match progress {
            Progress::Off => Box::new(std::io::sink()),
            Progress::Bar | Progress::Lines => Box::new(std::io::stderr()),
        };
        ConsoleProgress {
            bar: None,
            with_bar,
            out,
        }
    }

    /// Only the lines, written to `out` instead of stderr (a log file, or a buffer in a test).
    pub fn lines_to(out: impl Write + Send + 'static) -> ConsoleProgress {
        ConsoleProgress {
            bar: None,
            with_bar: false,
            out: Box::new(out),
        }
    }

    fn line(&mut self, text: String) {
        match &self.bar {
            Some(bar) => bar.println(text),
            // A console that went away (a closed pipe) must not end the training it reports on.
            None => drop(writeln!(self.out, "{text}")),
        }
    }

    fn start_bar(&mut self, steps: u64) {
        let bar = Bar::with_draw_target(Some(steps), ProgressDrawTarget::stderr());
        let style = ProgressStyle::with_template(
            "{bar:32.cyan/blue} {pos}/{len} steps [{elapsed_precise}<{eta_precise}] {msg}",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar());
        bar.set_style(style);
        self.bar = Some(bar);
    }
}

fn total_steps(max_epochs: u64, max_steps: Option<u64>, per_epoch: u64) -> u64 {
    let by_epochs = max_epochs.saturating_mul(per_epoch);
    max_steps.map_or(by_epochs, |m| m.min(by_epochs))
}

/// An epoch's line: `epoch 3: train loss 0.1234, val loss 0.2345, val acc 97.12% (4.2 s)`.
pub(crate) fn epoch_line(
    epoch: u64,
    train_loss: f64,
    val_loss: Option<f64>,
    val_accuracy: Option<f64>,
    seconds: f64,
) -> String {
    let val = match (val_loss, val_accuracy) {
        (Some(l), Some(a)) => format!(", val loss {l:.4}, val acc {:.2}%", a * 100.0),
        (Some(l), None) => format!(", val loss {l:.4}"),
        _ => String::new(),
    };
    format!("epoch {epoch}: train loss {train_loss:.4}{val} ({seconds:.1} s)")
}

impl EventListener for ConsoleProgress {
    fn on_event(&mut self, record: &Record) -> Result<()> {
        match &record.event {
            Event::RunStart { run } => {
                self.line(format!(
                    "training {} on {} ({} steps per epoch)",
                    run.model,
                    run.devices.join(", "),
                    run.steps_per_epoch
                ));
                if self.with_bar {
                    self.start_bar(total_steps(run.max_epochs, run.max_steps, run.steps_per_epoch));
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
                self.line(epoch_line(*epoch, *train_loss, *val_loss, *val_accuracy, *seconds));
            }
            Event::Resumed {
                path,
                epoch,
                step,
                changed,
            } => {
                let changed = if changed.is_empty() {
                    String::new()
                } else {
                    format!("; changed on purpose: {}", changed.join(", "))
                };
                self.line(format!("resumed from {path} at step {step} (epoch {epoch}){changed}"));
                if let Some(bar) = &self.bar {
                    bar.set_position(*step);
                }
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

#[cfg(test)]
mod tests {
    use super::epoch_line;

    #[test]
    fn an_epoch_line_shows_what_validation_measured() {
        assert_eq!(
            epoch_line(2, 0.5, Some(0.25), Some(0.975), 1.26),
            "epoch 2: train loss 0.5000, val loss 0.2500, val acc 97.50% (1.3 s)"
        );
        // A language model's validation has a loss and no accuracy.
        assert_eq!(
            epoch_line(1, 2.0, Some(1.5), None, 0.0),
            "epoch 1: train loss 2.0000, val loss 1.5000 (0.0 s)"
        );
        assert_eq!(
            epoch_line(1, 2.0, None, None, 0.0),
            "epoch 1: train loss 2.0000 (0.0 s)"
        );
    }
}
