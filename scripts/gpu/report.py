#!/usr/bin/env python3
"""Turns a `scripts/gpu/verify.sh` run directory into report.md and report.json: every step
with its exit code and time, the training results, and each benchmark beside PyTorch's as a
ratio (ours / PyTorch, above 1 means Lockstep is faster) and as a fraction of the GPU's peak."""
import datetime, json, os, re, sys

# Dense peak TFLOP/s by GPU (NVIDIA's data sheets: SXM parts; the H200 has the H100's cores).
PEAKS = {m: {"f32": 67, "tf32": 495, "f16": 989, "bf16": 989} for m in ("H100", "H200")}


def read(path, default=None):
    try:
        with open(path) as f:
            return json.load(f) if path.endswith(".json") else f.read()
    except (OSError, ValueError):
        return default


def main(out):
    steps = []
    for line in (read(os.path.join(out, "steps.tsv"), "") or "").splitlines():
        name, rc, seconds, command = line.split("\t", 3)
        log = read(os.path.join(out, "logs", name + ".log"), "") or ""
        steps.append({"name": name, "exit": int(rc), "seconds": float(seconds), "command": command,
                      "tail": log.strip().splitlines()[-8:]})
    machine = read(os.path.join(out, "logs", "machine.log"), "") or ""
    gpu = next((m for m in PEAKS if m in machine), None)
    report = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "gpu": gpu, "machine": machine.strip().splitlines()[-12:], "steps": steps,
              "training": {}, "gemm": [], "mlp": [], "epochs": []}
    for name in ("mlp", "lenet5", "bf16", "cuda-cpu", "one-device", "launch"):
        s = read(os.path.join(out, f"train-{name}.json"))
        if s:
            report["training"][name] = {k: s.get(k) for k in ("test_accuracy", "test_loss", "train_seconds",
                                                              "samples_per_sec", "final_train_loss", "steps")}
    # The GPU beside the CPU must train as the CPU alone does (same seed, same global batch).
    pair = report["training"].get("cuda-cpu"), report["training"].get("one-device")
    if all(pair) and all(t.get("test_loss") is not None for t in pair):
        gap = abs(pair[0]["test_loss"] - pair[1]["test_loss"])
        report["cuda_cpu_matches_one_device"] = {"test_loss_gap": gap, "matches": gap <= 1e-3 * abs(pair[1]["test_loss"])}
    # cuda:0 beside PyTorch in one file; wgpu:0 (the same GPU through Vulkan) beside PyTorch's
    # number from the cuda:0 file of the same element type.
    for device, suffix in (("cuda:0", ""), ("wgpu:0", "-wgpu"), ("wgpu:0 checked", "-wgpu")):
        for dtype in ("f32", "tf32", "f16", "bf16"):
            checked = "-checked" if device.endswith("checked") else ""
            b = read(os.path.join(out, f"bench-gemm{suffix}-{dtype}{checked}.json"))
            if not b:
                continue
            peer = (read(os.path.join(out, f"bench-gemm-{dtype}.json"), {}) or {}).get("peer") or {}
            theirs = {g["n"]: g for g in peer.get("gemm", [])}
            for g in b["ours"]["gemm"]:
                t = theirs.get(g["n"])
                peak = PEAKS.get(gpu, {}).get(dtype)
                report["gemm"].append({"device": device, "dtype": dtype, "n": g["n"], "ours_tflops": g["gflops"] / 1e3,
                                       "pytorch_tflops": t and t["gflops"] / 1e3,
                                       "ratio": t and g["gflops"] / t["gflops"],
                                       "ours_of_peak": peak and g["gflops"] / 1e3 / peak,
                                       "pytorch_of_peak": peak and t and t["gflops"] / 1e3 / peak})
    report["gpt"] = []
    for name in ("gpt2", "gpt2-wgpu"):
        b = read(os.path.join(out, f"bench-{name}.json"))
        if not b:
            continue
        for engine, results in (("Lockstep " + b["plan"].get("device", ""), b["ours"]), ("PyTorch", b.get("peer") or {})):
            for row in results.get("gpt", []):
                report["gpt"].append({"bench": name, "engine": engine, "precision": row["precision"],
                                      "tokens_per_s": row["items_per_s"], "step_ms": row["median_step_s"] * 1e3,
                                      "peak_device_mib": row.get("peak_device_bytes") and row["peak_device_bytes"] / 2**20,
                                      "kernels_per_step": row.get("kernels_per_step")})
    for name in ("mlp4096-32", "mlp4096-bf16-mixed", "mlp-mnist"):
        b = read(os.path.join(out, f"bench-{name}.json"))
        if not b or not b["ours"].get("mlp"):
            continue
        o, t = b["ours"]["mlp"], (b.get("peer") or {}).get("mlp")
        report["mlp"].append({"bench": name, "batch": o["batch"], "ours_steps_per_s": o["steps_per_s"],
                              "pytorch_steps_per_s": t and t["steps_per_s"],
                              "ratio": t and o["steps_per_s"] / t["steps_per_s"],
                              "ours_kernels_per_step": o.get("kernels_per_step"),
                              "ours_cublas_per_step": o.get("library_calls_per_step"),
                              "pytorch_kernels_per_step": t and t.get("kernels_per_step"),
                              "final_loss": [o["final_loss"], t and t["final_loss"]]})
    for model in ("mlp", "lenet5"):
        b = read(os.path.join(out, f"bench-epoch-{model}.json"))
        if b:
            report["epochs"].append(b)
    with open(os.path.join(out, "report.json"), "w") as f:
        json.dump(report, f, indent=2)
    with open(os.path.join(out, "report.md"), "w") as f:
        f.write(markdown(report))


def fmt(v, spec=".2f"):
    return "-" if v is None else format(v, spec)


def markdown(r):
    lines = [f"# Lockstep GPU report, {r['date']}", "", "```", *r["machine"], "```", "",
             "## Steps", "", "| step | exit | seconds |", "| --- | ---: | ---: |"]
    lines += [f"| {s['name']} | {'ok' if s['exit'] == 0 else s['exit']} | {s['seconds']:.1f} |" for s in r["steps"]]
    failed = [s for s in r["steps"] if s["exit"] != 0]
    for s in failed:
        lines += ["", f"### {s['name']} failed (exit {s['exit']})", "", f"`{s['command']}`", "", "```", *s["tail"], "```"]
    if r["training"]:
        lines += ["", "## Training", "", "| run | test accuracy | train seconds | samples/s |", "| --- | ---: | ---: | ---: |"]
        lines += [f"| {k} | {fmt(v['test_accuracy'], '.4f')} | {fmt(v['train_seconds'], '.1f')} | {fmt(v['samples_per_sec'], '.0f')} |"
                  for k, v in r["training"].items()]
    if "cuda_cpu_matches_one_device" in r:
        m = r["cuda_cpu_matches_one_device"]
        lines += ["", f"cuda:0 + cpu:0 against cpu:0 alone: test loss gap {m['test_loss_gap']:.2e} "
                      f"({'matches' if m['matches'] else 'DOES NOT MATCH'} within 0.1%)"]
    if r["gemm"]:
        lines += ["", "## GEMM (TFLOP/s as 2·m·n·k; fraction of the dense peak; PyTorch on cuda:0)", "",
                  "| device | dtype | n | Lockstep | PyTorch | ratio | Lockstep of peak | PyTorch of peak |",
                  "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
        lines += [f"| {g['device']} | {g['dtype']} | {g['n']} | {fmt(g['ours_tflops'], '.1f')} | {fmt(g['pytorch_tflops'], '.1f')} | "
                  f"{fmt(g['ratio'])} | {fmt(g['ours_of_peak'], '.0%')} | {fmt(g['pytorch_of_peak'], '.0%')} |" for g in r["gemm"]]
    if r.get("gpt"):
        lines += ["", "## GPT steps", "", "| bench | engine | precision | tokens/s | step ms | peak device MiB | kernels/step |",
                  "| --- | --- | --- | ---: | ---: | ---: | ---: |"]
        lines += [f"| {g['bench']} | {g['engine']} | {g['precision']} | {fmt(g['tokens_per_s'], '.0f')} | {fmt(g['step_ms'], '.1f')} | "
                  f"{fmt(g['peak_device_mib'], '.0f')} | {fmt(g['kernels_per_step'], '.0f')} |" for g in r["gpt"]]
    if r["mlp"]:
        lines += ["", "## Training steps (steps/s; kernels per step)", "",
                  "| bench | batch | Lockstep | PyTorch | ratio | kernels (ours, of them cuBLAS) | kernels (PyTorch) |",
                  "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
        lines += [f"| {m['bench']} | {m['batch']} | {fmt(m['ours_steps_per_s'], '.1f')} | {fmt(m['pytorch_steps_per_s'], '.1f')} | "
                  f"{fmt(m['ratio'])} | {fmt(m['ours_kernels_per_step'], '.1f')}, {fmt(m['ours_cublas_per_step'], '.1f')} | "
                  f"{fmt(m['pytorch_kernels_per_step'], '.1f')} |" for m in r["mlp"]]
    if r["epochs"]:
        lines += ["", "## MNIST epoch (seconds, median)", "", "| model | Lockstep | PyTorch | speed ratio |", "| --- | ---: | ---: | ---: |"]
        lines += [f"| {e['model']} | {e['lockstep_epoch_seconds']:.2f} | {e['pytorch_epoch_seconds']:.2f} | {e['ratio_speed']:.2f} |"
                  for e in r["epochs"]]
    lines += ["", f"{len(r['steps']) - len(failed)} passed, {len(failed)} failed", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    main(sys.argv[1])
