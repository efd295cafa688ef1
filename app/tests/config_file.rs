//! `lockstep train --config run.toml` and `--print-config`, as Lightning CLI's `--config` and
//! `--print_config`: the printed file reads back to the same flags, the command line overrides
//! the file, a run takes its flags from it, and a wrong key names the file and the key.

mod support;

use support::{TempDir, assert_fails_with, assert_succeeds, lockstep, mnist_dir, run};

fn printed(args: &[&str]) -> String {
    let mut all = vec!["train", "--print-config"];
    all.extend_from_slice(args);
    let out = run(&mut lockstep(&all));
    assert_succeeds(&out);
    String::from_utf8(out.stdout).expect("UTF-8")
}

fn path_str(p: &std::path::Path) -> &str {
    p.to_str().expect("a UTF-8 temp path")
}

#[test]
fn the_printed_config_reads_back_to_itself_and_the_command_line_wins() {
    let dir = TempDir::new("print-config");
    let text = printed(&[
        "--batch-size",
        "32",
        "--devices",
        "cpu:0,cpu:1",
        "--lr",
        "0.05",
        "--headless",
    ]);
    for line in [
        "batch_size = 32",
        "devices = [\"cpu:0\", \"cpu:1\"]",
        "lr = 0.05",
        "headless = true",
        "epochs = 1",
    ] {
        assert!(text.lines().any(|l| l == line), "no `{line}` in:\n{text}");
    }
    assert!(
        text.contains("# max_steps = (not set)"),
        "unset flags are listed:\n{text}"
    );
    // Like --print-config, --estimate-memory is what a command does, not a setting of the run:
    // a saved config must not turn every later run into an estimate.
    assert!(!text.contains("estimate_memory"), "{text}");
    let file = dir.join("run.toml");
    std::fs::write(&file, &text).unwrap();
    assert_eq!(
        printed(&["--config", path_str(&file)]),
        text,
        "a printed config reads back to itself"
    );

    let overridden = printed(&["--config", path_str(&file), "--batch-size", "64", "--devices", "cpu:0"]);
    assert!(overridden.lines().any(|l| l == "batch_size = 64"), "{overridden}");
    assert!(overridden.lines().any(|l| l == "devices = [\"cpu:0\"]"), "{overridden}");
    assert!(
        overridden.lines().any(|l| l == "lr = 0.05"),
        "the file's other keys stay:\n{overridden}"
    );
}

#[test]
fn a_run_takes_its_flags_from_the_file() {
    let dir = TempDir::new("run-config");
    let summary = dir.join("summary.json");
    let file = dir.join("run.toml");
    let config = format!(
        "data = {:?}\nmodel = \"mlp\"\nhidden = [32]\nmax_steps = 7\nno_val = true\nheadless = true\n\
         test_samples = 500\nthreads = 2\nsummary_out = {:?}\n",
        path_str(&mnist_dir()),
        path_str(&summary)
    );
    std::fs::write(&file, config).unwrap();
    let out = run(&mut lockstep(&[
        "train",
        "--config",
        path_str(&file),
        "--max-steps",
        "5",
    ]));
    assert_succeeds(&out);
    let json: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&summary).unwrap()).unwrap();
    assert_eq!(
        json["steps"], 5,
        "the command line's --max-steps wins over the file's: {json}"
    );
}

#[test]
fn a_wrong_key_or_value_names_the_file_and_the_key() {
    let dir = TempDir::new("bad-config");
    let file = dir.join("run.toml");
    std::fs::write(&file, "batch_sise = 64\n").unwrap();
    let out = run(&mut lockstep(&["train", "--config", path_str(&file)]));
    assert_fails_with(
        &out,
        &[
            "run.toml",
            "`batch_sise` is not a flag of `lockstep train`",
            "--print-config",
        ],
    );

    std::fs::write(&file, "headless = \"yes\"\n").unwrap();
    let out = run(&mut lockstep(&["train", "--config", path_str(&file)]));
    assert_fails_with(&out, &["run.toml", "`headless`", "true or false"]);

    std::fs::write(&file, "epochs = [\n").unwrap();
    let out = run(&mut lockstep(&["train", "--config", path_str(&file)]));
    assert_fails_with(&out, &["run.toml", "not valid TOML"]);

    let out = run(&mut lockstep(&[
        "train",
        "--config",
        path_str(&dir.join("missing.toml")),
    ]));
    assert_fails_with(&out, &["cannot read the config file", "missing.toml"]);
}
