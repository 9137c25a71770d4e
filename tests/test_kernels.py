"""kernels: tiled and sliding-window attention equal plain attention; linear attention equals its definition."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import PATIENCE
from qkv.core import attention as A
from qkv.core.kernels import linear_attention, sliding_window_attention, tiled_attention
from qkv.core.kernels import compare_to_softmax, elu_feature_map

TOL = 1e-5      # float32 kernels against a float64 reference


def reference(q, k, v, allowed):
    """softmax(q·kᵀ/√d + mask)·v in float64, K/V repeated per query head; rows that see nothing → 0."""
    q, k, v = (x.astype(np.float64) for x in (q, k, v))
    G = q.shape[1] // k.shape[1]
    k, v = np.repeat(k, G, axis=1), np.repeat(v, G, axis=1)
    s = np.where(allowed, q @ k.swapaxes(-1, -2) / math.sqrt(q.shape[-1]), -np.inf)
    top = s.max(-1, keepdims=True)
    e = np.exp(s - np.where(np.isfinite(top), top, 0))
    total = e.sum(-1, keepdims=True)
    return np.where(total > 0, (e / np.where(total > 0, total, 1)) @ v, 0.0)


def qkv_arrays(rng, B, H, Hkv, n, m, d):
    q = rng.standard_normal((B, H, n, d)).astype(np.float32)
    k = rng.standard_normal((B, Hkv, m, d)).astype(np.float32)
    v = rng.standard_normal((B, Hkv, m, d)).astype(np.float32)
    return q, k, v


SHAPES = [  # B, H, Hkv, n, m, d, block
    (2, 4, 4, 37, 37, 8, 16),      # n not a multiple of the block
    (1, 8, 2, 50, 50, 16, 16),     # GQA
    (2, 6, 1, 33, 33, 8, 8),       # MQA
    (1, 4, 2, 7, 40, 8, 16),       # causal with m > n: queries are the last 7 positions
    (1, 2, 2, 1, 19, 4, 4),        # one query against a cache
    (1, 3, 3, 64, 64, 12, 64),     # exactly one block
]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "B{}H{}Hkv{}n{}m{}d{}b{}".format(*s))
@pytest.mark.parametrize("causal", [False, True])
def test_tiled_equals_plain_attention(shape, causal):
    B, H, Hkv, n, m, d, block = shape
    q, k, v = qkv_arrays(np.random.default_rng(sum(shape)), B, H, Hkv, n, m, d)
    allowed = A.causal_mask(n, m) if causal else np.ones((n, m), bool)
    out = tiled_attention(q, k, v, causal=causal, block_size=block)
    assert out.dtype == np.float32 and out.shape == (B, H, n, d)
    assert np.max(np.abs(out - reference(q, k, v, allowed))) <= TOL
    if n == m:   # and it agrees with the engine's plain path
        z, _, _ = A.scaled_dot_product_attention(q, k, v, A.mask_bias(allowed[None, None]))
        assert np.max(np.abs(out - z)) <= TOL


@pytest.mark.parametrize("window", [1, 3, 16, 100])
@pytest.mark.parametrize("shape", SHAPES[:4], ids=lambda s: "n{}m{}".format(s[3], s[4]))
def test_sliding_window_equals_masked_attention(shape, window):
    B, H, Hkv, n, m, d, block = shape
    q, k, v = qkv_arrays(np.random.default_rng(window), B, H, Hkv, n, m, d)
    out = sliding_window_attention(q, k, v, window=window, block_size=block)
    assert np.max(np.abs(out - reference(q, k, v, A.sliding_window_mask(n, window, m)))) <= TOL


@pytest.mark.parametrize("window", [None, 5])
def test_softcap_equals_capped_scores(window):
    """softcap c: softmax(c·tanh(S/c) + M)·V, the cap before the mask (Gemma 2), with and without a window."""
    q, k, v = qkv_arrays(np.random.default_rng(7), 1, 4, 2, 21, 21, 8)
    q *= 6                                                      # scores of size ~10: the cap bends them
    c = 3.0
    qf, kf, vf = (x.astype(np.float64) for x in (q, k, v))
    kf, vf = np.repeat(kf, 2, axis=1), np.repeat(vf, 2, axis=1)
    s = c * np.tanh(qf @ kf.swapaxes(-1, -2) / math.sqrt(8) / c)
    allowed = A.causal_mask(21) if window is None else A.sliding_window_mask(21, window, 21)
    s = np.where(allowed, s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    want = (p / p.sum(-1, keepdims=True)) @ vf
    out = tiled_attention(q, k, v, causal=True, block_size=4, window=window, softcap=c)
    assert np.max(np.abs(out - want)) <= TOL
    assert np.max(np.abs(tiled_attention(q, k, v, causal=True, block_size=4, window=window) - want)) > 100 * TOL


def test_padding_keys_and_fully_masked_rows_give_zeros():
    q, k, v = qkv_arrays(np.random.default_rng(5), 2, 4, 2, 20, 20, 8)
    key_mask = np.ones((2, 20), bool)
    key_mask[0] = False                     # row 0: every key is padding
    key_mask[1, :5] = False                 # row 1: left padding
    allowed = A.causal_mask(20)[None, None] & key_mask[:, None, None, :]
    out = tiled_attention(q, k, v, causal=True, block_size=8, key_mask=key_mask)
    assert np.isfinite(out).all() and (out[0] == 0).all()
    assert np.max(np.abs(out - reference(q, k, v, allowed))) <= TOL


@given(n=st.integers(1, 70), extra=st.integers(0, 30), heads=st.sampled_from([(1, 1), (4, 2), (6, 3), (4, 1)]),
       d=st.sampled_from([4, 8, 12]), block=st.integers(1, 40), causal=st.booleans(), seed=st.integers(0, 99))
@settings(max_examples=60, deadline=None)
def test_tiled_property(n, extra, heads, d, block, causal, seed):
    H, Hkv = heads
    m = n + extra if causal else n
    q, k, v = qkv_arrays(np.random.default_rng(seed), 1, H, Hkv, n, m, d)
    allowed = A.causal_mask(n, m) if causal else np.ones((n, m), bool)
    assert np.max(np.abs(tiled_attention(q, k, v, causal=causal, block_size=block) - reference(q, k, v, allowed))) <= TOL


def linear_by_definition(q, k, v, causal):
    """out_i = Σ_j φ(q_i)·φ(k_j) v_j / Σ_j φ(q_i)·φ(k_j), over j ≤ i when causal, in float64."""
    fq, fk = elu_feature_map(q.astype(np.float64)), elu_feature_map(k.astype(np.float64))
    G = q.shape[1] // k.shape[1]
    fk, vv = np.repeat(fk, G, axis=1), np.repeat(v.astype(np.float64), G, axis=1)
    w = fq @ fk.swapaxes(-1, -2)
    n, m = q.shape[2], k.shape[2]
    if causal:
        w = w * A.causal_mask(n, m)
    return (w @ vv) / w.sum(-1, keepdims=True)


@pytest.mark.parametrize("shape, causal", [(s, c) for s in SHAPES for c in (False, True) if c or s[3] == s[4]],
                         ids=lambda x: "n{}m{}".format(x[3], x[4]) if isinstance(x, tuple) else f"causal={x}")
def test_linear_attention_equals_its_definition(shape, causal):
    B, H, Hkv, n, m, d, block = shape
    q, k, v = qkv_arrays(np.random.default_rng(7), B, H, Hkv, n, m, d)
    out = linear_attention(q, k, v, causal=causal, chunk_size=block)
    assert out.dtype == np.float32
    np.testing.assert_allclose(out, linear_by_definition(q, k, v, causal), atol=1e-5, rtol=1e-4)


def test_feature_map_is_elu_plus_one():
    x = np.array([-3.0, -0.5, 0.0, 0.5, 2.0])
    np.testing.assert_allclose(elu_feature_map(x), np.where(x > 0, x, np.exp(x) - 1) + 1)
    assert (elu_feature_map(np.array([-100.0])) > 0).all()


def test_comparison_tool_sees_the_difference_on_real_activations(minilm):
    lt = minilm.run("The cat sat on the mat because it was warm.", layers=[1]).layer(1)
    cmp = compare_to_softmax(lt.q[None], lt.k[None], lt.v[None], causal=False)
    assert cmp["relative_error"].shape == (12,) and cmp["cosine"].shape == (12,)
    assert (cmp["relative_error"] > 1e-3).all() and (cmp["cosine"] <= 1 + 1e-6).all()
    same = compare_to_softmax(lt.q[None] * 0, lt.k[None] * 0, lt.v[None], causal=False)   # both uniform
    assert np.max(same["relative_error"]) < 1e-5


MEMORY_PROBE = r"""
import json, sys, tracemalloc
import numpy as np
from qkv.core.kernels import tiled_attention
from qkv.runtime.tuning import choices
choices()                    # the machine's block sizes, measured (or read) before counting: the kernel's memory only
n, H, d = int(sys.argv[1]), 1, 64
rng = np.random.default_rng(0)
q, k, v = (rng.standard_normal((1, H, n, d), dtype=np.float32) for _ in range(3))
tracemalloc.start()
out = tiled_attention(q, k, v, causal=True)
_, peak = tracemalloc.get_traced_memory()
print(json.dumps({"peak": peak, "out": out.nbytes, "scores": H * n * n * 4, "finite": bool(np.isfinite(out).all())}))
"""


def test_memory_at_16k_tokens_is_far_below_the_score_matrix():
    """In a fresh process: the extra memory of tiled attention at n = 16384 is O(n·block), not n²."""
    r = subprocess.run([sys.executable, "-c", MEMORY_PROBE, "16384"], capture_output=True, text=True,
                       timeout=PATIENCE)
    assert r.returncode == 0, r.stderr
    m = json.loads(r.stdout)
    assert m["finite"]
    extra = m["peak"] - m["out"]
    assert extra < m["scores"] / 50, m               # the n² matrix would be 2 GiB here


@pytest.mark.parametrize("causal", [False, True])
def test_default_blocks_over_several_query_and_key_blocks(causal):
    """The default Q_BLOCK × K_BLOCK tiling (query blocks in parallel), n not a multiple of either."""
    from qkv.core.kernels import K_BLOCK, Q_BLOCK

    n = K_BLOCK + Q_BLOCK + 37
    q, k, v = qkv_arrays(np.random.default_rng(11), 1, 4, 2, n, n, 8)
    allowed = A.causal_mask(n) if causal else np.ones((n, n), bool)
    assert np.max(np.abs(tiled_attention(q, k, v, causal=causal) - reference(q, k, v, allowed))) <= TOL
