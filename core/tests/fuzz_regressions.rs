//! Every input kept in fuzz/regressions/<target>/ (inputs that once crashed a reader, and
//! hand-made adversarial ones) goes through the fuzz target's own harness, which must return:
//! the readers may refuse it with an error, never panic, hang or allocate past the fuzzing bound
//! (`HEAP_LIMIT`, which this test's allocator enforces as the fuzzers' does). To add one:
//! copy the input from fuzz/artifacts/<target>/ to fuzz/regressions/<target>/<what-it-is>.

use std::path::Path;

#[path = "../../fuzz/src/lib.rs"]
#[allow(dead_code)]
mod harness;

/// Targets whose harness needs more than the core: `command_line` replays in
/// flags/tests/fuzz_regressions.rs.
const REPLAYED_ELSEWHERE: [&str; 1] = ["command_line"];

#[test]
fn every_fuzz_regression_input_is_read_without_panicking() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/regressions");
    let mut targets: Vec<_> = std::fs::read_dir(&root)
        .unwrap_or_else(|e| panic!("{}: {e}", root.display()))
        .map(|e| e.unwrap().path())
        .collect();
    targets.sort();
    let (mut inputs, mut panicked) = (0, Vec::new());
    for dir in targets {
        let target = dir.file_name().unwrap().to_string_lossy().into_owned();
        if REPLAYED_ELSEWHERE.contains(&target.as_str()) {
            continue;
        }
        let mut files: Vec<_> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().path()).collect();
        files.sort();
        for file in files {
            let data = std::fs::read(&file).unwrap();
            match std::panic::catch_unwind(|| harness::run(&target, &data)) {
                Ok(true) => {}
                Ok(false) => panic!("{}: no fuzz target `{target}`", dir.display()),
                Err(_) => panicked.push(file.display().to_string()),
            }
            inputs += 1;
        }
    }
    assert!(panicked.is_empty(), "readers panicked on: {panicked:#?}");
    assert!(inputs >= 5, "only {inputs} regression inputs under {}", root.display());
}
