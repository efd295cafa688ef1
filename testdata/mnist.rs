//! Where the tests find real MNIST, in order: `$LOCKSTEP_DATA/mnist`, `../shared/data/mnist`
//! beside the repository, else the subset committed in `testdata/mnist-subset` (the first 2,000
//! training and 500 test images), so a fresh clone tests itself. Checks that need the whole set
//! (accuracy targets, published counts) ask for [`full_mnist`], which skips loudly without it;
//! with `LOCKSTEP_EXPECT_FULL_MNIST=1` (CI, which has the full set) that skip is a failure.
//!
//! Included by each crate's test support with `#[path]`, so every test looks in the same places.

use std::io::Read;
use std::path::{Path, PathBuf};

/// The four standard files, as a data directory holds them (gzipped).
pub const MNIST_FILES: [&str; 4] = [
    "train-images-idx3-ubyte",
    "train-labels-idx1-ubyte",
    "t10k-images-idx3-ubyte",
    "t10k-labels-idx1-ubyte",
];

/// Training images in the full set.
pub const FULL_TRAIN: usize = 60_000;

/// A directory holding the four files, and how many training images they hold.
pub struct MnistCopy {
    pub dir: PathBuf,
    pub train_images: usize,
}

impl MnistCopy {
    pub fn is_full(&self) -> bool {
        self.train_images == FULL_TRAIN
    }
}

fn repository() -> PathBuf {
    // Every crate of the workspace sits one level below the repository.
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn has_all_files(dir: &Path) -> bool {
    MNIST_FILES.iter().all(|n| dir.join(format!("{n}.gz")).is_file())
}

/// The first real copy found, in the order above. Panics (the repository is broken) if even the
/// committed subset is gone.
pub fn mnist() -> MnistCopy {
    let from_env = std::env::var_os("LOCKSTEP_DATA")
        .filter(|d| !d.is_empty())
        .map(|d| PathBuf::from(d).join("mnist"));
    let candidates = from_env.into_iter().chain([
        repository().join("../shared/data/mnist"),
        repository().join("testdata/mnist-subset"),
    ]);
    for dir in candidates {
        if has_all_files(&dir) {
            let train_images = label_count(&dir.join("train-labels-idx1-ubyte.gz"));
            return MnistCopy { dir, train_images };
        }
    }
    panic!("no MNIST copy found, not even testdata/mnist-subset: restore it with git checkout testdata")
}

/// The full set's directory, or None after saying loudly that `check` was skipped.
pub fn full_mnist(check: &str) -> Option<PathBuf> {
    let copy = mnist();
    if copy.is_full() {
        return Some(copy.dir);
    }
    let why = format!(
        "{check} needs the full MNIST ({FULL_TRAIN} training images) and found only {} in {}; put the full set in $LOCKSTEP_DATA/mnist",
        copy.train_images,
        copy.dir.display()
    );
    assert!(
        std::env::var("LOCKSTEP_EXPECT_FULL_MNIST").as_deref() != Ok("1"),
        "LOCKSTEP_EXPECT_FULL_MNIST=1 but {why}"
    );
    eprintln!("\n*** SKIPPED: {why} ***\n");
    None
}

/// The item count in a gzipped IDX file's header.
fn label_count(path: &Path) -> usize {
    let file = std::fs::File::open(path).unwrap_or_else(|e| panic!("cannot open {}: {e}", path.display()));
    let mut header = [0u8; 8];
    flate2::read::GzDecoder::new(file)
        .read_exact(&mut header)
        .unwrap_or_else(|e| panic!("cannot read the header of {}: {e}", path.display()));
    u32::from_be_bytes([header[4], header[5], header[6], header[7]]) as usize
}
