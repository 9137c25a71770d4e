"""Choosing the next token (guide: temperature): P(next) = softmax(logits[last] / temperature).

The filters follow transformers' order and definitions: temperature, then top-k, then
top-p, each turning the logits of excluded tokens into -inf. `Sampling` holds the settings
of one generation; everything that writes (Model.generate / stream / chat, TextStream,
Conversation, decode, the CLI and the server) takes it, or its fields by name.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

import numpy as np

from ..runtime.errors import QkvError
from ..core.ops import softmax


MIN_TEMPERATURE = 1e-4     # below it (but 0) logits / T leave float64's range: softmax gives NaN


def check_sampling(temperature: float, top_k: int | None, top_p: float | None) -> None:
    """One clear error for each impossible setting."""
    if temperature is None or not np.isfinite(temperature) or temperature < 0:
        raise QkvError(f"temperature must be ≥ 0 (0 = greedy), got {temperature}")
    if 0 < temperature < MIN_TEMPERATURE:
        raise QkvError(f"temperature {temperature:g} is too small to compute; give 0 for greedy or at least "
                       f"{MIN_TEMPERATURE:g}")
    if top_k is not None and (int(top_k) != top_k or top_k < 1):
        raise QkvError(f"top_k must be a whole number ≥ 1, got {top_k}")
    if top_p is not None and not (0 < top_p <= 1):
        raise QkvError(f"top_p must be in (0, 1], got {top_p}")


@dataclass(frozen=True)
class Sampling:
    """How the next token is chosen, and whether the model's EOS ends the text. Checked when made.

    temperature 0 (or top_k 1) is greedy, the default (as transformers' generate without do_sample, and as chat
    and translate): give a temperature to sample; seed makes sampling repeatable (None: fresh each run).
    """

    temperature: float = 0.0
    top_k: int | None = None
    top_p: float | None = None
    seed: int | None = None
    stop_at_eos: bool = True

    def __post_init__(self) -> None:
        check_sampling(self.temperature, self.top_k, self.top_p)
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, (int, np.integer))
                                      or self.seed < 0):
            raise QkvError(f"seed must be a whole number ≥ 0, got {self.seed!r}")

    @classmethod
    def of(cls, base: Sampling | None = None, **settings) -> Sampling:
        """`base` (default Sampling()) with some fields changed by name: the one place keyword
        settings (temperature=0, seed=3, …) become a Sampling."""
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(settings) - names)
        if unknown:
            raise TypeError(f"unknown sampling setting(s) {unknown}; choose from {sorted(names)}")
        if base is not None and not isinstance(base, cls):
            raise TypeError(f"sampling must be a Sampling, got {base!r}; give settings by name, e.g. temperature=0.7")
        base = cls() if base is None else base
        return replace(base, **settings) if settings else base

    def rng(self) -> np.random.Generator:
        """A fresh generator for one generation (the same draws for the same seed)."""
        return np.random.default_rng(self.seed)

    def pick(self, logits: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """The next token of each row: (B, V) logits → (B,) ids."""
        return sample(logits, rng, self.temperature, self.top_k, self.top_p)


def top_k_filter(logits: np.ndarray, k: int) -> np.ndarray:
    """Keep the k largest logits of each row (ties at the k-th value kept too), -inf elsewhere."""
    if k >= logits.shape[-1]:
        return logits
    kth = np.partition(logits, -k, axis=-1)[..., -k, None]        # (B, 1) the k-th largest
    return np.where(logits < kth, -np.inf, logits)


def top_p_filter(logits: np.ndarray, p: float) -> np.ndarray:
    """Nucleus: keep the most probable tokens until their probability mass reaches p.

    As transformers: sort ascending, drop tokens whose cumulative probability is ≤ 1 - p,
    always keep the most probable one.
    """
    if p >= 1.0:
        return logits
    order = np.argsort(logits, axis=-1, kind="stable")             # ascending
    probs = softmax(np.take_along_axis(logits, order, axis=-1).astype(np.float64))
    drop_sorted = np.cumsum(probs, axis=-1) <= 1 - p
    drop_sorted[..., -1] = False                                   # keep the top token
    drop = np.zeros_like(drop_sorted)
    np.put_along_axis(drop, order, drop_sorted, axis=-1)
    return np.where(drop, -np.inf, logits)


def distribution(logits: np.ndarray, temperature: float = 1.0, top_k: int | None = None,
                 top_p: float | None = None) -> np.ndarray:
    """P = softmax(filter(logits / T)) over the last axis, float64: (..., V) → (..., V), what `sample`
    draws from. T = 0 is greedy: one-hot on the argmax (the first one on ties, as `sample` picks)."""
    check_sampling(temperature, top_k, top_p)
    z = np.asarray(logits)
    if z.ndim == 0 or z.shape[-1] == 0:
        raise QkvError(f"logits must have a vocabulary axis, got shape {z.shape}")
    if temperature == 0 or top_k == 1:
        one_hot = np.zeros(z.shape)                                       # (..., V)
        np.put_along_axis(one_hot, np.argmax(z, axis=-1)[..., None], 1.0, axis=-1)
        return one_hot
    x = z.reshape(-1, z.shape[-1]).astype(np.float64) / temperature      # (B, V)
    if top_k is not None:
        x = top_k_filter(x, int(top_k))
    if top_p is not None:
        x = top_p_filter(x, float(top_p))
    return softmax(x).reshape(z.shape)                                   # (..., V)


def sample(logits: np.ndarray, rng: np.random.Generator, temperature: float = 1.0,
           top_k: int | None = None, top_p: float | None = None) -> np.ndarray:
    """The next token of each row: (B, V) logits → (B,) ids.

    Temperature 0 (or top_k 1) is greedy: the argmax, no randomness used.
    """
    if temperature == 0 or top_k == 1:
        return np.argmax(logits, axis=-1)
    probs = distribution(logits, temperature, top_k, top_p)
    u = 1.0 - rng.random((probs.shape[0], 1))                        # one uniform in (0, 1] per row
    cdf = np.cumsum(probs, axis=-1)
    cdf /= cdf[:, -1:]                                               # exact 1 at the end
    return np.minimum((cdf < u).sum(axis=-1), probs.shape[-1] - 1)   # inverse CDF
