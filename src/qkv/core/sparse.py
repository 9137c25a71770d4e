"""Sparse attention (guide: sparse, 희소 어텐션): each query sees only some keys, and the kernel skips the rest.

Full attention scores every (query, key) pair: n² of them. A sparse *pattern* keeps a few, so
softmax(Q·Kᵀ/√d_k + M)·V with M = −∞ outside the pattern. Applying M to the dense n × n matrix
saves nothing; the point is to never compute what M hides. The kernel here is the tiled kernel
of `kernels.tiled_attention` (FlashAttention's online softmax) that asks the pattern, for each
tile of (query block, key block), whether the tile is

    hidden   every pair masked: the tile is skipped (no Q·Kᵀ, no exp, no P·V)
    full     every pair visible: computed without a mask
    partial  some pairs visible: computed, with M added to the tile's scores

The gallery (i the query's position, j the key's, d = i − j; causal adds j ≤ i to every one):

    dense           every key (causal: the keys so far)
    sliding_window  |d| < w                                        (Mistral; Longformer's local part)
    dilated_window  |d| < w·r and d a multiple of r: w keys a side, r apart (Longformer's dilated heads)
    longformer      sliding window, plus global tokens G that see and are seen by every token
    bigbird         longformer, plus `random` random key blocks per query block (BigBird, seeded)
    block_sparse    query block a sees key block b if |a − b| < local, or b is a "summary" block
                    (b mod stride = stride − 1): the "fixed" pattern of Sparse Transformers, by blocks

A pattern is a union of parts (`Band`, `Globals`, `BlockRule`, `RandomBlocks`), each able to say
exactly when a tile holds none of its pairs; the tile is hidden when every part says so. A row
that sees no key at all (possible only with hand-made parts, never in the gallery, whose every
query sees itself) gets zeros, as in `kernels.tiled_attention` and `ops.softmax`: never NaN.

Shapes as `kernels.tiled_attention`: q (B, H, n, d_k) or (H, n, d_k), k and v (B, Hkv, m, d_k) or
(Hkv, m, d_k), H a multiple of Hkv (GQA/MQA: query head h reads K/V head h // (H/Hkv)); with m > n
the queries are the last n positions (cached decoding).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Iterable, Sequence

import numpy as np

from ..runtime.errors import QkvError
from ..runtime.threads import parallel_map

HIDDEN, PARTIAL, FULL = 0, 1, 2                    # what a tile holds (Pattern.tile, Pattern.tiles)
KINDS = ("hidden", "partial", "full")
BLOCK = 128                                        # rows of queries and of keys per tile by default
_FAR = 1 << 62                                     # "no limit" for a band's distance


# ── the parts a pattern is made of ──────────────────────────────────────────────────

@dataclass(frozen=True)
class Band:
    """Keys at distance d = i − j with lo ≤ d ≤ hi and d a multiple of `step` (1: every one)."""

    lo: int = -_FAR
    hi: int = _FAR
    step: int = 1

    def visible(self, i: np.ndarray, j: np.ndarray, n_k: int) -> np.ndarray:
        d = i - j                                                   # (r, c) how far back each key is
        ok = (d >= self.lo) & (d <= self.hi)
        return ok & (d % self.step == 0) if self.step > 1 else ok

    def hidden(self, q0: int, q1: int, k0: int, k1: int, n_k: int, causal: bool) -> bool:
        """A tile [q0, q1) × [k0, k1) holds every distance from q0 − (k1 − 1) to (q1 − 1) − k0: none
        visible iff that range, cut to [lo, hi] (and d ≥ 0 when causal), holds no multiple of step."""
        a = max(q0 - (k1 - 1), self.lo, 0 if causal else -_FAR)
        b = min(q1 - 1 - k0, self.hi)
        return a > b or -(-a // self.step) * self.step > b          # the first multiple ≥ a is past b

    def full(self, q0: int, q1: int, k0: int, k1: int) -> bool:
        return self.step == 1 and q0 - (k1 - 1) >= self.lo and q1 - 1 - k0 <= self.hi


@dataclass(frozen=True)
class Globals:
    """Global tokens (Longformer): a global query sees every key, every query sees a global key."""

    tokens: tuple[int, ...]

    def visible(self, i: np.ndarray, j: np.ndarray, n_k: int) -> np.ndarray:
        g = np.asarray(self.tokens, dtype=np.int64)
        return np.isin(i, g) | np.isin(j, g)                        # (r, c)

    def hidden(self, q0: int, q1: int, k0: int, k1: int, n_k: int, causal: bool) -> bool:
        as_key = [t for t in self.tokens if k0 <= t < k1 and (not causal or t <= q1 - 1)]
        as_query = [t for t in self.tokens if q0 <= t < q1 and (not causal or k0 <= t)]
        return not as_key and not as_query

    def full(self, q0: int, q1: int, k0: int, k1: int) -> bool:
        return False                                                # rare: the tile's mask decides


class _ByBlocks:
    """A part decided block by block: query block a = i // block sees key block b = j // block if rule(a, b)."""

    block: int

    def rule(self, a: np.ndarray, b: np.ndarray, n_k: int) -> np.ndarray:
        raise NotImplementedError

    def visible(self, i: np.ndarray, j: np.ndarray, n_k: int) -> np.ndarray:
        return self.rule(i // self.block, j // self.block, n_k)

    def pair(self, a: int, b: int, n_k: int) -> bool:
        """rule(a, b) for one pair of blocks (the tile test's fast path: a tile touches few blocks)."""
        return bool(self.rule(np.array([[a]]), np.array([[b]]), n_k)[0, 0])

    def hidden(self, q0: int, q1: int, k0: int, k1: int, n_k: int, causal: bool) -> bool:
        """No pair of blocks the tile touches is kept (causal: in the piece of it where j ≤ i)."""
        p = self.block
        for a in range(q0 // p, (q1 - 1) // p + 1):                 # the query blocks the tile touches
            last_i = min((a + 1) * p, q1) - 1
            for b in range(k0 // p, (k1 - 1) // p + 1):             # the key blocks
                if (not causal or max(b * p, k0) <= last_i) and self.pair(a, b, n_k):
                    return False
        return True

    def full(self, q0: int, q1: int, k0: int, k1: int) -> bool:
        return False


@dataclass(frozen=True)
class BlockRule(_ByBlocks):
    """Block-sparse: |a − b| < local (the block's neighbours), or b mod stride = stride − 1 (summary blocks)."""

    block: int
    local: int = 1
    stride: int = 0                                                 # 0: no summary blocks

    def rule(self, a: np.ndarray, b: np.ndarray, n_k: int) -> np.ndarray:
        ok = np.abs(a - b) < self.local
        return ok | (b % self.stride == self.stride - 1) if self.stride else ok

    def pair(self, a: int, b: int, n_k: int) -> bool:
        return abs(a - b) < self.local or (self.stride > 0 and b % self.stride == self.stride - 1)


@dataclass(frozen=True)
class RandomBlocks(_ByBlocks):
    """`count` key blocks per query block, drawn with a seed (BigBird); causal draws only earlier blocks."""

    block: int
    count: int
    seed: int = 0
    causal: bool = False

    def rule(self, a: np.ndarray, b: np.ndarray, n_k: int) -> np.ndarray:
        n_kb = -(-n_k // self.block)
        rows, at = np.unique(a, return_inverse=True)                # the query blocks asked about
        drawn = np.zeros((len(rows), n_kb + 1), dtype=bool)         # (rows, key blocks) the draws of each
        for r, qa in enumerate(rows):
            drawn[r, list(_drawn(self.seed, self.count, int(qa), n_kb, self.causal))] = True
        return drawn[at.reshape(np.shape(a)), np.clip(b, 0, n_kb)]

    def pair(self, a: int, b: int, n_k: int) -> bool:
        return b in _drawn(self.seed, self.count, a, -(-n_k // self.block), self.causal)


@functools.lru_cache(maxsize=4096)
def _drawn(seed: int, count: int, a: int, n_kb: int, causal: bool) -> tuple[int, ...]:
    """The random key blocks of query block a: the same for the same (seed, a, n_kb) on every call."""
    pool = np.arange(min(a, n_kb) if causal else n_kb)              # causal: blocks wholly in the past
    if len(pool) == 0:
        return ()
    rng = np.random.default_rng([seed, a, n_kb])
    return tuple(sorted(int(x) for x in rng.choice(pool, size=min(count, len(pool)), replace=False)))


# ── patterns ─────────────────────────────────────────────────────────────────────

@dataclass(frozen=True)
class Pattern:
    """Which keys each query sees: the union of `parts`, cut to j ≤ i when causal."""

    name: str                      # short id: "window"
    label: str                     # what a reader sees: "sliding window, w = 64"
    parts: tuple
    causal: bool

    def visible(self, q_pos: Iterable[int], k_pos: Iterable[int], n_k: int) -> np.ndarray:
        """(len(q_pos), len(k_pos)) bool: True where the query at q_pos[r] sees the key at k_pos[c]."""
        i = np.asarray(list(q_pos) if not isinstance(q_pos, np.ndarray) else q_pos, dtype=np.int64)[:, None]
        j = np.asarray(list(k_pos) if not isinstance(k_pos, np.ndarray) else k_pos, dtype=np.int64)[None, :]
        ok = np.zeros((i.shape[0], j.shape[1]), dtype=bool)          # (r, c)
        for part in self.parts:
            ok |= part.visible(i, j, n_k)
        return ok & (j <= i) if self.causal else ok

    def mask(self, n_q: int, n_k: int | None = None) -> np.ndarray:
        """The dense mask (n_q, n_k): queries at the last n_q of n_k positions (self-attention: n_q = n_k)."""
        n_k = n_q if n_k is None else n_k
        return self.visible(np.arange(n_k - n_q, n_k), np.arange(n_k), n_k)

    def tile(self, q0: int, q1: int, k0: int, k1: int, n_k: int) -> tuple[int, np.ndarray | None]:
        """(HIDDEN, PARTIAL or FULL, the tile's mask when PARTIAL) for query positions [q0, q1), keys [k0, k1).

        Hidden is decided from the parts alone (no mask built); full too where a part can tell;
        otherwise the tile's mask decides, and the kernel adds it to the scores.
        """
        if all(p.hidden(q0, q1, k0, k1, n_k, self.causal) for p in self.parts):
            return HIDDEN, None
        if (not self.causal or k1 - 1 <= q0) and any(p.full(q0, q1, k0, k1) for p in self.parts):
            return FULL, None
        m = self.visible(np.arange(q0, q1), np.arange(k0, k1), n_k)     # (bq, bk)
        return (FULL, None) if m.all() else (PARTIAL, m) if m.any() else (HIDDEN, None)

    def tiles(self, n_q: int, n_k: int | None = None, block: int | tuple[int, int] = BLOCK) -> np.ndarray:
        """What each tile holds, (⌈n_q/bq⌉, ⌈n_k/bk⌉) of HIDDEN, PARTIAL, FULL: the kernel's map of work."""
        n_k = n_q if n_k is None else n_k
        bq, bk = _blocks(block)
        off = n_k - n_q
        return np.array([[self.tile(off + q0, off + min(n_q, q0 + bq), k0, min(n_k, k0 + bk), n_k)[0]
                          for k0 in range(0, n_k, bk)] for q0 in range(0, n_q, bq)], dtype=np.int8)

    def density(self, n_q: int, n_k: int | None = None) -> float:
        """The share of (query, key) pairs the pattern keeps (causal counts all n_q·n_k pairs)."""
        return float(self.mask(n_q, n_k).mean())


def _check(what: str, value: int, least: int = 1) -> int:
    if int(value) != value or value < least:
        raise QkvError(f"{what} must be a whole number ≥ {least}, got {value}")
    return int(value)


def _globals(tokens: Sequence[int]) -> tuple[int, ...]:
    tokens = tuple(sorted({int(t) for t in tokens}))
    if any(t < 0 for t in tokens):
        raise QkvError(f"global tokens are positions counted from 0, got {list(tokens)}")
    return tokens


def dense(causal: bool = True) -> Pattern:
    """Every key (causal: every key up to the query's own position)."""
    return Pattern("causal" if causal else "full", "causal (dense)" if causal else "full (dense)", (Band(),), causal)


def sliding_window(window: int, causal: bool = True) -> Pattern:
    """Keys at distance < w: the last w positions (causal), or w − 1 on each side and the query's own."""
    w = _check("window", window)
    return Pattern("window", f"sliding window, w = {w}", (Band(-(w - 1), w - 1),), causal)


def dilated_window(window: int, dilation: int, causal: bool = True) -> Pattern:
    """w keys a side, r apart: distances 0, r, 2r, … (w − 1)·r; reaches r times as far as a window of w."""
    w, r = _check("window", window), _check("dilation", dilation)
    return Pattern("dilated", f"dilated window, w = {w}, r = {r}", (Band(-(w - 1) * r, (w - 1) * r, r),), causal)


def longformer(window: int, globals: Sequence[int] = (0,), causal: bool = True) -> Pattern:
    """Sliding window plus global tokens, which see and are seen by every token (Longformer)."""
    w, g = _check("window", window), _globals(globals)
    return Pattern("longformer", f"global {list(g)} + window w = {w} (Longformer)", (Band(-(w - 1), w - 1), Globals(g)),
                   causal)


def bigbird(window: int, globals: Sequence[int] = (0,), random: int = 2, block: int = 32, seed: int = 0,
            causal: bool = True) -> Pattern:
    """Longformer plus `random` random key blocks of `block` keys per query block (BigBird), drawn with `seed`."""
    w, g = _check("window", window), _globals(globals)
    r, p = _check("random blocks", random, 0), _check("block", block)
    return Pattern("bigbird", f"global + window w = {w} + {r} random blocks of {p} (BigBird)",
                   (Band(-(w - 1), w - 1), Globals(g), RandomBlocks(p, r, int(seed), causal)), causal)


def block_sparse(block: int, local: int = 1, stride: int = 4, causal: bool = True) -> Pattern:
    """Blocks of `block` tokens: a block sees its `local` − 1 neighbours a side and every stride-th block."""
    p, loc, s = _check("block", block), _check("local", local), _check("stride", stride, 0)
    return Pattern("block", f"block-sparse, blocks of {p}, local {loc}" + (f", every {s}th block" if s else ""),
                   (BlockRule(p, loc, s),), causal)


def gallery(causal: bool = True, window: int = 64, block: int = 32, seed: int = 0) -> list[Pattern]:
    """The guide's sparse patterns with matching sizes: dense, window, dilated, Longformer, BigBird, block-sparse."""
    return [dense(causal), sliding_window(window, causal), dilated_window(max(1, window // 4), 4, causal),
            longformer(window, (0,), causal), bigbird(window, (0,), 2, block, seed, causal),
            block_sparse(block, 2, 4, causal)]


# ── the kernel ───────────────────────────────────────────────────────────────────

@dataclass
class TileCount:
    """What the kernel did: tiles of (query block, key block) in all, and how many it computed."""

    total: int
    full: int
    partial: int
    skipped: int                   # hidden by the pattern: never computed

    @property
    def visited(self) -> int:
        return self.full + self.partial


def _blocks(block: int | tuple[int, int]) -> tuple[int, int]:
    bq, bk = (block, block) if isinstance(block, (int, np.integer)) else block
    return _check("block", bq), _check("block", bk)


def sparse_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, pattern: Pattern, *,
                     block: int | tuple[int, int] = BLOCK) -> tuple[np.ndarray, TileCount]:
    """softmax(Q·Kᵀ/√d_k + M)·V with M = −∞ outside `pattern`, tile by tile, skipping hidden tiles.

    block: rows of queries and of keys per tile (one number, or (queries, keys)). Returns the
    output (same shape and dtype as q) and the `TileCount`. Query blocks run in parallel
    (threads.parallel_map), as in `kernels.tiled_attention`.

    Plain form it equals:  softmax(q @ kᵀ / √d + where(pattern.mask(n, m), 0, −∞)) @ v
    """
    squeeze = q.ndim == 3
    if squeeze:
        q, k, v = q[None], k[None], v[None]                         # (1, H, n, d) …
    if q.ndim != 4 or k.ndim != 4 or k.shape[:-1] != v.shape[:-1]:
        raise QkvError(f"q, k, v must be (B, H, n, d_k) and (B, Hkv, m, d_k): got {q.shape}, {k.shape}, {v.shape}")
    B, H, n, d = q.shape
    Hkv, m = k.shape[1], k.shape[2]
    if H % Hkv or k.shape[3] != d or k.shape[0] != B or m < n:
        raise QkvError(f"q {q.shape} does not fit k {k.shape}: H must be a multiple of Hkv, d_k equal, m ≥ n")
    bq, bk = _blocks(block)
    qg = q.reshape(B, Hkv, H // Hkv, n, d)                          # (B, Hkv, G, n, d) query heads by K/V head
    out = np.empty((B, Hkv, H // Hkv, n, v.shape[-1]), dtype=q.dtype)
    counts = parallel_map(lambda q0: _query_block(qg, k, v, out, q0, min(n, q0 + bq), bk, pattern),
                          range(0, n, bq))
    total = TileCount(*(int(x) for x in np.sum(counts, axis=0)))
    z = out.reshape(B, H, n, -1)                                    # (B, H, n, d_v)
    return (z[0] if squeeze else z), total


def _query_block(qg: np.ndarray, k: np.ndarray, v: np.ndarray, out: np.ndarray, q0: int, q1: int, bk: int,
                 pattern: Pattern) -> tuple[int, int, int, int]:
    """out[..., q0:q1, :] by the online softmax over the key tiles the pattern does not hide.

    For each visited tile: M_new = max(M, rowmax S), P = exp(S − M_new), ℓ = ℓ·exp(M − M_new) + rowsum P,
    acc = acc·exp(M − M_new) + P·V; finally acc / ℓ (0 for a row that saw no key).
    Returns (tiles, full, partial, skipped).
    """
    B, Hkv, G, n, d = qg.shape
    m, rows = k.shape[2], G * (q1 - q0)
    offset = m - n                                                  # absolute position of query 0
    qb = (qg[:, :, :, q0:q1] * (1.0 / math.sqrt(d))).reshape(B, Hkv, rows, d)   # (B, Hkv, G·bq, d) pre-scaled
    row_max = np.full((B, Hkv, rows, 1), -np.inf, dtype=qg.dtype)
    row_sum = np.zeros((B, Hkv, rows, 1), dtype=qg.dtype)
    acc = np.zeros((B, Hkv, rows, v.shape[-1]), dtype=qg.dtype)
    full = partial = skipped = 0
    for k0 in range(0, m, bk):
        k1 = min(m, k0 + bk)
        kind, allowed = pattern.tile(offset + q0, offset + q1, k0, k1, m)
        if kind == HIDDEN:
            skipped += 1
            continue                                                # nothing of this tile is ever computed
        s = np.matmul(qb, k[:, :, k0:k1].swapaxes(-1, -2))          # (B, Hkv, G·bq, bk) S = Q·Kᵀ/√d
        if kind == PARTIAL:
            partial += 1
            s5 = s.reshape(B, Hkv, G, q1 - q0, k1 - k0)             # S + M in place (grouped layout)
            s5 += np.where(allowed, 0.0, -np.inf).astype(s.dtype)   # (bq, bk) broadcast over B, Hkv, G
        else:
            full += 1
        new_max = np.maximum(row_max, s.max(axis=-1, keepdims=True))
        safe_max = np.where(np.isfinite(new_max), new_max, 0).astype(qg.dtype, copy=False)
        np.subtract(s, safe_max, out=s)
        np.exp(s, out=s)                                            # P = exp(S − M_new)
        rescale = np.exp(row_max - safe_max)                        # exp(M_old − M_new) ≤ 1
        row_sum *= rescale
        row_sum += s.sum(axis=-1, keepdims=True)
        acc *= rescale
        acc += np.matmul(s, v[:, :, k0:k1])                         # + P·V_tile
        row_max = new_max
    np.divide(acc, row_sum, out=acc, where=row_sum > 0)
    acc[np.broadcast_to(row_sum == 0, acc.shape)] = 0               # saw no key: zeros, never NaN
    out[:, :, :, q0:q1] = acc.reshape(B, Hkv, G, q1 - q0, -1)
    return full + partial + skipped, full, partial, skipped


def compare_to_dense(q: np.ndarray, k: np.ndarray, v: np.ndarray, pattern: Pattern, *,
                     dense_out: np.ndarray | None = None, weights: np.ndarray | None = None,
                     block: int | tuple[int, int] = BLOCK) -> dict[str, np.ndarray]:
    """How far a sparse pattern is from dense attention (full, or causal if the pattern is) on the same q, k, v.

    Per head (H,): the relative error ‖Z_sparse − Z_dense‖ / ‖Z_dense‖ and, given the dense
    weights A (H, n, m) (e.g. a trace's attentions, or batch-free), the mass kept: the mean over
    rows of Σ_j A[i, j] over the keys the pattern keeps. q, k, v as `sparse_attention`.
    """
    z, _ = sparse_attention(q, k, v, pattern, block=block)
    if dense_out is None:
        dense_out, _ = sparse_attention(q, k, v, dense(pattern.causal), block=block)
    diff = np.linalg.norm((z - dense_out).astype(np.float64), axis=(-2, -1))
    rel = diff / np.linalg.norm(dense_out.astype(np.float64), axis=(-2, -1))     # (B, H) or (H,)
    found = {"relative_error": rel if rel.ndim == 1 else rel.mean(axis=0)}
    if weights is not None:
        keep = pattern.mask(weights.shape[-2], weights.shape[-1])                 # (n, m)
        found["mass_kept"] = (weights.astype(np.float64) * keep).sum(-1).mean(-1)  # (H,)
    return found
