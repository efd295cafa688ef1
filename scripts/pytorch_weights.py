#!/usr/bin/env python3
"""PyTorch's side of the pytorch_weights example (core/examples/pytorch_weights.rs).

A small PyTorch model (a Sequential encoder with a BatchNorm, then a head) with seeded random
weights, its BatchNorm's affine weights and running statistics moved off their defaults (the
latter by a few training-mode passes), then put in eval mode and run on a batch. Writes its
state dict under PyTorch's names, plus that batch (`check.input`) and what the model computed
from it (`check.output`), to testdata/pytorch-weights/tiny_net.safetensors (about 2 KB).

Run: python3 scripts/pytorch_weights.py   (CPU; torch 2.x, safetensors)
"""

from pathlib import Path

import torch
import torch.nn as nn
from safetensors.torch import save_file

OUT = Path(__file__).resolve().parent.parent / "testdata" / "pytorch-weights" / "tiny_net.safetensors"


class TinyNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(6, 16), nn.BatchNorm1d(16), nn.GELU())
        self.head = nn.Linear(16, 3)

    def forward(self, x):
        return self.head(self.encoder(x))


def main():
    torch.manual_seed(0)
    net = TinyNet()
    net.train()
    with torch.no_grad():
        nn.init.uniform_(net.encoder[1].weight, 0.5, 1.5)
        nn.init.uniform_(net.encoder[1].bias, -0.5, 0.5)
        for _ in range(5):
            net(torch.randn(32, 6) * 2.0 + 0.5)
    net.eval()
    x = torch.randn(4, 6)
    with torch.no_grad():
        y = net(x)
    tensors = {name: t.contiguous() for name, t in net.state_dict().items()}
    tensors["check.input"] = x
    tensors["check.output"] = y
    OUT.parent.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(OUT))
    print(y)
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
