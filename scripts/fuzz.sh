#!/usr/bin/env bash
# Coverage-guided fuzzing of every reader of outside bytes (fuzz/fuzz_targets/*.rs: MNIST's IDX
# files, checkpoints and weight files, the metrics log, CIFAR's records and archive, text, the
# rendezvous wire protocol) and of the command line (its flags, --config files and launcher
# variables) on the STABLE toolchain: the fuzz crate is built with the
# instrumentation `cargo fuzz` uses with `--sanitizer none` (SanitizerCoverage passes, `--cfg
# fuzzing`, debug assertions and overflow checks), and each target's libFuzzer runs for a
# bounded time. The heap is bounded by the crate's allocator (lockstep_fuzz::HEAP_LIMIT), memory
# by -rss_limit_mb, time per input by -timeout.
#
# The committed seeds in fuzz/corpus/<target>/ are inputs only: what a run adds goes to a
# scratch directory, so the repository stays clean. A crash, panic, timeout or out-of-memory
# fails the script and leaves its input in fuzz/artifacts/<target>/ (printed); to rerun it:
# fuzz/target/<host>/release/<target> <artifact>. Keep it as a regression: fuzz/regressions/.
#
# With cargo-fuzz and a nightly toolchain, the same layout also runs as
# `cargo fuzz run <target>` (with AddressSanitizer) from the repository root.
#
# Usage: bash scripts/fuzz.sh [seconds-per-target] [target...]   (default: 20 s, every target)
set -euo pipefail
cd "$(dirname "$0")/.."

seconds=${1:-20}
shift || true
if [ $# -gt 0 ]; then
    targets=("$@")
else
    targets=()
    for f in fuzz/fuzz_targets/*.rs; do targets+=("$(basename "$f" .rs)"); done
fi

# The largest input each target tries (-max_len): room for its seeds and their mutations, and
# small enough that what the readers legitimately inflate from it stays far below the bound.
max_len() {
    case "$1" in
        mnist_idx) echo 8192 ;;
        checkpoint) echo 16384 ;;
        metrics_jsonl) echo 8192 ;;
        cifar) echo 16384 ;;
        text) echo 4096 ;;
        rendezvous_wire) echo 4096 ;;
        *) echo 4096 ;;
    esac
}

host=$(rustc -vV | sed -n 's/^host: //p')
echo "== build (stable, SanitizerCoverage instrumentation, $host)"
cargo --version
# --target keeps the instrumentation off build scripts and proc macros, as cargo fuzz does.
build_start=$(date +%s)
RUSTFLAGS="${RUSTFLAGS:-} -Cpasses=sancov-module -Cllvm-args=-sanitizer-coverage-level=4 \
-Cllvm-args=-sanitizer-coverage-inline-8bit-counters -Cllvm-args=-sanitizer-coverage-pc-table \
-Cllvm-args=-sanitizer-coverage-trace-compares --cfg fuzzing -Cdebug-assertions -Coverflow-checks" \
    cargo build --release --manifest-path fuzz/Cargo.toml --target "$host" --bins
echo "built in $(($(date +%s) - build_start)) s"

scratch=$(mktemp -d "${TMPDIR:-/tmp}/lockstep-fuzz.XXXXXX")
trap 'rm -rf "$scratch"' EXIT
failed=()
for t in "${targets[@]}"; do
    bin="fuzz/target/$host/release/$t"
    [ -x "$bin" ] || { echo "no fuzz target $t (fuzz/fuzz_targets/$t.rs)" >&2; exit 2; }
    mkdir -p "$scratch/$t" "fuzz/artifacts/$t"
    echo "== $t: ${seconds} s, max_len $(max_len "$t")"
    log="$scratch/$t.log"
    # New inputs go to the first directory (scratch); the seeds are only read.
    status=0
    "$bin" "$scratch/$t" "fuzz/corpus/$t" \
        -max_total_time="$seconds" -rss_limit_mb=1024 -timeout=10 -max_len="$(max_len "$t")" \
        -artifact_prefix="fuzz/artifacts/$t/" -print_final_stats=1 >"$log" 2>&1 || status=$?
    grep -E '^#[0-9]+[[:space:]]+(INITED|DONE)' "$log" || true
    grep -E '^stat::(number_of_executed_units|average_exec_per_sec|peak_rss_mb)' "$log" || true
    if [ "$status" -ne 0 ]; then
        tail -n 60 "$log"
        artifact=$(sed -n 's/.*Test unit written to \(.*\)$/\1/p' "$log" | tail -n 1)
        echo "!! $t failed (exit $status): input in ${artifact:-fuzz/artifacts/$t/}" >&2
        failed+=("$t")
    fi
done

if [ ${#failed[@]} -gt 0 ]; then
    echo "fuzzing found problems in: ${failed[*]}" >&2
    exit 1
fi
echo "fuzzing: ${#targets[@]} targets, no crash, panic, timeout or excess allocation in ${seconds} s each"
