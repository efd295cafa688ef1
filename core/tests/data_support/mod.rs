//! Where the tests find the real MNIST: see testdata/mnist.rs.

// Each test file uses a different part of the shared locator.
#![allow(dead_code, unused_imports)]

#[path = "../../../testdata/mnist.rs"]
mod locator;

pub use locator::{full_mnist, mnist};

/// A real copy of MNIST: the full set, or the committed subset on a fresh clone.
pub fn mnist_dir() -> std::path::PathBuf {
    mnist().dir
}
