//! `lockstep train --model resnet18 --dataset cifar10|cifar100` end to end on CIFAR files in the
//! published format that the test writes: the default ResNet recipe trains from the .tar.gz and
//! its loss falls, a wrong data set for a model is refused, and a missing CIFAR says where to
//! put it.

mod support;

use std::path::Path;

use lockstep_core::data::cifar::Kind;
use support::{TempDir, assert_succeeds, lockstep, run, stderr};

#[path = "../../testdata/cifar.rs"]
mod cifar_files;

fn path_str(p: &Path) -> &str {
    p.to_str().expect("scratch paths are UTF-8")
}

/// The losses of each logged step of `lockstep train <args>`, which must succeed.
fn losses(dir: &TempDir, args: &[&str]) -> Vec<f64> {
    let metrics = dir.join("metrics.jsonl");
    let mut all = vec!["train", "--headless", "--threads", "2", "--log-every", "1"];
    all.extend_from_slice(args);
    all.extend_from_slice(&["--metrics-out", path_str(&metrics)]);
    let out = run(&mut lockstep(&all));
    assert_succeeds(&out);
    std::fs::read_to_string(&metrics)
        .expect("the metrics log")
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).expect("JSON"))
        .filter(|e| e["event"] == "step")
        .map(|e| e["loss"].as_f64().expect("a loss"))
        .collect()
}

#[test]
fn resnet18_trains_on_cifar10_from_the_published_archive_and_its_loss_falls() {
    let dir = TempDir::new("cifar10");
    let files = cifar_files::batch_files(Kind::Cifar10, 32);
    cifar_files::write_archive(&dir.join(Kind::Cifar10.archive()), Kind::Cifar10, &files);
    let args = [
        "--model",
        "resnet18",
        "--dataset",
        "cifar10",
        "--data",
        path_str(dir.path()),
        "--batch-size",
        "16",
        "--max-steps",
        "20",
        "--lr",
        "0.01",
        "--test-samples",
        "16",
        "--workers",
        "2",
    ];
    let losses = losses(&dir, &args);
    assert_eq!(losses.len(), 20, "{losses:?}");
    let (first, last) = (losses[..4].iter().sum::<f64>(), losses[16..].iter().sum::<f64>());
    assert!(last < 0.6 * first, "the loss did not fall: {losses:?}");
}

#[test]
fn cifar100_trains_from_its_extracted_folder_with_100_classes() {
    let dir = TempDir::new("cifar100");
    let files = cifar_files::batch_files(Kind::Cifar100, 16);
    cifar_files::write_dir(&dir.join(Kind::Cifar100.folder()), &files);
    let args = [
        "--model",
        "mlp",
        "--hidden",
        "64",
        "--dataset",
        "cifar100",
        "--data",
        path_str(dir.path()),
        "--batch-size",
        "8",
        "--max-steps",
        "2",
        "--no-val",
    ];
    assert_eq!(losses(&dir, &args).len(), 2);
}

#[test]
fn a_missing_cifar_or_a_model_built_for_mnist_is_refused_clearly() {
    let dir = TempDir::new("no-cifar");
    let out = run(&mut lockstep(&[
        "train",
        "--model",
        "resnet18",
        "--dataset",
        "cifar10",
        "--data",
        path_str(dir.path()),
        "--headless",
    ]));
    let err = stderr(&out);
    assert!(
        !out.status.success() && err.contains("CIFAR-10 not found") && err.contains("cifar-10-binary.tar.gz"),
        "{err}"
    );

    cifar_files::write_dir(dir.path(), &cifar_files::batch_files(Kind::Cifar10, 2));
    let out = run(&mut lockstep(&[
        "train",
        "--model",
        "lenet5",
        "--dataset",
        "cifar10",
        "--data",
        path_str(dir.path()),
        "--headless",
    ]));
    let err = stderr(&out);
    assert!(
        !out.status.success() && err.contains("1x28x28") && err.contains("3x32x32"),
        "{err}"
    );
}
