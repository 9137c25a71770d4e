"""qkv.train.optim against torch and transformers (make test-live): AdamW equals torch.optim.AdamW
(two param groups, one without decay) over 20 steps of a warm-up + cosine schedule, clip_grad_norm
equals torch.nn.utils.clip_grad_norm_, lr_at equals transformers' cosine schedules step by step.
Tolerances: float32, 1e-6 relative (max |a − b| / max |b| per tensor); the schedule exactly.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import get_cosine_schedule_with_warmup, get_cosine_with_min_lr_schedule_with_warmup

from qkv.train.optim import AdamW, clip_grad_norm, lr_at

pytestmark = pytest.mark.live

TOL = 1e-6
SHAPES = {"transformer.wte.weight": (50, 16), "transformer.h.0.attn.c_attn.weight": (16, 48),
          "transformer.h.0.attn.c_attn.bias": (48,), "transformer.h.0.ln_1.weight": (16,),
          "transformer.h.0.mlp.c_fc.weight": (16, 64)}
STEPS = 20
LR, BETAS, EPS, WD = 3e-2, (0.9, 0.95), 1e-8, 0.1


def rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a.astype(np.float64) - b.astype(np.float64)).max() / np.abs(b.astype(np.float64)).max())


def grads_at(step: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng([7, step])
    return {k: (rng.standard_normal(s) * rng.uniform(0.05, 2)).astype(np.float32) for k, s in SHAPES.items()}


def test_adamw_equals_torch_adamw():
    rng = np.random.default_rng(0)
    params = {k: rng.standard_normal(s).astype(np.float32) for k, s in SHAPES.items()}
    tensors = {k: torch.nn.Parameter(torch.from_numpy(v.copy())) for k, v in params.items()}
    decay = [t for k, t in tensors.items() if t.ndim >= 2]
    no_decay = [t for k, t in tensors.items() if t.ndim < 2]
    ref = torch.optim.AdamW([{"params": decay, "weight_decay": WD}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=LR, betas=BETAS, eps=EPS)
    sched = get_cosine_schedule_with_warmup(ref, num_warmup_steps=5, num_training_steps=STEPS)
    opt = AdamW(params, lr=LR, betas=BETAS, eps=EPS, weight_decay=WD)
    assert [opt.decay[k] for k in SHAPES] == [True, True, False, False, True]
    for step in range(STEPS):
        grads = grads_at(step)
        for k, t in tensors.items():
            t.grad = torch.from_numpy(grads[k].copy())
        ref.step()
        sched.step()
        opt.step(grads, lr=lr_at(step, lr=LR, warmup=5, total=STEPS))
    for k, t in tensors.items():
        assert rel(params[k], t.detach().numpy()) <= TOL, k
        state = ref.state[t]
        assert rel(opt.m[k], state["exp_avg"].numpy()) <= TOL, k
        assert rel(opt.v[k], state["exp_avg_sq"].numpy()) <= TOL, k
        assert int(state["step"]) == opt.step_count == STEPS


@pytest.mark.parametrize("max_norm", [0.5, 1e4])
def test_clip_equals_torch_clip_grad_norm(max_norm):
    grads = grads_at(0)
    tensors = [torch.nn.Parameter(torch.zeros(s)) for s in SHAPES.values()]
    for t, g in zip(tensors, grads.values()):
        t.grad = torch.from_numpy(g.copy())
    want = float(torch.nn.utils.clip_grad_norm_(tensors, max_norm))
    got = clip_grad_norm(grads, max_norm)
    assert abs(got - want) <= TOL * want
    for t, g in zip(tensors, grads.values()):
        assert rel(g, t.grad.numpy()) <= TOL


@pytest.mark.parametrize("warmup, total", [(0, 30), (7, 50), (10, 10), (1, 2)])
def test_lr_at_equals_transformers_cosine_schedule(warmup, total):
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=LR)
    sched = get_cosine_schedule_with_warmup(opt, num_warmup_steps=warmup, num_training_steps=total)
    for step in range(total + 1):
        assert lr_at(step, lr=LR, warmup=warmup, total=total) == opt.param_groups[0]["lr"], step
        opt.step()
        sched.step()


def test_lr_at_with_min_lr_equals_transformers_min_lr_schedule():
    total, warmup, min_lr = 40, 6, 3e-3
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=LR)
    sched = get_cosine_with_min_lr_schedule_with_warmup(opt, num_warmup_steps=warmup, num_training_steps=total,
                                                         min_lr=min_lr)
    for step in range(total + 1):
        assert lr_at(step, lr=LR, warmup=warmup, total=total, min_lr=min_lr) == \
            pytest.approx(opt.param_groups[0]["lr"], rel=1e-14, abs=0), step
        opt.step()
        sched.step()
