//! `lockstep` on a wgpu adapter (Mesa's lavapipe in CI): training follows the CPU run step for
//! step, `check` passes, `devices --details` shows the adapter, and a machine without an adapter
//! gets an error that says what to install.

mod support;

use std::path::Path;

use support::{TempDir, assert_fails_with, assert_succeeds, full_mnist, lockstep, mnist_dir, run};

/// Whether `wgpu:0` exists; without it the test says so loudly, and fails when
/// `LOCKSTEP_EXPECT_WGPU=1` (CI installs lavapipe and sets it).
fn have_wgpu() -> bool {
    let out = run(&mut lockstep(&["devices"]));
    assert_succeeds(&out);
    let listed = String::from_utf8_lossy(&out.stdout).contains("wgpu:0");
    if !listed {
        assert!(
            std::env::var("LOCKSTEP_EXPECT_WGPU").as_deref() != Ok("1"),
            "LOCKSTEP_EXPECT_WGPU=1 but `lockstep devices` lists no wgpu adapter"
        );
        eprintln!("\n*** SKIPPED: no wgpu adapter (install mesa-vulkan-drivers) ***\n");
    }
    listed
}

fn path_str(p: &Path) -> &str {
    p.to_str().expect("a UTF-8 temp path")
}

/// The loss of every step of a short run of `recipe` on `device`, read from its metrics log.
fn step_losses(device: &str, recipe: &[&str], dir: &TempDir) -> Vec<f64> {
    step_losses_placed(&["--device", device], recipe, dir)
}

/// `step_losses` with the model placed by `placement` (e.g. `--place encoder=wgpu:0,…`).
fn step_losses_placed(placement: &[&str], recipe: &[&str], dir: &TempDir) -> Vec<f64> {
    let label = placement.join("_").replace([':', '=', ',', '-'], "_");
    let metrics = dir.join(&format!("{label}-{}.jsonl", recipe.join("_")));
    let data = mnist_dir();
    let mut args = vec!["train", "--data", path_str(&data)];
    args.extend_from_slice(placement);
    args.extend_from_slice(recipe);
    args.extend_from_slice(&[
        "--log-every",
        "1",
        "--no-val",
        "--headless",
        "--metrics-out",
        path_str(&metrics),
    ]);
    let out = run(&mut lockstep(&args));
    assert_succeeds(&out);
    std::fs::read_to_string(&metrics)
        .expect("the metrics log")
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).expect("a JSON line"))
        .filter(|e| e["event"] == "step")
        .map(|e| e["loss"].as_f64().expect("a step has a loss"))
        .collect()
}

#[test]
fn training_on_wgpu_follows_the_cpu_run_step_for_step() {
    if !have_wgpu() {
        return;
    }
    let dir = TempDir::new("wgpu-curve");
    let recipe = ["--hidden", "128", "--max-steps", "30"];
    let cpu = step_losses("cpu", &recipe, &dir);
    let gpu = step_losses("wgpu:0", &recipe, &dir);
    assert_eq!(cpu.len(), 30);
    assert_eq!(gpu.len(), cpu.len());
    // Same seed, same batches, same initial weights: only f32 rounding (other summation orders
    // in the GEMM and reductions) separates the runs, about 1e-7 relative per step here.
    for (step, (c, g)) in cpu.iter().zip(&gpu).enumerate() {
        assert!(
            (c - g).abs() <= 1e-5 * c.abs(),
            "step {}: cpu loss {c}, wgpu loss {g}",
            step + 1
        );
    }
    assert!(gpu[29] < gpu[0] * 0.5, "the wgpu run did not learn: {gpu:?}");
}

#[test]
fn seq2seq_with_its_encoder_on_wgpu_follows_the_cpu_run() {
    if !have_wgpu() {
        return;
    }
    let dir = TempDir::new("wgpu-seq2seq");
    let recipe = [
        "--model",
        "seq2seq",
        "--optimizer",
        "adam",
        "--lr",
        "0.003",
        "--batch-size",
        "16",
        "--micro-batches",
        "2",
        "--max-steps",
        "2",
        "--test-samples",
        "16",
    ];
    let cpu = step_losses("cpu", &recipe, &dir);
    let placed = step_losses_placed(&["--place", "encoder=wgpu:0,decoder=cpu:0"], &recipe, &dir);
    assert_eq!(cpu.len(), 2);
    assert_eq!(placed.len(), cpu.len());
    // Model parallel across vendors, 2 micro-batches: f32 rounding apart from one device.
    for (step, (c, g)) in cpu.iter().zip(&placed).enumerate() {
        assert!(
            (c - g).abs() <= 1e-5 * c.abs(),
            "step {}: cpu loss {c}, encoder on wgpu {g}",
            step + 1
        );
    }
}

#[test]
fn check_passes_on_wgpu_and_shows_the_adapter() {
    if !have_wgpu() {
        return;
    }
    let out = run(&mut lockstep(&["check", "--device", "wgpu:0", "--failures-only"]));
    assert_succeeds(&out);
    let text = String::from_utf8_lossy(&out.stdout);
    for needle in ["wgpu:0", "driver", "max storage binding", "0 failed"] {
        assert!(text.contains(needle), "`check` output lacks `{needle}`:\n{text}");
    }
}

#[test]
fn devices_details_show_vendor_driver_and_limits() {
    if !have_wgpu() {
        return;
    }
    let out = run(&mut lockstep(&["devices", "--details"]));
    assert_succeeds(&out);
    let text = String::from_utf8_lossy(&out.stdout);
    for needle in ["wgpu:0", "vendor", "driver", "shader f16", "max buffer"] {
        assert!(text.contains(needle), "`devices --details` lacks `{needle}`:\n{text}");
    }
}

/// With no display session (no `XDG_RUNTIME_DIR`), Mesa's device-select layer made libwayland
/// print "error: XDG_RUNTIME_DIR is invalid or not set" twice on every headless run.
#[test]
fn a_headless_machine_gets_no_display_probe_errors() {
    if !have_wgpu() {
        return;
    }
    let mut cmd = lockstep(&["devices"]);
    for var in [
        "XDG_RUNTIME_DIR",
        "WAYLAND_DISPLAY",
        "WAYLAND_SOCKET",
        "DISPLAY",
        "NODEVICE_SELECT",
    ] {
        cmd.env_remove(var);
    }
    let out = run(&mut cmd);
    assert_succeeds(&out);
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("wgpu:0"),
        "the adapter is still listed"
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !stderr.contains("XDG_RUNTIME_DIR"),
        "a headless `devices` printed:\n{stderr}"
    );
}

#[test]
fn without_an_adapter_the_error_says_what_to_install() {
    // No Vulkan driver, and only the Vulkan backend allowed: wgpu finds nothing.
    let data = mnist_dir();
    let out = run(lockstep(&[
        "train",
        "--data",
        path_str(&data),
        "--device",
        "wgpu:0",
        "--max-steps",
        "1",
    ])
    .env("VK_ICD_FILENAMES", "/nonexistent.json")
    .env("VK_DRIVER_FILES", "/nonexistent.json")
    .env("WGPU_BACKEND", "vulkan"));
    assert_fails_with(&out, &["wgpu:0", "no adapter", "mesa-vulkan-drivers"]);
}

/// Test accuracy of a short run of `recipe` (model and optimizer flags) on `device` in
/// `precision`, from its summary.
fn accuracy(device: &str, recipe: &[&str], precision: &str, dir: &TempDir) -> f64 {
    let summary = dir.join(&format!(
        "{}-{}-{precision}.json",
        device.replace(':', "_"),
        recipe.join("_")
    ));
    let data = mnist_dir();
    let mut args = vec![
        "train",
        "--data",
        path_str(&data),
        "--device",
        device,
        "--precision",
        precision,
    ];
    args.extend_from_slice(recipe);
    args.extend_from_slice(&["--no-val", "--headless", "--summary-out", path_str(&summary)]);
    let out = run(&mut lockstep(&args));
    assert_succeeds(&out);
    let json: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&summary).unwrap()).unwrap();
    json["test_accuracy"].as_f64().expect("test_accuracy")
}

/// 16-mixed and bf16-mixed reach the test accuracy of 32 within 0.3 points (the bar).
fn mixed_precision_matches_f32(recipe: &[&str], at_least: f64) {
    let dir = TempDir::new("wgpu-precision");
    let full = accuracy("wgpu:0", recipe, "32", &dir);
    assert!(full > at_least, "{recipe:?} in 32: {full}");
    for precision in ["16-mixed", "bf16-mixed"] {
        let mixed = accuracy("wgpu:0", recipe, precision, &dir);
        assert!(
            (full - mixed).abs() <= 0.003,
            "{recipe:?}: {precision} {mixed} vs 32 {full}"
        );
    }
}

#[test]
fn mixed_precision_mlp_on_wgpu_matches_f32() {
    // 0.3 points are 30 of the full set's test images; the subset's 500 would allow 1.5.
    if have_wgpu() && full_mnist("mixed precision's 0.3-point bar on wgpu").is_some() {
        mixed_precision_matches_f32(&["--model", "mlp", "--hidden", "128", "--max-steps", "200"], 0.9);
    }
}

/// LeNet-5 in 16-mixed and bf16-mixed on wgpu follows the same run on the CPU step for step:
/// the GPU's half-precision convolutions, pooling and loss scaling, in a few steps. That mixed
/// precision reaches f32's accuracy is shown on the CPU (core/tests/train_mnist.rs); on lavapipe
/// a run long enough to show it took half an hour of CI on an AVX2 machine.
#[test]
fn mixed_precision_lenet5_on_wgpu_follows_the_cpu() {
    if !have_wgpu() {
        return;
    }
    let dir = TempDir::new("wgpu-lenet-mixed");
    for precision in ["16-mixed", "bf16-mixed"] {
        let recipe = [
            "--model",
            "lenet5",
            "--precision",
            precision,
            "--batch-size",
            "32",
            "--max-steps",
            "8",
        ];
        let cpu = step_losses("cpu", &recipe, &dir);
        let gpu = step_losses("wgpu:0", &recipe, &dir);
        assert_eq!((cpu.len(), gpu.len()), (8, 8), "{precision}");
        // The same half-precision inputs on both; only f32 summation orders differ, which can
        // move a half-precision rounding by one unit here and there.
        for (step, (c, g)) in cpu.iter().zip(&gpu).enumerate() {
            assert!(
                (c - g).abs() <= 1e-2 * c.abs(),
                "{precision} step {}: cpu loss {c}, wgpu loss {g}",
                step + 1
            );
        }
    }
}

#[test]
fn half_precision_on_an_adapter_without_f16_is_refused_before_training() {
    if !have_wgpu() {
        return;
    }
    // The GL face of Mesa's llvmpipe has no SHADER_F16.
    let devices = run(&mut lockstep(&["devices"]));
    let listing = String::from_utf8_lossy(&devices.stdout).to_string();
    let Some(gl) = listing.lines().find(|l| l.split_whitespace().nth(2) == Some("gl")) else {
        eprintln!("\n*** SKIPPED: no GL adapter without SHADER_F16 among:\n{listing}***\n");
        return;
    };
    let location = gl.split_whitespace().next().expect("a location column");
    let data = mnist_dir();
    let out = run(&mut lockstep(&[
        "train",
        "--data",
        path_str(&data),
        "--device",
        location,
        "--precision",
        "16-mixed",
        "--max-steps",
        "1",
    ]));
    assert_fails_with(&out, &["16-mixed", location, "f16"]);
}

/// Every tensor of `dir/last.safetensors` (model and optimizer state) as f64, by name.
fn checkpoint_values(dir: &TempDir) -> Vec<(String, Vec<f64>)> {
    let file = lockstep_core::train::checkpoint::load_tensors(&dir.join("last.safetensors")).expect("a checkpoint");
    file.tensors
        .iter()
        .map(|(name, t)| (name.clone(), t.data.to_f64_vec()))
        .collect()
}

/// A short shuffled run of the 784-64-10 mlp with global batch 32 on `devices`, checkpointed.
fn train_on(devices: &[&str], dir: &TempDir) -> Vec<(String, Vec<f64>)> {
    let data = mnist_dir();
    let joined = devices.join(",");
    let flag = if devices.len() == 1 { "--device" } else { "--devices" };
    let out = run(&mut lockstep(&[
        "train",
        "--data",
        path_str(&data),
        flag,
        &joined,
        "--hidden",
        "64",
        "--batch-size",
        "32",
        "--max-steps",
        "12",
        "--seed",
        "5",
        "--no-val",
        "--headless",
        "--checkpoint-dir",
        path_str(dir.path()),
    ]));
    assert_succeeds(&out);
    checkpoint_values(dir)
}

#[test]
fn a_job_mixing_the_cpu_and_a_wgpu_adapter_trains_as_one_device() {
    if !have_wgpu() {
        return;
    }
    let (single_dir, mixed_dir) = (TempDir::new("single"), TempDir::new("mixed"));
    let single = train_on(&["cpu"], &single_dir);
    let mixed = train_on(&["cpu:0", "wgpu:0"], &mixed_dir);
    assert_eq!(
        single.iter().map(|(n, _)| n).collect::<Vec<_>>(),
        mixed.iter().map(|(n, _)| n).collect::<Vec<_>>()
    );
    let initial = lockstep_core::models::mlp(&[64], &lockstep_core::Device::cpu(), &lockstep_core::Generator::new(5))
        .expect("the mlp");
    let first = lockstep_core::nn::ModuleExt::parameters(&initial)[0]
        .to_f64_vec()
        .expect("weights");
    assert_ne!(single[0].1, first, "training changed the weights");
    for ((name, a), (_, b)) in single.iter().zip(&mixed) {
        for (x, y) in a.iter().zip(b) {
            assert!(
                (x - y).abs() <= 1e-5 + 1e-3 * x.abs(),
                "{name}: {x} on one device, {y} on cpu:0 + wgpu:0"
            );
        }
    }
}
