//! The CUDA backend end to end without a GPU: `lockstep train` on `cuda:0` served by the CPU
//! emulator (lockstep-cuda-emulator: the driver and cuBLAS on the CPU, the backend's own kernel
//! files compiled as C++), step for step beside the same run on the CPU. What a GPU session
//! would otherwise find first — a launch with the wrong shape, a kernel reading memory nobody
//! wrote (fresh emulated memory is all NaN), a start-up self-check that steps aside — shows
//! here. Timing, stream races and tensor-core rounding are a GPU's to show (scripts/gpu/).

mod support;

use std::path::PathBuf;
use std::process::Command;

use support::mpi::{checkpoint_tensors, logged_losses, path_str};
use support::{TempDir, assert_succeeds, lockstep, mnist_dir, run};

/// `lockstep` with the emulator's libraries first on the library path: cudarc asks dlopen for
/// `libcuda.so` by name.
fn on_emulator(args: &[&str]) -> Command {
    let mut cmd = lockstep(args);
    let inherited = std::env::var("LD_LIBRARY_PATH").unwrap_or_default();
    cmd.env(
        "LD_LIBRARY_PATH",
        format!("{}:{inherited}", lockstep_cuda_emulator::LIB_DIR),
    );
    cmd
}

/// Whether the emulated cuda:0 is there with NVRTC (which still compiles every kernel); without
/// them the test says so loudly, and fails when `LOCKSTEP_EXPECT_CUDA_EMULATOR=1` (CI).
fn have_emulator() -> bool {
    let out = run(&mut on_emulator(&["devices", "--details"]));
    assert_succeeds(&out);
    let listing = String::from_utf8_lossy(&out.stdout);
    let ready = lockstep_cuda_emulator::built().and_then(|()| {
        match (listing.contains("Lockstep CUDA emulator"), listing.contains("NVRTC ok")) {
            (true, true) => {
                let line = listing.lines().find(|l| l.starts_with("cuda:0")).unwrap_or_default();
                assert!(
                    line.contains("software"),
                    "the emulator is software, as lavapipe is: {line}"
                );
                Ok(())
            }
            (false, _) => Err("`lockstep devices` lists no emulated cuda:0".to_string()),
            (true, false) => Err("NVRTC is missing (see `lockstep devices --details`)".to_string()),
        }
    });
    if let Err(why) = &ready {
        assert!(
            std::env::var("LOCKSTEP_EXPECT_CUDA_EMULATOR").as_deref() != Ok("1"),
            "LOCKSTEP_EXPECT_CUDA_EMULATOR=1 but {why}\n{listing}"
        );
        eprintln!("\n*** SKIPPED: no emulated CUDA device: {why} ***\n");
    }
    ready.is_ok()
}

/// Each step's loss of `lockstep train <recipe> <placement>`, on the emulator's library path.
fn step_losses(placement: &[&str], recipe: &[&str], dir: &TempDir) -> Vec<f64> {
    launched_step_losses(&[], placement, recipe, dir)
}

/// As `step_losses`, the train command run by `lockstep <launcher…> train …` (e.g. `launch
/// --nproc-per-node 2 --`), or by itself when `launcher` is empty.
fn launched_step_losses(launcher: &[&str], placement: &[&str], recipe: &[&str], dir: &TempDir) -> Vec<f64> {
    step_losses_with_env(&[], launcher, placement, recipe, dir)
}

/// As `launched_step_losses`, with the environment variables `env` set for the run.
fn step_losses_with_env(
    env: &[(&str, &str)],
    launcher: &[&str],
    placement: &[&str],
    recipe: &[&str],
    dir: &TempDir,
) -> Vec<f64> {
    let settings: Vec<String> = env.iter().map(|(k, v)| format!("{k}={v}")).collect();
    let label = [
        &settings.iter().map(String::as_str).collect::<Vec<_>>(),
        launcher,
        placement,
    ]
    .concat()
    .join("_")
    .replace([':', ',', '-', '='], "_");
    let metrics = dir.join(&format!("{label}-{}.jsonl", recipe.join("_").replace(['-', '/'], "_")));
    let mut args = launcher.to_vec();
    args.push("train");
    args.extend_from_slice(recipe);
    args.extend_from_slice(placement);
    args.extend_from_slice(&["--log-every", "1", "--no-val", "--no-shuffle", "--headless"]);
    args.extend_from_slice(&["--metrics-out", path_str(&metrics)]);
    let out = run(on_emulator(&args).envs(env.iter().copied()));
    assert_succeeds(&out);
    logged_losses(&metrics)
}

/// A copy of this repository's README in `dir`, a text to train on (copied: nothing is written
/// beside the original).
fn readme_text(dir: &TempDir) -> PathBuf {
    let text = dir.join("readme.txt");
    std::fs::copy(concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md"), &text).unwrap();
    text
}

/// Every step's loss within `tolerance` (relative) of the CPU run's.
fn assert_follows(what: &str, cpu: &[f64], cuda: &[f64], steps: usize, tolerance: f64) {
    assert_eq!(cpu.len(), steps, "{what}: the CPU run's steps");
    assert_eq!(cuda.len(), steps, "{what}: the emulated CUDA run's steps");
    for (step, (c, g)) in cpu.iter().zip(cuda).enumerate() {
        assert!(
            (c - g).abs() <= tolerance * c.abs(),
            "{what}, step {}: cpu loss {c}, emulated cuda loss {g}",
            step + 1
        );
    }
}

#[test]
fn gpt_tiny_trains_on_emulated_cuda_as_on_the_cpu() {
    if !have_emulator() {
        return;
    }
    let dir = TempDir::new("cuda-emulator-gpt");
    let text = readme_text(&dir);
    for (precision, tolerance) in [("32", 1e-5), ("bf16-mixed", 2e-3)] {
        let recipe = [
            "--model",
            "gpt-tiny",
            "--dataset",
            "text",
            "--data",
            path_str(&text),
            "--batch-size",
            "4",
            "--max-steps",
            "6",
            "--precision",
            precision,
        ];
        let cpu = step_losses(&["--device", "cpu"], &recipe, &dir);
        let cuda = step_losses(&["--device", "cuda:0"], &recipe, &dir);
        // f32: other summation orders only; bf16-mixed: the fused attention's and the
        // products' roundings differ from the CPU's (about 1e-4 relative seen).
        assert_follows(&format!("gpt-tiny {precision}"), &cpu, &cuda, 6, tolerance);
        if precision == "bf16-mixed" {
            // Autocast's LayerNorms written in bf16 and residual adds reading bf16 (the fused
            // kernels) give the bits of the casts and ops they replace.
            let off = [("LOCKSTEP_AUTOCAST_FUSIONS", "off")];
            let composed = step_losses_with_env(&off, &[], &["--device", "cuda:0"], &recipe, &dir);
            assert_eq!(cuda, composed, "gpt-tiny bf16-mixed: fused against composed casts");
        }
    }
}

/// Six Adam steps of LeNet-5 on the MNIST in `data`, batch 32.
fn lenet5_recipe(data: &std::path::Path) -> [&str; 12] {
    [
        "--model",
        "lenet5",
        "--data",
        path_str(data),
        "--optimizer",
        "adam",
        "--lr",
        "0.001",
        "--batch-size",
        "32",
        "--max-steps",
        "6",
    ]
}

#[test]
fn lenet5_trains_on_emulated_cuda_alone_and_under_zero_2_beside_the_cpu() {
    if !have_emulator() {
        return;
    }
    let dir = TempDir::new("cuda-emulator-lenet5");
    let data = mnist_dir();
    let recipe = lenet5_recipe(&data);
    let cpu = step_losses(&["--device", "cpu"], &recipe, &dir);
    let cuda = step_losses(&["--device", "cuda:0"], &recipe, &dir);
    assert_follows("lenet5 on cuda:0", &cpu, &cuda, 6, 1e-5);
    let zero = step_losses(
        &["--devices", "cuda:0,cpu:0", "--no-balance", "--zero", "2"],
        &recipe,
        &dir,
    );
    assert_follows("lenet5 on cuda:0 + cpu:0 under ZeRO-2", &cpu, &zero, 6, 1e-5);
}

/// Data parallel over NCCL (the emulator's: two devices, ranks meeting in shared memory), as a
/// machine with two GPUs runs it: one process's replicas (ncclCommInitAll), under ZeRO-2 too
/// (reduce-scatter, all-gather), and two processes under `lockstep launch` with ZeRO-2, whose
/// checkpoint gathers rank 1's optimizer state by NCCL's point-to-point messages. Every step's
/// loss follows the CPU's, and the two ZeRO-2 checkpoints hold the same tensors, bit for bit.
#[test]
fn lenet5_data_parallel_over_nccl_on_two_emulated_gpus_follows_the_cpu() {
    if !have_emulator() {
        return;
    }
    let dir = TempDir::new("cuda-emulator-nccl");
    let data = mnist_dir();
    let recipe = lenet5_recipe(&data);
    let cpu = step_losses(&["--device", "cpu"], &recipe, &dir);
    let replicas = step_losses(&["--devices", "cuda:0,cuda:1"], &recipe, &dir);
    assert_follows("lenet5 on cuda:0,cuda:1 over NCCL", &cpu, &replicas, 6, 1e-5);
    let (threads, processes) = (dir.join("threads"), dir.join("processes"));
    let zero_2 = |checkpoints| ["--zero", "2", "--checkpoint-dir", path_str(checkpoints)];
    let placement = [&["--devices", "cuda:0,cuda:1"][..], &zero_2(&threads)].concat();
    let losses = step_losses(&placement, &recipe, &dir);
    assert_follows("lenet5 on cuda:0,cuda:1 under ZeRO-2 over NCCL", &cpu, &losses, 6, 1e-5);
    let port = support::free_port().to_string();
    let placement = [&["--device", "cuda"][..], &zero_2(&processes)].concat();
    let losses = launched_step_losses(&two_processes(&port), &placement, &recipe, &dir);
    assert_follows("lenet5 in 2 processes on NCCL under ZeRO-2", &cpu, &losses, 6, 1e-5);
    let checkpoint = |d: &PathBuf| checkpoint_tensors(&d.join("last.safetensors"));
    assert!(
        checkpoint(&processes) == checkpoint(&threads),
        "the processes' ZeRO-2 checkpoint differs from the threads'"
    );
}

/// `lockstep launch` of two processes, its rendezvous on `port` (a free one: not the default,
/// which other jobs may hold).
fn two_processes(port: &str) -> [&str; 6] {
    ["launch", "--nproc-per-node", "2", "--master-port", port, "--"]
}

/// SyncBatchNorm over NCCL: the batch statistics' all-reduces run on the training thread, on
/// their own communicator, while the gradients' run on the communication thread. In one process
/// and in two launched ones, each step's loss follows the CPU replicas'.
#[test]
fn sync_batchnorm_over_nccl_on_two_emulated_gpus_follows_the_cpu_replicas() {
    if !have_emulator() {
        return;
    }
    let dir = TempDir::new("cuda-emulator-sync-batchnorm");
    let data = mnist_dir();
    let recipe = [
        "--model",
        "convnet-bn",
        "--sync-batchnorm",
        "--data",
        path_str(&data),
        "--lr",
        "0.01",
        "--batch-size",
        "32",
        "--max-steps",
        "4",
    ];
    let cpu = step_losses(&["--devices", "cpu:0,cpu:1"], &recipe, &dir);
    let threads = step_losses(&["--devices", "cuda:0,cuda:1"], &recipe, &dir);
    assert_follows("convnet-bn on cuda:0,cuda:1 over NCCL", &cpu, &threads, 4, 1e-5);
    let port = support::free_port().to_string();
    let processes = launched_step_losses(&two_processes(&port), &["--device", "cuda"], &recipe, &dir);
    assert_follows("convnet-bn in 2 processes on NCCL", &cpu, &processes, 4, 1e-5);
}

/// A batch past the device's memory (here the emulator's, set to 64 MiB) ends the run with the
/// out-of-memory error that says what to try, never a panic, and the checkpoint an earlier run
/// wrote stays as it was (issue 51's GPU row, on the CUDA backend's own allocation path).
#[test]
fn a_batch_past_cuda_memory_says_what_to_try_and_keeps_the_checkpoint() {
    if !have_emulator() {
        return;
    }
    let dir = TempDir::new("cuda-emulator-oom");
    let text = readme_text(&dir);
    let train = |batch: &str, steps: &str| {
        let mut cmd = on_emulator(&[
            "train",
            "--device",
            "cuda:0",
            "--model",
            "gpt-tiny",
            "--dataset",
            "text",
            "--data",
            path_str(&text),
            "--no-val",
            "--headless",
            "--checkpoint-dir",
            path_str(dir.path()),
            "--batch-size",
            batch,
            "--max-steps",
            steps,
        ]);
        run(cmd.env("LOCKSTEP_CUDA_EMULATOR_MEMORY", (64u64 << 20).to_string()))
    };
    assert_succeeds(&train("1", "2"));
    let last = dir.join("last.safetensors");
    let before = std::fs::read(&last).expect("the small run's checkpoint");
    let out = train("4096", "1");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "a batch of 4096 fit in 64 MiB?\n{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    for part in [
        "cuda:0: a new tensor asks for ",
        " in use, more than the 64 MiB the device may hold",
        "--accumulate",
        "--activation-checkpointing",
        "--zero 2",
        "bf16-mixed",
    ] {
        assert!(stderr.contains(part), "the error lacks `{part}`:\n{stderr}");
    }
    assert!(std::fs::read(&last).unwrap() == before, "the checkpoint changed");
}
