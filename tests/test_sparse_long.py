"""Longformer's global tokens and BigBird's blocks on long inputs without an n × n matrix (core/sparse_layers.py:
SparseMask, sparse_layer_attention): the pattern equals the tables `qkv explain sparse` draws; the kernel, a block of
queries with only the keys it reads, equals the plain softmax(Q·Kᵀ/√d_k + log c + M)·V (float64 ≤ 1e-12, its weights,
scores and each row's largest weights too); the committed fixtures equal transformers through it; a 1024-token pass
equals the plain pass and never allocates n × n (every array of scores the kernel makes is recorded)."""

from __future__ import annotations

import json

import numpy as np
import pytest

import qkv
from qkv.core import attention as att
from qkv.core import sparse_layers as sparse
from conftest import MODELS, TOL_HIDDEN, max_abs, reference

RNG = np.random.default_rng(47)


def longformer_mask(n, half, globals, key_mask=None):
    return sparse.SparseMask(n=n, m=n, causal=False, key_mask=key_mask, half=half, globals=tuple(globals))


def bigbird_mask(n, b, r, key_mask=None):
    return sparse.SparseMask(n=n, m=n, causal=False, key_mask=key_mask, blocks=(b, r))


def padded(n, cut):
    """(2, n) key mask: row 1's last n − cut keys padding."""
    k = np.ones((2, n), dtype=bool)
    k[1, cut:] = False
    return k


def test_the_pattern_equals_the_tables_explain_sparse_draws():
    """copies(i, j) over the whole grid: longformer_visible's window and global rows/columns, bigbird_copies' blocks
    (block 0 counted 1 + r times); bias() is log c plus the padding's −∞, as the dense mask was."""
    for n, half, g in ((37, 3, (0, 5)), (50, 8, ()), (20, 20, (19,))):
        grid = longformer_mask(n, half, g).copies(np.arange(n), np.arange(n))
        np.testing.assert_array_equal(grid, sparse.longformer_visible(n, half, g).astype(np.int64))
    for n, b, r in ((15, 2, 1), (29, 3, 2), (61, 4, 3)):
        mask = bigbird_mask(n, b, r, padded(n, n - 5))
        np.testing.assert_array_equal(mask.copies(np.arange(n), np.arange(n)), sparse.bigbird_copies(n, b, r))
        want = sparse.copies_bias(sparse.bigbird_copies(n, b, r), np.float64) + att.mask_bias(
            padded(n, n - 5)[:, None, None, :], np.float64)
        np.testing.assert_array_equal(mask.bias(np.float64), want)
        for q0, q1 in mask.row_blocks(8):                      # the keys a block reads are every key it sees
            seen = np.flatnonzero(mask.copies(np.arange(q0, q1), np.arange(n)).any(0))
            assert set(seen) <= set(mask.keys(q0, q1))


MASKS = [
    pytest.param(lambda: longformer_mask(300, 9, (0, 77, 299)), id="longformer-globals"),
    pytest.param(lambda: longformer_mask(300, 9, (3,), padded(300, 250)), id="longformer-padded"),
    pytest.param(lambda: longformer_mask(130, 130, (1,)), id="longformer-full-window"),
    pytest.param(lambda: bigbird_mask(301, 4, 2), id="bigbird-b4-r2"),
    pytest.param(lambda: bigbird_mask(300, 3, 1, padded(300, 260)), id="bigbird-padded"),
]


@pytest.mark.parametrize("make", MASKS)
def test_the_kernel_equals_the_plain_path(make):
    """Z, the weights and scores of two heads, and each row's 12 largest weights of every head, against the plain
    softmax(Q·Kᵀ/√d_k + mask.bias)·V in float64; another mask would not give Z."""
    mask = make()
    n = mask.n
    q, k, v = (RNG.standard_normal((2, 4, n, 8)) for _ in range(3))
    z, a, s, top = sparse.sparse_layer_attention(q, k, v, mask, heads=[1, 3], scores=True, top=12)
    Z, A, S = att.scaled_dot_product_attention(q, k, v, mask.bias(np.float64), keep_scores=True)
    assert max_abs(z, Z) <= 1e-12 and max_abs(a, A[:, [1, 3]]) <= 1e-12
    np.testing.assert_array_equal(np.isfinite(s), np.isfinite(S[:, [1, 3]]))
    assert max_abs(np.where(np.isfinite(s), s, 0), np.where(np.isfinite(S), S, 0)[:, [1, 3]]) <= 1e-12
    want = att.top_of(A, 12)
    assert max_abs(top.weight, want.weight) <= 1e-7 and max_abs(top.rest, want.rest) <= 1e-6
    kept = want.weight > 0                                      # a 0 weight's key is any of the ties
    np.testing.assert_array_equal(top.index[kept], want.index[kept])
    other = longformer_mask(n, 2, ()) if mask.blocks is not None else bigbird_mask(n, 2, 1)
    assert max_abs(sparse.sparse_layer_attention(q, k, v, other)[0], Z) > 1e-3


def test_the_fixtures_equal_transformers_through_the_kernel():
    """The committed references (transformers 5.25) met without keeping the weights (the pass then runs
    sparse_layer_attention): Longformer with global tokens 0 and 5, BigBird block-sparse on 17 tokens and on a
    padded batch of 20."""
    ref = reference("longformer")
    model = qkv.load(MODELS / "longformer").with_config(global_tokens=tuple(int(t) for t in ref["global_tokens"]))
    assert max_abs(model.forward(ref["single_input_ids"], attentions=False).logits, ref["global_logits"]) <= TOL_HIDDEN
    ref = reference("big_bird")
    model = qkv.load(MODELS / "big_bird")
    assert max_abs(model.forward(ref["single_input_ids"], attentions=False).logits, ref["single_logits"]) <= TOL_HIDDEN
    out = model.forward(ref["sparse_input_ids"], ref["sparse_attention_mask"], attentions=False)
    real = ref["sparse_attention_mask"].astype(bool)
    assert max_abs(out.logits[real], ref["sparse_logits"][real]) <= TOL_HIDDEN


def tiny(name: str, **change) -> qkv.Model:
    """A random float64 model of fixture NAME's config with 1100 positions and CHANGE."""
    cfg = json.loads((MODELS / name / "config.json").read_text())
    cfg.update(max_position_embeddings=1100, **change)
    return qkv.init(cfg, seed=3, dtype=np.float64)


def recorded_shapes(monkeypatch) -> list[tuple[int, ...]]:
    """Every array of scores the sparse layers make (the kernel's blocks, the global rows'); the plain path's n × n
    bias refused outright."""
    shapes = []

    def scores(q, k, *args):
        shapes.append(q.shape[:-1] + k.shape[2:3])
        return att.attention_scores(q, k, *args)

    def plain(q, k, *args, **kwargs):
        shapes.append(q.shape[:-1] + k.shape[2:3])
        return att.scaled_dot_product_attention(q, k, *args, **kwargs)

    def refused(self, dtype=np.float32):
        raise AssertionError("the n × n mask was built")

    monkeypatch.setattr(sparse, "attention_scores", scores)
    monkeypatch.setattr(sparse, "scaled_dot_product_attention", plain)
    monkeypatch.setattr(sparse.SparseMask, "bias", refused)
    return shapes


@pytest.mark.parametrize("name, change, glob", [
    ("longformer", {"attention_window": [16, 32]}, (0, 9, 700)),
    ("longformer", {"attention_window": [16, 32]}, ()),             # the band with padding: no tiled kernel takes it
    ("big_bird", {"block_size": 4, "num_random_blocks": 2}, ()),
])
def test_a_long_input_equals_the_plain_pass_without_n_by_n(monkeypatch, name, change, glob):
    """1024 tokens, a padded batch of two: the hidden states of the pass that keeps no weight equal the plain pass's
    (which keeps every weight, n × n per head) within 1e-12 in float64, each row's 16 largest weights equal top_of
    of the plain weights; no array of scores the kernel makes is n × n (the largest: a block of 64 rows against
    every key, for BigBird's global blocks and a block holding a global token)."""
    model = tiny(name, **change).with_config(global_tokens=glob)
    n = 1024
    ids = np.random.default_rng(5).integers(5, 190, (2, n))
    mask = np.ones_like(ids)
    mask[1, 1000:] = 0
    plain = model.forward(ids, mask, attentions=True)
    trace_plain = model.run(ids[0], keep=("attentions",))
    shapes = recorded_shapes(monkeypatch)
    fast = model.forward(ids, mask, attentions=False)
    real = mask.astype(bool)
    assert max_abs(fast.hidden[real], plain.hidden[real]) <= 1e-12
    trace = model.run(ids[0], keep=("attention_top",), top=16)
    assert shapes and all(s[-2] * s[-1] <= 64 * n and s[-2] < n for s in shapes)
    assert sum(s[-2] == 64 and s[-1] == n for s in shapes) <= 4 * model.config.n_layers    # blocks reading all
    for i in trace.layer_ids:
        want = att.top_of(trace_plain.layer(i).attentions, 16)
        got = trace.layer(i).attention_top
        assert max_abs(got.weight, want.weight) <= 1e-7
        np.testing.assert_array_equal(got.index[want.weight > 0], want.index[want.weight > 0])
