"""The viewer of an encoder–decoder in a real browser (Debian's Chromium, driven by Playwright, as
tests/test_browser.py): the encoder / decoder / cross selector, the cross view's target × source
matrix and its labels, the model view of each kind, and no request leaving the page."""

from __future__ import annotations

import numpy as np
import pytest

import qkv
from qkv.writing.seq2seq_generate import translation_trace
from qkv.viz.html import save_viewer
from qkv.viz import wire
from qkv.viz.payload import encode_attention
from qkv.viz.seq2seq import cross_written
from test_browser import assert_offline, browser, open_viewer, tab, tokens_shown  # noqa: F401 (fixtures)
from test_seq2seq_cli import SOURCE, marian_with_tokenizer

TARGET = "I go to school"


@pytest.fixture(scope="module")
def marian(tmp_path_factory):
    return qkv.load(marian_with_tokenizer(tmp_path_factory.mktemp("marian")))


@pytest.fixture(scope="module")
def school(marian):
    return translation_trace(marian, SOURCE, marian.encode(TARGET)[0])             # 5 target rows × 4 source tokens


def quantised(a: np.ndarray) -> np.ndarray:
    """The weights as the page holds them: one byte each (payload.encode_attention), as integers 0..255."""
    return np.rint(wire.decode(encode_attention(a[None, None]))[0, 0] * 255).astype(int)


def shown(q: int) -> str:
    """viewer.js fmt: a byte as the page prints it."""
    return "0.00" if q == 0 else "<0.01" if q / 255 < 0.01 else f"{q / 255:.2f}"


def cell_centre(page, i: int, j: int) -> tuple[float, float]:
    geo = page.eval_on_selector(".qkv-heat", "c => ({...c.dataset, box: c.getBoundingClientRect().toJSON()})")
    cell = float(geo["cell"])
    return (geo["box"]["x"] + float(geo["padL"]) + (j + 0.5) * cell,
            geo["box"]["y"] + float(geo["padT"]) + (i + 0.5) * cell)


def test_the_cross_view_draws_target_rows_against_source_columns(tab, marian, school, tmp_path):
    tab.page.context.set_offline(True)
    open_viewer(tab, save_viewer(school, tmp_path / "s2s.html", tokenizer=marian.tokenizer))
    page = tab.page
    cross = cross_written(school, marian.tokenizer)
    written, read, source = cross.labels, school.labels, school.encoder.labels
    assert written[:4] == ["I", "go", "to", "school"] and source == ["나는", "학교에", "간다", "</s>"]
    assert tab.state().items() >= {"kind": "cross", "view": "head", "layer": "0", "head": "all"}.items()
    pressed = page.eval_on_selector_all(".qkv-kind", "bs => bs.map(b => [b.textContent, b.getAttribute('aria-pressed')])")
    assert pressed == [["Encoder", "false"], ["Decoder", "false"], ["Cross", "true"]]
    assert tokens_shown(page, "q") == written and tokens_shown(page, "k") == source
    assert "cross-attention · 5 × 4 tokens · layer 0 · all heads" in page.text_content(".qkv-meta")
    caption = page.text_content(".qkv-caption")
    assert "labelled by the token it WROTE: row t is the query that produced target token t + 1" in caption
    q = [quantised(a) for a in cross.layer(0).attentions]                    # H × (n_tgt, n_src) bytes
    mean = np.floor(np.sum(q, axis=0) / 4 + 0.5).astype(int)                 # viewer.js selected(): Math.round
    j = int(np.argmax(mean[0]))
    assert f"when the decoder writes “I” it looks most at “{source[j]}” ({shown(mean[0, j])})" in caption

    page.click(".qkv-tab >> text=Matrix")
    page.select_option(".qkv-head", "2")
    a = quantised(cross.layer(0).attentions[2])                               # (5, 4)
    for i, j in [(0, 0), (1, 1), (3, 2), (4, 3)]:                             # the last row and the last column
        page.mouse.move(*cell_centre(page, i, j))
        assert tab.state()["cell"] == f"{i},{j}"
        assert page.text_content(".qkv-readout") == (
            f"writing “{written[i]}” (query {i}, reading “{read[i]}”) → “{source[j]}” (key {j}): {shown(a[i, j])}")
    page.mouse.move(*cell_centre(page, 5, 0))                                # no 6th row ...
    assert tab.state()["cell"] == ""
    page.mouse.move(*cell_centre(page, 0, 4))                                # ... and no 5th column
    assert tab.state()["cell"] == ""

    page.click(".qkv-tab >> text=Model view")
    assert page.locator(".qkv-thumb").count() == 2 * 4
    size = page.eval_on_selector(".qkv-thumb canvas", "c => [c.clientWidth, c.clientHeight]")
    assert size[0] < size[1]                                                  # 5 rows × 4 columns: taller than wide
    assert "cross-attention (rows = target tokens written, columns = source tokens" in page.text_content(".qkv-model")
    page.click(".qkv-thumb[data-layer='1'][data-head='3']")
    assert tab.state().items() >= {"kind": "cross", "view": "head", "layer": "1", "head": "3"}.items()
    assert_offline(tab)
    assert tab.errors == [] and tab.dialogs == []


def test_the_selector_switches_to_each_stacks_self_attention(tab, marian, school, tmp_path):
    open_viewer(tab, save_viewer(school, tmp_path / "s2s.html", tokenizer=marian.tokenizer))
    page = tab.page
    page.click(".qkv-tab >> text=Matrix")
    page.select_option(".qkv-layer", "1")
    page.select_option(".qkv-head", "1")
    page.click(".qkv-kind >> text=Encoder")                                   # the view, layer and head stay
    assert tab.state().items() >= {"kind": "encoder", "view": "matrix", "layer": "1", "head": "1"}.items()
    assert "encoder self-attention · 4 tokens · layer 1 · head 1" in page.text_content(".qkv-meta")
    a = quantised(school.encoder.layer(1).attentions[1])                      # (4, 4)
    page.mouse.move(*cell_centre(page, 3, 0))
    assert page.text_content(".qkv-readout") == f"“</s>” (query 3) → “나는” (key 0): {shown(a[3, 0])}"
    page.click(".qkv-tab >> text=Head view")
    assert tokens_shown(page, "q") == tokens_shown(page, "k") == school.encoder.labels

    page.click(".qkv-kind >> text=Decoder")
    assert tab.state()["kind"] == "decoder"
    assert tokens_shown(page, "q") == tokens_shown(page, "k") == ["<pad>", "I", "go", "to", "school"]
    assert page.locator(".qkv-tab >> text=Next token").count() == 0           # a given target: nothing generated
    page.click(".qkv-tab >> text=Model view")
    assert page.locator(".qkv-thumb").count() == 2 * 4
    assert "grey: masked" in page.text_content(".qkv-model")                  # causal
    page.click(".qkv-kind >> text=Cross")
    assert tab.state().items() >= {"kind": "cross", "view": "model"}.items()
    assert_offline(tab)
    assert tab.errors == [] and tab.dialogs == []


def test_a_translations_decoder_has_the_next_token_view(tab, marian, tmp_path):
    trace = marian.generate(SOURCE, 6, temperature=1, seed=1, trace=True)
    open_viewer(tab, save_viewer(trace, tmp_path / "gen.html", tokenizer=marian.tokenizer))
    page = tab.page
    page.click(".qkv-kind >> text=Decoder")
    page.click(".qkv-tab >> text=Next token")
    assert tab.state().items() >= {"kind": "decoder", "view": "next", "step": "1"}.items()
    assert page.locator(".qkv-step").count() == 6 and page.is_hidden(".qkv-caption")
    page.click(".qkv-kind >> text=Cross")                                     # no next-token view here: head view
    state = tab.state()
    assert state["view"] == "head" and "step" not in state and "temperature" not in state
    assert tokens_shown(page, "q")[:6] == [marian.tokenizer.id_to_token(int(i)) for i in trace.ids[1:]]
    assert tab.errors == []
