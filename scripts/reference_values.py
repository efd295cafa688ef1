#!/usr/bin/env python3
"""PyTorch reference values for the nn and optim tests (core/tests/nn_*.rs, core/tests/optim_*.rs).

Prints Rust constants; each test embeds the block it needs and names the section here that
produced it. Inputs are exact binary fractions from `pat` (mirrored by `pat` in
core/tests/nn_support/mod.rs), so both sides start from bit-identical tensors.

Run: python3 scripts/reference_values.py [SECTION...]   (CPU only; any PyTorch 2.x)
"""

import math
import sys

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

torch.set_default_dtype(torch.float32)


def pat(shape, k, m=17):
    """Element i is ((i*k) % m - m//2) / 8: small, signed and exact in f32."""
    n = math.prod(shape)
    return torch.tensor([((i * k) % m - m // 2) / 8 for i in range(n)], dtype=torch.float32).reshape(shape)


def lit(v, ty):
    """The shortest literal that reads back as the same `ty` value (f32 or f64)."""
    return str(np.float32(v)) if ty == "f32" else repr(float(v))


def emit(name, values, ty="f32"):
    flat = values if isinstance(values, list) else torch.as_tensor(values).flatten().tolist()
    body = ", ".join(lit(v, ty) for v in flat)
    print(f"const {name}: [{ty}; {len(flat)}] = [{body}];")


def header(title):
    print(f"\n// --- {title} ---")


# --- nn ------------------------------------------------------------------------------------------


def conv():
    header("conv: F.conv2d on pat inputs")
    x = pat([2, 3, 5, 5], 5)
    w = pat([4, 3, 3, 3], 7) / 2
    b = pat([4], 3)
    emit("CONV_S2_P1", F.conv2d(x, w, b, stride=2, padding=1))  # [2, 4, 3, 3]
    x = pat([1, 4, 6, 6], 3)
    w = pat([6, 2, 2, 2], 5)
    emit("CONV_G2_D2", F.conv2d(x, w, None, dilation=2, groups=2))  # [1, 6, 4, 4]


def pool():
    header("pool: F.max_pool2d / F.avg_pool2d on pat([1, 2, 5, 5], 7)")
    x = pat([1, 2, 5, 5], 7)
    emit("MAXPOOL_K3_S2_P1", F.max_pool2d(x, 3, stride=2, padding=1))  # [1, 2, 3, 3]
    emit("AVGPOOL_K2", F.avg_pool2d(x, 2))  # [1, 2, 2, 2]
    emit("AVGPOOL_K3_S2_P1", F.avg_pool2d(x, 3, stride=2, padding=1))  # [1, 2, 3, 3], count_include_pad


def batchnorm():
    header("batchnorm: nn.BatchNorm2d(3) twice in train mode, then eval; nn.BatchNorm1d(3) once")
    bn = nn.BatchNorm2d(3)
    x1, x2 = pat([4, 3, 2, 2], 5), pat([4, 3, 2, 2], 11) * 2
    y1 = bn(x1)
    bn(x2)
    emit("BN2D_TRAIN_Y1", y1.detach())
    emit("BN2D_RUNNING_MEAN", bn.running_mean)
    emit("BN2D_RUNNING_VAR", bn.running_var)
    assert int(bn.num_batches_tracked) == 2
    bn.eval()
    emit("BN2D_EVAL_Y", bn(x1).detach())
    bn1 = nn.BatchNorm1d(3)
    y = bn1(pat([5, 3], 7))
    emit("BN1D_TRAIN_Y", y.detach())
    emit("BN1D_RUNNING_VAR", bn1.running_var)


def gelu():
    header("gelu: nn.GELU() on pat([9], 5)")
    emit("GELU_Y", nn.GELU()(pat([9], 5)))


def names():
    header("state-dict names: the project's MLP and LeNet-5 as one nn.Sequential, and one with BatchNorm")
    mlp = nn.Sequential(nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10))
    lenet = nn.Sequential(
        nn.Conv2d(1, 6, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(6, 16, 5), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
        nn.Linear(400, 120), nn.ReLU(), nn.Linear(120, 84), nn.ReLU(), nn.Linear(84, 10),
    )
    bn = nn.Sequential(nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 26 * 26, 10), nn.BatchNorm1d(10))
    for label, model in [("MLP", mlp), ("LENET", lenet), ("BN_NET", bn)]:
        items = ", ".join(f'("{k}", &{list(v.shape)})' for k, v in model.state_dict().items())
        print(f"const {label}_STATE: &[(&str, &[usize])] = &[{items}];")
    print("// LeNet-5 repr:")
    for line in repr(lenet).splitlines():
        print("//   " + line)


# --- optim ---------------------------------------------------------------------------------------


def run_optimizer(make, steps=5):
    """Two parameters; before step t the gradient is 0.5 * p + pat(shape, 3 + 2t) / 4."""
    w = pat([2, 3], 5).requires_grad_(True)
    b = pat([3], 7).requires_grad_(True)
    opt = make([w, b])
    first = None
    for t in range(steps):
        for p in (w, b):
            p.grad = 0.5 * p.detach() + pat(list(p.shape), 3 + 2 * t) / 4
        opt.step()
        if first is None:
            first = torch.cat([w.detach().flatten(), b.detach().flatten()])
    return first, torch.cat([w.detach().flatten(), b.detach().flatten()])


def optimizers():
    header("optimizers: 5 steps of torch.optim.* (foreach=False) on w=pat([2,3],5), b=pat([3],7); grads 0.5*p + pat(shape, 3+2t)/4")
    cases = {
        "SGD_PLAIN": lambda ps: torch.optim.SGD(ps, lr=0.1, foreach=False),
        "SGD_MOMENTUM_DAMPENING": lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, dampening=0.1, foreach=False),
        "SGD_NESTEROV_WD": lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.01, foreach=False),
        "SGD_MOMENTUM_WD": lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.5, weight_decay=0.05, foreach=False),
        "ADAM_LR01": lambda ps: torch.optim.Adam(ps, lr=0.01, foreach=False),
        "ADAM_WD_BETAS": lambda ps: torch.optim.Adam(ps, lr=0.02, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.1, foreach=False),
        "ADAMW_DEFAULT_WD": lambda ps: torch.optim.AdamW(ps, lr=0.01, foreach=False),
        "ADAMW_WD": lambda ps: torch.optim.AdamW(ps, lr=0.05, weight_decay=0.1, foreach=False),
    }
    for name, make in cases.items():
        first, last = run_optimizer(make)
        emit(f"{name}_STEP1", first)
        emit(f"{name}_STEP5", last)


def schedulers():
    header("schedulers: get_last_lr() after construction and after each of N step() calls, base lr 0.1")
    sched = torch.optim.lr_scheduler

    def lrs(make, n):
        opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)
        s = make(opt)
        out = [s.get_last_lr()[0]]
        for _ in range(n):
            opt.step()
            s.step()
            out.append(s.get_last_lr()[0])
        return out

    cases = {
        "STEP_LR": (lambda o: sched.StepLR(o, step_size=3, gamma=0.5), 12),
        "MULTI_STEP_LR": (lambda o: sched.MultiStepLR(o, milestones=[2, 5, 5, 9], gamma=0.1), 12),
        "COSINE_LR": (lambda o: sched.CosineAnnealingLR(o, T_max=10, eta_min=0.001), 25),
        "LINEAR_LR": (lambda o: sched.LinearLR(o, start_factor=0.25, end_factor=1.0, total_iters=4), 8),
        "SEQUENTIAL_LR": (
            lambda o: sched.SequentialLR(o, [sched.LinearLR(o, 0.1, 1.0, 3), sched.CosineAnnealingLR(o, T_max=8)], milestones=[3]),
            14,
        ),
        "CHAINED_LINEAR_STEP": (lambda o: sched.ChainedScheduler([sched.LinearLR(o, 0.5, 1.0, 4), sched.StepLR(o, 3, 0.5)]), 10),
        "CHAINED_LINEAR_COSINE": (lambda o: sched.ChainedScheduler([sched.LinearLR(o, 0.2, 1.0, 5), sched.CosineAnnealingLR(o, T_max=10)]), 10),
    }
    for name, (make, n) in cases.items():
        emit(name, lrs(make, n), "f64")


def clipping():
    header("clipping: torch.nn.utils.clip_grad_norm_ / clip_grad_value_ on grads pat([2,3],5) and pat([4],3), grads of a third parameter None")

    def params():
        a, b, c = torch.zeros(2, 3, requires_grad=True), torch.zeros(4, requires_grad=True), torch.zeros(2, requires_grad=True)
        a.grad, b.grad = pat([2, 3], 5), pat([4], 3)
        return [a, b, c]

    for name, max_norm, norm_type in [("CLIP_L2", 1.0, 2.0), ("CLIP_INF", 0.5, math.inf), ("CLIP_L1_NOOP", 100.0, 1.0), ("CLIP_L3", 0.75, 3.0)]:
        ps = params()
        total = torch.nn.utils.clip_grad_norm_(ps, max_norm, norm_type=norm_type)
        print(f"const {name}_TOTAL: f32 = {lit(total, 'f32')};")
        emit(f"{name}_GRADS", torch.cat([ps[0].grad.flatten(), ps[1].grad.flatten()]))
    ps = params()
    torch.nn.utils.clip_grad_value_(ps, 0.3)
    emit("CLIP_VALUE_GRADS", torch.cat([ps[0].grad.flatten(), ps[1].grad.flatten()]))


SECTIONS = {f.__name__: f for f in [conv, pool, batchnorm, gelu, names, optimizers, schedulers, clipping]}

if __name__ == "__main__":
    for name in sys.argv[1:] or SECTIONS:
        SECTIONS[name]()
