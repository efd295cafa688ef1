//! The JSONL metrics log: one `Record` per line, flushed at epoch boundaries and at the end,
//! so another process (the dashboard's `--follow`) can read a run while it trains.

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
