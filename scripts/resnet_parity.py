#!/usr/bin/env python3
"""PyTorch's side of the ResNet-18 parity test (core/tests/resnet_parity.rs).

torchvision's resnet18 with the CIFAR stem (conv1 3x3 stride 1, no max-pool) and 10 classes,
every state-dict tensor filled from a counter hash that the Rust test mirrors (`fill` below and
`fill` there), trained for STEPS SGD steps on hashed batches (no augmentation, no shuffle).
Writes the per-step losses and every BatchNorm's running statistics afterwards to
testdata/resnet18-parity/reference.safetensors; with --weights FILE it also writes the initial
state dict, torchvision-named, for `lockstep train --init-weights FILE`.

Run: python3 scripts/resnet_parity.py [--weights FILE]   (CPU; torch and torchvision 0.2x)
"""

import argparse
import json
import math
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torchvision
from safetensors.torch import save_file

from parity_hash import uniform

STEPS = 20
BATCH = 16
IMAGE = 32
CLASSES = 10
# A small learning rate and batches of 16: ResNet training is chaotic at the scale of f32
# rounding. A ReLU input within ~1e-7 of zero takes either side depending on summation order,
# which moves that gradient by ~1e-3, and larger steps amplify it: at lr 2e-3 and batch 8
# PyTorch's own f32 run leaves its f64 run by 1e-4 within 5 steps. At lr 1e-4 and batch 16 it
# stays within 8e-6 over 20 steps, Lockstep within 1.3e-5 of PyTorch on 1 to 5 threads, and
# the loss still falls from 2.46 to 2.17.
LR, MOMENTUM, WEIGHT_DECAY = 1e-4, 0.9, 5e-4
# Four batches, cycled: a task the model can fit, so the losses fall steadily.
BATCHES = 4
FIXTURE = Path(__file__).resolve().parent.parent / "testdata" / "resnet18-parity"
OUT = FIXTURE / "reference.safetensors"
# torchvision's state-dict names and shapes, for the naming test (core/tests/resnet.rs).
NAMES_OUT = FIXTURE / "torchvision_state_dicts.json"


def fill(name, shape, stream):
    """The initial value of one state-dict tensor (the Rust test computes the same)."""
    n = math.prod(shape)
    u = uniform(stream, n)
    if name.endswith("running_mean"):
        v = np.zeros(n)
    elif name.endswith("running_var"):
        v = np.ones(n)
    elif ".bn" in name or name.startswith("bn") or ".downsample.1." in name:
        v = 1.0 + 0.1 * u if name.endswith("weight") else 0.1 * u
    elif len(shape) == 4:
        fan_out = shape[0] * shape[2] * shape[3]
        v = math.sqrt(6.0 / fan_out) * u
    else:
        fan_in = 512
        v = u / math.sqrt(fan_in)
    return torch.from_numpy(v.astype(np.float32)).reshape(shape)


def cifar_resnet18():
    """torchvision's resnet18 with the CIFAR stem, as Lockstep builds it for 32px images."""
    net = torchvision.models.resnet18(num_classes=CLASSES)
    net.conv1 = nn.Conv2d(3, 64, 3, 1, 1, bias=False)
    net.maxpool = nn.Identity()
    return net


def write_names():
    """Names, shapes and parameter counts of torchvision's ResNets, ImageNet and CIFAR stems."""
    nets = {
        "resnet18": torchvision.models.resnet18(),
        "resnet34": torchvision.models.resnet34(),
        "resnet50": torchvision.models.resnet50(),
        "resnet18-cifar10": cifar_resnet18(),
    }
    out = {
        name: {
            "state_dict": [[k, list(t.shape)] for k, t in net.state_dict().items()],
            "parameters": sum(p.numel() for p in net.parameters()),
        }
        for name, net in nets.items()
    }
    NAMES_OUT.write_text(json.dumps(out, separators=(",", ":")) + "\n")


def model():
    net = cifar_resnet18()
    state = {}
    for k, (name, t) in enumerate(net.state_dict().items()):
        state[name] = t if name.endswith("num_batches_tracked") else fill(name, tuple(t.shape), k)
    net.load_state_dict(state)
    return net, state


def batch(step):
    """Batch step mod BATCHES: images in [-1, 1) from stream 1000 + b, labels from stream 2000 + b."""
    step %= BATCHES
    x = torch.from_numpy(uniform(1000 + step, BATCH * 3 * IMAGE * IMAGE).astype(np.float32))
    labels = (uniform(2000 + step, BATCH) + 1.0) * 0.5 * CLASSES
    y = torch.from_numpy(np.floor(labels).astype(np.int64))
    return x.reshape(BATCH, 3, IMAGE, IMAGE), y


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--weights", type=Path, help="also write the initial state dict here")
    args = parser.parse_args()
    torch.set_num_threads(2)
    write_names()
    net, state = model()
    if args.weights:
        save_file({k: v.contiguous() for k, v in state.items()}, str(args.weights))
    net.train()
    opt = torch.optim.SGD(net.parameters(), lr=LR, momentum=MOMENTUM, weight_decay=WEIGHT_DECAY)
    losses = []
    for step in range(STEPS):
        x, y = batch(step)
        loss = nn.functional.cross_entropy(net(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
        print(f"step {step}: loss {loss.item():.6f}")
    out = {"loss": torch.tensor(losses, dtype=torch.float32)}
    for name, t in net.state_dict().items():
        if name.endswith("running_mean") or name.endswith("running_var"):
            out[name] = t.contiguous()
    OUT.parent.mkdir(parents=True, exist_ok=True)
    save_file(out, str(OUT))
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
