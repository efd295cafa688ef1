# GPT-2 on cuda:0: the conformance suite with the fused attention forced (the default steps aside
# silently where its start-up check fails), in one stage and pipelined, the attention kernels at
# GPT-2's sizes, a GPT-2 124M bf16-mixed step beside PyTorch eager and torch.compile, our step
# again on the composed attention, on the pipelined attention and with autocast's casts
# unfused, where the step's GPU time goes, and (where Nsight Compute is installed) why the
# attention kernels take what they take; wgpu's product tier with its self-test report.
# Sourced by sweep.sh; `$tests` (optional) is a directory of CUDA test binaries.
step devices 60 "$bin" devices --details
step check-cuda-fused 150 env LOCKSTEP_CUDA_ATTENTION=fused "$bin" check --device cuda:0 --failures-only
step check-cuda-fused-pipelined 150 env LOCKSTEP_CUDA_ATTENTION=fused LOCKSTEP_CUDA_ATTENTION_STAGES=2 "$bin" check --device cuda:0 --failures-only
for t in ${tests:+"$tests"/*}; do
    [ -x "$t" ] && step "test-$(basename "$t")" 90 env LOCKSTEP_EXPECT_CUDA=1 "$t" --test-threads=1
done
[ -n "$wgpu" ] && step check-wgpu 60 "$bin" check --device "$wgpu" --failures-only
step gpt2-peer 200 "$bin" bench gpt --device cuda:0 --model gpt2 --batch 16 --precision bf16-mixed --peer pytorch --json "$out/gpt2-peer.json"
step gpt2-composed-attention 60 env LOCKSTEP_CUDA_ATTENTION=composed "$bin" bench gpt --device cuda:0 --model gpt2 --batch 16 --precision bf16-mixed --json "$out/gpt2-composed.json"
# The attention kernels in two stages (the next tile's copies in flight while a block works on
# this one): the default becomes whichever build is faster here.
step gpt2-pipelined-attention 60 env LOCKSTEP_CUDA_ATTENTION_STAGES=2 "$bin" bench gpt --device cuda:0 --model gpt2 --batch 16 --precision bf16-mixed --json "$out/gpt2-pipelined.json"
# Autocast's casts as separate launches again (LayerNorm then a cast, a cast then the residual
# add): what the mixed-dtype fusions take off the step.
step gpt2-autocast-composed 60 env LOCKSTEP_AUTOCAST_FUSIONS=off "$bin" bench gpt --device cuda:0 --model gpt2 --batch 16 --precision bf16-mixed --json "$out/gpt2-autocast-composed.json"
# Where the step's GPU time goes, by our kernels' own names: one more step with each launch and
# cuBLAS product timed alone (Backend::profile_kernels), its 40 longest listed.
step gpt2-kernels 90 "$bin" bench gpt --device cuda:0 --model gpt2 --batch 16 --precision bf16-mixed --kernels 40
step gpt2-kernels-pipelined 90 env LOCKSTEP_CUDA_ATTENTION_STAGES=2 "$bin" bench gpt --device cuda:0 --model gpt2 --batch 16 --precision bf16-mixed --kernels 40
# Why the attention kernels take what they take: Nsight Compute on one forward, dQ and dK/dV
# launch of each build at GPT-2's sizes (the 3 start-up check launches and 11 of the first
# step's 12 forward ones skipped): throughput against the peaks, occupancy, warp stalls.
attention_kernels='regex:^causal_attention_(dq_|dkdv_)?(pipelined_)?bf16_d64$'
if command -v ncu >/dev/null; then
    for stages in 1 2; do
        step "attention-ncu-stages$stages" 150 env LOCKSTEP_CUDA_ATTENTION_STAGES=$stages ncu -k "$attention_kernels" \
            --launch-skip 14 --launch-count 3 --section SpeedOfLight --section Occupancy --section WarpStateStats \
            --section MemoryWorkloadAnalysis "$bin" bench gpt --device cuda:0 --model gpt2 --batch 16 \
            --precision bf16-mixed
    done
    # The memory-bound kernels beside them (bias + GELU, LayerNorm, the bias gradients' column
    # sums, the residual adds, the casts): 24 launches from the second step on, each against
    # the GPU's memory and compute peaks, so an ALU-bound one (integer division per element,
    # software bf16 rounding) shows as such.
    step elementwise-ncu 150 ncu -k 'regex:^(bias_act|layer_norm|reduce_columns|binary|cast_)' \
        --launch-skip 400 --launch-count 24 --section SpeedOfLight "$bin" bench gpt --device cuda:0 \
        --model gpt2 --batch 16 --precision bf16-mixed
fi
