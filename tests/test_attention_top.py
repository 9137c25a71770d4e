"""Each query row's largest attention weights (core.attention.TopAttention, keep=("attention_top",)): what
a view of a long input keeps. Computed by blocks of query rows beside a tiled pass, they are exactly the K
largest entries of the dense A the plain pass computes, with their keys, in order, and the rest of the row."""

from __future__ import annotations

import numpy as np
import pytest

import qkv
from qkv.core import attention as at
from conftest import DECODER_FIXTURES, FAMILY_FIXTURES, MODELS

IDS = np.random.default_rng(1).integers(3, 90, 21)          # every fixture's vocabulary but ESM's holds ids below 90


def check(top: at.TopAttention, A: np.ndarray, K: int) -> None:
    """TOP holds the K largest weights of each row of A (…, n, m), largest first, and the rest of the row."""
    m = A.shape[-1]
    assert top.keys == m and top.index.shape == A.shape[:-1] + (min(K, m),) and top.index.dtype == np.int32
    got = np.take_along_axis(A, top.index.astype(np.intp), axis=-1)
    np.testing.assert_allclose(top.weight, got, atol=1e-6)                             # the weights of those keys
    assert (np.diff(top.weight, axis=-1) <= 1e-6).all()                                # largest first
    kth = np.sort(A, axis=-1)[..., ::-1][..., min(K, m) - 1]
    assert (top.weight[..., -1] >= kth - 1e-6).all()                                   # none larger left out
    np.testing.assert_allclose(top.rest, A.sum(-1) - got.sum(-1), atol=1e-5)
    assert (top.rest >= 0).all()


@pytest.mark.parametrize("name", FAMILY_FIXTURES)
def test_the_kept_rows_are_the_largest_weights_of_the_dense_pass(name):
    model = qkv.load(MODELS / name)
    ids = IDS % model.config.vocab_size                               # IDS itself but in ESM's 33 tokens
    dense = model.run(ids, keep=("attentions",))
    sparse = model.run(ids, keep=("attention_top",), top=5)          # beside the (plain or tiled) pass
    for i in dense.layer_ids:
        check(sparse.layer(i).attention_top, dense.layer(i).attentions, 5)
    np.testing.assert_allclose(sparse.hidden, dense.hidden, atol=1e-5)


@pytest.mark.parametrize("name", ["gemma2", "bloom", "qwen2_sliding"])      # softcap + window + GQA, ALiBi, window
def test_blocks_of_query_rows_and_a_top_past_the_row(monkeypatch, name):
    model = qkv.load(MODELS / name)
    dense = model.run(IDS, keep=("attentions",))
    monkeypatch.setattr(at.attention_top, "__defaults__", (3, None, None))           # blocks of 3 query rows
    for K in (4, 1000):
        sparse = model.run(IDS, keep=("attention_top",), top=K)
        for i in dense.layer_ids:
            check(sparse.layer(i).attention_top, dense.layer(i).attentions, K)
    top = sparse.layer(0).attention_top                                  # K past the row: all of it, A itself
    np.testing.assert_allclose(top.dense(), dense.layer(0).attentions, atol=1e-6)


def test_a_long_input_keeps_k_numbers_a_row_and_errors_are_one_line():
    model = qkv.load("smollm2")
    ids = np.random.default_rng(0).integers(5, model.config.vocab_size, 700)
    trace = model.run(ids, layers=[0, 15], keep=("attention_top",), top=8)        # the pass runs tiled
    top = trace.layer(15).attention_top
    assert top.index.shape == (model.config.n_heads, 700, 8) and top.keys == 700
    assert (top.index[:, :, 0] <= np.arange(700)).all()                                # causal: no later key
    np.testing.assert_allclose(top.weight.sum(-1) + top.rest, 1, atol=1e-5)            # each row sums to 1
    with pytest.raises(qkv.QkvError, match="not kept"):
        trace.layer(0).attentions
    with pytest.raises(qkv.QkvError, match="top must be a whole number"):
        model.run([1, 2], keep=("attention_top",), top=0)
