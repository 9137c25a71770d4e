"""`qkv heads` on a real LLM: the detectors find SmolLM2's previous-token, duplicate-token and
induction heads (docs/heads.md, "SmolLM2-135M-Instruct"). The scores were measured with
`qkv heads --model smollm2 --file docs/heads-corpus.txt`; each test asserts them with a margin,
and fails if detection broke (a wrong pattern, a shifted diagonal, scores of the wrong heads)."""

from __future__ import annotations

import numpy as np
import pytest

from qkv.analysis import analyse
from qkv.analysis.detectors import top_heads

TEXTS = ["The cat sat on the mat.", "Attention is all you need, said the paper.",
         "She opened the window because the room was warm."]


@pytest.fixture(scope="module")
def report():
    return analyse("smollm2", TEXTS)


def test_a_strong_previous_token_head(report):
    prev = report.detectors["previous_token"]                       # measured: L16 h0 0.69 over 60 sentences
    layer, head, score = top_heads(prev, 1)[0]
    assert (layer, head) in {(16, 0), (11, 1), (1, 2)} and score > 0.55, top_heads(prev)
    assert np.allclose(prev, report.stats["prev"], atol=1e-6)      # TransformerLens's score = Clark's prev
    assert report.roles[16][0] == "previous" and np.percentile(prev, 90) < 0.35     # it stands out: 0.27 here


def test_an_induction_head_on_repeated_random_tokens(report):
    ind = report.detectors["induction"]                             # measured: L18 h6 0.434 (at most ≈ 0.5)
    assert top_heads(ind, 1)[0][:2] == (18, 6) and ind[18, 6] > 0.38, top_heads(ind)
    assert {(17, 3), (17, 4)} <= {(l, h) for l, h, _ in top_heads(ind, 4)}       # 0.38, 0.40
    assert report.roles[18][6] == "induction" and np.median(ind) < 0.05


def test_duplicate_token_heads_on_repeated_random_tokens(report):
    dup = report.detectors["duplicate_token_repeated"]               # measured: L14 h3 0.384, L8 h0 0.374
    assert {(l, h) for l, h, _ in top_heads(dup, 2)} == {(14, 3), (8, 0)} and dup.max() > 0.33, top_heads(dup)
    assert np.median(dup) < 0.05
