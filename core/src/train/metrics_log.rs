//! The JSONL metrics log: one `Record` per line, flushed at epoch boundaries and at the end,
//! so another process (the dashboard's `--follow`) can read a run while it trains; and reading
//! it back, where a bad line is a warning, never the end of the log.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use super::events::{Event, EventListener, Record};
use crate::error::{Error, Result};

/// A listener that writes each `Record` as one JSON line; step and device lines are flushed with
/// the next other event.
pub struct JsonlWriter {
    path: PathBuf,
    out: BufWriter<File>,
}

impl JsonlWriter {
    /// Creates or truncates the log at `path`, creating its parent directories.
    pub fn create(path: impl AsRef<Path>) -> Result<JsonlWriter> {
        let path = path.as_ref().to_path_buf();
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
        }
        let file = File::create(&path).map_err(|e| Error::io(&path, e))?;
        Ok(JsonlWriter {
            path,
            out: BufWriter::new(file),
        })
    }
}

impl EventListener for JsonlWriter {
    fn on_event(&mut self, record: &Record) -> Result<()> {
        let line =
            serde_json::to_string(record).map_err(|e| Error::data(self.path.display().to_string(), e.to_string()))?;
        writeln!(self.out, "{line}").map_err(|e| Error::io(&self.path, e))?;
        if !matches!(record.event, Event::Step { .. } | Event::Device(_)) {
            self.out.flush().map_err(|e| Error::io(&self.path, e))?;
        }
        Ok(())
    }
}

/// The event kinds a metrics log may hold: a line of another kind is from a newer Lockstep.
const KNOWN_EVENTS: [&str; 7] = ["run_start", "step", "epoch", "device", "checkpoint", "test", "run_end"];

/// One line of a metrics log, line `number` (from 1): its record, nothing when it is blank, or a
/// warning naming the line and what is wrong with it. `unterminated_last` says the line is the
/// log's last and has no newline yet, so a cut-off record is one still being written.
pub fn parse_metrics_line(
    line: &str,
    number: usize,
    unterminated_last: bool,
) -> std::result::Result<Option<Record>, String> {
    if line.trim().is_empty() {
        return Ok(None);
    }
    serde_json::from_str::<Record>(line).map(Some).map_err(|e| {
        if unterminated_last && e.is_eof() {
            return format!("line {number} is incomplete (the run may still be writing it); skipped");
        }
        match serde_json::from_str::<serde_json::Value>(line) {
            Ok(v) => match v.get("event").and_then(|k| k.as_str()) {
                Some(kind) if !KNOWN_EVENTS.contains(&kind) => {
                    format!("line {number}: unknown event kind `{kind}` (from a newer lockstep?); skipped")
                }
                _ => format!("line {number}: {e}; skipped"),
            },
            Err(_) => format!("line {number} is not JSON ({e}); skipped"),
        }
    })
}

/// Every line of a metrics log's `text`, in order, as [`parse_metrics_line`] reads them (blank
/// lines left out): a record, or a warning. A last line without its newline may be one the run
/// is still writing.
pub fn parse_metrics_log(text: &str) -> Vec<std::result::Result<Record, String>> {
    let ends_cleanly = text.ends_with('\n');
    let lines: Vec<&str> = text.lines().collect();
    lines
        .iter()
        .enumerate()
        .filter_map(|(i, line)| {
            let last = i + 1 == lines.len();
            parse_metrics_line(line, i + 1, last && !ends_cleanly).transpose()
        })
        .collect()
}
