# The cooperative-matrix tier on wgpu (issue 49), first thing on the next NVIDIA GPU: does our
# SPIR-V (workgroup-memory accesses non-private under the Vulkan memory model naga declares)
# pass the self-test where wgpu's translation failed it (session 59's H200), and how fast is it.
# About 9 minutes. Sourced by sweep.sh; `--tests DIR` should hold the release build of
# backend-wgpu's cooperative_probe and cooperative test binaries.
step devices 60 "$bin" devices --details
step devices-wgpu-translation 60 env LOCKSTEP_WGPU_COOP_SPIRV=wgpu "$bin" devices --details
if [ -n "$tests" ]; then
    for t in "$tests"/cooperative*; do
        [ -x "$t" ] || continue
        step "test-$(basename "$t")" 120 env LOCKSTEP_EXPECT_WGPU=1 "$t" --nocapture --test-threads=1
    done
fi
# Each tile of our SPIR-V (the self-test takes the first that computes right), then wgpu's
# translation of the default one.
for tile in g2f4 g2f2 g1f2; do
    step "gemm-f16-coop-$tile" 60 env LOCKSTEP_WGPU_COOP_TILE=$tile "$bin" bench gemm --device "$wgpu" --gemm-dtype f16 --sizes 4096,8192 --json "$out/gemm-f16-coop-$tile.json"
done
step gemm-f16-coop-wgpu-translation 60 env LOCKSTEP_WGPU_COOP_SPIRV=wgpu "$bin" bench gemm --device "$wgpu" --gemm-dtype f16 --sizes 4096,8192 --json "$out/gemm-f16-coop-wgpu-translation.json"
# bf16 on the tier by default (rows and columns scaled into f16's range); =f16 keeps it on SIMT.
for coop in bf16 f16; do
    step "gemm-bf16-coop-$coop" 60 env LOCKSTEP_WGPU_COOP=$coop "$bin" bench gemm --device "$wgpu" --gemm-dtype bf16 --sizes 4096,8192 --json "$out/gemm-bf16-coop-$coop.json"
done
step gemm-cuda-f16 60 "$bin" bench gemm --device cuda:0 --gemm-dtype f16 --sizes 4096,8192 --json "$out/gemm-cuda-f16.json"
step check-wgpu 150 "$bin" check --device "$wgpu" --failures-only
step resnet-bf16-coop 90 "$bin" bench resnet --device "$wgpu" --batch 512 --precision bf16-mixed --kernels 14
step resnet-cuda-bf16 90 "$bin" bench resnet --device cuda:0 --batch 512 --precision bf16-mixed
step gpt2-wgpu-b8-coop 90 "$bin" bench gpt --device "$wgpu" --model gpt2 --batch 8 --precision bf16-mixed --kernels 10
step gpt2-cuda-b8 90 "$bin" bench gpt --device cuda:0 --model gpt2 --batch 8 --precision bf16-mixed
