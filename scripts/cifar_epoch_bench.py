#!/usr/bin/env python3
"""CIFAR-10 training epochs of `resnet18` (CIFAR stem), Lockstep beside PyTorch eager on the
same device: the same batch size, precision, SGD recipe and augmentation (RandomCrop(32, 4),
RandomHorizontalFlip, Normalize) done by loader workers. Each round runs `--epochs` epochs in a
fresh process on each side, alternating for `--rounds` rounds. The first epoch holds each side's
warm-up (kernels loaded, algorithms chosen, memory grown), the later ones are what a long run
repeats: both are compared, as ratios of the medians (ours / PyTorch's seconds; at most 1.0 is the
target), and `ratio` is the later epochs' (the first's with `--epochs 1`).

    python3 scripts/cifar_epoch_bench.py --device cuda:0 --precision bf16-mixed --batch-size 512 \
        --bin target/release/lockstep --json out.json

Without --data it writes a synthetic CIFAR-10 in the published binary format (random pixels and
labels; 50,000 training and 10,000 test records) to a temporary directory: the epoch's work does
not depend on the pixels. Needs torch and torchvision.
"""
import argparse, json, os, statistics, subprocess, sys, tempfile, time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
RECORD = 1 + 3 * 32 * 32
MEAN, STD = (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)


def write_synthetic(directory, seed=0):
    import numpy as np

    rng = np.random.default_rng(seed)
    names = [f"data_batch_{i}.bin" for i in range(1, 6)] + ["test_batch.bin"]
    for name in names:
        records = rng.integers(0, 256, size=(10000, RECORD), dtype=np.uint8)
        records[:, 0] %= 10
        records.tofile(os.path.join(directory, name))


def read_train(directory):
    import numpy as np

    parts = [np.fromfile(os.path.join(directory, f"data_batch_{i}.bin"), dtype=np.uint8).reshape(-1, RECORD)
             for i in range(1, 6)]
    records = np.concatenate(parts)
    return records[:, 1:].reshape(-1, 3, 32, 32), records[:, 0].astype(np.int64)


def lockstep(a, data):
    """Each epoch's seconds of one `lockstep train` process."""
    with tempfile.TemporaryDirectory() as tmp:
        summary = os.path.join(tmp, "summary.json")
        cmd = [a.bin, "train", "--device", a.device, "--model", "resnet18", "--dataset", "cifar10",
               "--data", data, "--epochs", str(a.epochs), "--batch-size", str(a.batch_size), "--precision",
               a.precision, "--workers", str(a.workers), "--headless", "--no-val", "--summary-out", summary]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        with open(summary) as f:
            return json.load(f)["epoch_seconds"]


def pytorch(a, data):
    """Each epoch's seconds of one fresh Python process (this script with --worker), so PyTorch
    starts as cold as our process does."""
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", "--data", data, "--device", a.device,
           "--precision", a.precision, "--batch-size", str(a.batch_size), "--workers", str(a.workers),
           "--epochs", str(a.epochs)] + (["--peer-device", a.peer_device] if a.peer_device else [])
    out = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def pytorch_epochs(a, data):
    import torch
    import torchvision
    from torchvision.transforms import v2

    device = torch.device(a.peer_device or a.device)
    images, labels = read_train(data)
    augment = v2.Compose([v2.RandomCrop(32, padding=4), v2.RandomHorizontalFlip(),
                          v2.ToDtype(torch.float32, scale=True), v2.Normalize(MEAN, STD)])

    class Cifar(torch.utils.data.Dataset):
        def __len__(self):
            return len(labels)

        def __getitem__(self, i):
            return augment(torch.from_numpy(images[i])), int(labels[i])

    loader = torch.utils.data.DataLoader(Cifar(), batch_size=a.batch_size, shuffle=True, drop_last=False,
                                         num_workers=a.workers, pin_memory=device.type == "cuda",
                                         persistent_workers=False)
    net = torchvision.models.resnet18(num_classes=10)
    net.conv1 = torch.nn.Conv2d(3, 64, 3, 1, 1, bias=False)
    net.maxpool = torch.nn.Identity()
    net = net.to(device).train()
    decay = [p for p in net.parameters() if p.ndim >= 2]
    no_decay = [p for p in net.parameters() if p.ndim < 2]
    opt = torch.optim.SGD([{"params": decay}, {"params": no_decay, "weight_decay": 0.0}],
                          lr=0.1, momentum=0.9, weight_decay=5e-4)
    low = {"bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}.get(a.precision)
    scaler = torch.amp.GradScaler(enabled=a.precision == "16-mixed")
    seconds = []
    for _ in range(a.epochs):
        start = time.perf_counter()
        for x, y in loader:
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            opt.zero_grad()
            with torch.autocast(device.type, dtype=low, enabled=low is not None):
                loss = torch.nn.functional.cross_entropy(net(x), y)
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        loss.item()  # the epoch ends when the device has finished
        seconds.append(time.perf_counter() - start)
    return seconds


def compare(ours, peer, pick):
    """The medians over rounds of `pick(epochs of a round)` on each side, and their ratio."""
    o = statistics.median(pick(r) for r in ours) if ours else None
    t = statistics.median(pick(r) for r in peer) if peer else None
    return {"lockstep": o, "pytorch": t, "ratio": o / t if o and t else None}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--device", default="cuda:0")
    p.add_argument("--peer-device", help="PyTorch's device where ours is not one of its (wgpu:0 beside cuda:0)")
    p.add_argument("--precision", default="bf16-mixed", choices=["32", "16-mixed", "bf16-mixed"])
    p.add_argument("--batch-size", type=int, default=512)
    p.add_argument("--workers", type=int, default=8)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--epochs", type=int, default=2, help="epochs a round (each side's process)")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--side", choices=["both", "lockstep", "pytorch"], default="both")
    p.add_argument("--data", help="a CIFAR-10 binary directory (default: a synthetic one)")
    p.add_argument("--bin", default=os.path.join(ROOT, "target/release/lockstep"))
    p.add_argument("--json", help="also write the result here")
    a = p.parse_args()
    if a.worker:
        print(json.dumps(pytorch_epochs(a, a.data)))
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        data = a.data or tmp
        if not a.data:
            write_synthetic(tmp)
        ours, peer = [], []
        for r in range(a.rounds):
            if a.side in ("both", "lockstep"):
                ours.append(lockstep(a, data))
            if a.side in ("both", "pytorch"):
                peer.append(pytorch(a, data))
            print(f"round {r}: lockstep {ours[-1] if ours else '-'} s, pytorch {peer[-1] if peer else '-'} s",
                  flush=True)
    first = compare(ours, peer, lambda epochs: epochs[0])
    later = compare(ours, peer, lambda epochs: statistics.mean(epochs[1:])) if a.epochs > 1 else None
    result = {"model": "resnet18", "dataset": "cifar10 (synthetic)" if not a.data else "cifar10",
              "device": a.device, "peer_device": a.peer_device or a.device, "precision": a.precision, "batch_size": a.batch_size, "workers": a.workers,
              "epochs": a.epochs, "lockstep_epoch_seconds": ours, "pytorch_epoch_seconds": peer,
              "first_epoch": first, "later_epochs": later, "ratio": (later or first)["ratio"]}
    print(json.dumps(result))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    sys.exit(main())
