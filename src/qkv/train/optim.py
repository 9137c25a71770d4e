"""How the weights move: AdamW, gradient clipping, and the warm-up + cosine learning-rate schedule.

    g  ─clip_grad_norm─▶  g·min(1, max_norm/(‖g‖+1e-6))  ─AdamW.step(lr = lr_at(step))─▶  θ updated in place

Everything works on plain dicts name → np.ndarray (the checkpoint's tensor names, as
`qkv.train.gradients` returns them). The parameters are updated IN PLACE: the model's weight
tree holds views into these arrays, so a step shows through without copying anything back.

The math is torch's, step for step (torch.optim.AdamW, torch.nn.utils.clip_grad_norm_,
transformers' get_cosine_schedule_with_warmup), so a run here and a run in torch agree, and
`tests/live/test_live_train_optim.py` checks that they do.
"""

from __future__ import annotations

import math
from typing import Callable, Mapping

import numpy as np

from ..runtime.errors import QkvError

NoDecay = Callable[[str, np.ndarray], bool]


def _finite(name: str, value, fix: str) -> float:
    """A setting as a float, or a QkvError if it is not a finite number."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)) \
            or not math.isfinite(value):
        raise QkvError(f"{name} must be a finite number, got {value!r}; {fix}")
    return float(value)


def check_lr(lr, name: str = "lr") -> float:
    """A learning rate must be a finite number > 0."""
    lr = _finite(name, lr, "give e.g. 1e-3")
    if lr <= 0:
        raise QkvError(f"{name} must be > 0, got {lr:g}; give e.g. 1e-3")
    return lr


def no_decay_1d(name: str, p: np.ndarray) -> bool:
    """The default exemption from weight decay: every 1-D array — biases, LayerNorm / RMSNorm
    weights — is not decayed; matrices (W_Q, …, W_vocab, the embeddings) are (as nanoGPT and
    most LM recipes do: decay pulls the weights of a matmul toward 0, not a bias or a gain)."""
    return p.ndim < 2


class AdamW:
    """Adam with decoupled weight decay (Loshchilov & Hutter 2019), exactly as torch.optim.AdamW
    (amsgrad off, not maximising). For each parameter θ with gradient g, at step t = 1, 2, …:

        θ ← θ − lr·λ·θ                      decoupled weight decay (λ = weight_decay; 0 for no_decay names)
        m ← β1·m + (1−β1)·g                 first moment (running mean of g)
        v ← β2·v + (1−β2)·g²                second moment (running mean of g²)
        m̂ = m / (1−β1ᵗ)                     bias correction: m, v start at 0
        v̂ = v / (1−β2ᵗ)
        θ ← θ − lr·m̂ / (√v̂ + ε)             ε added after the square root, as torch does

    torch computes the last line as θ − (lr/(1−β1ᵗ))·m / (√v/√(1−β2ᵗ) + ε), and so do we.

    params: name → float array, updated in place (other code holds views into them).
    no_decay(name, array) → True exempts a parameter from weight decay; default `no_decay_1d`
    (biases and norm weights, i.e. every 1-D array, are not decayed).
    m and v have the parameters' shapes and dtype; one scratch buffer (the size of the largest
    parameter) is all a step allocates, once.
    """

    def __init__(self, params: dict[str, np.ndarray], lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.01, no_decay: NoDecay | None = None):
        self.lr = check_lr(lr)
        if not isinstance(betas, (tuple, list)) or len(betas) != 2:
            raise QkvError(f"betas must be two numbers (β1, β2), got {betas!r}; give e.g. (0.9, 0.999)")
        b1, b2 = (_finite(f"beta{i + 1}", b, "give e.g. (0.9, 0.999)") for i, b in enumerate(betas))
        for i, b in enumerate((b1, b2)):
            if not 0.0 <= b < 1.0:
                raise QkvError(f"beta{i + 1} must be in [0, 1), got {b:g}; give e.g. (0.9, 0.999)")
        self.betas = (b1, b2)
        self.eps = _finite("eps", eps, "give e.g. 1e-8")
        if self.eps <= 0:
            raise QkvError(f"eps must be > 0, got {self.eps:g}; give e.g. 1e-8")
        self.weight_decay = _finite("weight_decay", weight_decay, "give e.g. 0.01, or 0 for none")
        if self.weight_decay < 0:
            raise QkvError(f"weight_decay must be ≥ 0, got {self.weight_decay:g}; give e.g. 0.01, or 0 for none")
        if not params:
            raise QkvError("AdamW needs at least one parameter; pass the model's tensors")
        for name, p in params.items():
            if not isinstance(p, np.ndarray) or not np.issubdtype(p.dtype, np.floating):
                raise QkvError(f"parameter {name!r} must be a float array, got {type(p).__name__} "
                               f"{getattr(p, 'dtype', '')}; pass the model's tensors")
        no_decay = no_decay or no_decay_1d
        self.params = params
        self.decay = {name: not no_decay(name, p) for name, p in params.items()}
        self.step_count = 0                                                   # t: steps taken
        self.m = {name: np.zeros_like(p) for name, p in params.items()}
        self.v = {name: np.zeros_like(p) for name, p in params.items()}
        self._scratch = {dt: np.empty(max(p.size for p in params.values() if p.dtype == dt), dt)
                         for dt in {p.dtype for p in params.values()}}

    def step(self, grads: Mapping[str, np.ndarray], lr: float | None = None) -> None:
        """One AdamW update of every parameter from its gradient (the class docstring's formula).

        grads: name → gradient, the same names and shapes as the parameters.
        lr: this step's learning rate (the schedule's `lr_at(step, …)`; 0 is allowed, as at the
        first warm-up step); None uses the lr given at construction.
        """
        if grads.keys() != self.params.keys():
            missing = sorted(self.params.keys() - grads.keys())[:3]
            extra = sorted(grads.keys() - self.params.keys())[:3]
            raise ValueError(f"gradients must name exactly the parameters (missing {missing}, unknown {extra})")
        lr = self.lr if lr is None else _finite("lr", lr, "give the schedule's lr_at(step, ...)")
        if lr < 0:
            raise QkvError(f"lr must be ≥ 0, got {lr:g}; give the schedule's lr_at(step, ...)")
        b1, b2 = self.betas
        self.step_count += 1
        t = self.step_count
        step_size = lr / (1 - b1 ** t)                                        # lr / (1−β1ᵗ)
        bias2_sqrt = (1 - b2 ** t) ** 0.5                                     # √(1−β2ᵗ)
        for name, p in self.params.items():
            g, m, v = grads[name], self.m[name], self.v[name]
            if g.shape != p.shape:
                raise ValueError(f"gradient {name!r} has shape {g.shape}, its parameter {p.shape}")
            tmp = self._scratch[p.dtype][: p.size].reshape(p.shape)          # same shape as θ
            if self.decay[name] and self.weight_decay != 0:
                p *= 1 - lr * self.weight_decay                               # θ ← θ − lr·λ·θ
            # m ← β1·m + (1−β1)·g, written as torch's lerp: m + (1−β1)·(g − m)
            np.subtract(g, m, out=tmp)
            tmp *= 1 - b1
            m += tmp
            # v ← β2·v + (1−β2)·g²
            v *= b2
            np.multiply(g, g, out=tmp)
            tmp *= 1 - b2
            v += tmp
            # θ ← θ − (lr/(1−β1ᵗ))·m / (√v/√(1−β2ᵗ) + ε)
            np.sqrt(v, out=tmp)
            tmp /= bias2_sqrt
            tmp += self.eps
            np.divide(m, tmp, out=tmp)
            tmp *= step_size
            p -= tmp

    def state_dict(self) -> dict[str, np.ndarray]:
        """What a checkpoint must keep to resume bit for bit: {"step": (1,) int64, "m.NAME": m,
        "v.NAME": v} (copies; safetensors can store the dict as it is)."""
        state = {"step": np.array([self.step_count], dtype=np.int64)}
        for name in self.params:
            state[f"m.{name}"] = self.m[name].copy()
            state[f"v.{name}"] = self.v[name].copy()
        return state

    def load_state_dict(self, state: Mapping[str, np.ndarray]) -> None:
        """Continue from a saved `state_dict()`: the same parameter names, shapes and dtypes, or a QkvError."""
        fix = "resume from the checkpoint this run wrote, or start a fresh run"
        want = {"step"} | {f"{k}.{name}" for name in self.params for k in ("m", "v")}
        missing, extra = sorted(want - state.keys()), sorted(state.keys() - want)
        if missing or extra:
            what = f"lacks {', '.join(missing[:3])}" if missing else f"has unknown {', '.join(extra[:3])}"
            more = len(missing or extra) - 3
            raise QkvError(f"the optimizer state does not match the model: it {what}"
                           f"{f' and {more} more' if more > 0 else ''}; {fix}")
        step = np.asarray(state["step"])
        if step.size != 1 or not np.issubdtype(step.dtype, np.integer) or int(step.reshape(-1)[0]) < 0:
            raise QkvError(f"the optimizer state's step must be one integer ≥ 0, got {step!r:.60}; {fix}")
        for key in sorted(want - {"step"}):
            name = key[2:]
            a, p = np.asarray(state[key]), self.params[name]
            if a.shape != p.shape or a.dtype != p.dtype:
                raise QkvError(f"the optimizer state's {key} is {a.dtype} {a.shape}, its parameter "
                               f"{p.dtype} {p.shape}; {fix}")
        for name in self.params:                                              # all checked: now copy
            np.copyto(self.m[name], state[f"m.{name}"])
            np.copyto(self.v[name], state[f"v.{name}"])
        self.step_count = int(step.reshape(-1)[0])


NORM_CHUNK = 1 << 16            # elements per BLAS dot in global_norm


def global_norm(grads: Mapping[str, np.ndarray]) -> float:
    """‖g‖ = √(Σ over every gradient array of Σ g²).

    Plain form: √(Σ_arrays (g.astype(float64)**2).sum()). Fast form: BLAS dots of 65 536 elements
    in the arrays' own dtype, added up in float64 (10× faster than casting, ~1e-7 relative apart)."""
    total = 0.0
    for g in grads.values():
        flat = g.reshape(-1)                                                  # (size,), a view
        for i in range(0, flat.size, NORM_CHUNK):
            chunk = flat[i: i + NORM_CHUNK]
            total += float(np.dot(chunk, chunk))
    return math.sqrt(total)


def clip_grad_norm(grads: Mapping[str, np.ndarray], max_norm: float) -> float:
    """Scale every gradient by min(1, max_norm / (‖g‖ + 1e-6)) in place (torch's clip_grad_norm_);
    returns ‖g‖ before clipping. ‖g‖ is the global L2 norm over all the arrays together.

    As in torch, a non-finite ‖g‖ (inf, nan) scales the gradients by 0 or nan: the caller
    should look at the returned norm before stepping.
    """
    max_norm = _finite("max_norm", max_norm, "give e.g. 1.0")
    if max_norm <= 0:
        raise QkvError(f"max_norm must be > 0, got {max_norm:g}; give e.g. 1.0")
    norm = global_norm(grads)
    coef = max_norm / (norm + 1e-6)
    if not coef >= 1.0:                                                      # nan scales too, as torch
        for g in grads.values():
            g *= coef
    return norm


def lr_at(step: int, *, lr: float, warmup: int, total: int, min_lr: float = 0.0) -> float:
    """The learning rate after STEP optimizer steps: linear warm-up from 0, then half a cosine down to min_lr.

        step < warmup:   lr · step/warmup
        otherwise:       lr · (f·(1 − r) + r),   f = ½·(1 + cos(π·p)),  p = min(1, (step − warmup)/(total − warmup)),
                                                 r = min_lr/lr

    This is LambdaLR's multiplier at STEP times lr, for transformers' get_cosine_schedule_with_warmup
    (min_lr = 0) and get_cosine_with_min_lr_schedule_with_warmup (min_lr_rate = r), written as they
    write it; past `total` it stays at min_lr (theirs would rise again). Step 0 gives 0 when warmup > 0.
    """
    lr = check_lr(lr)
    min_lr = _finite("min_lr", min_lr, "give a value in [0, lr]")
    if not 0 <= min_lr <= lr:
        raise QkvError(f"min_lr must be in [0, lr={lr:g}], got {min_lr:g}; give a value in [0, lr]")
    for name, value in (("warmup", warmup), ("total", total), ("step", step)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
            raise QkvError(f"{name} must be a whole number ≥ 0, got {value!r}; give a count of optimizer steps")
    if total < 1:
        raise QkvError(f"total must be ≥ 1, got {total}; give the number of optimizer steps of the run")
    if warmup > total:
        raise QkvError(f"warmup ({warmup}) is longer than the run (total {total}); give warmup ≤ total")
    if step < warmup:
        return lr * (float(step) / float(max(1, warmup)))
    progress = min(1.0, float(step - warmup) / float(max(1, total - warmup)))
    factor = 0.5 * (1.0 + math.cos(math.pi * 0.5 * 2.0 * progress))
    rate = min_lr / lr
    return lr * max(0.0, factor * (1 - rate) + rate)
