#!/usr/bin/env python3
"""One MNIST training epoch, Lockstep beside PyTorch, in one run: both sides alternate for
`--rounds` rounds on the same machine and the medians are compared as a ratio (ours / peer
samples per second; above 1 means Lockstep is faster).

    python3 scripts/mnist_epoch_bench.py --model mlp --optimizer sgd --lr 0.05 --momentum 0.9
    python3 scripts/mnist_epoch_bench.py --model lenet5 --optimizer adam --lr 0.001
    python3 scripts/mnist_epoch_bench.py --device cuda:0 --bin /path/to/lockstep --json out.json

Needs a release build (`cargo build --release`, or --bin) and python3 with torch.
"""
import argparse, json, os, statistics, subprocess, sys, tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def lockstep(a, data):
    with tempfile.TemporaryDirectory() as tmp:
        summary = os.path.join(tmp, "summary.json")
        cmd = [a.bin, "train", "--device", a.device, "--model", a.model, "--epochs", "1",
               "--optimizer", a.optimizer, "--lr", str(a.lr), "--momentum", str(a.momentum),
               "--batch-size", "128", "--threads", str(a.threads), "--workers", str(a.workers),
               "--data", data, "--headless", "--no-val", "--summary-out", summary]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        with open(summary) as f:
            s = json.load(f)
    return {"seconds": s["train_seconds"], "accuracy": s["test_accuracy"]}


def pytorch(a, data):
    cmd = [sys.executable, os.path.join(HERE, "mnist_pytorch.py"), "--model", a.model, "--optimizer", a.optimizer,
           "--lr", str(a.lr), "--momentum", str(a.momentum), "--threads", str(a.threads), "--data", data,
           "--device", a.device]
    env = dict(os.environ, OMP_NUM_THREADS=str(a.threads), MKL_NUM_THREADS=str(a.threads))
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env).stdout.strip().splitlines()[-1]
    s = json.loads(out)
    return {"seconds": s["epoch_seconds"], "accuracy": s["test_accuracy"]}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="mlp")
    p.add_argument("--optimizer", default="sgd")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--momentum", type=float, default=0.0)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--device", default="cpu", help="cpu or cuda:N (PyTorch gets the same device)")
    p.add_argument("--bin", default=os.path.join(ROOT, "target/release/lockstep"))
    p.add_argument("--json", help="also write the result here")
    p.add_argument("--data", default=os.environ.get("LOCKSTEP_DATA", os.path.join(ROOT, "../shared/data/mnist")))
    a = p.parse_args()
    ours, peer = [], []
    for r in range(a.rounds):
        ours.append(lockstep(a, a.data))
        peer.append(pytorch(a, a.data))
        print(f"round {r}: lockstep {ours[-1]['seconds']:.2f} s ({ours[-1]['accuracy']:.2%}), "
              f"pytorch {peer[-1]['seconds']:.2f} s ({peer[-1]['accuracy']:.2%})", flush=True)
    o = statistics.median(x["seconds"] for x in ours)
    t = statistics.median(x["seconds"] for x in peer)
    result = {"model": a.model, "optimizer": a.optimizer, "device": a.device, "threads": a.threads,
              "workers": a.workers, "lockstep_epoch_seconds": o, "pytorch_epoch_seconds": t, "ratio_speed": t / o,
              "lockstep_accuracy": [x["accuracy"] for x in ours], "pytorch_accuracy": [x["accuracy"] for x in peer]}
    print(json.dumps(result))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
