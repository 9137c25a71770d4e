"""Stateless array functions: the arithmetic under every box of the guide's diagram.

All keep the input dtype (float32 stays float32): scalars are Python floats, never
NumPy float64 scalars, which would silently promote float32 arrays under NumPy 2.

Training (qkv.train) needs each function's backward: `f_backward(dy, x, …)` sits right after
`f`, with the same letters, and returns dL/dx (and the weights' gradients) given dL/dy. It
takes the forward's inputs, not its intermediates, and recomputes what it needs (a mean, a
σ(x)): cheap next to the matrix products, and training keeps fewer arrays alive.
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


def sigmoid(x: np.ndarray) -> np.ndarray:
    """σ(x) = 1 / (1 + e^−x), as ½·(1 + tanh(x/2)): the same function, with no overflow for large |x|."""
    return 0.5 * (1.0 + np.tanh(0.5 * x))


def softmax_backward(dA: np.ndarray, A: np.ndarray) -> np.ndarray:
    """dS for A = softmax(S) along the last axis: dS = A ⊙ (dA − rowsum(dA ⊙ A)).

    From ∂A_j/∂S_i = A_j(δ_ij − A_i). A fully masked row (A = 0) gets dS = 0.
    """
    rowsum = np.einsum("...j,...j->...", dA, A)[..., None]   # (..., 1) Σ_j dA_j A_j, without dA ⊙ A in memory
    dS = dA - rowsum                                     # (..., m)
    dS *= A
    return dS


def softmax_(x: np.ndarray) -> np.ndarray:
    """softmax over the last axis, in place (the hot path: x is the score matrix S).

    Equals `softmax(x)`; it reuses x's memory because S is the biggest array we make. A fully masked row
    (max −∞) subtracts the lowest finite number instead, so its exps are 0, and its sum 0 is raised to
    the smallest normal number, so the row stays 0: two clamps in place, not masks of the rows (half the
    time of a one-token step's softmax)."""
    finfo = np.finfo(x.dtype)
    m = np.maximum.reduce(x, axis=-1, keepdims=True)     # (..., 1)
    np.maximum(m, finfo.min, out=m)
    np.subtract(x, m, out=x)
    np.exp(x, out=x)
    s = np.add.reduce(x, axis=-1, keepdims=True)         # (..., 1) ≥ 1 unless the row is fully masked
    np.maximum(s, finfo.tiny, out=s)
    np.divide(x, s, out=x)
    return x


def softmax_sink_(x: np.ndarray, sink: np.ndarray) -> np.ndarray:
    """softmax over the last axis with one more logit per head that has no column (an attention sink, gpt-oss),
    in place: A_j = exp(x_j) / (Σ_k exp(x_k) + exp(s_h)). x (..., H, n, m), sink (H,). Each row sums to 1 − the
    sink's share exp(s_h)/(…), so to less than 1; a fully masked row gives zeros (all its weight on the sink).
    Plain form: softmax(concat([x, s_h], -1))[..., :-1], as transformers' eager attention computes it."""
    s_h = sink.astype(x.dtype, copy=False)[:, None, None]   # (H, 1, 1)
    m = np.maximum.reduce(x, axis=-1, keepdims=True)     # (..., H, n, 1)
    np.maximum(m, s_h, out=m)                            # the row max, the sink's logit included
    np.subtract(x, m, out=x)
    np.exp(x, out=x)
    total = np.add.reduce(x, axis=-1, keepdims=True)     # (..., H, n, 1)
    total += np.exp(s_h - m)                             # + exp(s_h − max) ≥ … > 0
    np.divide(x, total, out=x)
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


def layer_norm_backward(dy: np.ndarray, x: np.ndarray, weight: np.ndarray, eps: float
                        ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(dx, dγ, dβ) of y = x̂·γ + β with x̂ = (x − mean) · r, r = 1/√(var + eps).

        dx̂ = dy ⊙ γ
        dx = r · (dx̂ − mean(dx̂) − x̂ ⊙ mean(dx̂ ⊙ x̂))      (means over d_model)
        dγ = Σ_rows dy ⊙ x̂,   dβ = Σ_rows dy
    """
    d = x.shape[-1]
    xc = x - x.mean(axis=-1, keepdims=True)              # (..., d)
    r = 1.0 / np.sqrt(np.mean(xc * xc, axis=-1, keepdims=True) + float(eps))   # (..., 1)
    xhat = xc * r                                        # (..., d)
    dxhat = dy * weight                                  # (..., d)
    dx = dxhat - dxhat.mean(axis=-1, keepdims=True)
    dx -= xhat * (np.einsum("...j,...j->...", dxhat, xhat)[..., None] / d)
    dx *= r
    rows = dy.reshape(-1, d)                             # (B·n, d)
    return dx, np.add.reduce(rows * xhat.reshape(-1, d), axis=0), np.add.reduce(rows, axis=0)


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


def rms_norm_backward(dy: np.ndarray, x: np.ndarray, weight: np.ndarray, eps: float
                      ) -> tuple[np.ndarray, np.ndarray]:
    """(dx, dγ) of y = x̂·γ with x̂ = x · r, r = 1/√(mean(x²) + eps).

        dx̂ = dy ⊙ γ
        dx = r · (dx̂ − x̂ ⊙ mean(dx̂ ⊙ x̂))
        dγ = Σ_rows dy ⊙ x̂
    """
    d = x.shape[-1]
    r = 1.0 / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + float(eps))   # (..., 1)
    xhat = x * r                                         # (..., d)
    dxhat = dy * weight                                  # (..., d)
    dx = dxhat - xhat * (np.einsum("...j,...j->...", dxhat, xhat)[..., None] / d)
    dx *= r
    return dx, np.add.reduce(dy.reshape(-1, d) * xhat.reshape(-1, d), axis=0)


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


def gelu_backward(dy: np.ndarray, x: np.ndarray) -> np.ndarray:
    """dx of GELU(x) = x·Φ(x): dx = dy · (Φ(x) + x·φ(x)), φ(x) = e^(−x²/2)/√(2π)."""
    Phi = 0.5 * (1.0 + erf(x * (1.0 / math.sqrt(2.0))))
    phi = np.exp(-0.5 * x * x) * (1.0 / math.sqrt(2.0 * math.pi))
    return dy * (Phi + x * phi)


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


def gelu_tanh_backward(dy: np.ndarray, x: np.ndarray) -> np.ndarray:
    """dx of ½x(1 + tanh u), u = √(2/π)(x + 0.044715x³):
    dx = dy · (½(1 + t) + ½x(1 − t²)·√(2/π)(1 + 3·0.044715x²)), t = tanh u.

    Computed with s = ½(1 + t) = 1/(1 + e^(−2u)) and 1 − t² = 4s(1 − s), as the forward does
    (exp is faster than tanh): dx = dy · (s + 2x·s(1 − s)·√(2/π)(1 + 3·0.044715x²)).
    """
    c = math.sqrt(2.0 / math.pi)
    x2 = x * x                                           # x²
    e = x2 * (-2.0 * c * 0.044715)
    e -= 2.0 * c
    e *= x                                               # −2u
    with np.errstate(over="ignore"):
        np.exp(e, out=e)
    e += 1.0
    s = np.divide(1.0, e, out=e)                         # s = σ(2u)
    x2 *= 3 * 0.044715 * c
    x2 += c                                              # √(2/π)(1 + 3·0.044715x²)
    x2 *= x
    x2 *= 2.0
    x2 *= s
    x2 *= 1.0 - s                                        # 2x·s(1 − s)·√(2/π)(1 + 3·0.044715x²)
    x2 += s
    x2 *= dy
    return x2


def silu(x: np.ndarray) -> np.ndarray:
    """SiLU(x) = x · σ(x) = x / (1 + e^(-x))  — the gate of Llama's SwiGLU."""
    with np.errstate(over="ignore"):                     # e^(-x) = inf for x ≪ 0: SiLU → -0
        return x / (1.0 + np.exp(-x))


def silu_backward(dy: np.ndarray, x: np.ndarray) -> np.ndarray:
    """dx of x·σ(x): dx = dy · σ(x)·(1 + x·(1 − σ(x)))."""
    with np.errstate(over="ignore"):
        s = 1.0 / (1.0 + np.exp(-x))                     # σ(x)
    return dy * (s * (1.0 + x * (1.0 - s)))


def quick_gelu(x: np.ndarray) -> np.ndarray:
    """QuickGELU(x) = x · σ(1.702·x)  — CLIP's FFN (its original code's fast form of GELU)."""
    with np.errstate(over="ignore"):                     # e^(-1.702x) = inf for x ≪ 0: → -0
        return x / (1.0 + np.exp(-1.702 * x))


def quick_gelu_backward(dy: np.ndarray, x: np.ndarray) -> np.ndarray:
    """dx of x·σ(1.702x): dx = dy · s·(1 + 1.702·x·(1 − s)), s = σ(1.702x)."""
    with np.errstate(over="ignore"):
        s = 1.0 / (1.0 + np.exp(-1.702 * x))
    return dy * (s * (1.0 + 1.702 * x * (1.0 - s)))


def relu(x: np.ndarray) -> np.ndarray:
    """ReLU(x) = max(x, 0)."""
    return np.maximum(x, 0)


def relu_backward(dy: np.ndarray, x: np.ndarray) -> np.ndarray:
    """dx of max(x, 0): dy where x > 0, else 0."""
    return np.where(x > 0, dy, 0).astype(dy.dtype, copy=False)


def relu2(x: np.ndarray) -> np.ndarray:
    """ReLU²(x) = max(x, 0)²  — Arcee's FFN (So et al. 2021, Primer's squared ReLU)."""
    r = np.maximum(x, 0)
    return r * r


def relu2_backward(dy: np.ndarray, x: np.ndarray) -> np.ndarray:
    """dx of max(x, 0)²: dx = dy · 2·max(x, 0)."""
    return (dy * (2 * np.maximum(x, 0))).astype(dy.dtype, copy=False)


def clamped_glu(g: np.ndarray, u: np.ndarray, alpha: float, limit: float) -> np.ndarray:
    """gpt-oss's clamped SwiGLU: h = g'·σ(α·g') ⊙ (u' + 1) with g' = min(g, c), u' = clip(u, −c, c), c = LIMIT;
    g = x·W_gate + b_gate, u = x·W_in + b_in (B, n, d_ff) → h (B, n, d_ff), as transformers' GptOssExperts."""
    gc = np.minimum(g, limit)                            # (…, d_ff) the gate clamped above
    with np.errstate(over="ignore"):                     # e^(−α·g) = inf for g ≪ 0: the gate → −0
        h = gc / (1.0 + np.exp(-alpha * gc))             # g'·σ(α·g')
    h *= np.clip(u, -limit, limit) + 1.0                 # ⊙ (u' + 1)
    return h


def clamped_glu_backward(dh: np.ndarray, g: np.ndarray, u: np.ndarray, alpha: float, limit: float
                         ) -> tuple[np.ndarray, np.ndarray]:
    """(dg, du) of `clamped_glu`: with s = σ(α·g'),
        dg = dh ⊙ (u' + 1) ⊙ s·(1 + α·g'·(1 − s)) where g ≤ c, else 0
        du = dh ⊙ g'·s                               where −c ≤ u ≤ c, else 0   (torch's clamp: ends included)"""
    gc = np.minimum(g, limit)
    with np.errstate(over="ignore"):
        s = 1.0 / (1.0 + np.exp(-alpha * gc))            # σ(α·g')
    dg = dh * (np.clip(u, -limit, limit) + 1.0) * (s * (1.0 + alpha * gc * (1.0 - s)))
    dg *= g <= limit
    du = dh * (gc * s)
    du *= (u >= -limit) & (u <= limit)
    return dg, du


def softplus(x: np.ndarray) -> np.ndarray:
    """softplus(x) = ln(1 + eˣ), computed as max(x, 0) + ln(1 + e^(−|x|)) (no overflow for large x)."""
    return np.maximum(x, 0) + np.log1p(np.exp(-np.abs(x)))


def xielu(x: np.ndarray, alpha_p: np.ndarray, alpha_n: np.ndarray, beta: np.ndarray, eps: np.ndarray) -> np.ndarray:
    """xIELU (Huang & Schlag 2024; Apertus's FFN), with an FFN's own learned scalars (stored as transformers
    keeps them: a_p, a_n before their softplus):

        xIELU(x) = α_p·x² + β·x                          x > 0      α_p = softplus(a_p)
                   (e^min(x, ε) − 1 − x)·α_n + β·x       x ≤ 0      α_n = β + softplus(a_n)

    x (…) any shape; the scalars (1,) or () in x's dtype. Plain form: torch.where over both branches, as
    transformers' XIELUActivation._xielu_python."""
    a_p = softplus(alpha_p).astype(x.dtype, copy=False)                 # (1,)
    a_n = (beta + softplus(alpha_n)).astype(x.dtype, copy=False)         # (1,)
    pos = a_p * x * x + beta * x                                         # (…)
    neg = (np.expm1(np.minimum(x, eps)) - x) * a_n + beta * x            # (…)
    return np.where(x > 0, pos, neg).astype(x.dtype, copy=False)


def xielu_backward(dy: np.ndarray, x: np.ndarray, alpha_p: np.ndarray, alpha_n: np.ndarray, beta: np.ndarray,
                   eps: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(dx (…), da_p (1,), da_n (1,)) of `xielu` (β and ε are constants, as transformers' buffers):

        x > 0:  dx = dy·(2·α_p·x + β)                       da_p = Σ dy·x²·σ(a_p)
        x ≤ 0:  dx = dy·((e^x·[x < ε] − 1)·α_n + β)         da_n = Σ dy·(e^min(x, ε) − 1 − x)·σ(a_n)

    (σ = softplus'; at x = ε, min's gradient is shared half and half, as torch.minimum's.)"""
    a_p = softplus(alpha_p).astype(x.dtype, copy=False)
    a_n = (beta + softplus(alpha_n)).astype(x.dtype, copy=False)
    pos = x > 0                                                          # (…)
    low = np.where(x < eps, 1.0, np.where(x == eps, 0.5, 0.0)).astype(x.dtype)   # d min(x, ε)/dx
    e = np.expm1(np.minimum(x, eps))                                     # (…)
    slope = np.where(pos, 2 * a_p * x + beta, ((e + 1) * low - 1) * a_n + beta)
    dx = (dy * slope).astype(dy.dtype, copy=False)
    da_p = np.sum(np.where(pos, dy * x * x, 0), dtype=np.float64) * sigmoid(alpha_p.astype(np.float64))
    da_n = np.sum(np.where(pos, 0, dy * (e - x)), dtype=np.float64) * sigmoid(alpha_n.astype(np.float64))
    return dx, da_p.astype(alpha_p.dtype), da_n.astype(alpha_n.dtype)


ACTIVATIONS = {"gelu": gelu, "gelu_tanh": gelu_tanh, "silu": silu, "relu": relu, "relu2": relu2,
               "quick_gelu": quick_gelu}
ACTIVATION_BACKWARDS = {"gelu": gelu_backward, "gelu_tanh": gelu_tanh_backward, "silu": silu_backward,
                        "relu": relu_backward, "relu2": relu2_backward, "quick_gelu": quick_gelu_backward}
