#!/usr/bin/env bash
# The whole GPU report on a fresh NVIDIA machine, from a release binary built elsewhere.
#
#   scripts/gpu/verify.sh REPORT_DIR [--bin target/release/lockstep] [--tests DIR]
#                         [--data DIR] [--quick] [--only STEP,STEP]
#
# --tests DIR holds the CUDA crate's test binaries (`cargo test --release -p lockstep-cuda
# --no-run`, copied there); --data is an MNIST directory; --quick skips the benchmarks;
# LOCKSTEP_STEP_LIMIT=SECONDS caps every step's time limit.
# It finds NVRTC, cuBLAS and NCCL in the installed Python wheels or a CUDA toolkit, makes the
# libnccl.so link NCCL's wheel lacks, then runs each step under a time limit, goes on after a
# failure, and writes REPORT_DIR/report.md and report.json (scripts/gpu/report.py) with every
# step's log under REPORT_DIR/logs.
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"

out="${1:?usage: verify.sh REPORT_DIR [--bin PATH] [--tests DIR] [--data DIR] [--quick] [--only STEPS]}"
shift
bin="$root/target/release/lockstep"
tests=""
data="${LOCKSTEP_DATA:-$root/../shared/data/mnist}"
quick=0
only=""
while [ $# -gt 0 ]; do
    case "$1" in
        --bin) bin="$2"; shift 2 ;;
        --tests) tests="$2"; shift 2 ;;
        --data) data="$2"; shift 2 ;;
        --quick) quick=1; shift ;;
        --only) only=",$2,"; shift 2 ;;
        *) echo "verify.sh: unknown argument $1" >&2; exit 2 ;;
    esac
done
mkdir -p "$out/logs"
out="$(cd "$out" && pwd)"
python="${LOCKSTEP_PYTHON:-python3}"

# shellcheck source=scripts/gpu/lib.sh
. "$here/lib.sh"

step machine 60 bash -c 'nvidia-smi; nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,power.limit --format=csv; uname -a; nproc; free -g; '"$python"' -c "import torch; print(\"torch\", torch.__version__, torch.version.cuda, torch.cuda.get_device_name(0))"'
step vulkan 30 bash -c 'ls /usr/share/vulkan/icd.d /etc/vulkan/icd.d /usr/local/nvidia/share/vulkan/icd.d 2>&1; ldconfig -p | grep -E "libvulkan|libGLX_nvidia|libnvidia-vulkan|libEGL_nvidia" || echo "no Vulkan loader or NVIDIA Vulkan driver in ldconfig"'
# What a tensor-core tier on wgpu could use: the driver's cooperative-matrix shapes and bf16.
if command -v vulkaninfo >/dev/null; then
    step vulkan-features 60 bash -c 'vulkaninfo 2>&1 | grep -iE "apiVersion|driverVersion|deviceName|cooperative|bfloat16|subgroupSize|shaderFloat16|VK_KHR_shader_bfloat16|VK_NV_cooperative" | sort -u'
fi
step devices 60 "$bin" devices --details
step check-cuda 600 "$bin" check --device cuda:0 --failures-only
step train-mlp 300 "$bin" train --device cuda:0 --model mlp --epochs 1 --data "$data" --headless --summary-out "$out/train-mlp.json"
# Every CUDA test binary runs; test-nccl-* also checks what only a GPU shows of the collective
# timeout: a rank whose peer never joins fails after it, naming the peer, and collectives are
# timed on the device (backend-cuda/tests/nccl.rs).
if [ -n "$tests" ]; then
    for t in "$tests"/*; do
        [ -x "$t" ] || continue
        step "test-$(basename "$t")" 600 "$t" --test-threads=1
    done
fi
step train-lenet5 300 "$bin" train --device cuda:0 --model lenet5 --optimizer adam --lr 0.001 --epochs 1 --data "$data" --headless --summary-out "$out/train-lenet5.json"
step train-mixed-precision 300 "$bin" train --device cuda:0 --model mlp --precision bf16-mixed --epochs 1 --data "$data" --headless --summary-out "$out/train-bf16.json"
# NCCL cannot hold two ranks on one GPU: pair the GPU with the CPU, and with one device alone.
step train-cuda-cpu 300 "$bin" train --devices cuda:0,cpu:0 --no-balance --model mlp --max-steps 60 --no-shuffle --no-val --data "$data" --headless --summary-out "$out/train-cuda-cpu.json"
step train-one-device 300 "$bin" train --device cpu:0 --model mlp --max-steps 60 --no-shuffle --no-val --data "$data" --headless --summary-out "$out/train-one-device.json"
step launch-one-rank 300 "$bin" launch --nproc-per-node 1 -- train --device cuda --model mlp --epochs 1 --data "$data" --headless --summary-out "$out/train-launch.json"
# Issue 51's GPU rows: ZeRO-2 with a CUDA replica (beside the CPU, as above: each bucket reduced
# to its owner), a batch past the GPU's memory that explains itself and keeps the checkpoint,
# and device memory flat over 1000 steps.
step train-zero2-cuda-cpu 300 "$bin" train --devices cuda:0,cpu:0 --no-balance --zero 2 --model mlp --max-steps 60 --no-shuffle --no-val --data "$data" --headless --summary-out "$out/train-zero2-cuda-cpu.json"
step out-of-memory-cuda 300 bash "$here/out_of_memory.sh" "$bin" cuda:0 "$out/out-of-memory" gpt2 2048
step flat-memory-cuda 300 bash -c '"$1" train --device cuda:0 --model mlp --max-steps 1000 --log-every 50 --no-val --data "$2" --headless --metrics-out "$3" && "$4" "$5" "$3"' flat "$bin" "$data" "$out/flat-memory.jsonl" "$python" "$here/flat_memory.py"

if [ "$quick" = 0 ]; then
    for dtype in f32 tf32 f16 bf16; do
        step "bench-gemm-$dtype" 300 "$bin" bench gemm --device cuda:0 --gemm-dtype "$dtype" --sizes 4096,8192 --peer pytorch --json "$out/bench-gemm-$dtype.json"
    done
    for precision in 32 bf16-mixed; do
        step "bench-mlp4096-$precision" 300 "$bin" bench mlp --device cuda:0 --hidden 4096,4096,4096,4096 --batch 1024 --precision "$precision" --peer pytorch --json "$out/bench-mlp4096-$precision.json"
    done
    step bench-mlp-mnist 300 "$bin" bench mlp --device cuda:0 --peer pytorch --json "$out/bench-mlp-mnist.json"
    # ResNet-18 (CIFAR stem) bf16-mixed at batch 512: steps, and a CIFAR-10 epoch (synthetic
    # files in the real format) with loader workers, each beside PyTorch eager.
    step bench-resnet 300 "$bin" bench resnet --device cuda:0 --batch 512 --precision bf16-mixed --peer pytorch --json "$out/bench-resnet.json"
    # Where a step's GPU time goes, kernel by kernel (about one step's launches, after warm-up).
    if command -v ncu >/dev/null; then
        step profile-resnet 300 ncu --metrics gpu__time_duration.sum --launch-skip 1200 --launch-count 1100 --csv --log-file "$out/profile-resnet.csv" "$bin" bench resnet --device cuda:0 --batch 512 --precision bf16-mixed
    fi
    # GPT-2 124M, bf16-mixed, batch 16 x 1024 tokens, beside PyTorch eager and torch.compile
    # (SDPA flash attention, fused AdamW): tokens/s, peak device memory, launches per step.
    step bench-gpt2 600 "$bin" bench gpt --device cuda:0 --model gpt2 --batch 16 --precision bf16-mixed --peer pytorch --json "$out/bench-gpt2.json"
    # Attention's memory against T (issue 50): the same batch at T = 1024 and 2048; the fused
    # kernels keep no T x T matrix, so the peak should about double, not quadruple.
    for block in 1024 2048; do
        step "bench-gpt2-memory-t$block" 300 "$bin" bench gpt --device cuda:0 --model gpt2 --batch 4 --block-size "$block" --precision bf16-mixed --json "$out/bench-gpt2-memory-t$block.json"
    done
    # Where its time goes, by kernel name: each launch and cuBLAS product of one step timed alone.
    step profile-gpt2 300 "$bin" bench gpt --device cuda:0 --model gpt2 --batch 16 --precision bf16-mixed --kernels 40
    step bench-epoch-resnet18 600 "$python" "$root/scripts/cifar_epoch_bench.py" --bin "$bin" --device cuda:0 --precision bf16-mixed --batch-size 512 --rounds 3 --epochs 3 --json "$out/bench-epoch-resnet18.json"
    # The same epoch with cuDNN's non-deterministic algorithms admitted (PyTorch's default).
    step bench-epoch-resnet18-any-cudnn 600 env LOCKSTEP_CUDNN_DETERMINISTIC=0 "$python" "$root/scripts/cifar_epoch_bench.py" --bin "$bin" --device cuda:0 --precision bf16-mixed --batch-size 512 --rounds 2 --epochs 3 --side lockstep --json "$out/bench-epoch-resnet18-any-cudnn.json"
    for model in mlp lenet5; do
        step "bench-epoch-$model" 600 "$python" "$root/scripts/mnist_epoch_bench.py" --bin "$bin" --device cuda:0 --model "$model" --rounds 2 --data "$data" --json "$out/bench-epoch-$model.json"
    done
fi

# wgpu on the same GPU, where NVIDIA's Vulkan driver is installed.
wgpu=$("$bin" devices 2>/dev/null | grep -E 'NVIDIA|H100|H200' | grep -o 'wgpu:[0-9]\+' | head -n 1)
if [ -n "$wgpu" ]; then
    step check-wgpu 600 "$bin" check --device "$wgpu" --failures-only
    if [ "$quick" = 0 ]; then
        step bench-wgpu 600 "$bin" bench gpu --device "$wgpu"
        # Square products in FLOP/s (2·m·n·k), each element type; f32 again with wgpu's
        # runtime checks kept on the product shaders, to see what the trusted modules save.
        for dtype in f32 f16 bf16; do
            step "bench-gemm-wgpu-$dtype" 300 "$bin" bench gemm --device "$wgpu" --gemm-dtype "$dtype" --sizes 4096,8192 --json "$out/bench-gemm-wgpu-$dtype.json"
        done
        # The cooperative tier's f16 products translated by wgpu instead of our SPIR-V (whose
        # workgroup-memory accesses are non-private): the self-test decides whether each runs.
        step bench-gemm-wgpu-f16-wgpu-translation 300 env LOCKSTEP_WGPU_COOP_SPIRV=wgpu "$bin" bench gemm --device "$wgpu" --gemm-dtype f16 --sizes 4096,8192 --json "$out/bench-gemm-wgpu-f16-wgpu-translation.json"
        step bench-gemm-wgpu-f32-checked 300 env LOCKSTEP_WGPU_CHECKS=all "$bin" bench gemm --device "$wgpu" --sizes 4096,8192 --json "$out/bench-gemm-wgpu-f32-checked.json"
        step bench-resnet-wgpu 600 "$bin" bench resnet --device "$wgpu" --batch 512 --precision bf16-mixed --json "$out/bench-resnet-wgpu.json" --kernels 25
        # The same step with session 62's implicit-GEMM convolutions turned off (im2col, GEMM,
        # col2im), to decide LOCKSTEP_WGPU_CONV's default from a GPU's numbers.
        step bench-resnet-wgpu-im2col 600 env LOCKSTEP_WGPU_CONV=im2col "$bin" bench resnet --device "$wgpu" --batch 512 --precision bf16-mixed --json "$out/bench-resnet-wgpu-im2col.json"
        # And with session 63's multi-tensor optimizer shaders off (one dispatch a parameter).
        step bench-resnet-wgpu-per-tensor 600 env LOCKSTEP_WGPU_MULTI_TENSOR=off "$bin" bench resnet --device "$wgpu" --batch 512 --precision bf16-mixed --json "$out/bench-resnet-wgpu-per-tensor.json"
        step bench-resnet-wgpu-f32 600 "$bin" bench resnet --device "$wgpu" --batch 512 --precision 32 --json "$out/bench-resnet-wgpu-f32.json"
        step bench-resnet-cuda-f32 600 "$bin" bench resnet --device cuda:0 --batch 512 --precision 32 --json "$out/bench-resnet-cuda-f32.json"
        step bench-gpt2-wgpu 600 "$bin" bench gpt --device "$wgpu" --model gpt2 --batch 16 --precision bf16-mixed --kernels 30 --json "$out/bench-gpt2-wgpu.json"
        # And with the fused attention turned off (composed products and causal_softmax).
        step bench-gpt2-wgpu-composed 600 env LOCKSTEP_WGPU_ATTENTION=composed "$bin" bench gpt --device "$wgpu" --model gpt2 --batch 16 --precision bf16-mixed --json "$out/bench-gpt2-wgpu-composed.json"
    fi
else
    echo "no wgpu adapter on an NVIDIA GPU: $("$bin" devices 2>&1 | tr '\n' ' ')" >"$out/logs/wgpu-absent.log"
fi

"$python" "$here/report.py" "$out" || echo "report.py failed; the logs are in $out/logs" >&2
echo "report: $out/report.md"
