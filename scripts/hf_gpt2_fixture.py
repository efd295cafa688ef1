#!/usr/bin/env python3
"""PyTorch's side of the Hugging Face GPT-2 loading test (core/tests/gpt_hugging_face.rs).

A small random transformers `GPT2LMHeadModel` (2 layers, 2 heads, 16 wide, vocabulary 65, 16
positions, dropout 0) is saved with `save_pretrained(safe_serialization=True)`, exactly as
transformers writes it (`transformer.`-prefixed names, Conv1D weights stored `[in, out]`, the tied
`lm_head.weight` left out). Beside it, the same weights as a `GPT2Model` state dict (no prefix)
with the causal-mask buffers older transformers versions kept (`h.N.attn.bias`,
`h.N.attn.masked_bias`). The reference holds a batch of token ids, transformers' loss on them
(`labels=ids`: each position predicts the next), its logits, and the loss after one AdamW step
on that batch.

The weights are drawn wider than GPT-2's 0.02 so that the MLP's inputs reach where the tanh
GELU ("gelu_new") and the exact one differ. That moves the mean loss by only ~1e-6 relative, but
the logits by ~1e-3: the script checks that the exact GELU would move the logits by several times
the test's logit tolerance (LOGIT_TOLERANCE), so the test can tell the two apart.

Run: pip install --target /tmp/pyhf transformers safetensors
     PYTHONPATH=/tmp/pyhf python3 scripts/hf_gpt2_fixture.py   (CPU; torch 2.x)
"""

import shutil
import tempfile
from pathlib import Path

import torch
from safetensors.torch import save_file
from transformers import GPT2Config, GPT2LMHeadModel

N_LAYER, N_HEAD, N_EMBD, VOCAB, POSITIONS = 2, 2, 16, 65, 16
BATCH = 4
LR, BETAS, WEIGHT_DECAY = 1e-2, (0.9, 0.95), 0.1
INIT_STD = 0.3
LOGIT_TOLERANCE = 1e-4  # core/tests/gpt_hugging_face.rs compares logits within this, absolute
OUT = Path(__file__).resolve().parent.parent / "testdata" / "hf-gpt2"


def config(activation):
    return GPT2Config(
        n_layer=N_LAYER,
        n_head=N_HEAD,
        n_embd=N_EMBD,
        vocab_size=VOCAB,
        n_positions=POSITIONS,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        activation_function=activation,
        initializer_range=INIT_STD,
        bos_token_id=0,
        eos_token_id=0,
    )


def loss(net, ids):
    return net(input_ids=ids, labels=ids).loss


def main():
    torch.set_num_threads(2)
    torch.manual_seed(0)
    net = GPT2LMHeadModel(config("gelu_new")).eval()
    # LayerNorms start at 1 and 0: perturb them, so a swapped weight and bias shows.
    with torch.no_grad():
        for name, p in net.named_parameters():
            if ".ln_" in name or "ln_f" in name:
                p.add_(0.1 * torch.randn_like(p))
    ids = torch.randint(0, VOCAB, (BATCH, POSITIONS), generator=torch.Generator().manual_seed(1))

    # Position t predicts token t + 1: the next-token cross-entropy over the window.
    first = loss(net, ids)
    logits = net(input_ids=ids).logits
    shifted = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, VOCAB), ids[:, 1:].reshape(-1))
    assert torch.allclose(first, shifted), (first, shifted)

    exact = GPT2LMHeadModel(config("gelu")).eval()
    exact.load_state_dict(net.state_dict())
    gap = (exact(input_ids=ids).logits - logits).abs().max().item()
    assert gap > 5 * LOGIT_TOLERANCE, f"the exact GELU moves the logits by only {gap:.1e}: draw wider weights"

    OUT.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        net.save_pretrained(tmp, safe_serialization=True)
        shutil.copy(Path(tmp) / "model.safetensors", OUT / "model.safetensors")

    legacy = {k: v.clone().contiguous() for k, v in net.transformer.state_dict().items()}
    mask = torch.tril(torch.ones(POSITIONS, POSITIONS, dtype=torch.uint8)).view(1, 1, POSITIONS, POSITIONS)
    for i in range(N_LAYER):
        legacy[f"h.{i}.attn.bias"] = mask.clone()
        legacy[f"h.{i}.attn.masked_bias"] = torch.tensor(-1e4)
    save_file(legacy, str(OUT / "gpt2model-legacy.safetensors"), metadata={"format": "pt"})

    # One AdamW step, nanoGPT's groups (decay on matrices only), as our LanguageModeling sees it.
    net.train()
    decay = [p for p in net.parameters() if p.dim() >= 2]
    rest = [p for p in net.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": WEIGHT_DECAY}, {"params": rest, "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=LR, betas=BETAS, eps=1e-8)
    opt.zero_grad()
    loss(net, ids).backward()
    opt.step()
    second = loss(net, ids)

    losses = torch.tensor([first.item(), second.item()], dtype=torch.float32)
    reference = {"ids": ids.to(torch.int64), "logits": logits.detach().contiguous(), "loss": losses}
    save_file(reference, str(OUT / "reference.safetensors"))
    print(f"losses {losses.tolist()}, the exact GELU moves the logits by up to {gap:.1e}")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
