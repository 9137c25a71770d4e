"""The heart (guide: qkv to heads): masks, scaled dot-product attention, heads, GQA/MQA.

    S = Q·Kᵀ / √d_k  (+ mask M: -∞ where a query may not look)
    A = softmax(S)                         each row sums to 1
    Z = A·V
    MultiHead = Concat(head_1 … head_H) · W_O

Shapes: B batch, H query heads, Hkv key/value heads (H = Hkv for plain multi-head,
Hkv = 1 for MQA), n queries, m keys (m = n except when a KV cache holds the past).
Who may see whom is one rule (masks.visible), made into a pass's mask in one place
(AttentionMask); the kernels for long inputs are kernels.py's.
"""

from __future__ import annotations

import importlib.util
import math
from dataclasses import dataclass, field
from functools import cache

import numpy as np

from .kernels import tiled_attention
from .masks import same_chunk, visible
from .ops import softmax_, softmax_backward, softmax_sink_
from .sparse import sliding_window, sparse_attention


def causal_mask(n: int, m: int | None = None) -> np.ndarray:
    """M[i, j] = True where query i may see key j: j ≤ i (guide: mask), the mask a decoder's pass
    uses (AttentionMask.allowed): (n, m).

    With m > n keys, the queries are the last n positions (cached decoding), so
    query i sits at position m - n + i.
    """
    return AttentionMask(n, n if m is None else m, causal=True).allowed()[0, 0]      # (n, m)


def sliding_window_mask(n: int, window: int, m: int | None = None) -> np.ndarray:
    """Causal and local: query i sees the last `window` positions, itself included: (n, m)."""
    return AttentionMask(n, n if m is None else m, causal=True, window=window).allowed()[0, 0]   # (n, m)


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


def attention_scores(q: np.ndarray, k: np.ndarray, scale: float | None = None, cap: float | None = None) -> np.ndarray:
    """S = Q·Kᵀ / √d_k for every query head, K/V heads shared in groups (GQA/MQA).

    q: (B, H, n, d_k); k: (B, Hkv, m, d_k) → S: (B, H, n, m). scale: what Q·Kᵀ is multiplied by,
    1/√d_k unless the config says otherwise (T5: 1, the scale folded into W_Q; see `score_scale`).
    cap: S = cap·tanh(S/cap), soft-capped before any mask (Gemma 2's attn_logit_softcapping); None: none.
    Query head h uses K/V head h // (H/Hkv), as transformers' `repeat_kv`; the group
    is folded into the rows of one matmul instead of copying K per head.
    """
    B, H, n, dk = q.shape
    Hkv, m = k.shape[1], k.shape[2]
    G = H // Hkv
    qg = q.reshape(B, Hkv, G * n, dk)                    # (B, Hkv, G·n, d_k)
    if n == 1:                                           # one query (a cached step): qkv's own order
        s = one_query_dots(qg, k)                        # (B, Hkv, G, m)
    else:
        s = np.matmul(qg, k.transpose(0, 1, 3, 2))       # (B, Hkv, G·n, m)
    s *= 1.0 / math.sqrt(dk) if scale is None else scale   # Python float: keeps float32
    if cap is not None:
        soft_cap_(s, cap)
    return s.reshape(B, H, n, m)                         # (B, H, n, m)


def soft_cap_(s: np.ndarray, cap: float) -> np.ndarray:
    """s ← cap·tanh(s/cap) in place (the order of transformers' three steps): near s for |s| ≪ cap, never past ±cap."""
    s /= cap
    np.tanh(s, out=s)
    s *= cap
    return s


def attend(weights: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Z = A·V per head; v: (B, Hkv, m, d_k) shared by groups of query heads → (B, H, n, d_k)."""
    B, H, n, m = weights.shape
    Hkv, dk = v.shape[1], v.shape[3]
    G = H // Hkv
    if n == 1:                                           # one query (a cached step): qkv's own order
        z = one_query_sum(weights.reshape(B, Hkv, G, m), v)                                # (B, Hkv, G, d_k)
    else:
        z = np.matmul(weights.reshape(B, Hkv, G * n, m), v)                               # (B, Hkv, G·n, d_k)
    return z.reshape(B, H, n, dk)


# One query's scores and weighted sum are summed in an order qkv defines, not BLAS's (whose order depends on the
# library, its kernel for the CPU, and the shapes: gemv or gemm), so that the compiled one-token step
# (core/step_compiled.py) is the readable one to the bit on any machine: each product rounded to float32, and every
# sum one term after another in order — q·k_j over d_k, Σ_j a_j·v_j over the keys (np.add.accumulate's order).
# With numba they run as core/step_math's loops (the compiled step's own; NumPy's accumulate over many short rows
# is several times slower), else in NumPy, ONE_QUERY_CHUNK products at a time: the same numbers
# (tests/test_attention.py).
ONE_QUERY_CHUNK = 1 << 22


@cache
def _compiled_loops() -> bool:
    """Whether numba is installed (imported only when the loops first run: `import qkv` stays without it)."""
    return importlib.util.find_spec("numba") is not None


def _loops(dtype, n: int) -> bool:
    """Whether step_math's loops sum N > 0 terms of DTYPE (float32, where numba is installed)."""
    return dtype == np.float32 and n > 0 and _compiled_loops()


def _key_chunks(m: int, per_key: int):
    """(j0, j1): the keys in chunks of at most ONE_QUERY_CHUNK products, PER_KEY a key."""
    step = max(1, ONE_QUERY_CHUNK // max(1, per_key))
    return ((j0, min(m, j0 + step)) for j0 in range(0, m, step))


def one_query_dots(q: np.ndarray, k: np.ndarray) -> np.ndarray:
    """S[…, g, j] = q_g·k_j, its d_k products added in order: q (B, Hkv, G, d_k), k (B, Hkv, m, d_k) → (B, Hkv, G,
    m)."""
    B, Hkv, G, dk = q.shape
    m = k.shape[2]
    dtype = np.result_type(q, k)
    if _loops(dtype, dk):
        from . import step_math
        s = np.empty((B, Hkv * G, m), np.float32)
        step_math.one_query_dots(np.ascontiguousarray(q).reshape(B, Hkv * G * dk), k, s)
        return s.reshape(B, Hkv, G, m)
    s = np.empty((B, Hkv, G, m), dtype)
    for j0, j1 in _key_chunks(m, B * Hkv * G * dk):
        terms = np.multiply(q[:, :, :, None, :], k[:, :, None, j0:j1], out=np.empty((B, Hkv, G, j1 - j0, dk), dtype))
        s[..., j0:j1] = np.add.accumulate(terms, axis=-1)[..., -1] if dk else 0           # over d_k, in order
    return s


def one_query_sum(a: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Z[…, g, :] = Σ_j a_gj·v_j, the keys added in their order: a (B, Hkv, G, m), v (B, Hkv, m, d_k) → (B, Hkv, G,
    d_k)."""
    B, Hkv, G, m = a.shape
    dk = v.shape[3]
    dtype = np.result_type(a, v)
    if _loops(dtype, m):
        from . import step_math
        z = np.empty((B, Hkv * G * dk), np.float32)
        step_math.one_query_sum(np.ascontiguousarray(a).reshape(B, Hkv * G, m), v, z)
        return z.reshape(B, Hkv, G, dk)
    z = np.zeros((B, Hkv, G, dk), dtype)
    for j0, j1 in _key_chunks(m, B * Hkv * G * dk):
        terms = np.multiply(a[..., j0:j1, None], v[:, :, None, j0:j1], out=np.empty((B, Hkv, G, j1 - j0, dk), dtype))
        if j0:
            terms[..., 0, :] += z                        # the keys before, then this chunk's first
        z = np.add.accumulate(terms, axis=-2)[..., -1, :]                                  # (B, Hkv, G, d_k)
    return z


def scaled_dot_product_attention(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, bias: np.ndarray | None = None,
    *, keep_scores: bool = False, scale: float | None = None, cap: float | None = None,
    sink: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """Attention(Q, K, V) = softmax(Q·Kᵀ/√d_k + M)·V  (guide: scores to weighted-sum).

    Returns (Z, A, S): the output (B, H, n, d_k), the weights A (B, H, n, m) whose rows
    sum to 1 (or are 0 where every key is masked), and the scaled, masked scores S
    (only with keep_scores: otherwise softmax overwrites them to save memory). scale: see
    `attention_scores`, cap: its soft-cap. sink: (H,) each head's sink logit (gpt-oss), one more term of
    the softmax with no value (ops.softmax_sink_): A's rows then sum to less than 1; None: none.
    """
    s = attention_scores(q, k, scale, cap)               # ①② (B, H, n, m)
    if bias is not None:
        s += bias                                        # M: -∞ on masked keys
    a = softmax_of(s.copy() if keep_scores else s, sink)   # ③ (B, H, n, m)
    z = attend(a, v)                                     # ④ (B, H, n, d_k)
    return z, a, (s if keep_scores else None)


def softmax_of(s: np.ndarray, sink: np.ndarray | None = None) -> np.ndarray:
    """A = softmax(S) in place over the last axis, S (B, H, n, m); with SINK (H,), each head's sink logit in the
    sum too (ops.softmax_sink_; rows then sum to less than 1)."""
    return softmax_(s) if sink is None else softmax_sink_(s, sink)


def sink_backward(dZ: np.ndarray, Z: np.ndarray, A: np.ndarray) -> np.ndarray:
    """d s_h of the sink logits (H,) given dZ, Z (B, H, n, d_k) and A (B, H, n, m): the sink has no value, so

        d s_h = Σ_{b,i} −p_sink · rowsum(dA ⊙ A) = −Σ_{b,i} (1 − Σ_j A_ij)·(dZ_i · Z_i)

    (rowsum(dA ⊙ A) = Σ_j A_ij dZ_i·V_j = dZ_i·Z_i); Q, K, V's gradients are `attention_backward`'s, unchanged:
    softmax_backward of A without the sink's column is the sink softmax's own on the key columns."""
    share = 1.0 - A.sum(axis=-1, dtype=np.float64)                       # (B, H, n) the sink's share
    rows = np.einsum("bhnd,bhnd->bhn", dZ, Z, dtype=np.float64)          # (B, H, n)
    return (-(share * rows).sum(axis=(0, 2))).astype(dZ.dtype)          # (H,)


def attention_backward(dZ: np.ndarray, q: np.ndarray, k: np.ndarray, v: np.ndarray, A: np.ndarray,
                       scale: float | None = None, cap: float | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(dQ, dK, dV) of Z = A·V, A = softmax(S), S = Q·Kᵀ/√d_k + M, given dZ (guide: scores to weighted-sum, backwards).

        dV = Aᵀ·dZ            dA = dZ·Vᵀ
        dS = A ⊙ (dA − rowsum(dA ⊙ A))                 (softmax_backward; masked keys: A = 0 → dS = 0)
        dQ = dS·K / √d_k      dK = dSᵀ·Q / √d_k

    q, dZ: (B, H, n, d_k); k, v: (B, Hkv, m, d_k); A: (B, H, n, m). A K/V head shared by G = H/Hkv
    query heads (GQA/MQA) gets the sum of their gradients: the group is folded into the rows of
    each product, as in the forward, so the sum is the matrix product's own. scale: what the
    forward multiplied Q·Kᵀ by (None: 1/√d_k). cap: the forward's soft-cap S = c·tanh(S₀/c), whose
    backward dS₀ = dS ⊙ (1 − tanh²(S₀/c)) reads S₀ recomputed from q, k (nothing more kept).
    """
    B, H, n, dk = q.shape
    Hkv, m = k.shape[1], k.shape[2]
    G = H // Hkv
    Ag = A.reshape(B, Hkv, G * n, m)                     # (B, Hkv, G·n, m)
    dZg = dZ.reshape(B, Hkv, G * n, dZ.shape[-1])        # (B, Hkv, G·n, d_v) (MLA's d_v ≠ d_k)
    dV = np.matmul(Ag.swapaxes(-1, -2), dZg)             # (B, Hkv, m, d_k)
    dA = np.matmul(dZg, v.swapaxes(-1, -2))              # (B, Hkv, G·n, m)
    dS = softmax_backward(dA, Ag)                        # (B, Hkv, G·n, m)
    if cap is not None:                                  # through S = c·tanh(S₀/c): dS₀ = dS ⊙ (1 − tanh²)
        th = np.tanh(attention_scores(q, k, scale).reshape(B, Hkv, G * n, m) / cap)   # (B, Hkv, G·n, m)
        dS *= 1 - th * th
    dS *= 1.0 / math.sqrt(dk) if scale is None else scale
    dQ = np.matmul(dS, k).reshape(B, H, n, dk)           # (B, H, n, d_k)
    dK = np.matmul(dS.swapaxes(-1, -2), q.reshape(B, Hkv, G * n, dk))   # (B, Hkv, m, d_k)
    return dQ, dK, dV


# ── choosing how to compute it ─────────────────────────────────────────────────

# From this many scores per head (n · m), the output is computed by tiles with an online
# softmax (kernels.py) unless someone asked to see the weights: the n × m matrix then
# never exists. Measured in docs/benchmarks.md ("Attention at length"): tiled is faster
# than plain from n = 512, causal or not (12 heads, d_k 64).
TILED_MIN_SCORES = 512 * 512


@dataclass
class AttentionMask:
    """What is added to the scores S before softmax, described rather than built: which keys each
    query may see (causal, window, padding: M, 0 or -∞) and a position bias B (T5's relative bias,
    ALiBi's slope × key position).

    n queries are the last n of m keys. Building the (B, 1, n, m) mask costs as much memory
    as the scores themselves, so it is only built where the plain path needs it. This is the one
    place the rule of masks.visible becomes a mask of a pass (the tiled kernels build theirs per
    block from the same fields).
    """

    n: int
    m: int
    causal: bool
    window: int | None = None                   # sliding window: i − j < w (causal), |i − j| < w (an encoder's)
    key_mask: np.ndarray | None = None          # (B, m) False on padding keys; None = no padding
    position_bias: np.ndarray | None = None     # (B|1, H|1, n|1, m) added to S (T5; ALiBi: one row); None = none
    chunk: int | None = None                    # Llama 4's chunked layers: ⌊i / C⌋ = ⌊j / C⌋ too (masks.same_chunk)
    _bias: dict = field(default_factory=dict, repr=False, compare=False)

    def allowed(self, q0: int = 0, q1: int | None = None) -> np.ndarray | None:
        """True where query rows q0..q1 may see each key: (B or 1, 1, q1 - q0, m); None = everywhere."""
        q1 = self.n if q1 is None else q1
        ok = None
        if self.causal or self.window:
            offset = self.m - self.n                                    # absolute position of query 0
            ok = visible(np.arange(q0, q1) + offset, np.arange(self.m), self.causal, self.window)[None, None]
        if self.chunk is not None:                                      # counted from each row's first real token
            lead = np.zeros(1, int) if self.key_mask is None else np.argmax(self.key_mask, axis=1)   # (B,) or (1,)
            keys = np.arange(self.m) - lead[:, None]                    # (B, m)
            rows = keys[:, self.m - self.n + q0:self.m - self.n + q1]   # (B, q1 − q0) the queries' positions
            chunked = same_chunk(rows, keys, self.chunk)[:, None]       # (B, 1, q1 − q0, m)
            ok = chunked if ok is None else ok & chunked
        if self.key_mask is not None:
            pad = self.key_mask[:, None, None, :]                       # (B, 1, 1, m)
            ok = pad if ok is None else ok & pad
        return ok

    def bias(self, dtype=np.float32) -> np.ndarray | None:
        """What S gets added: B + M (M: 0 where allowed, -∞ elsewhere); None when nothing is.

        Built once and shared by every layer of a forward pass.
        """
        key = np.dtype(dtype)
        if key not in self._bias:
            ok = self.allowed()
            m = None if ok is None else mask_bias(ok, dtype)
            b = None if self.position_bias is None else self.position_bias.astype(dtype, copy=False)
            self._bias[key] = b if m is None else (m if b is None else b + m)
        return self._bias[key]

    @property
    def key_bias(self) -> np.ndarray | None:
        """The position bias when it is one row for every query (ALiBi): (B|1, H, m), what the tiled
        kernels take; None otherwise."""
        pb = self.position_bias
        return None if pb is None or pb.shape[2] != 1 else pb[:, :, 0]

    def plain_only(self, cap: float | None = None) -> bool:
        """Whether attention must be computed the plain way: a position bias that varies with the query (T5)
        or a soft-cap (Gemma 2), which the tiled kernels do not take (they take any scale: Granite's, Gemma's,
        T5's 1, and ALiBi's one row per key through key_bias), or an encoder's window reaching both ways
        (ModernBERT's local layers; the kernels' windows reach back), or an encoder's chunks (a causal layer's,
        Llama 4's, the kernels take)."""
        return ((self.position_bias is not None and self.key_bias is None) or cap is not None
                or (self.window is not None and not self.causal) or (self.chunk is not None and not self.causal))


def attention_output(q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: AttentionMask,
                     scale: float | None = None, cap: float | None = None, *,
                     sink: np.ndarray | None = None) -> np.ndarray:
    """Z = softmax(Q·Kᵀ/√d_k + M)·V by the cheapest exact route: plain for short inputs, tiled for long.
    sink: (H,) each head's sink logit (gpt-oss), or None. An encoder's window reaching both ways (Longformer's,
    ModernBERT's local layers) on a long unpadded input runs sparse.sparse_attention, which skips the tiles the band
    hides."""
    if (q.shape[2] * k.shape[2] >= TILED_MIN_SCORES and mask.window is not None and not mask.causal
            and mask.key_mask is None and mask.position_bias is None and mask.chunk is None and scale is None
            and cap is None and sink is None):                # plain form: the last line, with mask.bias's band
        return sparse_attention(q, k, v, sliding_window(mask.window, causal=False))[0]
    if q.shape[2] * k.shape[2] >= TILED_MIN_SCORES and not mask.plain_only(cap):
        return tiled_attention(q, k, v, causal=mask.causal, window=mask.window, key_mask=mask.key_mask, scale=scale,
                               key_bias=mask.key_bias, sink=sink, chunk=mask.chunk)
    if mask.causal and q.shape[2] > CAUSAL_BLOCK:
        return causal_attention(q, k, v, mask, scale=scale, cap=cap, sink=sink)
    z, _, _ = scaled_dot_product_attention(q, k, v, mask.bias(q.dtype), scale=scale, cap=cap, sink=sink)
    return z


# Query rows per block of `causal_attention` (causal inputs shorter than the tiled path's).
# Measured on GPT-2-small's attention (12 heads, d_k 64) on an idle machine: at n = 512 one
# call takes 9.4 ms in blocks of 64 rows (9.6 ms in blocks of 128) against 14.1 ms plain; at
# n = 256 the whole forward pass takes 522 ms against 552 ms; at n = 128 they tie.
CAUSAL_BLOCK = 64


def causal_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: AttentionMask,
                     block_size: int = CAUSAL_BLOCK, scale: float | None = None, cap: float | None = None, *,
                     sink: np.ndarray | None = None) -> np.ndarray:
    """Causal softmax(Q·Kᵀ/√d_k + M)·V, a block of query rows at a time, each with the keys it can see.

    Plain form: scaled_dot_product_attention(q, k, v, mask.bias(q.dtype))[0]. Query i sits at
    position m - n + i and sees no later key, so rows q0..q1 need only the first m - n + q1
    keys: the upper triangle of S (about half of it), all -inf, is never computed.
    """
    n, m = q.shape[2], k.shape[2]
    bias = mask.bias(q.dtype)                            # (B or 1, 1, n, m)
    z = np.empty(q.shape[:3] + v.shape[3:], q.dtype)    # (B, H, n, d_v): V's width (MLA's differs from d_k)
    for q0 in range(0, n, block_size):
        q1 = min(n, q0 + block_size)
        seen = m - n + q1                                # keys 0..seen-1 are visible to some row
        z[:, :, q0:q1], _, _ = scaled_dot_product_attention(
            q[:, :, q0:q1], k[:, :, :seen], v[:, :, :seen], bias[:, :, q0:q1, :seen], scale=scale, cap=cap, sink=sink)
    return z


def _block_scores(qh: np.ndarray, kh: np.ndarray, mask: AttentionMask, hs: np.ndarray, q0: int, q1: int,
                  scale: float | None, cap: float | None) -> np.ndarray:
    """S of query rows q0..q1 for heads HS: Q·Kᵀ·scale, soft-capped, + position bias, masked (B, h, q1 − q0, m)."""
    dk = qh.shape[-1]
    s = np.matmul(qh[:, :, q0:q1], kh.swapaxes(-1, -2))                # (B, h, q1 − q0, m)
    s *= 1.0 / math.sqrt(dk) if scale is None else scale
    if cap is not None:
        soft_cap_(s, cap)
    if mask.position_bias is not None:
        pb = mask.position_bias
        rows = slice(q0, q1) if pb.shape[2] > 1 else slice(None)         # ALiBi: one row for every query
        s += pb[:, hs if pb.shape[1] > 1 else slice(None), rows]
    ok = mask.allowed(q0, q1)
    return s if ok is None else np.where(ok, s, -np.inf)


def attention_weights(q: np.ndarray, k: np.ndarray, mask: AttentionMask, heads: list[int],
                      block_size: int = 256, scale: float | None = None, cap: float | None = None, *,
                      sink: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(A, S) for some heads only, computed by blocks of query rows: (B, h, n, m) each.

    For looking at a long input: memory grows with the heads asked for, not with all H. sink: (H,) every
    head's sink logit (gpt-oss), or None.
    """
    B, H, n, dk = q.shape
    G = H // k.shape[1]
    hs = np.asarray(heads)
    qh, kh = q[:, hs], k[:, hs // G]                                    # (B, h, n, d_k), (B, h, m, d_k)
    s = np.empty((B, len(hs), n, k.shape[2]), dtype=q.dtype)           # (B, h, n, m)
    for q0 in range(0, n, block_size):
        q1 = min(n, q0 + block_size)
        s[:, :, q0:q1] = _block_scores(qh, kh, mask, hs, q0, q1, scale, cap)
    return softmax_of(s.copy(), None if sink is None else sink[hs]), s


@dataclass
class TopAttention:
    """Each query row's K largest attention weights, exact, and the rest of the row: what a view of a long
    input keeps (L·H·n·K numbers instead of L·H·n²). Rows are queries, as in A.

        index   (..., H, n, K) int32   the keys, largest weight first (ties: the lower key first)
        weight  (..., H, n, K) float32 A[h, i, index] — the weights themselves, not rounded
        rest    (..., H, n)    float32 Σ of the row's other weights, Σ_j A − Σ kept (≥ 0; 0 for a masked row)
        keys    m, the row's length
    """

    index: np.ndarray
    weight: np.ndarray
    rest: np.ndarray
    keys: int

    def __getitem__(self, row) -> "TopAttention":
        """Batch row ROW (a recorder's store holds a batch)."""
        return TopAttention(self.index[row], self.weight[row], self.rest[row], self.keys)

    @property
    def k(self) -> int:
        return self.index.shape[-1]

    def dense(self) -> np.ndarray:
        """(..., H, n, m): the kept weights in place, 0 elsewhere (equal to A when K = m)."""
        out = np.zeros(self.index.shape[:-1] + (self.keys,), dtype=self.weight.dtype)
        np.put_along_axis(out, self.index.astype(np.intp), self.weight, axis=-1)
        return out


def top_of(a: np.ndarray, top: int) -> TopAttention:
    """The K = min(top, m) largest weights of each row of A (..., n, m), largest first, and the rest."""
    m = a.shape[-1]
    K = min(int(top), m)
    part = np.argpartition(-a, K - 1, axis=-1)[..., :K] if K < m else np.broadcast_to(np.arange(m), a.shape).copy()
    w = np.take_along_axis(a, part, axis=-1)                              # (..., n, K) unordered
    order = np.lexsort((part, -w), axis=-1)                               # by weight, then by key
    index = np.take_along_axis(part, order, axis=-1).astype(np.int32)
    weight = np.take_along_axis(w, order, axis=-1).astype(np.float32)
    rest = np.maximum(a.sum(axis=-1, dtype=np.float64) - weight.sum(axis=-1, dtype=np.float64), 0).astype(np.float32)
    return TopAttention(index, weight, rest, m)


def attention_top(q: np.ndarray, k: np.ndarray, mask: AttentionMask, top: int, block_size: int = 256,
                  scale: float | None = None, cap: float | None = None, *, sink: np.ndarray | None = None
                  ) -> TopAttention:
    """Every head's TOP largest weights per query row, by blocks of query rows (a block's A of all heads
    at a time, (B, H, block, m)): what a long input's views keep, without L·H·n² numbers in memory."""
    B, H, n, dk = q.shape
    G = H // k.shape[1]
    hs = np.arange(H)
    kh = k[:, hs // G]                                                    # (B, H, m, d_k)
    K = min(int(top), k.shape[2])
    index = np.empty((B, H, n, K), np.int32)
    weight = np.empty((B, H, n, K), np.float32)
    rest = np.empty((B, H, n), np.float32)
    for q0 in range(0, n, block_size):
        q1 = min(n, q0 + block_size)
        t = top_of(softmax_of(_block_scores(q, kh, mask, hs, q0, q1, scale, cap), sink), K)   # (B, H, q1 − q0, K)
        index[:, :, q0:q1], weight[:, :, q0:q1], rest[:, :, q0:q1] = t.index, t.weight, t.rest
    return TopAttention(index, weight, rest, k.shape[2])
