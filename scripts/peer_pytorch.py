#!/usr/bin/env python3
"""The PyTorch peer of `lockstep bench --peer pytorch`.

Runs the same benchmarks as Lockstep, with the same shapes, model, optimizer and timing rules,
all taken from the plan Lockstep passes as one JSON argument (see app/src/cli/bench/plan.rs),
and prints one JSON object in Lockstep's `Results` schema on stdout.

Exit codes: 0 with the JSON on stdout; 3 when torch cannot be imported (one line on stderr);
anything else is a failure of this script.

By hand: python3 scripts/peer_pytorch.py '{"threads": 2, "device": "cpu", "gemm_sizes": [512],
  "gemm_timing": {"warmup": 3, "min_reps": 10, "max_reps": 2000, "min_seconds": 1.0}, "mlp": null}'
"""

import json
import statistics
import sys
import time

NO_TORCH = 3


def measure(timing, rep, sync):
    """Warm-up, then timed repetitions until both min_reps and min_seconds; the median seconds."""
    for _ in range(timing["warmup"]):
        rep()
    sync()
    times = []
    start = time.perf_counter()
    while len(times) < timing["max_reps"] and (
        len(times) < timing["min_reps"] or time.perf_counter() - start < timing["min_seconds"]
    ):
        t = time.perf_counter()
        rep()
        sync()
        times.append(time.perf_counter() - t)
    return statistics.median(times), len(times)


def gemm(torch, device, n, timing, sync, dtype):
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    median_s, reps = measure(timing, lambda: torch.mm(a, b), sync)
    return {"n": n, "median_s": median_s, "gflops": 2.0 * n**3 / median_s / 1e9, "reps": reps}


def peak_rss_bytes():
    # VmHWM, as the Lockstep side reads it: ru_maxrss would include the parent's peak, which
    # Linux carries across the exec that started this script.
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return None


def mlp(torch, device, plan, sync):
    layers = plan["layers"]
    modules = [torch.nn.Flatten()]  # as Lockstep's built-in `mlp` model
    for i, (fan_in, fan_out) in enumerate(zip(layers, layers[1:])):
        if i > 0:
            modules.append(torch.nn.ReLU())
        modules.append(torch.nn.Linear(fan_in, fan_out))
    model = torch.nn.Sequential(*modules).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=plan["lr"], momentum=plan["momentum"])
    x = torch.randn(plan["batch"], layers[0], device=device)
    y = torch.randint(0, layers[-1], (plan["batch"],), device=device)
    last = {"loss": float("nan")}

    # Mixed precision as PyTorch users write it: autocast around the forward pass, a GradScaler
    # for f16 (bf16 needs none).
    precision = plan.get("precision", "32")
    low = {"16-mixed": torch.float16, "bf16-mixed": torch.bfloat16}.get(precision)
    scaler = torch.amp.GradScaler(device.type) if precision == "16-mixed" else None

    def step():
        opt.zero_grad()
        with torch.autocast(device.type, dtype=low, enabled=low is not None):
            loss = torch.nn.functional.cross_entropy(model(x), y)
        if scaler is None:
            loss.backward()
            opt.step()
        else:
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        return loss

    def window():
        for _ in range(plan["steps_per_window"]):
            loss = step()
        # The window's one host sync, as on the Lockstep side.
        last["loss"] = loss.item()

    median_s, windows = measure(plan["timing"], window, sync)
    steps_per_s = plan["steps_per_window"] / median_s
    return {
        "batch": plan["batch"],
        "steps_per_window": plan["steps_per_window"],
        "windows": windows,
        "median_window_s": median_s,
        "steps_per_s": steps_per_s,
        "samples_per_s": steps_per_s * plan["batch"],
        "final_loss": last["loss"],
        # Peak resident memory of the process, as the Lockstep side reports it (Linux: KiB).
        "peak_rss_bytes": peak_rss_bytes(),
        "kernels_per_step": kernels_per_step(torch, step, sync) if device.type == "cuda" else None,
    }


def resnet(torch, device, plan, sync):
    """ResNet-18 steps as `lockstep bench resnet` runs them: torchvision's model with the CIFAR
    stem, SGD with weight decay on weights only (a second parameter group without it), one host
    sync per step; one result per precision."""
    import torchvision

    net = getattr(torchvision.models, plan["model"])(num_classes=plan["classes"])
    net.conv1 = torch.nn.Conv2d(3, 64, 3, 1, 1, bias=False)
    net.maxpool = torch.nn.Identity()
    net = net.to(device).train()
    decay = [p for p in net.parameters() if p.ndim >= 2]
    no_decay = [p for p in net.parameters() if p.ndim < 2]
    opt = torch.optim.SGD(
        [{"params": decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=plan["lr"], momentum=plan["momentum"], weight_decay=plan["weight_decay"],
    )
    image, batch = plan["image"], plan["batch"]
    x = torch.randn(batch, 3, image, image, device=device)
    y = torch.randint(0, plan["classes"], (batch,), device=device)
    loss = lambda: torch.nn.functional.cross_entropy(net(x), y)
    return train_steps(torch, device, plan, opt, loss, None, batch, sync)


def gpt(torch, device, plan, sync):
    """GPT steps as `lockstep bench gpt` runs them: nanoGPT's architecture (scripts/gpt_model.py)
    with F.scaled_dot_product_attention (flash attention on a GPU), AdamW with weight decay on
    matrices only (fused on CUDA, as nanoGPT asks for it), gradients clipped; tokens are random
    ids, inputs and next-token targets. With plan["compile"], each precision again with the
    model under torch.compile, as nanoGPT trains by default."""
    from gpt_model import Gpt

    net = Gpt(plan["vocab_size"], plan["block_size"], plan["n_layer"], plan["n_head"], plan["n_embd"],
              plan["dropout"]).to(device).train()
    decay = [p for p in net.parameters() if p.ndim >= 2]
    no_decay = [p for p in net.parameters() if p.ndim < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": plan["weight_decay"]}, {"params": no_decay, "weight_decay": 0.0}],
        lr=plan["lr"], betas=tuple(plan["betas"]), fused=device.type == "cuda",
    )
    batch, block, vocab = plan["batch"], plan["block_size"], plan["vocab_size"]
    rows = torch.randint(0, vocab, (batch, block + 1), device=device)
    x, y = rows[:, :-1].contiguous(), rows[:, 1:].contiguous()
    clip = (list(net.parameters()), plan["clip"])
    variants = [("", net)]
    if plan.get("compile"):
        variants.append((" compiled", torch.compile(net)))
    out = []
    for suffix, model in variants:
        loss = lambda model=model: torch.nn.functional.cross_entropy(model(x).view(-1, vocab), y.view(-1))
        for row in train_steps(torch, device, plan, opt, loss, clip, batch * block, sync):
            row["precision"] += suffix
            out.append(row)
    return out


def train_steps(torch, device, plan, opt, loss_fn, clip, items_per_step, sync):
    """One result per precision of whole training steps, as app/src/cli/bench/steps.rs times them."""
    out = []
    for precision in plan["precisions"]:
        low = {"bf16-mixed": torch.bfloat16}.get(precision)
        last = {"loss": float("nan")}

        def step():
            opt.zero_grad()
            with torch.autocast(device.type, dtype=low, enabled=low is not None):
                loss = loss_fn()
            loss.backward()
            if clip is not None:
                torch.nn.utils.clip_grad_norm_(clip[0], clip[1])
            opt.step()
            last["loss"] = loss.item()

        on_gpu = device.type == "cuda"
        if on_gpu:
            torch.cuda.reset_peak_memory_stats(device)
        median_s, steps = measure(plan["timing"], step, sync)
        out.append({
            "precision": precision,
            "batch": plan["batch"],
            "steps": steps,
            "median_step_s": median_s,
            "items_per_s": items_per_step / median_s,
            "final_loss": last["loss"],
            "peak_rss_bytes": peak_rss_bytes(),
            "peak_device_bytes": torch.cuda.max_memory_allocated(device) if on_gpu else None,
            "kernels_per_step": kernels_per_step(torch, step, sync) if on_gpu else None,
        })
    return out


def kernels_per_step(torch, step, sync, steps=5):
    """GPU kernels per training step, counted by PyTorch's profiler (memcpy and memset excluded,
    as the Lockstep side counts kernels only); None where the profiler is not usable."""
    try:
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(steps):
                step()
            sync()
        kernels = [e for e in prof.events() if e.device_type.name == "CUDA" and not e.name.lower().startswith("memcpy")
                   and not e.name.lower().startswith("memset")]
        return len(kernels) / steps
    except Exception as e:  # an old or CPU-only build: no number rather than no result
        print(f"kernel count unavailable: {e}", file=sys.stderr)
        return None


def main(argv):
    if len(argv) != 2:
        print("usage: peer_pytorch.py PLAN_JSON", file=sys.stderr)
        return 2
    plan = json.loads(argv[1])
    try:
        import torch
    except Exception as e:  # ImportError, or a CUDA build whose CUDA libraries are missing
        print(f"import torch failed: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}", file=sys.stderr)
        return NO_TORCH
    torch.set_num_threads(plan["threads"])
    torch.manual_seed(0)
    device = torch.device(plan["device"])
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    results = {"engine": f"PyTorch {torch.__version__.split('+')[0]}", "gemm": [], "mlp": None}
    gemm_dtype = plan.get("gemm_dtype", "f32")
    torch.backends.cuda.matmul.allow_tf32 = gemm_dtype == "tf32"
    for n in plan["gemm_sizes"]:
        dtype = {"f32": torch.float32, "tf32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}[gemm_dtype]
        results["gemm"].append(gemm(torch, device, n, plan["gemm_timing"], sync, dtype))
    if plan["mlp"] is not None:
        results["mlp"] = mlp(torch, device, plan["mlp"], sync)
    if plan.get("resnet") is not None:
        try:
            results["resnet"] = resnet(torch, device, plan["resnet"], sync)
        except ImportError as e:
            print(f"the ResNet peer needs torchvision: {e}", file=sys.stderr)
            return NO_TORCH
    if plan.get("gpt") is not None:
        results["gpt"] = gpt(torch, device, plan["gpt"], sync)
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
