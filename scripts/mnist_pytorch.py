#!/usr/bin/env python3
"""The PyTorch side of Lockstep's MNIST benchmark: the same model, batch size, optimizer, data
order semantics and normalisation as `lockstep train`, on the CPU with N threads or on a GPU
(`--device cuda:0`: the data set stays in host memory and each batch is copied over, as a
loader feeds a GPU; the epoch ends with a device sync).

    python3 scripts/mnist_pytorch.py --model mlp --optimizer sgd --lr 0.05 --momentum 0.9 --threads 2

Reads the gzipped IDX files directly (no torchvision) and prints one JSON line:
{"model", "epoch_seconds", "test_accuracy", "test_loss", "samples_per_sec"}.
"""
import argparse, gzip, json, os, struct, time

import torch
import torch.nn as nn
import torch.nn.functional as F


def read_idx(path):
    with (gzip.open if path.endswith(".gz") else open)(path, "rb") as f:
        data = f.read()
    magic = struct.unpack(">I", data[:4])[0]
    dims = magic & 0xFF
    shape = struct.unpack(">" + "I" * dims, data[4:4 + 4 * dims])
    return torch.frombuffer(bytearray(data[4 + 4 * dims:]), dtype=torch.uint8).reshape(shape)


def load(data_dir, split):
    prefix = "train" if split == "train" else "t10k"
    find = lambda name: next(p for p in (os.path.join(data_dir, name), os.path.join(data_dir, name + ".gz")) if os.path.exists(p))
    x = read_idx(find(f"{prefix}-images-idx3-ubyte")).float().div_(255).sub_(0.1307).div_(0.3081).unsqueeze(1)
    y = read_idx(find(f"{prefix}-labels-idx1-ubyte")).long()
    return x, y


def model(name, hidden):
    if name == "mlp":
        layers, width = [nn.Flatten()], 784
        for h in hidden:
            layers += [nn.Linear(width, h), nn.ReLU()]
            width = h
        return nn.Sequential(*layers, nn.Linear(width, 10))
    return nn.Sequential(
        nn.Conv2d(1, 6, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(6, 16, 5), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
        nn.Linear(400, 120), nn.ReLU(), nn.Linear(120, 84), nn.ReLU(), nn.Linear(84, 10))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="mlp", choices=["mlp", "lenet5"])
    p.add_argument("--hidden", default="512,512")
    p.add_argument("--data", default=os.environ.get("LOCKSTEP_DATA", "../shared/data/mnist"))
    p.add_argument("--optimizer", default="sgd", choices=["sgd", "adam", "adamw"])
    p.add_argument("--lr", type=float, default=None)
    p.add_argument("--momentum", type=float, default=0.0)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cpu")
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    xtr, ytr = load(a.data, "train")
    xte, yte = load(a.data, "test")
    device = torch.device(a.device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    if device.type == "cuda":
        xtr, ytr = xtr.pin_memory(), ytr.pin_memory()
    net = model(a.model, [int(h) for h in a.hidden.split(",")]).to(device)
    lr = a.lr if a.lr is not None else (0.05 if a.optimizer == "sgd" else 1e-3)
    opt = {"sgd": lambda: torch.optim.SGD(net.parameters(), lr=lr, momentum=a.momentum),
           "adam": lambda: torch.optim.Adam(net.parameters(), lr=lr),
           "adamw": lambda: torch.optim.AdamW(net.parameters(), lr=lr)}[a.optimizer]()
    # One shuffled epoch, batches sliced from the in-memory tensors (as fast as a loader can be).
    order = torch.randperm(len(xtr))
    sync()
    start = time.perf_counter()
    for i in range(0, len(xtr), a.batch_size):
        idx = order[i:i + a.batch_size]
        x = xtr[idx].to(device, non_blocking=True)
        y = ytr[idx].to(device, non_blocking=True)
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(net(x), y).backward()
        opt.step()
    sync()
    epoch = time.perf_counter() - start
    xte, yte = xte.to(device), yte.to(device)
    with torch.no_grad():
        logits = torch.cat([net(xte[i:i + 1000]) for i in range(0, len(xte), 1000)])
        loss = F.cross_entropy(logits, yte).item()
        acc = (logits.argmax(1) == yte).float().mean().item()
    print(json.dumps({"model": a.model, "epoch_seconds": epoch, "test_accuracy": acc, "test_loss": loss,
                      "samples_per_sec": len(xtr) / epoch, "threads": a.threads, "torch": torch.__version__}))


if __name__ == "__main__":
    main()
