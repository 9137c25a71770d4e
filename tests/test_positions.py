"""positions: sinusoids, RoPE in the rotate-half convention, positions over real tokens."""

from __future__ import annotations

import math

import numpy as np
import pytest

from qkv.core import positions as P
from qkv.runtime.errors import QkvError


def test_sinusoidal_table_formula():
    t = P.sinusoidal_table(50, 16)
    p, i = 7, 3
    assert t[p, 2 * i] == pytest.approx(math.sin(p / 10000 ** (2 * i / 16)), abs=1e-6)
    assert t[p, 2 * i + 1] == pytest.approx(math.cos(p / 10000 ** (2 * i / 16)), abs=1e-6)


def test_positions_count_real_tokens_only():
    mask = np.array([[0, 0, 1, 1, 1], [1, 1, 1, 0, 0]])
    assert P.positions_from_mask(mask).tolist() == [[0, 0, 0, 1, 2], [0, 1, 2, 2, 2]]


def rope_by_pairs(x, pos, theta):
    """RoPE written as rotations of the pairs (i, i + d/2), the Hugging Face layout."""
    d = x.shape[-1]
    out = x.astype(np.float64).copy()
    for i in range(d // 2):
        a = pos * theta ** (-2 * i / d)
        x1, x2 = x[..., i], x[..., i + d // 2]
        out[..., i] = x1 * math.cos(a) - x2 * math.sin(a)
        out[..., i + d // 2] = x1 * math.sin(a) + x2 * math.cos(a)
    return out


@pytest.mark.parametrize("theta", [10000.0, 500000.0])
def test_rope_rotates_pairs_i_and_i_plus_half(theta):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((1, 2, 5, 8)).astype(np.float64)      # (B, H, n, d_k)
    pos = np.arange(5)[None]
    cos, sin = P.rope_cos_sin(pos, P.rope_inv_freq(8, theta, dtype=np.float64))
    got = P.apply_rope(x, cos, sin)
    for p in range(5):
        np.testing.assert_allclose(got[0, :, p], rope_by_pairs(x[0, :, p], p, theta), atol=1e-12)


def test_rope_scores_depend_only_on_relative_position():
    rng = np.random.default_rng(2)
    q, k = rng.standard_normal((2, 1, 1, 1, 16))
    inv = P.rope_inv_freq(16, 10000.0, dtype=np.float64)

    def score(pq, pk):
        cq, sq = P.rope_cos_sin(np.array([[pq]]), inv)
        ck, sk = P.rope_cos_sin(np.array([[pk]]), inv)
        return float(np.sum(P.apply_rope(q, cq, sq) * P.apply_rope(k, ck, sk)))

    assert score(5, 2) == pytest.approx(score(13, 10), abs=1e-9)
    assert score(5, 2) != pytest.approx(score(5, 3), abs=1e-3)


def test_rope_scaling_kinds():
    base = P.rope_inv_freq(64, 10000.0, dtype=np.float64)
    lin = P.rope_inv_freq(64, 10000.0, {"rope_type": "linear", "factor": 4.0}, dtype=np.float64)
    np.testing.assert_allclose(lin, base / 4)
    l3 = P.rope_inv_freq(64, 10000.0, {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                       "high_freq_factor": 4.0, "original_max_position_embeddings": 64},
                         dtype=np.float64)
    assert l3[0] == base[0] and l3[-1] == pytest.approx(base[-1] / 8)   # fast kept, slow slowed
    with pytest.raises(QkvError, match="not supported"):
        P.rope_inv_freq(64, 10000.0, {"rope_type": "proportional", "factor": 2.0})
