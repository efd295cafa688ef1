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
    // `lockstep train --model MODEL --dataset cifar10 --data DIR`, which must fail: its stderr.
    let refusal = |model: &str| {
        let out = run(&mut lockstep(&[
            "train",
            "--model",
            model,
            "--dataset",
            "cifar10",
            "--data",
            path_str(dir.path()),
            "--headless",
        ]));
        assert!(!out.status.success(), "{model} trained");
        stderr(&out)
    };
    let err = refusal("resnet18");
    assert!(
        err.contains("CIFAR-10 not found") && err.contains("cifar-10-binary.tar.gz"),
        "{err}"
    );
    cifar_files::write_dir(dir.path(), &cifar_files::batch_files(Kind::Cifar10, 2));
    let err = refusal("lenet5");
    assert!(err.contains("1x28x28") && err.contains("3x32x32"), "{err}");
}

/// `lockstep train --dataset cifar10 --download …` into `data` from `url`, one mlp step.
fn cifar_download_run(data: &Path, url: &str, md5: Option<&str>) -> std::process::Output {
    let mut cmd = lockstep(&[
        "train",
        "--dataset",
        "cifar10",
        "--download",
        "--download-url",
        url,
        "--data",
        path_str(data),
        "--hidden",
        "16",
        "--batch-size",
        "8",
        "--max-steps",
        "1",
        "--no-val",
        "--threads",
        "2",
    ]);
    if let Some(md5) = md5 {
        cmd.env("LOCKSTEP_TEST_CIFAR_MD5", md5);
    }
    run(&mut cmd)
}

fn md5_hex(bytes: &[u8]) -> String {
    use md5::Digest;
    md5::Md5::digest(bytes).iter().map(|b| format!("{b:02x}")).collect()
}

#[test]
fn cifar_downloads_only_when_missing_checks_the_archive_and_leaves_nothing_half_written() {
    let served = TempDir::new("cifar-served");
    let archive = served.join(Kind::Cifar10.archive());
    cifar_files::write_archive(&archive, Kind::Cifar10, &cifar_files::batch_files(Kind::Cifar10, 4));
    let bytes = std::fs::read(&archive).unwrap();
    let route = format!("/cifar/{}", Kind::Cifar10.archive());

    // The published MD5 refuses the test's archive: the error names both digests, no file stays.
    let server = support::http::Server::start([(route.clone(), support::http::Reply::ok(bytes.clone()))].into());
    let data = TempDir::new("cifar-refused");
    let out = cifar_download_run(data.path(), &server.url("cifar/"), None);
    let err = stderr(&out);
    assert!(
        !out.status.success()
            && err.contains("failed its MD5 check")
            && err.contains("c32a1d4ab5d03f1284b67883e8d87530"),
        "{err}"
    );
    assert!(data.names().is_empty(), "left behind: {:?}", data.names());
    server.stop();

    // With the archive's own digest it lands under its published name, loads and trains.
    let md5 = md5_hex(&bytes);
    let server = support::http::Server::start([(route.clone(), support::http::Reply::ok(bytes.clone()))].into());
    let data = TempDir::new("cifar-download");
    assert_succeeds(&cifar_download_run(data.path(), &server.url("cifar/"), Some(&md5)));
    assert_eq!(server.stop(), vec![route.clone()]);
    assert_eq!(data.names(), vec![Kind::Cifar10.archive().to_string()]);
    assert_eq!(std::fs::read(data.join(Kind::Cifar10.archive())).unwrap(), bytes);

    // The next run finds it and asks the server for nothing.
    let server = support::http::Server::start([(route, support::http::Reply::ok(bytes))].into());
    assert_succeeds(&cifar_download_run(data.path(), &server.url("cifar/"), Some(&md5)));
    assert!(server.stop().is_empty(), "downloaded again");
}

/// `n` PNGs per class under `dir/<class>/`, red or blue with a grain, of assorted sizes.
fn write_image_classes(dir: &Path, n: usize) {
    for (class, rgb) in [("blue", [20u8, 30, 220]), ("red", [220u8, 30, 20])] {
        std::fs::create_dir_all(dir.join(class)).unwrap();
        for i in 0..n {
            let (w, h) = (12 + (i % 5) as u32 * 3, 20 - (i % 3) as u32 * 4);
            let img = image::RgbImage::from_fn(w, h, |x, y| {
                let grain = ((x * 7 + y * 13 + i as u32 * 5) % 40) as u8;
                image::Rgb([
                    rgb[0].saturating_sub(grain),
                    rgb[1] + grain,
                    rgb[2].saturating_sub(grain),
                ])
            });
            img.save(dir.join(class).join(format!("{i:03}.png"))).unwrap();
        }
    }
}

#[test]
fn a_folder_of_images_trains_and_a_bad_image_is_skipped_when_asked() {
    let dir = TempDir::new("folder");
    write_image_classes(&dir.join("train"), 24);
    write_image_classes(&dir.join("val"), 4);
    std::fs::write(dir.join("train/red/zz-broken.png"), b"not a png").unwrap();
    let data = path_str(dir.path());
    let args = [
        "--dataset",
        "folder",
        "--data",
        data,
        "--image-size",
        "16",
        "--model",
        "mlp",
        "--hidden",
        "32",
        "--batch-size",
        "8",
        "--max-steps",
        "12",
        "--lr",
        "0.05",
    ];
    // The broken file stops the run, named, with the way out.
    let mut all = vec!["train", "--headless", "--threads", "2"];
    all.extend_from_slice(&args);
    let out = run(&mut lockstep(&all));
    let err = stderr(&out);
    assert!(
        !out.status.success() && err.contains("zz-broken.png") && err.contains("--skip-bad-images"),
        "{err}"
    );
    // Skipped, it is warned about once and the rest trains; the loss falls.
    let mut skipping = args.to_vec();
    skipping.push("--skip-bad-images");
    let losses = losses(&dir, &skipping);
    assert_eq!(losses.len(), 12);
    let (first, last) = (losses[..3].iter().sum::<f64>(), losses[9..].iter().sum::<f64>());
    assert!(last < 0.5 * first, "the loss did not fall: {losses:?}");
}
