//! Shared by the CLI test files: where MNIST is, scratch directories, running the binary, and a
//! tiny HTTP server on loopback that stops by itself.

// Each test file uses a different part of this module.
#![allow(dead_code, unused_imports)]

pub mod http;
pub mod mpi;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicUsize, Ordering};

#[path = "../../../testdata/mnist.rs"]
mod locator;

pub use locator::{full_mnist, mnist};

/// A loopback port that was free a moment ago: nothing listens there (until a test starts
/// something on it, e.g. a launcher's rendezvous).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

/// A real copy of MNIST: the full set, or the committed subset on a fresh clone.
pub fn mnist_dir() -> PathBuf {
    mnist().dir
}

pub fn mnist_file(name: &str) -> Vec<u8> {
    let path = mnist_dir().join(format!("{name}.gz"));
    std::fs::read(&path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()))
}

/// A fresh directory under the target's scratch space, removed when dropped.
pub struct TempDir(PathBuf);

impl TempDir {
    pub fn new(label: &str) -> TempDir {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("{label}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("cannot create {}: {e}", dir.display()));
        TempDir(dir)
    }
    pub fn path(&self) -> &Path {
        &self.0
    }
    pub fn join(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
    /// The names of the files in the directory, sorted.
    pub fn names(&self) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(&self.0)
            .unwrap_or_else(|e| panic!("cannot list {}: {e}", self.0.display()))
            .filter_map(|e| e.ok().map(|e| e.file_name().to_string_lossy().into_owned()))
            .collect();
        names.sort();
        names
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A data directory holding copies of the named MNIST files (gzipped, as shipped).
pub fn data_dir_with(names: &[&str]) -> TempDir {
    let dir = TempDir::new("data");
    for name in names {
        std::fs::write(dir.join(&format!("{name}.gz")), mnist_file(name))
            .unwrap_or_else(|e| panic!("cannot copy {name}: {e}"));
    }
    dir
}

pub const ALL: [&str; 4] = locator::MNIST_FILES;

/// Serves `files` (name without .gz, reply) under /mnist/.
pub fn mirror(files: &[(&str, http::Reply)]) -> http::Server {
    http::Server::start(
        files
            .iter()
            .map(|(name, reply)| (format!("/mnist/{name}.gz"), reply.clone()))
            .collect(),
    )
}

/// A mirror of the four files of the MNIST copy the tests use.
pub fn real_mirror() -> http::Server {
    let files: Vec<_> = ALL.iter().map(|n| (*n, http::Reply::ok(mnist_file(n)))).collect();
    mirror(&files)
}

/// `lockstep train` on the tests' MNIST, headless on 2 threads, with `extra` flags.
pub fn train_on_mnist(extra: &[&str]) -> Command {
    let data = mnist_dir();
    let mut args = vec![
        "train",
        "--data",
        data.to_str().expect("a UTF-8 path"),
        "--headless",
        "--threads",
        "2",
    ];
    args.extend_from_slice(extra);
    lockstep(&args)
}

/// `lockstep <args>` with an environment that cannot redirect it: no proxy, and a data home in
/// scratch space, so a run without `--data` never touches the user's cache.
pub fn lockstep(args: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_lockstep"));
    cmd.args(args);
    cmd.env(
        "LOCKSTEP_DATA",
        Path::new(env!("CARGO_TARGET_TMPDIR")).join("no-data-home"),
    );
    for var in [
        "http_proxy",
        "HTTP_PROXY",
        "https_proxy",
        "HTTPS_PROXY",
        "all_proxy",
        "ALL_PROXY",
    ] {
        cmd.env_remove(var);
    }
    cmd
}

pub fn run(cmd: &mut Command) -> Output {
    cmd.output().unwrap_or_else(|e| panic!("cannot start {cmd:?}: {e}"))
}

pub fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Asserts a clean refusal: a non-zero exit that is not a panic's (101), no panic message, and
/// every `needle` in stderr. Returns stderr for further checks.
pub fn assert_fails_with(out: &Output, needles: &[&str]) -> String {
    let err = stderr(out);
    let code = out.status.code();
    assert!(
        code.is_some_and(|c| c != 0 && c != 101),
        "expected a clean failure, got {:?}; stderr:\n{err}",
        out.status
    );
    assert!(!err.contains("panicked"), "the binary panicked:\n{err}");
    for needle in needles {
        assert!(err.contains(needle), "stderr lacks `{needle}`:\n{err}");
    }
    err
}

pub fn assert_succeeds(out: &Output) {
    assert!(
        out.status.success(),
        "lockstep failed ({:?}); stderr:\n{}",
        out.status,
        stderr(out)
    );
}

/// The optimizer steps a checkpoint holds, from its trainer state; None while the file is
/// missing or being replaced.
pub fn checkpoint_step(path: &Path) -> Option<u64> {
    let file = lockstep_core::train::checkpoint::load_tensors(path).ok()?;
    let state: serde_json::Value = serde_json::from_str(file.metadata.get("lockstep.trainer_state")?).ok()?;
    state["global_step"].as_u64()
}
