//! `lockstep train --download` against a local HTTP server on 127.0.0.1: files land, load and
//! train; only missing files are fetched; a corrupt, wrong, cut-off or absent file is a clear
//! error that leaves nothing behind.

mod support;

use support::http::Reply;
use support::{
    ALL, TempDir, assert_fails_with, assert_succeeds, data_dir_with, full_mnist, lockstep, mirror, mnist_file,
    real_mirror, run,
};

/// A short training run that downloads into `data` from `url` first.
fn train_with_download(data: &TempDir, url: &str, extra: &[&str]) -> std::process::Output {
    let data = data.path().to_str().expect("a UTF-8 temp path");
    let mut args = vec![
        "train",
        "--download",
        "--download-url",
        url,
        "--data",
        data,
        "--threads",
        "2",
        "--hidden",
        "16",
    ];
    args.extend_from_slice(&["--max-steps", "1", "--limit-train-batches", "1", "--no-val"]);
    args.extend_from_slice(extra);
    run(&mut lockstep(&args))
}

/// Only the finished files, never a temporary `.part` one.
fn assert_no_partial_files(dir: &TempDir) {
    let names = dir.names();
    assert!(
        names.iter().all(|n| !n.contains(".part")),
        "a partial download remains: {names:?}"
    );
}

#[test]
fn downloaded_files_land_intact_and_train() {
    // The files must pass the published checksums: the committed subset would not.
    let Some(_) = full_mnist("a download that passes the checksums") else {
        return;
    };
    let server = real_mirror();
    let data = TempDir::new("download-all");
    // Not headless: the progress bar path runs too (hidden, as stderr is not a terminal).
    let out = train_with_download(&data, &server.url("mnist/"), &[]);
    assert_succeeds(&out);
    let mut requested = server.stop();
    requested.sort();
    let mut expected: Vec<String> = ALL.iter().map(|n| format!("/mnist/{n}.gz")).collect();
    expected.sort();
    assert_eq!(requested, expected);
    for name in ALL {
        let got = std::fs::read(data.join(&format!("{name}.gz"))).expect("a downloaded file");
        assert!(got == mnist_file(name), "{name}.gz differs from the served file");
    }
    assert_no_partial_files(&data);
}

#[test]
fn only_missing_files_are_fetched() {
    let Some(_) = full_mnist("a download that passes the checksums") else {
        return;
    };
    let server = real_mirror();
    let data = data_dir_with(&[
        "train-images-idx3-ubyte",
        "t10k-images-idx3-ubyte",
        "t10k-labels-idx1-ubyte",
    ]);
    // A base URL without the trailing slash works too.
    let out = train_with_download(&data, &server.url("mnist"), &["--headless"]);
    assert_succeeds(&out);
    assert_eq!(server.stop(), ["/mnist/train-labels-idx1-ubyte.gz"]);
    assert!(data.join("train-labels-idx1-ubyte.gz").is_file());
    assert_no_partial_files(&data);
}

#[test]
fn nothing_is_fetched_when_the_files_are_there() {
    let server = real_mirror();
    let data = data_dir_with(&ALL);
    let out = train_with_download(&data, &server.url("mnist/"), &["--headless"]);
    assert_succeeds(&out);
    assert!(server.stop().is_empty());
}

/// A data dir missing only train-labels, so each failure test makes one small request.
fn without_train_labels() -> TempDir {
    data_dir_with(&[
        "train-images-idx3-ubyte",
        "t10k-images-idx3-ubyte",
        "t10k-labels-idx1-ubyte",
    ])
}

#[test]
fn a_file_with_other_contents_fails_its_sha256_check_and_is_removed() {
    // A valid gzip file, but the test labels: it inflates fine and hashes wrong.
    let server = mirror(&[(
        "train-labels-idx1-ubyte",
        Reply::ok(mnist_file("t10k-labels-idx1-ubyte")),
    )]);
    let data = without_train_labels();
    let out = train_with_download(&data, &server.url("mnist/"), &["--headless"]);
    assert_fails_with(
        &out,
        &[
            "train-labels-idx1-ubyte.gz",
            "SHA-256",
            "expected 65a50cbbf4e906d70832878ad85ccda5333a97f0f4c3dd2ef09a8a9eef7101c5",
            "got ",
        ],
    );
    assert!(!data.join("train-labels-idx1-ubyte.gz").exists());
    assert_no_partial_files(&data);
}

#[test]
fn a_corrupt_download_is_refused_and_removed() {
    let mut bytes = mnist_file("train-labels-idx1-ubyte");
    let middle = bytes.len() / 2;
    for b in &mut bytes[middle..middle + 64] {
        *b ^= 0x5a;
    }
    let server = mirror(&[("train-labels-idx1-ubyte", Reply::ok(bytes))]);
    let data = without_train_labels();
    let out = train_with_download(&data, &server.url("mnist/"), &["--headless"]);
    assert_fails_with(&out, &["train-labels-idx1-ubyte.gz", "not valid gzip data", "removed"]);
    assert!(!data.join("train-labels-idx1-ubyte.gz").exists());
    assert_no_partial_files(&data);
}

#[test]
fn a_download_cut_short_is_refused_and_removed() {
    let full = mnist_file("train-labels-idx1-ubyte");
    let reply = Reply {
        status: 200,
        declared_len: full.len(),
        body: full[..full.len() / 3].to_vec(),
    };
    let server = mirror(&[("train-labels-idx1-ubyte", reply)]);
    let data = without_train_labels();
    let out = train_with_download(&data, &server.url("mnist/"), &["--headless"]);
    assert_fails_with(&out, &["train-labels-idx1-ubyte.gz", "run again to retry"]);
    assert!(!data.join("train-labels-idx1-ubyte.gz").exists());
    assert_no_partial_files(&data);
}

#[test]
fn a_file_the_mirror_lacks_is_a_clear_404() {
    let server = mirror(&[]);
    let data = without_train_labels();
    let url = server.url("nothing-here/");
    let out = train_with_download(&data, &url, &["--headless"]);
    let wanted = format!("{url}train-labels-idx1-ubyte.gz");
    assert_fails_with(&out, &[&wanted, "HTTP 404", "--download-url"]);
    assert_no_partial_files(&data);
}

#[test]
fn an_unreachable_mirror_is_a_clear_error() {
    // A port that was just free: nothing listens there, so the connection is refused at once.
    let data = without_train_labels();
    let url = format!("http://127.0.0.1:{}/mnist/", support::free_port());
    let out = train_with_download(&data, &url, &["--headless"]);
    assert_fails_with(
        &out,
        &["cannot download", "train-labels-idx1-ubyte.gz", "--download-url"],
    );
    assert_no_partial_files(&data);
}

#[test]
fn a_bad_download_url_is_refused() {
    let data = without_train_labels();
    let out = train_with_download(&data, "mirror.example/mnist", &["--headless"]);
    assert_fails_with(&out, &["--download-url mirror.example/mnist", "http://"]);
    assert_no_partial_files(&data);
}
