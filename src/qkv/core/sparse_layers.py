"""Sparse attention in real models (guide: sparse, 희소 어텐션): the masks Longformer's and BigBird's layers use, exactly
as transformers computes them, and Longformer's global rows.

    Longformer   |i − j| ≤ W/2 in layer l (attention_window W), and global tokens G: every query sees them, their
                 rows see every key through their own Q_g, K_g, V_g (`global_rows`)
    BigBird      blocks of b: the first and last blocks global, a window of 3 blocks, r random blocks, which
                 transformers' eval mode reads as block 0 — so block 0's keys count 1 + r times (`bigbird_copies`)

A mask with copies c is softmax(S + log c): `sparse_mask` puts it into a pass's AttentionMask as its position bias,
and `real_mask` is the (n, n) picture of any layer's mask that `qkv explain sparse` draws (core/sparse.py holds the
guide's gallery of patterns and the tiled kernel that skips what they hide).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Sequence

import numpy as np

from ..runtime.errors import QkvError
from .attention import AttentionMask, mask_bias, scaled_dot_product_attention
from .config import ModelConfig
from .masks import same_chunk



def longformer_visible(n: int, half: int, globals: Sequence[int] = ()) -> np.ndarray:
    """(n, n) bool: what Longformer's layer with attention_window 2·half lets query i see: keys with |i − j| ≤ half
    (its sliding chunks), every key of a global query and every global key (its global_attention_mask's tokens)."""
    i, j = np.arange(n)[:, None], np.arange(n)[None, :]
    ok = np.abs(i - j) <= half                                      # (n, n) the window
    g = np.asarray([t for t in globals if t < n], dtype=np.int64)
    ok[g, :] = True                                                 # a global query sees every key
    ok[:, g] = True                                                 # and every query sees it
    return ok


def bigbird_sparse(n: int, block: int, random: int) -> bool:
    """Whether BigBird runs its block-sparse attention on n tokens: past (5 + 2r)·b, as BigBirdModel decides
    (shorter inputs it runs with full attention)."""
    return n > (5 + 2 * random) * block


def bigbird_copies(n: int, block: int, random: int) -> np.ndarray:
    """(n, n) int: how many times BigBird's block-sparse kernel (transformers' BigBirdBlockSparseAttention in eval
    mode) puts key j in query i's softmax; 0: never (masked).

    It pads n to N, a multiple of b, and reads in blocks a = i // b of b queries:
        a = 0 and a = last      every key (global rows)
        a = 1                   key blocks 0, 1, 2, last, and r random blocks
        1 < a < last − 1        key blocks 0, a − 1, a, a + 1, last, and r random blocks
        a = last − 1            key blocks 0, last − 2, last − 1, last, and r random blocks
    In eval mode transformers draws no random block: each of the r is block 0 (np.zeros in its
    _bigbird_block_rand_mask), so block 0's keys enter those rows' softmax 1 + r times. With copies c_ij,
    A_ij = c_ij·exp(S_ij) / Σ_j c_ij·exp(S_ij): softmax(S + log c). The padding's rows and columns are cut off
    (its keys are masked, its rows dropped)."""
    N = -(-n // block) * block
    last = N // block - 1
    c = np.zeros((last + 1, last + 1), dtype=np.int64)              # (query block, key block) copies
    c[0, :] = c[last, :] = 1
    for a in range(1, last):
        near = (0, 1, 2) if a == 1 else (last - 2, last - 1) if a == last - 1 else (a - 1, a, a + 1)
        c[a, [*near, last]] = 1
        c[a, 0] += 1 if a != 1 else 0                               # block 0: global (a = 1: among its near blocks)
        c[a, 0] += random                                           # the r "random" blocks, all block 0 in eval
    full = np.repeat(np.repeat(c, block, axis=0), block, axis=1)    # (N, N)
    return full[:n, :n]


def copies_bias(copies: np.ndarray, dtype=np.float32) -> np.ndarray:
    """What S gets added for a mask with copies c: log c where c > 0, −∞ where c = 0 (softmax(S + log c) counts
    each key c times)."""
    with np.errstate(divide="ignore"):
        return np.log(copies.astype(np.float64)).astype(dtype)     # log 0 = −∞


def real_mask(cfg: ModelConfig, n: int, layer: int) -> np.ndarray:
    """(n, n) int: the copies of each key in each query's softmax that LAYER of a model with config CFG uses on n
    tokens (0: hidden, 1: seen; BigBird's block 0 more): Longformer's window and global tokens, BigBird's blocks,
    a sliding window, Llama 4's chunks, or every key. The picture `qkv explain sparse` draws for a model's own
    layers."""
    if cfg.block_sparse is not None and bigbird_sparse(n, *cfg.block_sparse):
        return bigbird_copies(n, *cfg.block_sparse)
    w = cfg.window(layer)
    if w is None:
        ok = np.ones((n, n), dtype=bool) if not cfg.causal else np.tril(np.ones((n, n), dtype=bool))
        if cfg.chunk(layer) is not None:                     # Llama 4's chunked layers: each query its own chunk
            ok &= same_chunk(np.arange(n), np.arange(n), cfg.chunk(layer))
        return ok.astype(np.int64)
    if cfg.causal:
        i, j = np.arange(n)[:, None], np.arange(n)[None, :]
        return ((j <= i) & (i - j < w)).astype(np.int64)
    return longformer_visible(n, w - 1, cfg.global_tokens).astype(np.int64)


def sparse_mask(cfg: ModelConfig, layer: int, mask: AttentionMask) -> AttentionMask:
    """MASK (an attention.AttentionMask) with LAYER's sparse pattern where the config has one that a window cannot say
    (Longformer's global tokens, BigBird's blocks on a long enough input): the pattern as its position bias,
    log(copies) or −∞ (`real_mask`, `copies_bias`), the window dropped (the bias holds it); else MASK itself.
    Those models are encoders: the n queries are the m keys (no cache)."""
    sparse = cfg.block_sparse is not None and bigbird_sparse(mask.m, *cfg.block_sparse)
    if not (sparse or cfg.global_tokens):
        return mask
    if cfg.global_tokens and cfg.global_tokens[-1] >= mask.m:
        raise QkvError(f"global token {cfg.global_tokens[-1]} is past the input's {mask.m} tokens; give global "
                       f"positions from 0 to {mask.m - 1}")
    bias = copies_bias(real_mask(cfg, mask.m, layer), np.float64)[None, None]      # (1, 1, m, m)
    return replace(mask, window=None, position_bias=bias, _bias={})


def global_rows(x: np.ndarray, w, cfg: ModelConfig, mask: AttentionMask, z: np.ndarray, a: np.ndarray | None,
                s: np.ndarray | None, heads) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
    """Longformer's global tokens' rows (cfg.global_tokens G), which read every key through their own projections:

        Z[G] = softmax(Q_g·K_gᵀ/√d_k + M)·V_g,   Q_g = X[G]·W_Qg + b_Qg, K_g = X·W_Kg + b_Kg, V_g = X·W_Vg + b_Vg

    (M: the padding). x (B, n, d_model); z (B, H, n, d_k) the layer's heads, a, s (B, h, n, m) its weights and
    scores for HEADS (None: not kept): copies with G's rows replaced. The other rows see G's keys through K, V
    (their mask, `sparse_mask`)."""
    if w.W_Qg is None:
        raise QkvError(f"global_tokens need the global projections of Longformer's layers; this {cfg.family} model "
                       "has none: run it without global tokens")
    g = list(cfg.global_tokens)
    B, n, _ = x.shape
    H, d = cfg.n_heads, cfg.d_head

    def heads_of(y: np.ndarray) -> np.ndarray:
        return y.reshape(B, y.shape[1], H, d).transpose(0, 2, 1, 3)            # (B, H, rows, d_k)

    q = heads_of(x[:, g] @ w.W_Qg + w.b_Qg)                                     # (B, H, |G|, d_k)
    k = heads_of(x @ w.W_Kg + w.b_Kg)                                           # (B, H, n, d_k)
    v = heads_of(x @ w.W_Vg + w.b_Vg)                                           # (B, H, n, d_k)
    bias = None if mask.key_mask is None else mask_bias(mask.key_mask[:, None, None, :], x.dtype)   # (B, 1, 1, n)
    zg, ag, sg = scaled_dot_product_attention(q, k, v, bias, keep_scores=s is not None)
    z = z.copy()
    z[:, :, g] = zg                                                             # (B, H, n, d_k)
    if a is not None:
        hs = list(range(H)) if a.shape[1] == H or heads is None else list(heads)
        a = a.copy()
        a[:, :, g] = ag[:, hs]                                                  # (B, h, n, n)
    if s is not None:
        hs = list(range(H)) if s.shape[1] == H or heads is None else list(heads)
        s = s.copy()
        s[:, :, g] = sg[:, hs]
    return z, a, s
