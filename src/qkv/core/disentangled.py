"""DeBERTa's disentangled attention (He et al. 2021, "DeBERTa: Decoding-enhanced BERT with Disentangled
Attention", §3.1): a token is its content and, apart, its relative position to every other token, so a score is
three terms, each an n × n table of its own:

    S = c2c + c2p + p2c   (+ M)
    c2c[i, j] = Q_i·K_jᵀ · s                     content → content, the usual score
    c2p[i, j] = Q_i·K^r_{δ(i, j)}ᵀ · s           content → position: query i's content reads key j's distance
    p2c[i, j] = K_j·Q^r_{δ(j, i)}ᵀ · s           position → content: key j's content read from query i's distance
    s = 1/√(d_k · (1 + number of position terms))

K^r = P·W_Kr + b_Kr and Q^r = P·W_Qr + b_Qr are the relative position table P (2k, d_model), LayerNorm'ed where
the checkpoint says (norm_rel_ebd), through each layer's own projections, or through W_K and W_Q themselves
(share_att_key). δ(i, j) = clamp(bucket(i − j) + k, 0, 2k − 1), the row of P: bucket(r) = r near 0, log-spaced
past ±buckets/2 up to max_distance (position_buckets; DeBERTa-v3: 256 buckets over 512), r itself without buckets.

Where it enters the engine: the attention box (core.blocks.attention) adds c2p + p2c to S as the pass's position
bias (AttentionMask.position_bias), so every path that reads S (recorded, hooked, a view's blocks of rows) reads the
same S = c2c + (c2p + p2c); each term is recorded and hooked under its name (core.trace.DISENTANGLED). The pass
(core.stack.transformer) makes the table and the rows each pair reads once (`relative_table`); training and input
attribution take the terms back to q, k, the projections and the table (`terms_backward`, `table_backward`, read by
core.blocks_backward.attention and core.backward). transformers computes it in modeling_deberta_v2's
DisentangledSelfAttention (v1: modeling_deberta's, the same numbers from a table sliced by the input's length).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from ..runtime.errors import QkvError
from .attention import AttentionMask, attention_scores
from .ops import layer_norm, layer_norm_backward
from .weights import AttentionWeights, NormWeights

TERMS = ("c2p", "p2c")                     # the position terms a model may add, in the order S sums them


@dataclass(frozen=True)
class Disentangled:
    """The knobs of disentangled attention (ModelConfig.disentangled), as transformers' DebertaV2Config names them."""

    terms: tuple[str, ...]                 # pos_att_type: ("c2p", "p2c") or one of them (TERMS' order)
    max_distance: int                      # max_relative_positions (max_position_embeddings when < 1)
    buckets: int = 0                       # position_buckets: log-spaced buckets past ±buckets/2; 0: none
    share_key: bool = False                # share_att_key: positions projected by W_K, W_Q themselves
    norm: bool = False                     # norm_rel_ebd "layer_norm": P LayerNorm'ed (Weights.rel_norm) before use

    @property
    def span(self) -> int:
        """k: the table P has 2k rows, distances clamp to −k … k − 1 (position_buckets, else max_distance)."""
        return self.buckets if self.buckets > 0 else self.max_distance

    def check(self) -> str | None:
        """What is wrong with these knobs, in words (None: nothing), for ModelConfig's one error."""
        if not self.terms or any(t not in TERMS for t in self.terms) or len(set(self.terms)) != len(self.terms):
            return f"disentangled terms {self.terms} must be c2p, p2c or both"
        if self.max_distance < 1 or self.buckets < 0:
            return f"max_relative_positions={self.max_distance} must be ≥ 1 and position_buckets={self.buckets} ≥ 0"
        if self.buckets == 1 or (self.buckets > 1 and self.max_distance - 1 == self.buckets // 2):
            return (f"position_buckets={self.buckets} with max_relative_positions={self.max_distance} makes the log "
                    "buckets divide by zero")
        return None


def log_buckets(r: np.ndarray, buckets: int, max_distance: int) -> np.ndarray:
    """bucket(r) of relative distances r (int): r itself where |r| ≤ buckets/2, else sign(r)·(mid + ⌈log(|r|/mid)
    / log((max_distance − 1)/mid) · (mid − 1)⌉), mid = buckets // 2 — in float32, the steps of transformers'
    make_log_bucket_position, so that the rounding up lands on the same bucket."""
    mid = buckets // 2
    near = (r < mid) & (r > -mid)
    a = np.where(near, mid - 1, np.abs(r)).astype(np.float32)                       # (…) |r|, mid − 1 near 0
    ratio = np.log(np.float32((max_distance - 1) / mid))                            # float32, as torch.tensor(…)
    with np.errstate(divide="ignore"):
        log_pos = np.ceil(np.log(a / np.float32(mid)) / ratio * np.float32(mid - 1)) + np.float32(mid)
    return np.where(a <= mid, r, log_pos * np.sign(r)).astype(np.int64)             # (…)


def relative_rows(n: int, d: Disentangled) -> tuple[np.ndarray, np.ndarray]:
    """The rows of P each pair reads, (c2p (n, n), p2c (n, n)): c2p[i, j] = δ(i, j) = clamp(bucket(i − j) + k, 0, 2k − 1)
    by (query i, key j), and p2c[j, i] = clamp(−bucket(j − i) + k, 0, 2k − 1) by (key j, query i), as transformers
    gathers it (bucket is odd, so the two are one table transposed)."""
    pos = np.arange(n)
    r = pos[:, None] - pos[None, :]                                                 # (n, n) i − j
    if d.buckets > 0:
        r = log_buckets(r, d.buckets, d.max_distance)
    k = d.span
    return np.clip(r + k, 0, 2 * k - 1), np.clip(-r + k, 0, 2 * k - 1)              # (n, n) each


@dataclass
class RelativeTable:
    """What every layer of one pass reads: P (2k, d_model) after its norm, and the rows each pair reads."""

    P: np.ndarray                          # (2k, d_model)
    c2p: np.ndarray                        # (n, n) δ(i, j)
    p2c: np.ndarray                        # (n, n) by (key j, query i)


def relative_table(P: np.ndarray, norm: NormWeights | None, eps: float, n: int, d: Disentangled) -> RelativeTable:
    """The pass's RelativeTable for n tokens: P = the checkpoint's rel_embeddings (its first 2k rows), LayerNorm'ed
    (γ, β of NORM, ε EPS) where the model has that norm (norm_rel_ebd)."""
    P = P[:2 * d.span]                                                              # (2k, d_model)
    if norm is not None:
        P = layer_norm(P, norm.weight, norm.bias, eps)
    return RelativeTable(P, *relative_rows(n, d))


def position_heads(P: np.ndarray, W: np.ndarray, b: np.ndarray | None, H: int) -> np.ndarray:
    """P·W + b split into the H heads: (2k, d_model) → (H, 2k, d_k), K^r or Q^r."""
    y = P @ W                                                                       # (2k, H·d_k)
    if b is not None:
        y = y + b
    return y.reshape(len(P), H, -1).transpose(1, 0, 2)                              # (H, 2k, d_k)


def c2p_term(q: np.ndarray, Kr: np.ndarray, rows: np.ndarray, scale: float) -> np.ndarray:
    """c2p[b, h, i, j] = Q_i·K^r[δ(i, j)]ᵀ · s: every query against every row of K^r, then each pair's row picked.
    q (B, H, n, d_k), Kr (H, 2k, d_k), rows (n, n) → (B, H, n, n)."""
    every = np.matmul(q, Kr.swapaxes(-1, -2)[None])                                 # (B, H, n, 2k)
    t = np.take_along_axis(every, np.broadcast_to(rows, every.shape[:2] + rows.shape), axis=-1)   # (B, H, n, n)
    t *= scale
    return t


def p2c_term(k: np.ndarray, Qr: np.ndarray, rows: np.ndarray, scale: float) -> np.ndarray:
    """p2c[b, h, i, j] = K_j·Q^r[δ(j, i)]ᵀ · s: every key against every row of Q^r, each pair's row picked (rows by
    (key, query)), then transposed to (query, key). k (B, H, n, d_k), Qr (H, 2k, d_k), rows (n, n) → (B, H, n, n)."""
    every = np.matmul(k, Qr.swapaxes(-1, -2)[None])                                 # (B, H, n_k, 2k)
    t = np.take_along_axis(every, np.broadcast_to(rows, every.shape[:2] + rows.shape), axis=-1)   # (B, H, j, i)
    t = np.ascontiguousarray(t.swapaxes(-1, -2))                                    # (B, H, n, n) [i, j]
    t *= scale
    return t


def position_terms(q: np.ndarray, k: np.ndarray, W_Q: np.ndarray, b_Q: np.ndarray | None, W_K: np.ndarray,
                   b_K: np.ndarray | None, table: RelativeTable, d: Disentangled, scale: float
                   ) -> dict[str, np.ndarray]:
    """{"c2p": (B, H, n, n), "p2c": (B, H, n, n)}, the terms d.terms names, of q, k (B, H, n, d_k) after their
    hooks: K^r = P·W_K + b_K, Q^r = P·W_Q + b_Q (the layer's W_Kr, W_Qr, or W_K, W_Q with share_att_key)."""
    H = q.shape[1]
    out = {}
    if "c2p" in d.terms:
        out["c2p"] = c2p_term(q, position_heads(table.P, W_K, b_K, H), table.c2p, scale)
    if "p2c" in d.terms:
        out["p2c"] = p2c_term(k, position_heads(table.P, W_Q, b_Q, H), table.p2c, scale)
    return out


def disentangled_mask(q: np.ndarray, k: np.ndarray, w: AttentionWeights, ctx, layer: int,
                      mask: AttentionMask) -> AttentionMask:
    """MASK with S's position terms as its position bias, c2p + p2c (B, H, n, n) (the attention box's step for
    cfg.disentangled): each term hooked ("scores_c2p", "scores_p2c") and recorded, and c2c = Q·Kᵀ·s computed apart
    only to be read (recorded or hooked: the box's own Q·Kᵀ·s is S's first term, the same numbers). q, k (B, H, n,
    d_k) after their hooks; ctx: the pass's core.context.Context (not imported: it imports this module)."""
    rec, hooks, d = ctx.rec, ctx.hooks, ctx.cfg.disentangled
    if ctx.cache is not None or ctx.relative is None or ctx.relative.c2p.shape[0] != q.shape[2]:
        raise QkvError("disentangled attention (DeBERTa) reads the whole input in one pass with the relative table "
                       "that pass makes (qkv.core.stack.transformer): run it so, without a KV cache")
    scale = ctx.scale if ctx.scale is not None else 1.0 / math.sqrt(q.shape[-1])
    if rec.wants(layer, "scores_c2c") or (hooks is not None and hooks.wants(layer, "scores_c2c")):
        c2c = attention_scores(q, k, scale)                                         # (B, H, n, n)
        if hooks is not None and hooks(layer, "scores_c2c", c2c) is not c2c:
            raise QkvError(f"the hook on {layer}.scores_c2c returned an array: c2c is read only (it is Q·Kᵀ·s, "
                           "computed with S); return None, or hook 'scores' (S) or 'q', 'k' to change it")
        rec.put(layer, "scores_c2c", c2c if rec.heads is None else c2c[:, rec.heads])   # as S: the heads kept
    share = d.share_key
    terms = position_terms(q, k, w.W_Q if share else w.W_Qr, w.b_Q if share else w.b_Qr,
                           w.W_K if share else w.W_Kr, w.b_K if share else w.b_Kr, ctx.relative, d, scale)
    bias = None
    for name in d.terms:                                                            # c2p, then p2c
        t = terms[name] if hooks is None else hooks(layer, f"scores_{name}", terms[name])   # (B, H, n, n)
        rec.put(layer, f"scores_{name}", t if rec.heads is None else t[:, rec.heads])
        bias = t if bias is None else bias + t                                      # a new array: t stays recorded
    return replace(mask, position_bias=bias, _bias={})


# ── backward (training, input attribution): S's position terms back to q, k and the relative table ──────────────

def scatter_rows(G: np.ndarray, rows: np.ndarray, R: int) -> np.ndarray:
    """E[b, h, i, r] = Σ_j G[b, h, i, j]·[rows[i, j] = r]: the gradient of a take_along_axis of rows (n, m) from
    R columns, given G (B, H, n, m) → (B, H, n, R) (summed in float64, cast back)."""
    B, H, n, m = G.shape
    flat = (np.arange(n)[:, None] * R + rows).ravel()                               # (n·m,) into one (n, R) table
    idx = (np.arange(B * H)[:, None] * (n * R) + flat[None]).ravel()                # (B·H·n·m,)
    E = np.bincount(idx, weights=G.reshape(-1), minlength=B * H * n * R)           # (B·H·n·R,) float64
    return E.reshape(B, H, n, R).astype(G.dtype)


def _projection_grads(E: np.ndarray, x: np.ndarray, P: np.ndarray, W: np.ndarray, b: np.ndarray | None
                      ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None, np.ndarray]:
    """Through Y_h = P·W_h + b_h (H heads of (2k, d_k)) read as X·Y_hᵀ (x (B, H, n, d_k), E = dL/d(X·Y_hᵀ)
    (B, H, n, 2k)): (dX (B, H, n, d_k), dW (d_model, H·d_k), db (H·d_k,) or None, dP (2k, d_model))."""
    H, d_k = x.shape[1], x.shape[3]
    dx = np.matmul(E, position_heads(P, W, b, H)[None])                             # (B, H, n, d_k) E·Y
    dY = np.einsum("bhnr,bhnd->rhd", E, x).reshape(len(P), H * d_k)                 # (2k, H·d_k) Eᵀ·X
    return dx, P.T @ dY, (None if b is None else dY.sum(axis=0)), dY @ W.T


def terms_backward(dS: np.ndarray, q: np.ndarray, k: np.ndarray, w: AttentionWeights, table: RelativeTable,
                   d: Disentangled, scale: float) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict]:
    """Given dS (B, H, n, n), the gradient of the scores: (dq, dk (B, H, n, d_k), dP (2k, d_model) of the table
    after its norm, {field of AttentionWeights: gradient}) of S's position terms (`position_terms`):

        c2p = take(Q·K^rᵀ, δ)·s     →  E = scatter(dS, δ)·s,  dQ = E·K^r,  dK^r = Eᵀ·Q
        p2c = take(K·Q^rᵀ, δ')ᵀ·s   →  E = scatter(dSᵀ, δ')·s, dK = E·Q^r, dQ^r = Eᵀ·K
        K^r = P·W_Kr + b_Kr          →  dW_Kr = Pᵀ·dK^r, db_Kr = Σ dK^r, dP = dK^r·W_Krᵀ   (Q^r alike)

    with W_K, W_Q themselves under share_att_key (their fields then get these gradients to add)."""
    P, R = table.P, len(table.P)
    share = d.share_key
    dq, dk, dP, grads = np.zeros_like(q), np.zeros_like(k), np.zeros_like(P), {}
    if "c2p" in d.terms:
        W, b, names = (w.W_K, w.b_K, ("W_K", "b_K")) if share else (w.W_Kr, w.b_Kr, ("W_Kr", "b_Kr"))
        E = scatter_rows(dS, table.c2p, R)                                          # (B, H, n, 2k)
        E *= scale
        dq, grads[names[0]], grads[names[1]], dP = _projection_grads(E, q, P, W, b)
    if "p2c" in d.terms:
        W, b, names = (w.W_Q, w.b_Q, ("W_Q", "b_Q")) if share else (w.W_Qr, w.b_Qr, ("W_Qr", "b_Qr"))
        E = scatter_rows(np.ascontiguousarray(dS.swapaxes(-1, -2)), table.p2c, R)  # (B, H, n_k, 2k)
        E *= scale
        dk, grads[names[0]], grads[names[1]], dP_q = _projection_grads(E, k, P, W, b)
        dP += dP_q
    return dq, dk, dP, grads


def table_backward(d_tables: list[np.ndarray], P0: np.ndarray, norm: NormWeights | None, eps: float
                   ) -> tuple[np.ndarray, NormWeights | None]:
    """The relative table's gradient from every layer's dP (2k, d_model) (each layer reads the same P): their sum,
    back through P = LayerNorm(P0[:2k]) where the model has that norm → (dP0 like P0 (rows past 2k: 0), the norm's
    γ, β gradients or None)."""
    dP = np.add.reduce(d_tables)                                                    # (2k, d_model)
    g = None
    if norm is not None:
        dP, dg, db = layer_norm_backward(dP, P0[:len(dP)], norm.weight, eps)
        g = NormWeights(dg, None if norm.bias is None else db)
    out = np.zeros_like(P0)
    out[:len(dP)] = dP
    return out, g
