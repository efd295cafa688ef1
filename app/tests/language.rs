//! `lockstep train --dataset text` and `lockstep sample` end to end: a GPT trains on a text the
//! test writes, its checkpoint samples the same text for the same seed (and other text for
//! another), and the wrong pairings are refused with the way out: a language model on images,
//! text for an image model, a prompt outside the vocabulary, sampling an image model.

mod support;

use std::path::Path;

use support::{TempDir, assert_fails_with, assert_succeeds, lockstep, run};

fn path_str(p: &Path) -> &str {
    p.to_str().expect("scratch paths are UTF-8")
}

/// A few thousand characters of varied English.
fn write_text(dir: &TempDir) -> std::path::PathBuf {
    let path = dir.join("story.txt");
    let lines = [
        "The quick brown fox jumps over the lazy dog.",
        "A journey of a thousand miles begins with a single step.",
        "All that glitters is not gold; all who wander are not lost.",
        "Better late than never, but never late is better.",
    ];
    std::fs::write(&path, lines.join("\n").repeat(20)).unwrap();
    path
}

/// `lockstep sample` on `checkpoint` with `extra` flags; its stdout.
fn sample(checkpoint: &Path, extra: &[&str]) -> String {
    let mut args = vec!["sample", "--checkpoint", path_str(checkpoint), "--device", "cpu"];
    args.extend_from_slice(extra);
    let out = run(&mut lockstep(&args));
    assert_succeeds(&out);
    String::from_utf8(out.stdout).expect("UTF-8 text")
}

#[test]
fn a_gpt_trains_on_a_text_file_and_its_checkpoint_samples_text_in_its_vocabulary() {
    let dir = TempDir::new("gpt-text");
    let text = write_text(&dir);
    let checkpoints = dir.join("ckpt");
    #[rustfmt::skip]
    let out = run(&mut lockstep(&[
        "train", "--headless", "--threads", "2", "--device", "cpu",
        "--model", "gpt-tiny", "--dataset", "text", "--data", path_str(&text),
        "--block-size", "32", "--n-layer", "1", "--batch-size", "8", "--max-steps", "10",
        "--checkpoint-dir", path_str(&checkpoints),
    ]));
    assert_succeeds(&out);
    let last = checkpoints.join("last.safetensors");
    let story = std::fs::read_to_string(&text).unwrap();

    let first = sample(
        &last,
        &["--prompt", "The ", "--tokens", "60", "--seed", "3", "--top-k", "10"],
    );
    let again = sample(
        &last,
        &["--prompt", "The ", "--tokens", "60", "--seed", "3", "--top-k", "10"],
    );
    let other = sample(
        &last,
        &["--prompt", "The ", "--tokens", "60", "--seed", "4", "--top-k", "10"],
    );
    let generated = first
        .trim_end_matches('\n')
        .strip_prefix("The ")
        .expect("the prompt first");
    assert_eq!(generated.chars().count(), 60, "{first:?}");
    assert!(generated.chars().all(|c| story.contains(c)), "{first:?}");
    assert_eq!(first, again, "one seed, one text");
    assert_ne!(first, other, "another seed, another text");

    let out = run(&mut lockstep(&[
        "sample",
        "--checkpoint",
        path_str(&last),
        "--prompt",
        "Zebra",
        "--device",
        "cpu",
    ]));
    assert_fails_with(&out, &["prompt does not fit", "'Z'"]);
}

#[test]
fn language_models_and_text_pair_only_with_each_other_and_sampling_needs_a_language_model() {
    let dir = TempDir::new("gpt-pairs");
    let text = write_text(&dir);
    let out = run(&mut lockstep(&["train", "--model", "gpt-tiny", "--dataset", "mnist"]));
    assert_fails_with(&out, &["gpt-tiny is a language model", "--dataset text"]);
    let out = run(&mut lockstep(&[
        "train",
        "--model",
        "mlp",
        "--dataset",
        "text",
        "--data",
        path_str(&text),
    ]));
    assert_fails_with(&out, &["--dataset text is for the language models", "gpt-tiny"]);
    let out = run(&mut lockstep(&["train", "--model", "gpt-tiny", "--dataset", "text"]));
    assert_fails_with(&out, &["--dataset text needs --data FILE"]);

    // A checkpoint of an image model holds no vocabulary to sample from.
    let checkpoints = dir.join("mlp");
    let mnist = support::mnist_dir();
    #[rustfmt::skip]
    let out = run(&mut lockstep(&[
        "train", "--headless", "--device", "cpu", "--model", "mlp", "--hidden", "8",
        "--data", path_str(&mnist), "--max-steps", "2", "--test-samples", "10",
        "--checkpoint-dir", path_str(&checkpoints),
    ]));
    assert_succeeds(&out);
    let out = run(&mut lockstep(&[
        "sample",
        "--checkpoint",
        path_str(&checkpoints.join("last.safetensors")),
        "--device",
        "cpu",
    ]));
    assert_fails_with(&out, &["holds mlp, not a language model", "gpt-tiny"]);
}
