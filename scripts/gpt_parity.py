#!/usr/bin/env python3
"""PyTorch's side of the GPT parity test (core/tests/gpt_parity.rs).

A GPT with nanoGPT's architecture and parameter names (scripts/gpt_model.py), every state-dict tensor filled from a counter hash that the Rust test mirrors
(`fill` here and there), trained for STEPS AdamW steps (nanoGPT's betas and parameter groups,
gradients clipped at 1.0) on hashed token batches, dropout 0. Writes the per-step losses of
each model in MODELS, and the state-dict names and shapes (safetensors metadata), to
testdata/gpt-parity/reference.safetensors.

Run: python3 scripts/gpt_parity.py   (CPU; torch 2.x, numpy, safetensors)
"""

import json
import math
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import save_file

from gpt_model import Gpt
from parity_hash import uniform

STEPS = 20
BATCH = 8
BATCHES = 4
VOCAB = 65
BLOCK = 64
LR, BETAS, WEIGHT_DECAY, CLIP = 1e-3, (0.9, 0.95), 0.1, 1.0
# name: (n_layer, n_head, n_embd)
MODELS = {"gpt-tiny": (2, 2, 128), "gpt-4x256": (4, 4, 256)}
OUT = Path(__file__).resolve().parent.parent / "testdata" / "gpt-parity" / "reference.safetensors"


def fill(name, shape, stream):
    """The initial value of one state-dict tensor (the Rust test computes the same)."""
    u = uniform(stream, math.prod(shape))
    if ".ln_" in name:
        v = 1.0 + 0.1 * u if name.endswith("weight") else 0.1 * u
    elif name.endswith("bias"):
        v = 0.02 * u
    else:
        v = 0.02 * math.sqrt(3.0) * u
    return torch.from_numpy(v.astype(np.float32)).reshape(shape)


def model(n_layer, n_head, n_embd):
    net = Gpt(VOCAB, BLOCK, n_layer, n_head, n_embd)
    state = {}
    for k, (name, t) in enumerate(net.state_dict().items()):
        state[name] = fill(name, tuple(t.shape), k)
    # The head is the token embedding: both names hold its value.
    state["lm_head.weight"] = state["transformer.wte.weight"]
    net.load_state_dict(state)
    return net


def batch(step):
    """Batch step mod BATCHES: BATCH rows of BLOCK + 1 hashed tokens, inputs and next tokens."""
    u = uniform(3000 + step % BATCHES, BATCH * (BLOCK + 1))
    tokens = torch.from_numpy(np.floor((u + 1.0) * 0.5 * VOCAB).astype(np.int64)).view(BATCH, BLOCK + 1)
    return tokens[:, :-1], tokens[:, 1:]


def train(net):
    decay = [p for p in net.parameters() if p.dim() >= 2]
    rest = [p for p in net.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": WEIGHT_DECAY}, {"params": rest, "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=LR, betas=BETAS, eps=1e-8)
    losses = []
    for step in range(STEPS):
        x, y = batch(step)
        logits = net(x)
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), y.reshape(-1))
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(net.parameters(), CLIP)
        opt.step()
        losses.append(loss.item())
    return losses


def main():
    torch.set_num_threads(2)
    out, metadata = {}, {}
    for name, (n_layer, n_head, n_embd) in MODELS.items():
        torch.manual_seed(0)
        net = model(n_layer, n_head, n_embd)
        metadata[f"{name}.state_dict"] = json.dumps([[k, list(t.shape)] for k, t in net.state_dict().items()])
        losses = train(net)
        print(name, " ".join(f"{x:.6f}" for x in losses))
        out[f"{name}.loss"] = torch.tensor(losses, dtype=torch.float32)
    gpt2 = Gpt(50304, 1024, 12, 12, 768)
    metadata["gpt2.parameters"] = str(sum(p.numel() for p in gpt2.parameters()))
    OUT.parent.mkdir(parents=True, exist_ok=True)
    save_file(out, str(OUT), metadata=metadata)
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
