# GPT-2 on cuda:0: the conformance suite with the fused attention forced (the default steps aside
# silently where its start-up check fails), the attention kernels at GPT-2's sizes, a GPT-2 124M
# bf16-mixed step beside PyTorch eager and torch.compile, our step again on the composed
# attention and with autocast's casts unfused, and where the step's GPU time goes; wgpu's
# product tier with its self-test report.
# Sourced by sweep.sh; `$tests` (optional) is a directory of CUDA test binaries.
step devices 60 "$bin" devices --details
step check-cuda-fused 150 env LOCKSTEP_CUDA_ATTENTION=fused "$bin" check --device cuda:0 --failures-only
for t in ${tests:+"$tests"/*}; do
    [ -x "$t" ] && step "test-$(basename "$t")" 90 env LOCKSTEP_EXPECT_CUDA=1 "$t" --test-threads=1
done
[ -n "$wgpu" ] && step check-wgpu 60 "$bin" check --device "$wgpu" --failures-only
step gpt2-peer 200 "$bin" bench gpt --device cuda:0 --model gpt2 --batch 16 --precision bf16-mixed --peer pytorch --json "$out/gpt2-peer.json"
step gpt2-composed-attention 60 env LOCKSTEP_CUDA_ATTENTION=composed "$bin" bench gpt --device cuda:0 --model gpt2 --batch 16 --precision bf16-mixed --json "$out/gpt2-composed.json"
# Autocast's casts as separate launches again (LayerNorm then a cast, a cast then the residual
# add): what the mixed-dtype fusions take off the step.
step gpt2-autocast-composed 60 env LOCKSTEP_AUTOCAST_FUSIONS=off "$bin" bench gpt --device cuda:0 --model gpt2 --batch 16 --precision bf16-mixed --json "$out/gpt2-autocast-composed.json"
# Where the step's GPU time goes, by our kernels' own names: one more step with each launch and
# cuBLAS product timed alone (Backend::profile_kernels), its 40 longest listed.
step gpt2-kernels 90 "$bin" bench gpt --device cuda:0 --model gpt2 --batch 16 --precision bf16-mixed --kernels 40
