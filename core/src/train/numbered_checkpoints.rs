//! The step- and epoch-numbered checkpoints a `ModelCheckpoint` keeps when asked (Lightning's
//! `every_n_train_steps` / `every_n_epochs` with `save_top_k=-1`, or only the last K), named
//! as Lightning names them: `epoch=E-step=S.safetensors`.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// How many numbered checkpoints a `ModelCheckpoint` keeps.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Keep {
    /// Every one (Lightning's `save_top_k=-1`).
    All,
    /// The newest K (at least 1); older ones are deleted once a newer one is written.
    Last(usize),
}

impl Keep {
    /// Reads `all` or a count of at least 1 (the CLI's `--keep-checkpoints`).
    pub fn parse(s: &str) -> Result<Keep> {
        match s {
            "all" => Ok(Keep::All),
            n => match n.parse::<usize>() {
                Ok(k) if k >= 1 => Ok(Keep::Last(k)),
                _ => Err(Error::invalid(
                    "keep checkpoints",
                    format!("`{n}` is neither `all` nor a count of at least 1"),
                )),
            },
        }
    }
}

/// The numbered checkpoints written so far, oldest first: a `ModelCheckpoint`'s state, so a
/// resumed run goes on pruning the files the run before it wrote.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub(super) struct NumberedCheckpoints {
    files: Vec<PathBuf>,
}

impl NumberedCheckpoints {
    /// `dir/epoch=E-step=S.safetensors`.
    pub(super) fn path(dir: &Path, epoch: u64, step: u64) -> PathBuf {
        dir.join(format!("epoch={epoch}-step={step}.safetensors"))
    }

    /// Records `path` as written, then deletes the oldest beyond `keep`. Called only after the
    /// new file is safely on disk, so a failed write never costs an older checkpoint.
    pub(super) fn written(&mut self, path: PathBuf, keep: Keep) {
        // A step save and an epoch end at the same step write one file.
        if self.files.last() != Some(&path) {
            self.files.push(path);
        }
        if let Keep::Last(k) = keep {
            let excess = self.files.len().saturating_sub(k.max(1));
            for old in self.files.drain(..excess) {
                let _ = std::fs::remove_file(old);
            }
        }
    }

    /// The files kept, oldest first.
    pub(super) fn files(&self) -> &[PathBuf] {
        &self.files
    }
}
