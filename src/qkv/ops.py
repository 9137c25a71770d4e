"""Stateless array functions: the arithmetic under every box of the seeds' diagram.

All keep the input dtype (float32 stays float32): scalars are Python floats, never
NumPy float64 scalars, which would silently promote float32 arrays under NumPy 2.
"""

from __future__ import annotations

import math

import numpy as np


def softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    """softmax(x) = exp(x - max x) / Σ exp(x - max x), along `axis`.

    Subtracting the row max keeps exp from overflowing. A row that is all -inf (every
    key masked) gives zeros, not NaN.
    """
    m = np.max(x, axis=axis, keepdims=True)             # row max
    m = np.where(np.isfinite(m), m, 0).astype(x.dtype, copy=False)
    e = np.exp(x - m)                                    # same shape as x
    s = np.sum(e, axis=axis, keepdims=True)
    np.divide(e, s, out=e, where=s > 0)
    return e


def softmax_(x: np.ndarray) -> np.ndarray:
    """softmax over the last axis, in place (the hot path: x is the score matrix S).

    Equals `softmax(x)`; it reuses x's memory because S is the biggest array we make.
    """
    m = np.max(x, axis=-1, keepdims=True)
    m[~np.isfinite(m)] = 0
    np.subtract(x, m, out=x)
    np.exp(x, out=x)
    s = np.sum(x, axis=-1, keepdims=True)
    s[s == 0] = 1                                        # fully masked row: stays 0
    np.divide(x, s, out=x)
    return x


def entropy(p: np.ndarray, bits: bool = False) -> np.ndarray:
    """H(p) = −Σ p·ln p over the last axis, 0·ln 0 = 0: (..., m) → (...), in nats (bits: log₂).

    The one entropy of qkv: of attention rows (analysis, explain, figures) and of the
    next-token distribution (nexttoken). A measure, not part of the pass: always float64.
    """
    p = np.asarray(p, dtype=np.float64)
    log = np.log2 if bits else np.log
    return -(p * log(np.where(p > 0, p, 1.0))).sum(axis=-1) + 0.0        # + 0.0: no -0.0


def layer_norm(x: np.ndarray, weight: np.ndarray, bias: np.ndarray | None, eps: float) -> np.ndarray:
    """LayerNorm(x) = (x - mean) / √(var + eps) · γ + β over the last axis (d_model)."""
    mean = x.mean(axis=-1, keepdims=True)               # (..., 1)
    xc = x - mean                                        # (..., d)
    var = np.mean(xc * xc, axis=-1, keepdims=True)       # (..., 1), biased, as torch
    y = xc / np.sqrt(var + float(eps))                   # (..., d)
    y *= weight
    if bias is not None:
        y += bias
    return y


def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    """RMSNorm(x) = x / √(mean(x²) + eps) · γ over the last axis (Llama).

    Plain form: x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * weight. The mean
    is np.mean's own steps (a sum, then ÷ d: the same float32 numbers) without its Python
    wrapper, and the small (..., 1) array is updated in place: a decoding step calls this
    61 times for SmolLM2.
    """
    ms = np.add.reduce(x * x, axis=-1, keepdims=True)    # (..., 1) Σ x²
    ms /= x.shape[-1]                                    # mean(x²)
    ms += float(eps)
    np.sqrt(ms, out=ms)
    y = x / ms                                           # (..., d)
    y *= weight
    return y


# Rational approximation of erf for float32 (the XLA/Eigen form: odd polynomial over
# even polynomial in x², x clamped to [-4, 4] where erf is ±1 to float32 precision).
_ERF_ALPHA = (-2.72614225801306e-10, 2.77068142495902e-08, -2.10102402082508e-06,
              -5.69250639462346e-05, -7.34990630326855e-04, -2.95459980854025e-03,
              -1.60960333262415e-02)
_ERF_BETA = (-1.45660718464996e-05, -2.13374055278905e-04, -1.68282697438203e-03,
             -7.37332916720468e-03, -1.42647390514189e-02)


def _polyval(coeffs: tuple[float, ...], x: np.ndarray) -> np.ndarray:
    y = np.full_like(x, coeffs[0])
    for c in coeffs[1:]:
        y *= x
        y += c
    return y


def erf(x: np.ndarray) -> np.ndarray:
    """The error function, elementwise.

    float32: a rational approximation accurate to a few float32 ulp (fast, vectorised);
    float64: `math.erf` per element (exact, slow: float64 is for checks).
    """
    if x.dtype == np.float64:
        return np.vectorize(math.erf, otypes=[np.float64])(x)
    x = np.clip(x, -4.0, 4.0)
    x2 = x * x
    return x * _polyval(_ERF_ALPHA, x2) / _polyval(_ERF_BETA, x2)


def gelu(x: np.ndarray) -> np.ndarray:
    """GELU(x) = x · Φ(x) = ½x(1 + erf(x/√2))  — BERT's activation ("gelu")."""
    return 0.5 * x * (1.0 + erf(x * (1.0 / math.sqrt(2.0))))


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    """GELU ≈ ½x(1 + tanh(√(2/π)(x + 0.044715x³)))  — GPT-2's activation ("gelu_new").

    Plain form: 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x*x*x))).
    Computed as x / (1 + e^(-2u)), u = √(2/π)(x + 0.044715x³), which is the same number
    because ½(1 + tanh u) = 1 / (1 + e^(-2u)): NumPy's float32 exp is ~1.6× faster than
    its tanh, and this takes 7 passes over x instead of 9. (Never x**3: ~265× slower.)
    """
    c = math.sqrt(2.0 / math.pi)
    e = x * x                                            # x²
    e *= -2.0 * c * 0.044715
    e -= 2.0 * c                                         # -2√(2/π)(1 + 0.044715x²)
    e *= x                                               # -2u
    with np.errstate(over="ignore"):                     # e^(-2u) = inf for x ≪ 0: GELU → -0
        np.exp(e, out=e)
    e += 1.0
    return np.divide(x, e, out=e)                        # x / (1 + e^(-2u))


def silu(x: np.ndarray) -> np.ndarray:
    """SiLU(x) = x · σ(x) = x / (1 + e^(-x))  — the gate of Llama's SwiGLU."""
    with np.errstate(over="ignore"):                     # e^(-x) = inf for x ≪ 0: SiLU → -0
        return x / (1.0 + np.exp(-x))


def relu(x: np.ndarray) -> np.ndarray:
    """ReLU(x) = max(x, 0)."""
    return np.maximum(x, 0)


ACTIVATIONS = {"gelu": gelu, "gelu_tanh": gelu_tanh, "silu": silu, "relu": relu}
