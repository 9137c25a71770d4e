"""sparse: every pattern of the gallery against a float64 dense softmax with the same mask, and its map of tiles.

The reference here is written from the definitions (distance d = i − j, global tokens, blocks),
not from qkv.core.sparse's parts, so a wrong part fails both the mask test and the attention test.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from qkv.core import sparse as sp
from qkv.runtime.errors import QkvError
from qkv.core.kernels import tiled_attention


def dense_reference(q: np.ndarray, k: np.ndarray, v: np.ndarray, allowed: np.ndarray) -> np.ndarray:
    """softmax(q·kᵀ/√d + M)·v in float64, K/V heads repeated for GQA; a row with no key gives zeros."""
    q, k, v = (x.astype(np.float64) for x in (q, k, v))
    G = q.shape[-3] // k.shape[-3]
    k, v = np.repeat(k, G, axis=-3), np.repeat(v, G, axis=-3)
    s = np.where(allowed, q @ np.swapaxes(k, -1, -2) / math.sqrt(q.shape[-1]), -np.inf)
    top = s.max(-1, keepdims=True)
    e = np.exp(s - np.where(np.isfinite(top), top, 0))
    total = e.sum(-1, keepdims=True)
    return np.divide(e, total, out=np.zeros_like(e), where=total > 0) @ v


def mask_by_definition(name: str, n_q: int, n_k: int, causal: bool, w: int, block: int, pattern) -> np.ndarray:
    """The gallery's masks written out from their definitions (random blocks read back from the pattern)."""
    i = np.arange(n_k - n_q, n_k)[:, None]
    j = np.arange(n_k)[None, :]
    d = i - j
    if name in ("causal", "full"):
        ok = np.ones((n_q, n_k), bool)
    elif name == "window":
        ok = np.abs(d) < w
    elif name == "dilated":
        r, ww = 4, max(1, w // 4)
        ok = (np.abs(d) <= (ww - 1) * r) & (d % r == 0)
    elif name in ("longformer", "bigbird"):
        ok = (np.abs(d) < w) | (i == 0) | (j == 0)
        if name == "bigbird":                     # each query block's 2 drawn key blocks, as the pattern drew them
            rb = pattern.parts[2]
            for a in range(n_k // block + 1):
                drawn = sp._drawn(rb.seed, 2, a, -(-n_k // block), causal)
                assert len(drawn) == min(2, a if causal else -(-n_k // block))
                for b in drawn:
                    ok |= (i // block == a) & (j // block == b)
    elif name == "block":
        a, b = i // block, j // block
        ok = (np.abs(a - b) < 2) | (b % 4 == 3)
    else:
        raise AssertionError(name)
    return ok & (j <= i) if causal else ok


def qkv_arrays(H: int, Hkv: int, n: int, m: int, d: int = 16, seed: int = 0):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((H, n, d)).astype(np.float32), rng.standard_normal((Hkv, m, d)).astype(np.float32),
            rng.standard_normal((Hkv, m, d)).astype(np.float32))


W, PB = 24, 16                                    # window and pattern block of the gallery under test
GALLERY = [(causal, i) for causal in (True, False) for i in range(6)]


@pytest.mark.parametrize("causal, index", GALLERY)
def test_masks_follow_their_definitions(causal, index):
    p = sp.gallery(causal, window=W, block=PB)[index]
    for n_q, n_k in ((100, 100), (37, 100)):
        np.testing.assert_array_equal(p.mask(n_q, n_k), mask_by_definition(p.name, n_q, n_k, causal, W, PB, p))


@pytest.mark.parametrize("causal, index", GALLERY)
@pytest.mark.parametrize("block", [32, (16, 48)])
def test_kernel_equals_dense_reference_and_skips_hidden_tiles(causal, index, block):
    n, H, Hkv = 203, 6, 2                        # n not a multiple of any block; GQA: 3 query heads a K/V head
    p = sp.gallery(causal, window=W, block=PB)[index]
    q, k, v = qkv_arrays(H, Hkv, n, n)
    z, count = sp.sparse_attention(q, k, v, p, block=block)
    allowed = mask_by_definition(p.name, n, n, causal, W, PB, p)
    np.testing.assert_allclose(z, dense_reference(q, k, v, allowed), atol=2e-6)
    assert z.dtype == np.float32 and z.shape == (H, n, 16)
    bq, bk = (block, block) if isinstance(block, int) else block
    tiles = [(a, b) for a in range(0, n, bq) for b in range(0, n, bk)]
    hidden = sum(not allowed[a:a + bq, b:b + bk].any() for a, b in tiles)
    full = sum(allowed[a:a + bq, b:b + bk].all() for a, b in tiles)
    assert (count.total, count.skipped, count.full) == (len(tiles), hidden, full)
    assert count.visited == len(tiles) - hidden
    kinds = p.tiles(n, n, block)
    assert (kinds == sp.HIDDEN).sum() == hidden and (kinds == sp.FULL).sum() == full
    if p.name not in ("causal", "full"):
        assert hidden > 0                        # a sparse pattern at n = 203 leaves tiles out


@pytest.mark.parametrize("causal, index", GALLERY)
def test_parts_decide_hidden_tiles_exactly(causal, index):
    """Every part's analytic `hidden` agrees with the tile's mask, on tiles of many sizes and places."""
    p = sp.gallery(causal, window=W, block=PB)[index]
    n = 150
    allowed = p.mask(n)
    rng = np.random.default_rng(index)
    for _ in range(300):
        q0, k0 = rng.integers(0, n, 2)
        q1, k1 = q0 + rng.integers(1, 40), k0 + rng.integers(1, 40)
        q1, k1 = min(q1, n), min(k1, n)
        analytic = all(part.hidden(q0, q1, k0, k1, n, causal) for part in p.parts)
        assert analytic == (not allowed[q0:q1, k0:k1].any()), (p.name, q0, q1, k0, k1)
        if any(part.full(q0, q1, k0, k1) for part in p.parts) and (not causal or k1 - 1 <= q0):
            assert allowed[q0:q1, k0:k1].all()


def test_batched_cached_queries_and_the_tiled_kernel():
    """(B, H, n, d) with m > n keys (the queries are the last n): the dense pattern equals tiled_attention."""
    rng = np.random.default_rng(3)
    q = rng.standard_normal((2, 4, 40, 8)).astype(np.float32)
    k, v = (rng.standard_normal((2, 1, 90, 8)).astype(np.float32) for _ in range(2))   # MQA
    for causal in (True, False):
        z, _ = sp.sparse_attention(q, k, v, sp.dense(causal), block=16)
        np.testing.assert_allclose(z, tiled_attention(q, k, v, causal=causal, block_size=16), atol=1e-6)
        p = sp.longformer(10, (0, 5), causal)
        z, _ = sp.sparse_attention(q, k, v, p, block=(8, 32))
        np.testing.assert_allclose(z, dense_reference(q, k, v, p.mask(40, 90)), atol=2e-6)
    # a causal window reaches only back: the sliding window equals the engine's own kernel
    z, _ = sp.sparse_attention(q, k, v, sp.sliding_window(7), block=16)
    np.testing.assert_allclose(z, tiled_attention(q, k, v, causal=True, window=7, block_size=16), atol=1e-6)


def test_a_single_visible_key_returns_its_value():
    q, k, v = qkv_arrays(2, 2, 50, 50)
    z, count = sp.sparse_attention(q, k, v, sp.sliding_window(1), block=16)   # each query sees only itself
    np.testing.assert_allclose(z, v, atol=1e-6)
    assert count.partial == 4 and count.skipped == 16 - 4                   # only the diagonal tiles
    z, _ = sp.sparse_attention(q, k, v, sp.dilated_window(3, 10), block=16)  # row 0 sees only key 0
    np.testing.assert_allclose(z[:, 0], v[:, 0], atol=1e-6)


def test_a_row_with_no_visible_key_gives_zeros_not_nan():
    """A hand-made pattern 'the 3 tokens before, not itself': row 0 sees nothing and gets zeros."""
    p = sp.Pattern("previous", "previous 3", (sp.Band(1, 3),), causal=True)
    q, k, v = qkv_arrays(3, 3, 30, 30)
    z, count = sp.sparse_attention(q, k, v, p, block=8)
    assert np.isfinite(z).all() and not z[:, 0].any()
    np.testing.assert_allclose(z, dense_reference(q, k, v, p.mask(30)), atol=2e-6)
    np.testing.assert_allclose(z[:, 1], v[:, 0], atol=1e-6)                  # row 1 sees key 0 alone


def test_bigbird_is_seeded():
    a, b, c = (sp.bigbird(8, (0,), 2, 8, seed) for seed in (0, 0, 1))
    np.testing.assert_array_equal(a.mask(120), b.mask(120))
    assert not np.array_equal(a.mask(120), c.mask(120))


def test_density_and_compare_to_dense():
    q, k, v = qkv_arrays(4, 2, 64, 64)
    full = dense_reference(q, k, v, np.ones((64, 64), bool))
    s = q.astype(np.float64) @ np.repeat(k, 2, 0).astype(np.float64).transpose(0, 2, 1) / 4.0
    A = np.exp(s - s.max(-1, keepdims=True))
    A /= A.sum(-1, keepdims=True)                                            # (H, n, n) dense weights
    p = sp.sliding_window(9, causal=False)
    got = sp.compare_to_dense(q, k, v, p, weights=A.astype(np.float32), block=16)
    z = dense_reference(q, k, v, p.mask(64))
    want = np.linalg.norm(z - full, axis=(-2, -1)) / np.linalg.norm(full, axis=(-2, -1))
    np.testing.assert_allclose(got["relative_error"], want, rtol=1e-4)
    np.testing.assert_allclose(got["mass_kept"], (A * p.mask(64)).sum(-1).mean(-1), rtol=1e-5)
    assert p.density(64) == pytest.approx(p.mask(64).sum() / 64 ** 2)
    assert sp.dense(False).density(64) == 1.0 and sp.dense(True).density(64) == pytest.approx(65 / 128)


@pytest.mark.parametrize("make", [lambda: sp.sliding_window(0), lambda: sp.dilated_window(4, 0),
                                  lambda: sp.longformer(8, (-1,)), lambda: sp.block_sparse(0),
                                  lambda: sp.bigbird(8, random=-1)])
def test_bad_sizes_are_user_errors(make):
    with pytest.raises(QkvError):
        make()


def test_shapes_that_do_not_fit_are_user_errors():
    q, k, v = qkv_arrays(3, 2, 10, 10)
    with pytest.raises(QkvError, match="multiple"):
        sp.sparse_attention(q, k, v, sp.dense())
    q, k, v = qkv_arrays(2, 2, 10, 5)
    with pytest.raises(QkvError):
        sp.sparse_attention(q, k, v, sp.dense(), block=4)
    with pytest.raises(QkvError, match="block"):
        sp.sparse_attention(*qkv_arrays(2, 2, 10, 10), sp.dense(), block=0)
