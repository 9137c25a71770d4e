"""The heart (seeds §2–5): masks, scaled dot-product attention, heads, GQA/MQA.

    S = Q·Kᵀ / √d_k  (+ mask M: -∞ where a query may not look)
    A = softmax(S)                         each row sums to 1
    Z = A·V
    MultiHead = Concat(head_1 … head_H) · W_O

Shapes: B batch, H query heads, Hkv key/value heads (H = Hkv for plain multi-head,
Hkv = 1 for MQA), n queries, m keys (m = n except when a KV cache holds the past).
"""

from __future__ import annotations

import math

import numpy as np

from .ops import softmax_


def causal_mask(n: int, m: int | None = None) -> np.ndarray:
    """M[i, j] = True where query i may see key j: j ≤ i (seeds §5).

    With m > n keys, the queries are the last n positions (cached decoding), so
    query i sits at position m - n + i.
    """
    m = n if m is None else m
    i = np.arange(n)[:, None] + (m - n)                  # (n, 1) absolute query positions
    return np.arange(m)[None, :] <= i                    # (n, m)


def sliding_window_mask(n: int, window: int, m: int | None = None) -> np.ndarray:
    """Causal and local: query i sees the last `window` positions, itself included."""
    m = n if m is None else m
    i = np.arange(n)[:, None] + (m - n)                  # (n, 1)
    j = np.arange(m)[None, :]                            # (1, m)
    return (j <= i) & (j > i - window)                   # (n, m)


def padding_mask(attention_mask: np.ndarray) -> np.ndarray:
    """Keys that are real tokens (1) rather than padding (0): (B, 1, 1, m)."""
    return attention_mask.astype(bool)[:, None, None, :]


def mask_bias(allowed: np.ndarray, dtype=np.float32) -> np.ndarray:
    """The additive mask M: 0 where allowed, -∞ where not (softmax(-∞) = 0)."""
    return np.where(allowed, 0.0, -np.inf).astype(dtype)


def split_heads(x: np.ndarray, n_heads: int) -> np.ndarray:
    """(B, n, H·d_k) → (B, H, n, d_k): each head's slice of the projection."""
    B, n, hd = x.shape
    return x.reshape(B, n, n_heads, hd // n_heads).transpose(0, 2, 1, 3)


def merge_heads(z: np.ndarray) -> np.ndarray:
    """(B, H, n, d_k) → (B, n, H·d_k): Concat(head_1 … head_H)."""
    B, H, n, dk = z.shape
    return z.transpose(0, 2, 1, 3).reshape(B, n, H * dk)


def attention_scores(q: np.ndarray, k: np.ndarray) -> np.ndarray:
    """S = Q·Kᵀ / √d_k for every query head, K/V heads shared in groups (GQA/MQA).

    q: (B, H, n, d_k); k: (B, Hkv, m, d_k) → S: (B, H, n, m).
    Query head h uses K/V head h // (H/Hkv), as transformers' `repeat_kv`; the group
    is folded into the rows of one matmul instead of copying K per head.
    """
    B, H, n, dk = q.shape
    Hkv, m = k.shape[1], k.shape[2]
    G = H // Hkv
    qg = q.reshape(B, Hkv, G * n, dk)                    # (B, Hkv, G·n, d_k)
    s = np.matmul(qg, k.transpose(0, 1, 3, 2))           # (B, Hkv, G·n, m)
    s *= 1.0 / math.sqrt(dk)                              # Python float: keeps float32
    return s.reshape(B, H, n, m)                         # (B, H, n, m)


def attend(weights: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Z = A·V per head; v: (B, Hkv, m, d_k) shared by groups of query heads → (B, H, n, d_k)."""
    B, H, n, m = weights.shape
    Hkv, dk = v.shape[1], v.shape[3]
    G = H // Hkv
    z = np.matmul(weights.reshape(B, Hkv, G * n, m), v)  # (B, Hkv, G·n, d_k)
    return z.reshape(B, H, n, dk)


def scaled_dot_product_attention(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, bias: np.ndarray | None = None,
    *, keep_scores: bool = False,
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """Attention(Q, K, V) = softmax(Q·Kᵀ/√d_k + M)·V  (seeds §3, steps ① to ④).

    Returns (Z, A, S): the output (B, H, n, d_k), the weights A (B, H, n, m) whose rows
    sum to 1 (or are 0 where every key is masked), and the scaled, masked scores S
    (only with keep_scores: otherwise softmax overwrites them to save memory).
    """
    s = attention_scores(q, k)                           # ①② (B, H, n, m)
    if bias is not None:
        s += bias                                        # M: -∞ on masked keys
    a = softmax_(s.copy() if keep_scores else s)         # ③ (B, H, n, m)
    z = attend(a, v)                                     # ④ (B, H, n, d_k)
    return z, a, (s if keep_scores else None)
