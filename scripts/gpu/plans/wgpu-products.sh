# The wgpu product kernels on one GPU: each SIMT variant (LOCKSTEP_WGPU_MATMUL) and the
# cooperative-matrix tier (LOCKSTEP_WGPU_COOP) on square products, ResNet-18 and GPT-2, with
# cuda:0's numbers in the same call for the ratios; the conformance suite under the default
# choice and with bf16 on the tensor cores. Sourced by sweep.sh.
step devices 60 "$bin" devices --details
for v in tile64 tile128 tile128k16 auto; do
    step "gemm-f32-$v" 60 env LOCKSTEP_WGPU_MATMUL=$v "$bin" bench gemm --device "$wgpu" --sizes 4096,8192 --json "$out/gemm-f32-$v.json"
done
for coop in f16 off; do
    step "gemm-f16-coop-$coop" 60 env LOCKSTEP_WGPU_COOP=$coop "$bin" bench gemm --device "$wgpu" --gemm-dtype f16 --sizes 4096,8192 --json "$out/gemm-f16-coop-$coop.json"
done
for coop in f16 bf16; do
    step "gemm-bf16-coop-$coop" 60 env LOCKSTEP_WGPU_COOP=$coop "$bin" bench gemm --device "$wgpu" --gemm-dtype bf16 --sizes 4096,8192 --json "$out/gemm-bf16-coop-$coop.json"
done
for dtype in f32 f16 bf16; do
    step "gemm-cuda-$dtype" 60 "$bin" bench gemm --device cuda:0 --gemm-dtype $dtype --sizes 4096,8192 --json "$out/gemm-cuda-$dtype.json"
done
step resnet-bf16-tile64 90 env LOCKSTEP_WGPU_MATMUL=tile64 "$bin" bench resnet --device "$wgpu" --batch 512 --precision bf16-mixed
step resnet-bf16-auto 90 "$bin" bench resnet --device "$wgpu" --batch 512 --precision bf16-mixed --kernels 14
step resnet-bf16-auto-coop 90 env LOCKSTEP_WGPU_COOP=bf16 "$bin" bench resnet --device "$wgpu" --batch 512 --precision bf16-mixed --kernels 14
step resnet-f32-auto 90 "$bin" bench resnet --device "$wgpu" --batch 512 --precision 32
step resnet-cuda-bf16 90 "$bin" bench resnet --device cuda:0 --batch 512 --precision bf16-mixed
step resnet-cuda-f32 90 "$bin" bench resnet --device cuda:0 --batch 512 --precision 32
step gpt2-cuda-b16 90 "$bin" bench gpt --device cuda:0 --model gpt2 --batch 16 --precision bf16-mixed
step gpt2-cuda-b8 90 "$bin" bench gpt --device cuda:0 --model gpt2 --batch 8 --precision bf16-mixed
step gpt2-wgpu-b8-auto 90 "$bin" bench gpt --device "$wgpu" --model gpt2 --batch 8 --precision bf16-mixed --kernels 10
step gpt2-wgpu-b8-coop 90 env LOCKSTEP_WGPU_COOP=bf16 "$bin" bench gpt --device "$wgpu" --model gpt2 --batch 8 --precision bf16-mixed --kernels 10
step check-wgpu 75 "$bin" check --device "$wgpu" --failures-only
