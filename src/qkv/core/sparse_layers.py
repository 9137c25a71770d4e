"""Sparse attention in real models (guide: sparse, 희소 어텐션): the masks Longformer's and BigBird's layers use, exactly
as transformers computes them, and Longformer's global rows.

    Longformer   |i − j| ≤ W/2 in layer l (attention_window W), and global tokens G: every query sees them, their
                 rows see every key through their own Q_g, K_g, V_g (`global_rows`)
    BigBird      blocks of b: the first and last blocks global, a window of 3 blocks, r random blocks, which
                 transformers' eval mode reads as block 0 — so block 0's keys count 1 + r times (`bigbird_copies`)

A mask with copies c is softmax(S + log c). `sparse_mask` describes it for a pass (`SparseMask`: the pattern, never
an n × n array unless the plain path asks for one), and `sparse_layer_attention` computes such a layer a block of
queries at a time from only the keys the block reads: memory O(n·(w + |G|)) per head for Longformer, O(n·5b) for
BigBird's middle blocks, never n × n (plain form: softmax(Q·Kᵀ/√d_k + log c + M)·V with `SparseMask.bias`).
`real_mask` is the (n, n) picture of any layer's mask that `qkv explain sparse` draws (core/sparse.py holds the
guide's gallery of patterns and the tiled kernel that skips what they hide).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from ..runtime.errors import QkvError
from .attention import (TILED_MIN_SCORES, AttentionMask, TopAttention, attend, attention_scores, mask_bias,
                        scaled_dot_product_attention, softmax_of, top_of)
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


@dataclass
class SparseMask(AttentionMask):
    """The mask of a Longformer layer with global tokens, of a BigBird layer running block-sparse, or of a window
    reaching both ways on a padded long input, described by its pattern rather than built: `copies` gives any rows × columns of it, `keys` the keys a block of queries reads, and
    the (B|1, 1, n, m) array of log c + M is built only where the plain path asks for it (`bias`: a short input, every
    weight kept, a hook on the weights, training). Encoders: the n queries are the m keys."""

    half: int | None = None                     # Longformer: |i − j| ≤ half (None: BigBird's blocks)
    globals: tuple[int, ...] = ()               # Longformer's global tokens: they see, and are seen by, every token
    blocks: tuple[int, int] | None = None       # BigBird: (block b, random blocks r), block-sparse on this input

    def copies(self, i: np.ndarray, j: np.ndarray) -> np.ndarray:
        """(len(i), len(j)) int: how many times key j enters query i's softmax (0: hidden) — `longformer_visible`,
        `bigbird_copies` for any rows and columns, without the n × n table."""
        i, j = np.asarray(i, dtype=np.int64)[:, None], np.asarray(j, dtype=np.int64)[None, :]
        if self.blocks is None:
            ok = np.abs(i - j) <= self.half                             # (r, c) the window
            if self.globals:
                g = np.asarray(self.globals, dtype=np.int64)
                ok = ok | np.isin(i, g) | np.isin(j, g)                 # global rows and columns
            return ok.astype(np.int64)
        b, r = self.blocks
        last = -(-self.m // b) - 1                                      # the last block of the padded input
        a, c = i // b, j // b                                           # (r, 1) query blocks, (1, c) key blocks
        seen = (((np.abs(a - c) <= 1) | (c == last)) & (c != 0)).astype(np.int64)   # the window and the last block
        middle = np.where(c == 0, 1 + r, seen)                          # block 0: global, and the r "random" ones
        return np.where((a == 0) | (a == last), 1, middle)              # (r, c) the first and last rows see all

    def keys(self, q0: int, q1: int) -> np.ndarray:
        """The keys (sorted) queries q0..q1 − 1 read: every key for a block holding a global row, else Longformer's
        band [q0 − half, q1 + half) and the global tokens, or BigBird's key blocks 0, a − 1 … a + 1, last."""
        m = self.m
        if self.blocks is None:
            if any(q0 <= t < q1 for t in self.globals):
                return np.arange(m)
            band = np.arange(max(0, q0 - self.half), min(m, q1 + self.half))
            return np.union1d(band, np.asarray([t for t in self.globals if t < m], dtype=np.int64))
        b = self.blocks[0]
        last = -(-m // b) - 1
        a0, a1 = q0 // b, (q1 - 1) // b
        if a0 == 0 or a1 == last:
            return np.arange(m)
        near = sorted({0, last, *range(a0 - 1, a1 + 2)})
        return np.concatenate([np.arange(c * b, min(m, (c + 1) * b)) for c in near])

    def row_blocks(self, rows: int = 64) -> list[tuple[int, int]]:
        """The blocks of query rows the kernel takes (about ROWS each): BigBird's whole blocks of b, its first and
        last (global) blocks on their own; Longformer's every ROWS rows."""
        if self.blocks is None:
            return [(q0, min(self.n, q0 + rows)) for q0 in range(0, self.n, rows)]
        b = self.blocks[0]
        last = -(-self.m // b) - 1
        step = b * max(1, rows // b)
        middle = [(q0, min(last * b, q0 + step)) for q0 in range(b, last * b, step)]
        return [(0, b), *middle, (last * b, self.n)]

    def allowed(self, q0: int = 0, q1: int | None = None) -> np.ndarray:
        q1 = self.n if q1 is None else q1
        ok = (self.copies(np.arange(q0, q1) + self.m - self.n, np.arange(self.m)) > 0)[None, None]   # (1, 1, r, m)
        return ok if self.key_mask is None else ok & self.key_mask[:, None, None, :]

    def bias(self, dtype=np.float32) -> np.ndarray:
        """log c + M (B|1, 1, n, m): what the plain path adds to S (−∞ where c = 0 or on a padding key)."""
        key = np.dtype(dtype)
        if key not in self._bias:
            b = copies_bias(self.copies(np.arange(self.m - self.n, self.m), np.arange(self.m)), dtype)[None, None]
            if self.key_mask is not None:
                b = b + mask_bias(self.key_mask[:, None, None, :], dtype)          # (B, 1, n, m)
            self._bias[key] = b
        return self._bias[key]

    def plain_only(self, cap: float | None = None) -> bool:
        return True                                  # the tiled kernels know no copies: plain, or this module's


def sparse_mask(cfg: ModelConfig, layer: int, mask: AttentionMask) -> AttentionMask:
    """MASK (an attention.AttentionMask) as LAYER's `SparseMask` where the config has a pattern that a window cannot
    say (Longformer's global tokens, BigBird's blocks on a long enough input), its window and position bias dropped
    (the pattern holds them), or where a window reaching both ways (Longformer's, ModernBERT's local layers) meets
    padding on a long input (the tiled band of core/sparse.py takes no padding: the plain path would hold n × n);
    else MASK itself. Those models are encoders: the n queries are the m keys (no cache)."""
    sparse = cfg.block_sparse is not None and bigbird_sparse(mask.m, *cfg.block_sparse)
    if (mask.window is not None and not mask.causal and mask.key_mask is not None and mask.position_bias is None
            and mask.chunk is None and mask.n == mask.m and mask.m * mask.m >= TILED_MIN_SCORES and not sparse
            and not cfg.global_tokens):
        return SparseMask(n=mask.n, m=mask.m, causal=False, key_mask=mask.key_mask, half=mask.window - 1)
    if not (sparse or cfg.global_tokens):
        return mask
    if cfg.global_tokens and cfg.global_tokens[-1] >= mask.m:
        raise QkvError(f"global token {cfg.global_tokens[-1]} is past the input's {mask.m} tokens; give global "
                       f"positions from 0 to {mask.m - 1}")
    if sparse:
        return SparseMask(n=mask.n, m=mask.m, causal=False, key_mask=mask.key_mask, blocks=cfg.block_sparse)
    w = cfg.window(layer)
    return SparseMask(n=mask.n, m=mask.m, causal=False, key_mask=mask.key_mask,
                      half=mask.m if w is None else w - 1, globals=cfg.global_tokens)


def sparse_layer_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: SparseMask, *,
                           scale: float | None = None, cap: float | None = None, sink: np.ndarray | None = None,
                           heads: Sequence[int] | None = None, scores: bool = False, top: int | None = None
                           ) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None, TopAttention | None]:
    """Z = softmax(Q·Kᵀ/√d_k + log c + M)·V of a Longformer or BigBird layer, a block of query rows at a time with
    only the keys the block reads (`SparseMask.keys`): per head O(n·(w + |G|)) numbers (BigBird: O(n·5b)), never
    n × n, as transformers' sliding chunks and block-sparse kernels. Plain form it equals:
    scaled_dot_product_attention(q, k, v, mask.bias(q.dtype), scale=scale, cap=cap, sink=sink).

    q (B, H, n, d_k); k, v (B, Hkv, m, d_k). Returns (Z (B, H, n, d_k), A, S, top): A (B, h, n, m) of HEADS when
    given (S too with SCORES; −∞ outside the pattern), else None; with TOP, each row's TOP largest weights of every
    head (attention.TopAttention, equal to attention.top_of of the whole A), else None."""
    B, H, n, _ = q.shape
    m = k.shape[2]
    hs = None if heads is None else np.asarray(list(heads), dtype=np.intp)
    z = np.empty(q.shape[:3] + v.shape[3:], q.dtype)                               # (B, H, n, d_k)
    a_all = None if hs is None else np.zeros((B, len(hs), n, m), q.dtype)         # (B, h, n, m) asked for
    s_all = None if hs is None or not scores else np.full((B, len(hs), n, m), -np.inf, q.dtype)
    K = None if top is None else min(int(top), m)
    kept = None if K is None else (np.empty((B, H, n, K), np.int32), np.empty((B, H, n, K), np.float32),
                                   np.empty((B, H, n), np.float32))
    for q0, q1 in mask.row_blocks():
        J = mask.keys(q0, q1)                                                      # (|J|,) the keys these rows read
        bias = copies_bias(mask.copies(np.arange(q0, q1) + m - n, J), q.dtype)     # (r, |J|) log c, −∞ where 0
        if mask.key_mask is not None:
            bias = bias + mask_bias(mask.key_mask[:, None, None, J], q.dtype)       # (B, 1, r, |J|)
        s = attention_scores(q[:, :, q0:q1], k[:, :, J], scale, cap)               # (B, H, r, |J|)
        s += bias
        a = softmax_of(s.copy() if s_all is not None else s, sink)                 # (B, H, r, |J|)
        z[:, :, q0:q1] = attend(a, v[:, :, J])                                     # (B, H, r, d_k)
        if a_all is not None:
            a_all[:, :, q0:q1][..., J] = a[:, hs]
        if s_all is not None:
            s_all[:, :, q0:q1][..., J] = s[:, hs]
        if K is not None:
            t = top_within(a, J, m, K)                                             # (B, H, r, K)
            kept[0][:, :, q0:q1], kept[1][:, :, q0:q1], kept[2][:, :, q0:q1] = t.index, t.weight, t.rest
    return z, a_all, s_all, None if K is None else TopAttention(*kept, m)


def top_within(a: np.ndarray, J: np.ndarray, m: int, K: int) -> TopAttention:
    """attention.top_of(A, K) of rows whose whole A (…, r, m) is A at keys J (sorted) and 0 elsewhere, without
    building it: the candidates are J and the first K keys outside it (a weight of 0 ties, broken by the lower
    key), so the K kept and their order are top_of's."""
    extra = np.setdiff1d(np.arange(min(m, len(J) + K)), J)[:K]                     # zero-weight keys that may count
    cand = np.union1d(J, extra)                                                    # (c,) sorted
    full = np.zeros(a.shape[:-1] + (len(cand),), a.dtype)                          # (…, r, c)
    full[..., np.searchsorted(cand, J)] = a
    t = top_of(full, K)
    return TopAttention(cand[t.index].astype(np.int32), t.weight, t.rest, m)


def global_rows(x: np.ndarray, w, cfg: ModelConfig, mask: AttentionMask, z: np.ndarray, a: np.ndarray | None,
                s: np.ndarray | None, heads, top: TopAttention | None = None
                ) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
    """Longformer's global tokens' rows (cfg.global_tokens G), which read every key through their own projections:

        Z[G] = softmax(Q_g·K_gᵀ/√d_k + M)·V_g,   Q_g = X[G]·W_Qg + b_Qg, K_g = X·W_Kg + b_Kg, V_g = X·W_Vg + b_Vg

    (M: the padding). x (B, n, d_model); z (B, H, n, d_k) the layer's heads, a, s (B, h, n, m) its weights and
    scores for HEADS (None: not kept): copies with G's rows replaced (|G| × n scores per head); TOP, each row's
    largest weights of the layer's kernel (`sparse_layer_attention`), gets G's rows replaced in place. The other
    rows see G's keys through K, V (their mask, `sparse_mask`)."""
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
    if top is not None:                                                         # (B, H, n, K) G's rows their own
        t = top_of(ag, top.k)
        top.index[:, :, g], top.weight[:, :, g], top.rest[:, :, g] = t.index, t.weight, t.rest
    return z, a, s
