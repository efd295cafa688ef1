//! Where the tests find the real MNIST: ../shared/data/mnist beside the repository, or
//! LOCKSTEP_MNIST. Missing data fails loudly: these tests need the real data set.

use std::path::PathBuf;

pub fn mnist_dir() -> PathBuf {
    let dir = std::env::var_os("LOCKSTEP_MNIST")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared/data/mnist"));
    assert!(
        dir.is_dir(),
        "MNIST not found at {} (set LOCKSTEP_MNIST): this test needs the real data set",
        dir.display()
    );
    dir
}
