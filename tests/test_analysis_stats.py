"""Per-head statistics: hand-built attention with known answers, and qkv vs the reference."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import FIXTURES
from qkv.analysis.stats import STATS, bare, head_stats, punctuation_positions, uniform_entropy

TOKENS = ["[CLS]", "the", "cat", ",", "sat", ".", "[SEP]"]          # n = 7
N = len(TOKENS)
TOL_REFERENCE = 1e-5            # statistics from qkv's attention vs from transformers' attention


def shifted(n: int, offset: int) -> np.ndarray:
    """Each row i looks only at i + offset (at itself where that is outside the text)."""
    A = np.zeros((n, n))
    for i in range(n):
        j = i + offset
        A[i, j if 0 <= j < n else i] = 1.0
    return A


def test_identity_attention_is_all_self_and_zero_entropy():
    s = head_stats(np.eye(N), TOKENS)
    assert s["self"] == 1.0 and s["prev"] == 0.0 and s["next"] == 0.0
    assert s["entropy"] == 0.0                                        # 0·ln 0 = 0, never NaN
    assert s["cls"] == pytest.approx(1 / N) and s["sep"] == pytest.approx(1 / N)


def test_previous_and_next_token_heads():
    prev = head_stats(shifted(N, -1), TOKENS)
    assert prev["prev"] == pytest.approx((N - 1) / N)                 # row 0 has no previous token
    assert prev["self"] == pytest.approx(1 / N)
    assert prev["next"] == 0.0
    nxt = head_stats(shifted(N, +1), TOKENS)
    assert nxt["next"] == pytest.approx((N - 1) / N) and nxt["prev"] == 0.0
    assert nxt["sep"] == pytest.approx(2 / N)                          # "." → [SEP], and [SEP] itself


def test_uniform_attention_has_the_largest_entropy():
    s = head_stats(np.full((N, N), 1 / N), TOKENS)
    assert s["entropy"] == pytest.approx(math.log(N))
    assert s["entropy"] == pytest.approx(uniform_entropy(N, causal=False))
    assert s["cls"] == pytest.approx(1 / N) and s["sep"] == pytest.approx(1 / N)
    assert s["punct"] == pytest.approx(2 / N)                          # "," and "."
    assert s["first"] == pytest.approx(1 / N)


def test_causal_uniform_entropy_is_the_mean_of_ln_of_visible_keys():
    A = np.tril(np.ones((N, N)))
    A /= A.sum(-1, keepdims=True)
    assert head_stats(A, TOKENS)["entropy"] == pytest.approx(np.mean(np.log(np.arange(1, N + 1))))
    assert uniform_entropy(N, causal=True) == pytest.approx(np.mean(np.log(np.arange(1, N + 1))))


def test_attention_to_cls_sep_punctuation_is_counted_per_key_set():
    A = np.zeros((N, N))
    A[:, 0] = 0.5                                                      # half to [CLS]
    A[:, 6] = 0.25                                                     # a quarter to [SEP]
    A[:, 3] = 0.25                                                     # a quarter to ","
    s = head_stats(A, TOKENS)
    assert s["cls"] == pytest.approx(0.5) and s["sep"] == pytest.approx(0.25)
    assert s["punct"] == pytest.approx(0.25) and s["first"] == pytest.approx(0.5)


def test_missing_special_tokens_give_none_not_zero():
    tokens = ["The", "Ġcat", "Ġsat", ",", "Ġon", "Ġthe", "Ġmat"]       # GPT-2: no [CLS], no [SEP]
    s = head_stats(np.eye(len(tokens)), tokens, cls=None, sep=None)
    assert s["cls"] is None and s["sep"] is None
    assert s["self"] == 1.0


def test_bpe_markers_are_stripped_before_matching_punctuation():
    assert bare("Ġ,") == "," and bare("▁.") == "." and bare("Ġcat") == "cat"
    assert punctuation_positions(["a", "Ġ,", "▁.", ".", "..", ";"]) == [1, 2, 3]


def test_stats_of_a_stack_equal_stats_of_each_head():
    rng = np.random.default_rng(0)
    A = rng.random((3, 4, N, N))
    A /= A.sum(-1, keepdims=True)                                      # (L, H, n, n)
    stack = head_stats(A, TOKENS)
    for name in STATS:
        assert stack[name].shape == (3, 4)
        assert stack[name][2, 1] == pytest.approx(head_stats(A[2, 1], TOKENS)[name])


def test_shape_mismatch_is_a_bug_not_silence():
    with pytest.raises(ValueError):
        head_stats(np.eye(3), ["a", "b"])


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 12), st.integers(0, 2**32 - 1))
def test_statistics_stay_in_their_ranges(n, seed):
    rng = np.random.default_rng(seed)
    A = rng.random((n, n)) ** 4
    A /= A.sum(-1, keepdims=True)
    tokens = ["[CLS]"] + ["w"] * max(0, n - 2) + ["[SEP]"] if n >= 2 else ["[CLS]"]
    s = head_stats(A, tokens)
    assert s["self"] + s["prev"] + s["next"] <= 1 + 1e-12              # three disjoint key sets per row
    for name in ("self", "prev", "next", "cls", "sep", "punct", "first"):
        assert -1e-12 <= s[name] <= 1 + 1e-12
    assert -1e-12 <= s["entropy"] <= math.log(n) + 1e-9


@pytest.mark.parametrize("path", sorted((FIXTURES / "minilm").glob("sentence_*.npz")), ids=lambda p: p.stem)
def test_statistics_from_qkv_equal_statistics_from_the_reference(minilm, path):
    with np.load(path) as z:
        text, tokens, ref = str(z["text"]), z["tokens"].tolist(), z["attentions"]      # (L, H, n, n)
    trace = minilm.run(text, keep=("attentions",))
    assert trace.tokens == tokens
    ours, theirs = head_stats(trace.attentions, tokens), head_stats(ref, tokens)
    for name in STATS:
        assert np.max(np.abs(ours[name] - theirs[name])) <= TOL_REFERENCE, name


def test_cross_attention_statistics_over_the_keys_text():
    """n_q = 2 queries over the n_k = 7 keys of TOKENS: the per-key statistics are defined as for
    self-attention, averaged over the queries; self/prev/next compare positions of two texts: None."""
    A = np.zeros((2, N))
    A[0, 0], A[0, 3] = 0.5, 0.5                                        # [CLS] and ","
    A[1, 6] = 1.0                                                      # [SEP]
    s = head_stats(A, TOKENS)
    assert s["self"] is None and s["prev"] is None and s["next"] is None
    assert s["cls"] == pytest.approx(0.25) and s["sep"] == pytest.approx(0.5) and s["punct"] == pytest.approx(0.25)
    assert s["first"] == pytest.approx(0.25) and s["entropy"] == pytest.approx(math.log(2) / 2)
    with pytest.raises(ValueError):
        head_stats(np.ones((2, 3)) / 3, TOKENS)                        # keys must match the tokens given
