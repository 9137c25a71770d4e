"""attention: masks, heads, and softmax(QKᵀ/√d_k)·V against a loop over heads in float64."""

from __future__ import annotations

import math

import numpy as np
import pytest

from qkv.core import attention as A


def naive_attention(q, k, v, allowed=None):
    """The guide's four steps (guide: scores to weighted-sum), one head and one row at a time, in float64."""
    B, H, n, dk = q.shape
    Hkv, m = k.shape[1], k.shape[2]
    z = np.zeros((B, H, n, dk))
    w = np.zeros((B, H, n, m))
    for b in range(B):
        for h in range(H):
            kv = h // (H // Hkv)                                   # GQA: shared K/V head
            for i in range(n):
                s = np.array([q[b, h, i] @ k[b, kv, j] / math.sqrt(dk) for j in range(m)])
                ok = np.ones(m, bool) if allowed is None else np.broadcast_to(allowed, (B, H, n, m))[b, h, i]
                if not ok.any():
                    continue
                e = np.where(ok, np.exp(s - s[ok].max()), 0.0)
                w[b, h, i] = e / e.sum()
                z[b, h, i] = w[b, h, i] @ v[b, kv]
    return z, w


@pytest.mark.parametrize("H,Hkv", [(4, 4), (4, 2), (6, 1)])
@pytest.mark.parametrize("causal", [False, True])
def test_sdpa_equals_the_loop(H, Hkv, causal):
    rng = np.random.default_rng(H * 10 + Hkv)
    B, n, dk = 2, 7, 8
    q = rng.standard_normal((B, H, n, dk)).astype(np.float32)
    k = rng.standard_normal((B, Hkv, n, dk)).astype(np.float32)
    v = rng.standard_normal((B, Hkv, n, dk)).astype(np.float32)
    allowed = A.causal_mask(n)[None, None] if causal else None
    bias = None if allowed is None else A.mask_bias(allowed)
    z, w, s = A.scaled_dot_product_attention(q, k, v, bias, keep_scores=True)
    zr, wr = naive_attention(q, k, v, allowed)
    assert z.dtype == w.dtype == np.float32
    np.testing.assert_allclose(w, wr, atol=1e-6)
    np.testing.assert_allclose(z, zr, atol=1e-5)
    raw = np.einsum("bhnd,bhmd->bhnm", q.astype(np.float64), np.repeat(k, H // Hkv, axis=1)) / math.sqrt(dk)
    if causal:
        raw = np.where(allowed, raw, -np.inf)
    np.testing.assert_allclose(s, raw, atol=1e-5)                  # S kept before softmax, masked = -inf
    if causal:
        assert (w[..., np.triu_indices(n, 1)[0], np.triu_indices(n, 1)[1]] == 0).all()


def test_gqa_equals_plain_attention_with_repeated_kv():
    rng = np.random.default_rng(0)
    q = rng.standard_normal((1, 8, 5, 4)).astype(np.float32)
    k = rng.standard_normal((1, 2, 5, 4)).astype(np.float32)
    v = rng.standard_normal((1, 2, 5, 4)).astype(np.float32)
    z, w, _ = A.scaled_dot_product_attention(q, k, v)
    z2, w2, _ = A.scaled_dot_product_attention(q, np.repeat(k, 4, axis=1), np.repeat(v, 4, axis=1))
    np.testing.assert_allclose(z, z2, atol=1e-6)
    np.testing.assert_allclose(w, w2, atol=1e-7)


def test_guides_three_token_example():
    """Z_1 = 0.7·v1 + 0.2·v2 + 0.1·v3 (guide: weighted-sum): attend() mixes values by the weights."""
    a = np.array([[[[0.7, 0.2, 0.1], [0.1, 0.8, 0.1], [0.2, 0.3, 0.5]]]], dtype=np.float32)
    v = np.eye(3, dtype=np.float32)[None, None]
    np.testing.assert_allclose(A.attend(a, v)[0, 0], a[0, 0])


def test_masks():
    assert A.causal_mask(3).tolist() == [[1, 0, 0], [1, 1, 0], [1, 1, 1]]
    # two new queries after three cached keys: they sit at positions 3 and 4
    assert A.causal_mask(2, 5).tolist() == [[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]]
    assert A.sliding_window_mask(4, 2).tolist() == [[1, 0, 0, 0], [1, 1, 0, 0], [0, 1, 1, 0], [0, 0, 1, 1]]
    assert A.padding_mask(np.array([[1, 1, 0]])).shape == (1, 1, 1, 3)


def test_fully_masked_rows_give_zero_weights_and_outputs():
    rng = np.random.default_rng(3)
    q, k, v = rng.standard_normal((3, 1, 2, 3, 4)).astype(np.float32)
    allowed = np.array([[True, False, False], [False, False, False], [True, True, True]])[None, None]
    z, w, _ = A.scaled_dot_product_attention(q, k, v, A.mask_bias(allowed))
    assert np.isfinite(w).all() and np.isfinite(z).all()
    assert (w[:, :, 1] == 0).all() and (z[:, :, 1] == 0).all()
    np.testing.assert_allclose(w[:, :, 0, 0], 1.0)


def test_split_and_merge_heads_are_inverse():
    x = np.arange(2 * 3 * 12, dtype=np.float32).reshape(2, 3, 12)
    h = A.split_heads(x, 4)
    assert h.shape == (2, 4, 3, 3)
    assert (h[1, 2, 0] == x[1, 0, 6:9]).all()                     # head 2 = columns 6..8
    assert (A.merge_heads(h) == x).all()


@pytest.mark.parametrize("n, m, window, padded, Hkv", [
    (200, 200, None, False, 4),     # prefill: n = m, blocks of 64 rows + a ragged last one
    (130, 300, None, False, 2),     # queries after a cached past (m > n), GQA
    (150, 150, 40, False, 4),       # sliding window
    (100, 100, None, True, 1),      # padding keys, MQA
])
def test_causal_attention_by_blocks_equals_the_plain_path(n, m, window, padded, Hkv):
    """The fast causal path (habit 8) gives the plain softmax(QKᵀ/√d_k + M)·V."""
    rng = np.random.default_rng(7)
    B, H, dk = 2, 4, 16
    q = rng.standard_normal((B, H, n, dk)).astype(np.float32)
    k, v = rng.standard_normal((2, B, Hkv, m, dk)).astype(np.float32)
    key_mask = None
    if padded:
        key_mask = np.ones((B, m), dtype=bool)
        key_mask[1, :5] = False                                     # row 1 left-padded
    mask = A.AttentionMask(n=n, m=m, causal=True, window=window, key_mask=key_mask)
    assert n > A.CAUSAL_BLOCK
    plain, _, _ = A.scaled_dot_product_attention(q, k, v, mask.bias(q.dtype))
    fast = A.causal_attention(q, k, v, mask)
    assert fast.dtype == np.float32
    np.testing.assert_allclose(fast, plain, atol=1e-6, rtol=0)
    np.testing.assert_allclose(A.attention_output(q, k, v, mask), plain, atol=1e-6, rtol=0)


@pytest.mark.parametrize("window", [None, 1, 3])
def test_one_rule_for_every_mask(window):
    """masks.visible, and every mask built from it, equal the definition: j <= i and i - j < window."""
    from qkv.core import kernels, masks

    n, m = 5, 9
    pos = np.arange(m - n, m)                                            # the last n positions query
    want = np.array([[j <= i and (window is None or i - j < window) for j in range(m)] for i in pos])
    assert np.array_equal(masks.visible(pos, np.arange(m), True, window), want)
    built = A.AttentionMask(n=n, m=m, causal=True, window=window).allowed()[0, 0]
    assert np.array_equal(built, want)
    assert np.array_equal(A.causal_mask(n, m) if window is None else A.sliding_window_mask(n, window, m), want)
    block = kernels._block_mask(pos, np.arange(m), True, window)
    assert block is None and want.all() or np.array_equal(block, want)
    assert masks.visible(pos, np.arange(m), False) is None                # not causal, no window: nothing to build


@pytest.mark.parametrize("dk", [1, 5, 64, 200])
@pytest.mark.parametrize("how", ["loops", "numpy", "numpy-by-one-key"])
def test_one_query_is_summed_in_qkvs_own_order(dk, how, monkeypatch):
    """A single query (a cached step) is not left to BLAS's order (the library's, its CPU kernel's, gemv's or
    gemm's): each product rounded, q·k_j over d_k and Σ_j a_j·v_j over the keys added one term after another —
    the compiled loops and NumPy (in any chunks of keys) the same numbers, near the float64 loop."""
    monkeypatch.setattr(A, "_compiled_loops", lambda: how == "loops")
    if how == "numpy-by-one-key":
        monkeypatch.setattr(A, "ONE_QUERY_CHUNK", 1)
    rng = np.random.default_rng(dk)
    B, H, Hkv, m = 2, 4, 2, 37
    q = rng.standard_normal((B, H, 1, dk)).astype(np.float32)
    k, v = (rng.standard_normal((B, Hkv, m, dk)).astype(np.float32) for _ in range(2))
    z, w, s = A.scaled_dot_product_attention(q, k, v, keep_scores=True)
    scale = np.float32(1 / math.sqrt(dk))
    for b in range(B):
        for h in range(H):
            g = h // (H // Hkv)
            dots = []
            for j in range(m):
                acc = q[b, h, 0, 0] * k[b, g, j, 0]
                for i in range(1, dk):
                    acc = acc + q[b, h, 0, i] * k[b, g, j, i]
                dots.append(acc)
            assert np.array_equal(s[b, h, 0], np.array(dots, np.float32) * scale)
            acc = w[b, h, 0, 0] * v[b, g, 0]
            for j in range(1, m):
                acc = acc + w[b, h, 0, j] * v[b, g, j]
            assert np.array_equal(z[b, h, 0], acc)
    z64, w64 = naive_attention(q.astype(np.float64), k.astype(np.float64), v.astype(np.float64))
    assert np.allclose(w, w64, atol=1e-5) and np.allclose(z, z64, atol=1e-4)
