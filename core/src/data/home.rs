//! Where a data set lives when the user names no directory, as torchvision's and Lightning's
//! examples do: `$LOCKSTEP_DATA/<dataset>` when that is set, else the platform's per-user cache
//! (`~/.cache/lockstep/data/<dataset>` on Linux, `~/Library/Caches/…` on macOS,
//! `%LOCALAPPDATA%\…` on Windows).

use std::path::PathBuf;

use crate::error::{Error, Result};

/// The environment variable that moves every data set's home (e.g. to a shared disk).
pub const DATA_ENV: &str = "LOCKSTEP_DATA";

/// The directory that holds `dataset`'s files by default. It need not exist yet.
pub fn data_home(dataset: &str) -> Result<PathBuf> {
    root().map(|root| root.join(dataset))
}

/// The directory under which every data set has its home.
pub fn root() -> Result<PathBuf> {
    if let Some(dir) = std::env::var_os(DATA_ENV).filter(|d| !d.is_empty()) {
        return Ok(PathBuf::from(dir));
    }
    dirs::cache_dir()
        .map(|cache| cache.join("lockstep").join("data"))
        .ok_or_else(|| {
            Error::data(
                "the per-user data directory",
                format!(
                    "this machine has no per-user cache directory (no HOME?); set {DATA_ENV}=DIR or pass --data DIR"
                ),
            )
        })
}

#[cfg(test)]
mod tests {
    #[test]
    fn every_data_set_has_its_own_directory_under_one_root() {
        let mnist = super::data_home("mnist").unwrap();
        let cifar = super::data_home("cifar10").unwrap();
        assert_eq!(mnist.parent(), cifar.parent());
        assert!(mnist.ends_with("mnist"), "{}", mnist.display());
    }
}
