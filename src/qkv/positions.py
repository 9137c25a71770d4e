"""Where each token is (seeds §1): learned tables, sinusoids, and RoPE.

Attention itself is blind to order, so position enters either added to the token
embeddings (learned, sinusoidal) or as a rotation of Q and K (RoPE).
"""

from __future__ import annotations

import math

import numpy as np

from .errors import QkvError


def positions_from_mask(attention_mask: np.ndarray) -> np.ndarray:
    """Position of each token counting only real tokens: cumsum(mask) - 1 (padding → 0).

    A left-padded row then gets the same positions as the row without padding, as
    transformers' `generate` does.
    """
    pos = np.cumsum(attention_mask, axis=-1) - 1         # (B, n)
    return np.maximum(pos, 0)


def sinusoidal_table(n_positions: int, d_model: int) -> np.ndarray:
    """PE[p, 2i] = sin(p / 10000^(2i/d)), PE[p, 2i+1] = cos(p / 10000^(2i/d))."""
    pos = np.arange(n_positions, dtype=np.float64)[:, None]               # (P, 1)
    inv = np.exp(-math.log(10000.0) * np.arange(0, d_model, 2) / d_model)  # (d/2,)
    table = np.zeros((n_positions, d_model))                             # (P, d)
    table[:, 0::2] = np.sin(pos * inv)
    table[:, 1::2] = np.cos(pos * inv[: d_model // 2])
    return table.astype(np.float32)


def rope_inv_freq(d_rot: int, theta: float, scaling: dict | None = None, dtype=np.float32) -> np.ndarray:
    """RoPE's rotation speeds: ω_i = 1 / θ^(2i/d) for i < d/2, optionally rescaled.

    Computed in `dtype` as the reference does (float32 by default), so that angles
    p·ω_i round the same way at large positions. `scaling` follows Hugging Face's
    `rope_scaling`: None/"default", "linear" (positions divided by a factor) and
    "llama3" (low frequencies slowed, high ones kept).
    """
    dtype = np.dtype(dtype).type
    exps = np.arange(0, d_rot, 2).astype(dtype) / dtype(d_rot)                   # (d/2,)
    inv = (dtype(1.0) / np.power(dtype(theta), exps)).astype(dtype)             # (d/2,)
    kind = (scaling or {}).get("rope_type", (scaling or {}).get("type", "default"))
    if kind == "default":
        return inv
    if kind == "linear":
        return (inv / dtype(scaling["factor"])).astype(dtype)
    if kind == "llama3":
        factor = float(scaling["factor"])
        low, high = float(scaling["low_freq_factor"]), float(scaling["high_freq_factor"])
        old_len = float(scaling["original_max_position_embeddings"])
        wavelen = 2 * math.pi / inv
        smooth = (old_len / wavelen - low) / (high - low)
        scaled = np.where(wavelen > old_len / low, inv / factor, inv)
        mid = (wavelen <= old_len / low) & (wavelen >= old_len / high)
        return np.where(mid, (1 - smooth) * inv / factor + smooth * inv, scaled).astype(dtype)
    raise QkvError(f"rope_scaling type {kind!r} is not supported; supported: default, linear, llama3")


def rope_cos_sin(positions: np.ndarray, inv_freq: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin of the angles p·ω_i, laid out for rotate-half: (B, 1, n, d_rot).

    Hugging Face's Llama pairs dimension i with i + d/2 (not 2i with 2i+1), so the
    d/2 angles are repeated twice along the head dimension.
    """
    angles = positions[..., None].astype(inv_freq.dtype) * inv_freq  # (B, n, d/2)
    angles = np.concatenate([angles, angles], axis=-1)               # (B, n, d)
    return np.cos(angles)[:, None], np.sin(angles)[:, None]          # (B, 1, n, d)


def rotate_half(x: np.ndarray) -> np.ndarray:
    """[x1, x2] → [-x2, x1] over the last axis (the 90° turn of each pair (i, i+d/2))."""
    half = x.shape[-1] // 2
    return np.concatenate([-x[..., half:], x[..., :half]], axis=-1)


def apply_rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """RoPE(x) = x·cos + rotate_half(x)·sin: rotates each pair of Q or K by p·ω_i."""
    return x * cos + rotate_half(x) * sin                          # (B, H, n, d_k)


def apply_rope_backward(dy: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """dx of y = x·cos + rotate_half(x)·sin: dx = dy·cos − rotate_half(dy·sin).

    rotate_half is a 90° turn R of each pair, and Rᵀ = −R: the backward turns the other way.
    """
    return dy * cos - rotate_half(dy * sin)                        # (B, H, n, d_k)
