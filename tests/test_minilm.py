"""The real default model (all-MiniLM-L6-v2) against transformers' outputs on real sentences."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import FIXTURES, TOL_ATTENTION, TOL_HIDDEN, max_abs

SENTENCES = sorted((FIXTURES / "minilm").glob("sentence_*.npz"))


def load_ref(path):
    with np.load(path) as z:
        return {k: z[k] for k in z.files}


def test_fixtures_cover_a_non_english_sentence():
    texts = [str(load_ref(p)["text"]) for p in SENTENCES]
    assert len(texts) >= 4 and any(any(ord(c) > 0x3000 for c in t) for t in texts)


@pytest.mark.parametrize("path", SENTENCES, ids=lambda p: p.stem)
def test_sentence_equals_reference(minilm, path):
    ref = load_ref(path)
    trace = minilm.run(str(ref["text"]))
    assert trace.tokens == ref["tokens"].tolist()
    assert trace.ids.tolist() == ref["ids"].tolist()
    assert max_abs(trace.hidden, ref["hidden"]) <= TOL_HIDDEN
    assert max_abs(trace.attentions, ref["attentions"]) <= TOL_ATTENTION


def test_padded_batch_equals_reference(minilm):
    ref = load_ref(FIXTURES / "minilm" / "batch.npz")
    out = minilm.forward(ref["input_ids"], ref["attention_mask"])
    valid = ref["attention_mask"].astype(bool)
    assert max_abs(out.hidden[valid], ref["hidden"][valid]) <= TOL_HIDDEN
    for b in range(len(valid)):
        rows = valid[b]
        assert max_abs(out.attentions[:, b][:, :, rows], ref["attentions"][:, b][:, :, rows]) <= TOL_ATTENTION


def test_layer0_head2_looks_at_the_previous_token(minilm):
    """The first thing `make demo` shows: a previous-token head (Clark et al. 2019)."""
    a = minilm.run("The cat sat on the mat", layers=[0], keep=("attentions",)).layer(0).attentions[2]
    prev = np.mean([a[i, i - 1] for i in range(1, len(a))])
    assert prev > 0.99
    assert prev == pytest.approx(float(load_ref(SENTENCES[0])["prev_head_l0h2"]), abs=1e-4)
