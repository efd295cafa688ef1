//! `lockstep train --model gpt-tiny --pipeline-stages 2 --devices cpu:0,cpu:1`: the head's stage
//! holds a copy of the token embedding; 20 AdamW steps clipped by the global norm end with the
//! one-device run's weights within 1e-5 under the same nanoGPT names, both copies of the tied
//! weight equal.

mod support;

use std::path::Path;

use support::mpi::{checkpoint_tensors, path_str};
use support::{TempDir, assert_succeeds, lockstep, run};

/// The model's width.
const N_EMBD: usize = 32;

/// The weights (by name) after 20 steps of a one-layer gpt-tiny without dropout, with `extra`.
fn weights(dir: &TempDir, text: &Path, name: &str, extra: &[&str]) -> Vec<(String, Vec<f64>)> {
    let out = dir.join(name);
    let width = N_EMBD.to_string();
    #[rustfmt::skip]
    let mut args = vec![
        "train", "--headless", "--threads", "1", "--no-val",
        "--model", "gpt-tiny", "--dataset", "text", "--data", path_str(text),
        "--block-size", "16", "--n-layer", "2", "--n-embd", &width, "--dropout", "0", "--batch-size", "8",
        "--max-steps", "20", "--clip-grad-norm", "0.5", "--dump-weights", path_str(&out),
    ];
    args.extend_from_slice(extra);
    assert_succeeds(&run(&mut lockstep(&args)));
    checkpoint_tensors(&out.join("rank0.safetensors"))
}

#[test]
fn a_gpt_in_two_pipeline_stages_ends_with_one_device_s_weights() {
    let dir = TempDir::new("gpt-pipeline");
    let text = dir.join("story.txt");
    std::fs::write(
        &text,
        "All that glitters is not gold; all who wander are not lost.\n".repeat(20),
    )
    .unwrap();
    let one = weights(&dir, &text, "one", &["--device", "cpu"]);
    #[rustfmt::skip]
    let staged = weights(&dir, &text, "staged", &[
        "--pipeline-stages", "2", "--devices", "cpu:0,cpu:1", "--micro-batches", "1", "--schedule", "gpipe",
    ]);
    let names = |w: &[(String, Vec<f64>)]| w.iter().map(|(n, _)| n.clone()).collect::<Vec<_>>();
    assert_eq!(names(&staged), names(&one), "the same nanoGPT names");
    for ((name, got), (_, want)) in staged.iter().zip(&one) {
        let scale = want.iter().fold(0f64, |m, x| m.max(x.abs()));
        for (i, (a, b)) in got.iter().zip(want).enumerate() {
            // The key bias (c_attn's second third) has a zero gradient in exact arithmetic (a
            // softmax ignores a shift common to its row), so it moves by rounding noise that
            // AdamW's 1/(sqrt(v) + eps) amplifies; the two runs sum the clipping norm's parts
            // in another order (by device), so that noise differs: compared absolutely.
            let key_bias = name.ends_with("attn.c_attn.bias") && (N_EMBD..2 * N_EMBD).contains(&i);
            let tolerance = if key_bias { 1e-6 } else { 1e-5 * scale };
            assert!(
                (a - b).abs() <= tolerance,
                "{name}[{i}]: {a} in two stages, {b} on one device"
            );
        }
    }
    let tensor = |name: &str| &staged.iter().find(|(n, _)| n == name).unwrap().1;
    assert!(
        tensor("transformer.wte.weight") == tensor("lm_head.weight"),
        "the stages' copies of the tied weight differ"
    );
}
