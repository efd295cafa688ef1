#!/usr/bin/env bash
# Many variants in one GPU call: runs each `step` of a plan file (a bash file of
# `step NAME SECONDS COMMAND...` lines, see scripts/gpu/plans/) with the environment verify.sh
# gives its steps, and writes REPORT_DIR/steps.tsv with each step's log in REPORT_DIR/logs.
#
#   scripts/gpu/sweep.sh REPORT_DIR PLAN [--bin PATH] [--tests DIR]
#
# The plan sees `$bin` (the lockstep binary), `$tests` (a directory of test binaries, or empty),
# `$wgpu` (the wgpu device on the NVIDIA GPU, empty where Vulkan found none) and `$out`. LOCKSTEP_STEP_LIMIT=SECONDS caps every step's limit.
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"

out="${1:?usage: sweep.sh REPORT_DIR PLAN [--bin PATH]}"
plan="${2:?usage: sweep.sh REPORT_DIR PLAN [--bin PATH]}"
shift 2
bin="$root/target/release/lockstep"
tests=""
while [ $# -gt 0 ]; do
    case "$1" in
        --bin) bin="$2"; shift 2 ;;
        --tests) tests="$2"; shift 2 ;;
        *) echo "sweep.sh: unknown argument $1" >&2; exit 2 ;;
    esac
done
mkdir -p "$out/logs"
out="$(cd "$out" && pwd)"
python="${LOCKSTEP_PYTHON:-python3}"
only=""

# shellcheck source=scripts/gpu/lib.sh
. "$here/lib.sh"

wgpu=$("$bin" devices 2>/dev/null | grep -E 'NVIDIA|H100|H200' | grep -o 'wgpu:[0-9]\+' | head -n 1)
# shellcheck source=/dev/null
. "$plan"
awk -F'\t' '{ printf "%-34s exit %-4s %7ss\n", $1, $2, $3 }' "$out/steps.tsv"
