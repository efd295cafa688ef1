//! The first run on a machine with no data: README's main command (`lockstep train`, no
//! `--data`) downloads MNIST into the per-user data home (`$LOCKSTEP_DATA/mnist` here, a scratch
//! directory) from a loopback mirror, says where it went, and trains; the next run finds it there.
//! Offline, or told `--no-download`, it fails in two lines: where it looked, and the ways out.

mod support;

use std::process::Output;

use support::{ALL, TempDir, assert_fails_with, assert_succeeds, full_mnist, lockstep, real_mirror, run, stderr};

/// `lockstep train <args>` (no --data) with its data home in `home`.
fn first_run(home: &TempDir, args: &[&str]) -> Output {
    let mut all = vec!["train", "--headless", "--threads", "2"];
    all.extend_from_slice(args);
    run(lockstep(&all).env("LOCKSTEP_DATA", home.path()))
}

/// A base URL where nothing listens: the connection is refused at once, as offline.
fn unreachable_url() -> String {
    format!("http://127.0.0.1:{}/mnist/", support::free_port())
}

/// Asserts that the error is two lines (after any progress lines), and returns it.
fn two_lines(out: &Output, needles: &[&str]) -> String {
    let all = assert_fails_with(out, needles);
    let err = &all[all.find("error: ").unwrap_or_else(|| panic!("no error line:\n{all}"))..];
    assert_eq!(err.trim_end().lines().count(), 2, "not two lines:\n{err}");
    err.to_string()
}

#[test]
fn the_first_run_downloads_into_the_data_home_and_trains() {
    // Served files must pass the published checksums: the committed subset would not.
    let Some(_) = full_mnist("the first run's download") else {
        return;
    };
    let home = TempDir::new("first-run");
    let server = real_mirror();
    let url = server.url("mnist/");
    let out = first_run(&home, &["--download-url", &url, "--hidden", "32", "--max-steps", "20"]);
    assert_succeeds(&out);
    let dir = home.join("mnist");
    assert!(
        stderr(&out).contains("downloading it there") && stderr(&out).contains(dir.to_str().unwrap()),
        "the run does not say where the data goes:\n{}",
        stderr(&out)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("test accuracy"));
    assert_eq!(server.stop().len(), 4, "each file fetched once");
    for name in ALL {
        assert!(
            dir.join(format!("{name}.gz")).is_file(),
            "{name}.gz is not in {}",
            dir.display()
        );
    }
    // The second run finds the files there and fetches nothing, even offline.
    let again = first_run(
        &home,
        &[
            "--download-url",
            &unreachable_url(),
            "--hidden",
            "32",
            "--max-steps",
            "1",
        ],
    );
    assert_succeeds(&again);
    assert!(!stderr(&again).contains("downloading"), "{}", stderr(&again));
}

#[test]
fn offline_the_first_run_fails_in_two_lines_naming_the_directory_and_the_ways_out() {
    let home = TempDir::new("first-run-offline");
    let out = first_run(&home, &["--download-url", &unreachable_url()]);
    let dir = home.join("mnist");
    let err = two_lines(
        &out,
        &["cannot download MNIST into", dir.to_str().unwrap(), "--data DIR"],
    );
    assert!(
        err.contains("train-images-idx3-ubyte.gz") && err.contains("t10k-labels-idx1-ubyte.gz"),
        "{err}"
    );
}

#[test]
fn no_download_refuses_in_two_lines_naming_the_directory_and_the_files() {
    let home = TempDir::new("first-run-no-download");
    let dir = home.join("mnist");
    let out = first_run(&home, &["--no-download"]);
    let err = two_lines(
        &out,
        &[
            "MNIST not found in",
            dir.to_str().unwrap(),
            "--no-download",
            "--data DIR",
        ],
    );
    for name in ALL {
        assert_eq!(
            err.matches(&format!("{name}.gz")).count(),
            1,
            "{name}.gz named once:\n{err}"
        );
    }
    // Nothing was created on the way.
    assert!(!dir.exists(), "{} was created", dir.display());
}

#[test]
fn an_explicit_data_directory_never_downloads_without_download() {
    let home = TempDir::new("first-run-explicit");
    let data = TempDir::new("first-run-explicit-data");
    let out = first_run(&home, &["--data", data.path().to_str().unwrap()]);
    two_lines(
        &out,
        &[
            "MNIST not found in",
            data.path().to_str().unwrap(),
            "add --download",
            "--data DIR",
        ],
    );
    assert!(data.names().is_empty(), "{:?}", data.names());
    let out = first_run(&home, &["--download", "--no-download"]);
    assert_fails_with(&out, &["--download", "--no-download", "cannot be used with"]);
}
