"""Detectors (TransformerLens's patterns and "mul" score) and the roles built on them."""

from __future__ import annotations

import numpy as np
import pytest

from qkv.analysis import analyse
from qkv.analysis.detectors import (duplicate_token_pattern, induction_pattern, induction_scores, pattern_score,
                                    previous_token_pattern, repeated_random_tokens)
from qkv.analysis.roles import BROAD, DOMINANT, INDUCTION, classify, strength
from qkv.analysis.stats import STATS


def rows_to(targets: list[list[int]], n: int) -> np.ndarray:
    """Attention where row i spreads evenly over targets[i] (itself when empty)."""
    A = np.zeros((n, n))
    for i, js in enumerate(targets):
        js = js or [i]
        A[i, js] = 1.0 / len(js)
    return A


def test_patterns_are_transformerlens_definitions():
    ids = np.array([7, 8, 9, 7, 8, 9])
    assert np.array_equal(previous_token_pattern(3), [[0, 0, 0], [1, 0, 0], [0, 1, 0]])
    dup = duplicate_token_pattern(ids)
    assert {tuple(x) for x in np.argwhere(dup)} == {(3, 0), (4, 1), (5, 2)}          # only earlier copies
    ind = induction_pattern(ids)
    assert {tuple(x) for x in np.argwhere(ind)} == {(3, 1), (4, 2), (5, 3)}          # one past the earlier copy
    assert np.array_equal(np.tril(ind), ind) and np.array_equal(np.tril(dup), dup)


def test_planted_heads_score_high_and_others_low():
    ids = np.array([5, 11, 12, 13, 14, 11, 12, 13, 14])                              # n = 9, period 4
    n = len(ids)
    prev = rows_to([[i - 1] if i else [] for i in range(n)], n)
    ind = rows_to([np.flatnonzero(induction_pattern(ids)[i]).tolist() for i in range(n)], n)
    dup = rows_to([np.flatnonzero(duplicate_token_pattern(ids)[i]).tolist() for i in range(n)], n)
    uniform = np.full((n, n), 1 / n)
    A = np.stack([prev, ind, dup, uniform])                                          # (4 heads, n, n)
    assert pattern_score(A, previous_token_pattern(n)) == pytest.approx([8 / 9, 0, 0, 8 / 81])
    assert pattern_score(A, induction_pattern(ids)) == pytest.approx([0, 4 / 9, 0, 4 / 81])
    assert pattern_score(A, duplicate_token_pattern(ids)) == pytest.approx([0, 0, 4 / 9, 4 / 81])


def test_repeated_random_tokens_repeat_inside_the_template(minilm):
    ids = repeated_random_tokens(minilm, half=10, batch=3, prefix=(101,), suffix=(102,))
    assert ids.shape == (3, 22)
    assert (ids[:, 0] == 101).all() and (ids[:, -1] == 102).all()
    assert np.array_equal(ids[:, 1:11], ids[:, 11:21])
    special = {minilm.tokenizer.token_to_id(t) for t in ("[CLS]", "[SEP]", "[PAD]", "[MASK]", "[UNK]")}
    assert not special & set(ids[:, 1:-1].ravel().tolist())
    assert np.array_equal(ids, repeated_random_tokens(minilm, half=10, batch=3, prefix=(101,), suffix=(102,)))


def test_induction_scores_find_a_planted_induction_head(monkeypatch, minilm):
    """Replace the model's attention by a planted pattern: the detector must point at that head."""
    from qkv.models import model as model_module

    class Planted:
        def __init__(self, L, H):
            self.L, self.H = L, H

        def __call__(self, input_ids, attentions=True):
            B, n = input_ids.shape
            att = np.full((self.L, B, self.H, n, n), 1.0 / n)
            for b in range(B):
                P = induction_pattern(input_ids[b])
                rows = P.sum(-1) > 0
                att[3, b, 7][rows] = P[rows] / P[rows].sum(-1, keepdims=True)
            return model_module.Output(hidden=None, logits=None, attentions=att)

    monkeypatch.setattr(minilm, "forward", Planted(6, 12))
    scores = induction_scores(minilm, prefix=(101,), suffix=(102,))
    assert scores.shape == (6, 12)
    assert np.unravel_index(np.argmax(scores), scores.shape) == (3, 7)
    assert scores[3, 7] >= INDUCTION > np.delete(scores.ravel(), 3 * 12 + 7).max()


def test_default_model_previous_token_head_is_layer_0_head_2():
    report = analyse("minilm", ["The cat sat on the mat.", "Attention is all you need, said the paper."])
    prev = report.detectors["previous_token"]
    assert np.unravel_index(np.argmax(prev), prev.shape) == (0, 2)
    assert prev[0, 2] > 0.85
    assert np.allclose(prev, report.stats["prev"], atol=1e-6)           # TL's score equals Clark's prev here
    assert report.roles[0][2] == "previous"
    assert report.detectors["induction"].max() < INDUCTION              # an encoder: no induction heads


# ── roles ───────────────────────────────────────────────────────────────────────

def stats_with(**values) -> dict:
    """1 × len(values) heads of statistics: every statistic 0 except those given per head."""
    H = max(len(v) for v in values.values() if v is not None)
    s = {name: np.zeros((1, H)) for name in STATS}
    for name, v in values.items():
        s[name] = None if v is None else np.array([v], dtype=float)
    return s


def test_each_rule_names_its_head():
    s = stats_with(prev=[0.9, 0, 0, 0, 0, 0, 0, 0], next=[0, 0.6, 0, 0, 0, 0, 0, 0],
                   self=[0, 0, 0.7, 0, 0, 0, 0, 0], cls=[0, 0, 0, 0.8, 0, 0, 0, 0],
                   sep=[0, 0, 0, 0, 0.55, 0, 0, 0], punct=[0, 0, 0, 0, 0, 0.5, 0, 0],
                   entropy=[0, 0, 0, 0, 0, 0, 1.6, 1.4])
    induction = np.array([[0, 0, 0, 0, 0, 0, 0, INDUCTION]])
    roles = classify(s, uniform_entropy=2.0, induction=induction)
    assert roles == [["previous", "next", "self", "[CLS]", "[SEP]", "punctuation", "broad", "induction"]]


def test_thresholds_are_inclusive_and_below_them_is_mixed():
    just_below = DOMINANT - 1e-9
    s = stats_with(prev=[DOMINANT, just_below], entropy=[0.0, BROAD * 2.0 - 1e-9])
    assert classify(s, uniform_entropy=2.0) == [["previous", "mixed"]]


def test_first_is_a_role_only_without_cls():
    decoder = stats_with(first=[0.9], cls=None, sep=None)
    assert classify(decoder, uniform_entropy=2.0) == [["first"]]
    encoder = stats_with(first=[0.9], cls=[0.9])
    assert classify(encoder, uniform_entropy=2.0) == [["[CLS]"]]


def test_strength_is_the_number_behind_the_role():
    s = stats_with(prev=[0.9, 0], entropy=[0, 1.5])
    assert strength("previous", 0, 0, s, 2.0) == pytest.approx(0.9)
    assert strength("broad", 0, 1, s, 2.0) == pytest.approx(0.75)
    assert strength("mixed", 0, 1, s, 2.0) is None


def test_induction_stripe_scores_a_perfect_head_one():
    """On [bos] r r, a head whose second-copy rows look one past the first copy scores 1; the
    TransformerLens-style pattern score of the same head is capped near 0.5 (half the rows cannot match)."""
    from qkv.analysis.detectors import induction_stripe
    half, offset = 6, 1
    n = offset + 2 * half
    ids = np.concatenate([[0], np.arange(10, 10 + half), np.arange(10, 10 + half)])
    A = np.tril(np.ones((n, n)))
    A /= A.sum(1, keepdims=True)                                  # uniform causal attention
    perfect = A.copy()
    for i in range(offset + half, n):
        perfect[i] = 0
        perfect[i, i - half + 1] = 1
    assert induction_stripe(perfect, half, offset) == pytest.approx(1.0)
    assert induction_stripe(A, half, offset) < 0.2
    assert pattern_score(perfect, induction_pattern(ids)) < 0.55
    stacked = np.stack([A, perfect])                              # (..., n, n) → (...)
    np.testing.assert_allclose(induction_stripe(stacked, half, offset), [induction_stripe(A, half, offset), 1.0])
