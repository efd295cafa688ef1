#!/usr/bin/env bash
# A batch past the device's memory (issue 51): the run must end with Lockstep's out-of-memory
# error (the op, the bytes asked and in use, what to try), not a panic, and leave the checkpoint
# an earlier run wrote byte for byte as it was.
#
#   scripts/gpu/out_of_memory.sh BIN DEVICE DIR MODEL BATCH [TRAIN ARGS...]
#
# e.g. `out_of_memory.sh lockstep cuda:0 /tmp/oom gpt2 2048` on an 80-141 GiB GPU, or on a CPU
# `out_of_memory.sh lockstep cpu:0 /tmp/oom gpt-tiny 4096 --device-memory-limit 64`.
set -uo pipefail
bin="${1:?usage: out_of_memory.sh BIN DEVICE DIR MODEL BATCH [TRAIN ARGS...]}"
device="$2" dir="$3" model="$4" batch="$5"
shift 5
root="$(cd "$(dirname "$0")/../.." && pwd)"
mkdir -p "$dir"
run=("$bin" train --device "$device" --model "$model" --dataset text --data "$root/README.md"
    --no-val --headless --checkpoint-dir "$dir/checkpoints" "$@")
if ! "${run[@]}" --batch-size 1 --max-steps 2 >"$dir/small.log" 2>&1; then
    cat "$dir/small.log"
    echo "FAIL: the small run that writes the checkpoint failed"
    exit 1
fi
last="$dir/checkpoints/last.safetensors"
before="$(sha256sum <"$last")"
"${run[@]}" --batch-size "$batch" --max-steps 1 >"$dir/huge.log" 2>&1
status=$?
cat "$dir/huge.log"
failed=0
fail() { echo "FAIL: $*"; failed=1; }
[ "$status" -ne 0 ] || fail "a batch of $batch fit on $device"
! grep -q panicked "$dir/huge.log" || fail "the run panicked"
for part in " asks for " " in use" "--accumulate" "--activation-checkpointing" "--zero 2" "bf16-mixed"; do
    grep -qF -- "$part" "$dir/huge.log" || fail "the error lacks '$part'"
done
[ "$before" = "$(sha256sum <"$last")" ] || fail "the checkpoint changed"
[ "$failed" = 0 ] && echo "ok: out of memory on $device explained itself (exit $status), the checkpoint is intact"
exit "$failed"
