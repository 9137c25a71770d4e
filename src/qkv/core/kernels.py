"""Attention at length (guide: flash): the same softmax(QKᵀ/√d_k)·V without the n × n matrix.

Plain attention holds S (B, H, n, m): at n = 8192 and 12 heads that is 3 GB of float32.
The kernels here hold one block of scores at a time:

  tiled_attention           exact; FlashAttention's online softmax: for each block of keys,
                            keep a running row max M, a running sum ℓ of exp(S - M), and a
                            running output; rescale them by exp(M_old - M_new) as M grows.
  sliding_window_attention  exact local attention (Mistral): only the key blocks that the
                            window reaches are visited, O(n · window) time and memory.
  linear_attention          Katharopoulos et al. 2020: softmax(QKᵀ) replaced by φ(Q)φ(K)ᵀ with
                            φ(x) = elu(x) + 1, so (φ(Q)φ(K)ᵀ)V = φ(Q)(φ(K)ᵀV): O(n·d²), not O(n²·d).

Shapes: q (B, H, n, d), k and v (B, Hkv, m, d) with H a multiple of Hkv (GQA/MQA: query
head h reads K/V head h // (H/Hkv), never copied). With m > n the queries are the last n
positions (cached decoding). float32 in, float32 out.
"""

from __future__ import annotations

import math

import numpy as np

from .masks import same_chunk, visible
from ..runtime.threads import parallel_map
from ..runtime.tuning import choices

# Rows of queries and of keys per block of tiled attention when the machine's own measurement
# is not used (qkv.runtime.tuning measures them where qkv runs, with the worker threads): big enough that
# each matmul runs near BLAS speed, small enough that a block of scores (H · Q_BLOCK · K_BLOCK
# floats, 3 MB for 12 heads) stays in the cache. Of {32, 64, 128, 256, 512} × {256, 512, 1024}
# at n = 4096 (12 heads, d 64, 2-core AVX2, both cores busy), 128 × 512 and 64 × 512 were
# fastest; 256 × 512 was 8–10 % slower, 32 × 1024 20 %.
Q_BLOCK, K_BLOCK = 128, 512


def _grouped(q: np.ndarray, Hkv: int) -> np.ndarray:
    """(B, H, n, d) → (B, Hkv, G, n, d): the query heads that share each K/V head."""
    B, H, n, d = q.shape
    return q.reshape(B, Hkv, H // Hkv, n, d)


def tiled_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, *, causal: bool = False,
                    block_size: int | None = None, window: int | None = None,
                    key_mask: np.ndarray | None = None, scale: float | None = None,
                    key_bias: np.ndarray | None = None, softcap: float | None = None,
                    sink: np.ndarray | None = None, chunk: int | None = None) -> np.ndarray:
    """Exact softmax(Q·Kᵀ/√d + M)·V by blocks, holding O(block²) scores per head (scale: Q·Kᵀ·scale
    instead of /√d, ModelConfig.score_scale; None: 1/√d; softcap c: S = c·tanh(S/c) before the mask, Gemma 2's
    attn_logit_softcapping, as FlashAttention-2 does it).

    causal: query i (at position m - n + i) sees keys j ≤ its position; window: it also
    sees only the last `window` positions (itself included); key_mask (B, m): False for
    padding keys; key_bias (B|1, H, m): added to every query's score of key j (ALiBi's m_h·p_j); sink (H,): each
    head's sink logit (gpt-oss), one more term of every row's softmax with no value: it starts the online
    softmax (M = s_h, ℓ = 1, acc = 0), so a row's weights sum to less than 1 (ops.softmax_sink_); chunk C (Llama 4's
    chunked layers, causal): a query sees only the keys of its own chunk of C positions, counted from its row's first
    real key (masks.same_chunk), and only the key blocks its chunks reach are visited.
    A query that sees no key gets zeros. block_size: rows of queries and
    of keys per block (default: measured on this machine, qkv.runtime.tuning). Query blocks are
    independent: they run in parallel on the worker threads qkv.runtime.tuning chose (threads.parallel_map).

    Plain form it equals:  softmax(q @ kᵀ / √d + mask) @ v   (see `attention.scaled_dot_product_attention`).
    """
    B, H, n, d = q.shape
    Hkv = k.shape[1]
    tuned = choices()
    bq, bk = (block_size, block_size) if block_size else (tuned.q_block, tuned.k_block)
    qg = _grouped(q, Hkv)                                         # (B, Hkv, G, n, d)
    d_v = v.shape[-1]                                             # V's width (MLA's differs from d)
    out = np.empty(qg.shape[:4] + (d_v,), qg.dtype)               # (B, Hkv, G, n, d_v)
    kb = None if key_bias is None else key_bias.astype(q.dtype, copy=False).reshape(
        key_bias.shape[0], Hkv, H // Hkv, 1, key_bias.shape[-1])   # (B|1, Hkv, G, 1, m)
    starts = range(0, n, bq)
    lead = None if chunk is None else (np.zeros(1, int) if key_mask is None else np.argmax(key_mask, axis=1))   # (B,)
    if causal or window:                                          # later blocks see more keys:
        starts = reversed(starts)                                 # start them first (load balance)
    s = 1.0 / math.sqrt(d) if scale is None else scale
    parallel_map(lambda q0: _query_block(qg, k, v, out, q0, min(n, q0 + bq), bk, causal, window, key_mask, s, kb,
                                         softcap, sink, chunk, lead), starts, workers=tuned.attention)
    return out.reshape(B, H, n, d_v)


def _query_block(qg: np.ndarray, k: np.ndarray, v: np.ndarray, out: np.ndarray, q0: int, q1: int, bk: int,
                 causal: bool, window: int | None, key_mask: np.ndarray | None, scale: float,
                 key_bias: np.ndarray | None = None, softcap: float | None = None,
                 sink: np.ndarray | None = None, chunk: int | None = None, lead: np.ndarray | None = None) -> None:
    """out[..., q0:q1, :] = attention of query rows q0..q1 over their keys, block by block.

    The online softmax: for each key block, M_new = max(M, rowmax S), P = exp(S - M_new),
    ℓ = ℓ·exp(M - M_new) + rowsum P, acc = acc·exp(M - M_new) + P·V; finally acc / ℓ.
    """
    B, Hkv, G, n, d = qg.shape
    m, rows = k.shape[2], G * (q1 - q0)
    offset = m - n                                                # absolute position of query 0
    qb = (qg[:, :, :, q0:q1] * scale).reshape(B, Hkv, rows, d)   # (B, Hkv, G·bq, d) pre-scaled (1/√d)
    kt = k.transpose(0, 1, 3, 2)                                  # (B, Hkv, d, m) a view
    pos = offset + np.arange(q0, q1)                              # (bq,) absolute query positions
    k_end = min(m, offset + q1) if causal or window else m        # the keys this block can see at all
    k_start = max(0, offset + q0 - window + 1) if window else 0
    if chunk is not None:                                         # the first key of the earliest chunk a row is in
        k_start = max(k_start, int(np.min((offset + q0 - lead) // chunk * chunk + lead)))
    row_max = np.full((B, Hkv, rows, 1), -np.inf, dtype=qg.dtype)
    row_sum = np.zeros((B, Hkv, rows, 1), dtype=qg.dtype)
    d_v = v.shape[-1]
    acc = np.zeros((B, Hkv, rows, d_v), dtype=qg.dtype)
    if sink is not None:                                          # the sink's term first: M = s_h, ℓ = exp(0) = 1
        s_h = np.repeat(sink.astype(qg.dtype).reshape(Hkv, G), q1 - q0, axis=1)   # (Hkv, G·bq) row r = g·bq + i
        row_max = np.ascontiguousarray(np.broadcast_to(s_h[None, :, :, None], row_max.shape))
        row_sum += 1
    s_buf = np.empty(B * Hkv * rows * bk, dtype=qg.dtype)          # scores, reused by every key block
    pv = np.empty((B, Hkv, rows, d_v), dtype=qg.dtype)
    for k0 in range(k_start - k_start % bk, k_end, bk):
        k0, k1 = max(k0, k_start), min(k0 + bk, k_end)
        s = s_buf[:B * Hkv * rows * (k1 - k0)].reshape(B, Hkv, rows, k1 - k0)   # (B, Hkv, G·bq, bk) contiguous
        np.matmul(qb, kt[:, :, :, k0:k1], out=s)                  # S = Q·Kᵀ/√d of this block
        if softcap is not None:                                   # S = c·tanh(S/c), before the mask
            np.multiply(np.tanh(s / softcap, out=s), softcap, out=s)
        bias = _block_bias(pos, k0, k1, causal, window, key_mask, qg.dtype, chunk, lead)
        if bias is not None:                                      # only blocks that cross the mask's edge:
            s5 = s.reshape(B, Hkv, G, q1 - q0, k1 - k0)           # S + M, in place (grouped layout)
            s5 += bias
        if key_bias is not None:                                  # + m_h·p_j (ALiBi), one row for all queries
            s5 = s.reshape(B, Hkv, G, q1 - q0, k1 - k0)
            s5 += key_bias[..., k0:k1]
        new_max = np.maximum(row_max, s.max(axis=-1, keepdims=True))
        safe_max = np.where(np.isfinite(new_max), new_max, 0).astype(qg.dtype, copy=False)
        np.subtract(s, safe_max, out=s)
        np.exp(s, out=s)                                          # P = exp(S - M_new)
        rescale = np.exp(row_max - safe_max)                      # exp(M_old - M_new) ≤ 1
        row_sum *= rescale
        row_sum += s.sum(axis=-1, keepdims=True)
        acc *= rescale
        acc += np.matmul(s, v[:, :, k0:k1], out=pv)               # + P·V_block
        row_max = new_max
    np.divide(acc, row_sum, out=acc, where=row_sum > 0)
    acc[np.broadcast_to(row_sum == 0, acc.shape)] = 0             # saw no key: zeros
    out[:, :, :, q0:q1] = acc.reshape(B, Hkv, G, q1 - q0, d_v)


def _block_bias(q_pos: np.ndarray, k0: int, k1: int, causal: bool, window: int | None,
                key_mask: np.ndarray | None, dtype, chunk: int | None = None,
                lead: np.ndarray | None = None) -> np.ndarray | None:
    """The additive mask M of one block (0 or -∞), broadcastable to (B, Hkv, G, bq, bk);
    None when the block is entirely visible (most blocks: nothing to do). chunk, lead (B,): Llama 4's chunks, each
    row's counted from its first real key."""
    allowed = _block_mask(q_pos, np.arange(k0, k1), causal, window)         # (bq, bk) or None
    if chunk is not None:
        k_pos = np.arange(k0, k1)
        same = same_chunk(q_pos - lead[:, None], k_pos - lead[:, None], chunk)[:, None, None]   # (B, 1, 1, bq, bk)
        if not same.all():
            allowed = same if allowed is None else allowed & same
    if key_mask is not None and not key_mask[:, k0:k1].all():
        km = key_mask[:, None, None, None, k0:k1]                 # (B, 1, 1, 1, bk)
        allowed = km if allowed is None else (allowed & km)
    return None if allowed is None else np.where(allowed, 0.0, -np.inf).astype(dtype)


def _block_mask(q_pos: np.ndarray, k_pos: np.ndarray, causal: bool, window: int | None) -> np.ndarray | None:
    """Which (query, key) pairs of a block may attend (masks.visible); None when all may (no work to do)."""
    if (causal or window) and q_pos[0] >= k_pos[-1] and (not window or q_pos[-1] - k_pos[0] < window):
        return None                                               # block entirely visible
    return visible(q_pos, k_pos, causal, window)                  # (bq, bk) or None


def sliding_window_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, *, window: int,
                             block_size: int | None = None) -> np.ndarray:
    """Causal local attention: each position sees the last `window` positions, itself included.

    Exact; visits only the key blocks the window reaches: O(n · window) time and memory.
    """
    if window < 1:
        raise ValueError(f"window must be ≥ 1, got {window}")
    bs = block_size or max(64, min(512, window))
    return tiled_attention(q, k, v, causal=True, window=window, block_size=bs)


def elu_feature_map(x: np.ndarray) -> np.ndarray:
    """φ(x) = elu(x) + 1 = x + 1 for x > 0, eˣ otherwise: positive, so φ(q)·φ(k) > 0."""
    return np.where(x > 0, x + 1, np.exp(np.minimum(x, 0))).astype(x.dtype, copy=False)


def linear_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, *, causal: bool = True,
                     chunk_size: int = 128) -> np.ndarray:
    """Linear attention (Katharopoulos et al. 2020):  out_i = φ(q_i)ᵀ Σ_j φ(k_j) v_jᵀ / φ(q_i)ᵀ Σ_j φ(k_j).

    Non-causal: the sums run over all j, computed once: O(n·d²). Causal: over j ≤ i, as
    running sums carried from chunk to chunk (within a chunk, the small c × c masked
    product): O(n·c·d + n·d²) time, O(d²) state per head. No 1/√d: the feature map
    replaces the softmax's scaling, as in the paper.
    """
    B, H, n, d = q.shape
    Hkv, m = k.shape[1], k.shape[2]
    G = H // Hkv
    fq = _grouped(elu_feature_map(q), Hkv)                         # (B, Hkv, G, n, d)
    fk = elu_feature_map(k)[:, :, None]                            # (B, Hkv, 1, m, d)
    vv = v[:, :, None]                                             # (B, Hkv, 1, m, d_v)
    if not causal:
        kv = np.matmul(fk.swapaxes(-1, -2), vv)                    # (B, Hkv, 1, d, d_v) Σ φ(k_j) v_jᵀ
        z = fk.sum(axis=-2, keepdims=True)                         # (B, Hkv, 1, 1, d)   Σ φ(k_j)
        num = np.matmul(fq, kv)                                    # (B, Hkv, G, n, d_v)
        den = np.matmul(fq, z.swapaxes(-1, -2))                    # (B, Hkv, G, n, 1)
        return (num / den).reshape(B, H, n, -1).astype(q.dtype, copy=False)
    offset = m - n
    state = np.zeros((B, Hkv, 1, d, v.shape[-1]), dtype=np.float64)   # Σ φ(k_j) v_jᵀ over past chunks
    norm = np.zeros((B, Hkv, 1, 1, d), dtype=np.float64)               # Σ φ(k_j) over past chunks
    out = np.empty((B, Hkv, G, n, v.shape[-1]), dtype=q.dtype)
    if offset:                                                     # keys before the first query
        state += np.matmul(fk[..., :offset, :].swapaxes(-1, -2), vv[..., :offset, :])
        norm += fk[..., :offset, :].sum(axis=-2, keepdims=True)
    for c0 in range(0, n, chunk_size):
        c1 = min(n, c0 + chunk_size)
        qc = fq[..., c0:c1, :]                                     # (B, Hkv, G, c, d)
        kc, vc = fk[..., offset + c0:offset + c1, :], vv[..., offset + c0:offset + c1, :]
        tri = visible(np.arange(c0, c1), np.arange(c0, c1), causal=True).astype(q.dtype)   # j ≤ i inside the chunk
        qk = np.matmul(qc, kc.swapaxes(-1, -2)) * tri              # (B, Hkv, G, c, c) φ(q_i)·φ(k_j)
        num = np.matmul(qc, state) + np.matmul(qk, vc)             # past chunks + this chunk
        den = np.matmul(qc, norm.swapaxes(-1, -2)) + qk.sum(axis=-1, keepdims=True)
        out[..., c0:c1, :] = num / den
        state += np.matmul(kc.swapaxes(-1, -2), vc)
        norm += kc.sum(axis=-2, keepdims=True)
    return out.reshape(B, H, n, -1)


def compare_to_softmax(q: np.ndarray, k: np.ndarray, v: np.ndarray, *, causal: bool = True) -> dict[str, np.ndarray]:
    """How far linear attention is from softmax attention on the same q, k, v, per head.

    Returns per head (H,): the relative error ‖lin - soft‖ / ‖soft‖ of the outputs and their
    mean cosine similarity over positions. Use it on real activations (a Trace's q, k, v).
    """
    soft = tiled_attention(q, k, v, causal=causal)
    lin = linear_attention(q, k, v, causal=causal)
    diff = np.linalg.norm((lin - soft).astype(np.float64), axis=(-2, -1))
    rel = diff / np.linalg.norm(soft.astype(np.float64), axis=(-2, -1))
    cos = np.sum(lin * soft, axis=-1) / (np.linalg.norm(lin, axis=-1) * np.linalg.norm(soft, axis=-1) + 1e-30)
    return {"relative_error": rel.mean(axis=0), "cosine": cos.mean(axis=(0, 2))}
