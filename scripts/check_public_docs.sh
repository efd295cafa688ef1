#!/usr/bin/env bash
# Fails when lockstep-core's documentation shows an internal item: the crate's own plumbing
# (autograd nodes, what #[derive(Module)] calls, checkpoint writing, the conformance oracles'
# host arrays, …) is crate-private or #[doc(hidden)], so a user does not build on it.
#
#   scripts/check_public_docs.sh [DOC_DIR]     (default target/doc/lockstep_core)
#
# Run after `cargo doc --no-deps`. It reads all.html, which every doc build writes anew, rather
# than testing for the pages themselves: a page an earlier build left behind stays in target/doc.
# An entry ending in / stands for every item under that module.
set -euo pipefail
cd "$(dirname "$0")/.."
doc="${1:-target/doc/lockstep_core}"
listing="$doc/all.html"
[ -f "$listing" ] || { echo "no $listing: run cargo doc --no-deps first" >&2; exit 1; }

internal=(
    __private/
    autograd/struct.Node.html
    autograd/type.BackwardFn.html
    nn/trait.Child.html
    nn/fn.remap.html
    nn/fn.remap_opt.html
    nn/fn.join_name.html
    nn/fn.describe_tree.html
    nn/fn.name_failing_layer.html
    conformance/host/
    conformance/type.Oracle.html
    conformance/fn.logical_inputs.html
    conformance/fn.dims_label.html
    conformance/fn.output_weights.html
    conformance/fn.evaluate.html
    conformance/fn.compare.html
    conformance/struct.Observed.html
    conformance/struct.Comparison.html
    conformance/enum.Pass.html
    train/fn.forward_backward.html
    train/fn.each_replica.html
    train/fn.batchnorm_groups.html
    train/checkpoint/fn.write_atomically.html
    train/checkpoint/fn.host_to_device.html
    train/checkpoint/fn.remove_stale_temporaries.html
    train/checkpoint/constant.FORMAT.html
    train/checkpoint/constant.FORMAT_KEY.html
    data/augment/fn.render.html
    data/augment/struct.Placement.html
    rng/fn.philox4x32.html
    rng/fn.philox4x32_lanes.html
    rng/fn.stream_words.html
    rng/fn.keep_threshold.html
    rng/fn.unit_float.html
    rng/fn.uniform_block.html
    rng/fn.normal_block.html
    rng/struct.BatchWindow.html
    rng/struct.BatchWindowGuard.html
    rng/struct.StreamPlace.html
    distributed/fn.verify_same_model.html
    distributed/fn.all_gather_strings.html
    distributed/fn.all_gather_values.html
    distributed/fn.adopt_rank0_streams.html
    distributed/fn.check_replicas.html
    distributed/fn.find_drift.html
    distributed/struct.Drift.html
    distributed/fn.proportional_shares.html
    distributed/fn.rebalanced.html
    distributed/fn.step_seconds.html
    distributed/constant.MIN_GAIN.html
    distributed/rendezvous/wire/
    backend/gpu_plan/
    limits/fn.ram_and_swap.html
    limits/fn.read_file_that_fits.html
    macro.map_host_vec.html
)

shown=()
for page in "${internal[@]}"; do
    if grep -qF "href=\"$page" "$listing"; then
        shown+=("$page")
    fi
done
if [ "${#shown[@]}" -gt 0 ]; then
    echo "lockstep-core's documentation shows internals (make them pub(crate) or #[doc(hidden)]):" >&2
    printf '  %s\n' "${shown[@]}" >&2
    exit 1
fi
echo "lockstep-core's documentation shows none of its ${#internal[@]} internals"
