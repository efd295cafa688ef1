//! `lockstep train --dataset text` and `lockstep sample` end to end: a GPT trains on a text the
//! test writes, its checkpoint samples the same text for the same seed (and other text for
//! another), and the wrong pairings are refused with the way out: a language model on images,
//! text for an image model, a prompt outside the vocabulary, sampling an image model. With
//! `--tokenizer gpt2` the text is tokenized once into a cache beside it, reused, remade when the
//! text changes, and `sample` decodes GPT-2 tokens.

mod support;

use std::path::Path;

use support::{TempDir, assert_fails_with, assert_succeeds, lockstep, run, stderr};

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

/// `lockstep train` of the smallest GPT on `text` with GPT-2's tokenizer, for `steps` steps;
/// its stderr.
fn train_gpt2(text: &Path, steps: &str, extra: &[&str]) -> String {
    #[rustfmt::skip]
    let mut args = vec![
        "train", "--headless", "--threads", "2", "--device", "cpu",
        "--model", "gpt-tiny", "--dataset", "text", "--data", path_str(text), "--tokenizer", "gpt2",
        "--block-size", "16", "--n-layer", "1", "--n-head", "1", "--n-embd", "8",
        "--batch-size", "4", "--max-steps", steps,
    ];
    args.extend_from_slice(extra);
    let out = run(&mut lockstep(&args));
    assert_succeeds(&out);
    stderr(&out)
}

#[test]
fn a_gpt_trains_on_gpt2_tokens_cached_beside_its_text_and_samples_decoded_text() {
    let dir = TempDir::new("gpt2-text");
    let text = write_text(&dir);
    let cache = dir.join("story.txt.gpt2.bin");
    let checkpoints = dir.join("ckpt");
    let first = train_gpt2(&text, "3", &["--checkpoint-dir", path_str(&checkpoints)]);
    assert!(
        first.contains("tokenized") && first.contains("story.txt.gpt2.bin"),
        "{first}"
    );
    let made = std::fs::metadata(&cache).expect("the cache beside the text");
    // The 32-byte header, then u16 ids: far fewer than the text's characters.
    let tokens = (made.len() - 32) / 2;
    assert!(first.contains(&format!("{tokens} tokens")), "{first}");
    assert!(
        tokens > 100 && tokens < std::fs::metadata(&text).unwrap().len() / 2,
        "{tokens}"
    );

    let second = train_gpt2(&text, "1", &["--no-val"]);
    assert!(
        !second.contains("tokenized") && second.contains("GPT-2 tokens of"),
        "{second}"
    );
    let reused = std::fs::metadata(&cache).unwrap();
    assert_eq!(
        reused.modified().unwrap(),
        made.modified().unwrap(),
        "the cache was reused, not rewritten"
    );

    // Another text: the stale cache is made again.
    std::fs::write(
        &text,
        "A different story, told in different words, again and again. ".repeat(30),
    )
    .unwrap();
    let third = train_gpt2(&text, "1", &["--no-val"]);
    assert!(third.contains("again") && third.contains("the text changed"), "{third}");
    assert_ne!(std::fs::metadata(&cache).unwrap().len(), made.len());

    let last = checkpoints.join("last.safetensors");
    let args = ["--prompt", "The quick brown", "--tokens", "12", "--seed", "3"];
    let sampled = sample(&last, &args);
    let generated = sampled
        .trim_end_matches('\n')
        .strip_prefix("The quick brown")
        .expect("the prompt first");
    assert!(!generated.is_empty(), "{sampled:?}");
    assert_eq!(sample(&last, &args), sampled, "one seed, one text");

    let out = run(&mut lockstep(&[
        "train",
        "--model",
        "gpt-tiny",
        "--dataset",
        "text",
        "--data",
        path_str(&text),
        "--tokenizer",
        "gpt2",
        "--vocab-size",
        "65",
    ]));
    assert_fails_with(
        &out,
        &["GPT-2's 50257 ids", "--vocab-size 65", "leave --vocab-size out"],
    );
    let out = run(&mut lockstep(&["train", "--tokenizer", "gpt2"]));
    assert_fails_with(&out, &["--tokenizer is for --dataset text"]);
}

/// `lockstep train --init-weights` takes a Hugging Face transformers GPT-2 file
/// (testdata/hf-gpt2, written by scripts/hf_gpt2_fixture.py) when the flags give its sizes,
/// trains from its weights with the tanh GELU (kept in the checkpoint), and otherwise says
/// which flags fit it.
#[test]
fn a_gpt_starts_from_hugging_face_gpt2_weights_sized_by_the_flags() {
    let dir = TempDir::new("gpt-hf");
    // nanoGPT's token files: little-endian u16 ids below the file's vocabulary of 65.
    let ids: Vec<u8> = (0..2000u32)
        .flat_map(|i| ((i * 7919 % 65) as u16).to_le_bytes())
        .collect();
    for bin in ["train.bin", "val.bin"] {
        std::fs::write(dir.join(bin), &ids).unwrap();
    }
    let weights = Path::new(env!("CARGO_MANIFEST_DIR")).join("../testdata/hf-gpt2/model.safetensors");
    let checkpoints = dir.join("ckpt");
    let train = |n_layer: &str| {
        #[rustfmt::skip]
        let args = [
            "train", "--headless", "--threads", "2", "--device", "cpu", "--no-val",
            "--model", "gpt-tiny", "--dataset", "text", "--data", path_str(dir.path()), "--vocab-size", "65",
            "--block-size", "16", "--n-layer", n_layer, "--n-head", "2", "--n-embd", "16",
            "--batch-size", "4", "--max-steps", "1", "--init-weights", path_str(&weights),
            "--checkpoint-dir", path_str(&checkpoints),
        ];
        run(&mut lockstep(&args))
    };
    assert_succeeds(&train("2"));
    let last = checkpoints.join("last.safetensors");
    let hparams = lockstep_core::train::checkpoint::hparams(&last).unwrap();
    assert_eq!(hparams.get("gelu").map(String::as_str), Some("tanh"));
    // One AdamW step (lr 1e-3) away from the file's weights, Conv1D [in, out] turned [out, in]
    // (a fresh model's would be ~0.02 wide, the file's ~0.3).
    let f32s = |file: &lockstep_core::train::checkpoint::TensorFile, name: &str| match &file.get(name).unwrap().data {
        lockstep_core::HostVec::F32(v) => v.clone(),
        other => panic!("{name}: {other:?}"),
    };
    let load = lockstep_core::train::checkpoint::load_tensors;
    let (ours, theirs) = (load(&last).unwrap(), load(&weights).unwrap());
    let name = "transformer.h.0.attn.c_attn.weight";
    let (ours, theirs) = (f32s(&ours, name), f32s(&theirs, name));
    for (o, row) in ours.chunks_exact(16).enumerate() {
        for (i, value) in row.iter().enumerate() {
            assert!((value - theirs[i * 48 + o]).abs() < 2e-3, "{name}[{o}, {i}]");
        }
    }

    // Resumed without the file, the model would fall back to the exact GELU: refused.
    #[rustfmt::skip]
    let resumed = [
        "train", "--headless", "--threads", "2", "--device", "cpu", "--no-val",
        "--model", "gpt-tiny", "--dataset", "text", "--data", path_str(dir.path()), "--vocab-size", "65",
        "--block-size", "16", "--n-layer", "2", "--n-head", "2", "--n-embd", "16",
        "--batch-size", "4", "--max-steps", "2", "--checkpoint-dir", path_str(&checkpoints), "--resume", "last",
    ];
    let out = run(&mut lockstep(&resumed));
    assert_fails_with(&out, &["was trained with gelu \"tanh\"", "\"exact\"", "--init-weights"]);

    let out = train("3");
    assert_fails_with(
        &out,
        &[
            "does not fit model gpt-tiny",
            "missing: transformer.h.2.ln_1.weight",
            "--n-layer 2 --n-embd 16 --block-size 16 --vocab-size 65",
        ],
    );
}
