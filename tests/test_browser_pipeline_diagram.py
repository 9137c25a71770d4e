"""The pipeline page's attention diagram in Chromium: Q × Kᵀ = S → softmax → A, A × V = Z drawn from the engine's
arrays, and the arithmetic of any cell of S, A and Z (hovered or reached with the keyboard) equal to the engine's
float32 value; its products lit one by one; a layer the page does not hold says how to get it (and in `qkv serve`
gets it); Korean; a phone-sized screen; the flow's boxes carry their arrays small."""

from __future__ import annotations

import math

import numpy as np
import pytest

import qkv
import qkv.viz.pipeline_payload as pipeline_payload
from qkv.viz.pipeline import save_pipeline
from qkv.viz.pipeline_text import TEXTS
from conftest import MODELS, running_server
from test_browser import assert_offline, browser, tab  # noqa: F401 (fixtures)
from test_browser_pipeline import READY, SENTENCE, open_page, state

PANEL = ".qkv-p-arith"


@pytest.fixture(scope="module")
def llama():
    return qkv.load(str(MODELS / "llama_gqa"))                  # 2 layers, 8 query heads, 2 K/V heads


def arith(tab) -> dict:
    return tab.page.eval_on_selector(PANEL, "e => Object.assign({}, e.dataset)")


def worked(tab) -> tuple[str, int, int, float, float]:
    a = arith(tab)
    return a["matrix"], int(a["i"]), int(a["j"]), float(a["result"]), float(a["engine"])


def press(tab, matrix: str, keys: list[str]) -> None:
    tab.page.focus(f".qkv-p-grid[data-matrix='{matrix}']")
    for k in keys:
        tab.page.keyboard.press(k)


def test_every_cell_of_S_A_and_Z_is_worked_out_as_the_engine(tab, llama, tmp_path):
    trace = llama.run(SENTENCE)
    n, L, h = len(trace.tokens), 1, 5
    t = trace.layers[L]
    G = llama.config.n_heads // llama.config.n_kv_heads
    q, k, v = (x.astype(np.float64) for x in (t.q[h], t.k[h // G], t.v[h // G]))       # (n, d_k)
    scale = 1 / math.sqrt(q.shape[-1])
    tab.page.context.set_offline(True)
    open_page(tab, save_pipeline(llama, trace, tmp_path / "p.html", layer=L, head=h, box="scores"))
    page = tab.page
    assert page.locator(".qkv-p-grid").count() == 6                            # Q, Kᵀ, S, A, V, Z
    # S: every cell, reached with the arrow keys from the top-left corner
    press(tab, "S", ["Home"] + ["ArrowUp"] * n)
    for i in range(n):
        for j in range(n):
            matrix, gi, gj, value, engine = worked(tab)
            assert (matrix, gi, gj) == ("S", i, j)
            assert engine == float(t.scores[h, i, j])                         # the engine's own float32
            if j > i:                                                           # causal: masked, −∞
                assert value == engine == -np.inf
                assert page.locator(".qkv-p-ar-masked").count() == 1
            else:
                assert abs(value - engine) <= 1e-5 and abs(value - q[i] @ k[j] * scale) <= 1e-9
                products = [float(x) for x in page.eval_on_selector_all(".qkv-p-term", "ts => ts.map(t => t.dataset.term)")]
                assert np.allclose(products, q[i] * k[j], atol=1e-12)          # the d_k products themselves
            page.keyboard.press("ArrowRight")
        page.keyboard.press("ArrowDown")
        page.keyboard.press("Home")
    # A: the softmax of S's row, by the pointer (the cell under the mouse)
    page.click(".qkv-p-box[data-box='attn']")
    grid = page.locator(".qkv-p-grid[data-matrix='A']")
    box = grid.bounding_box()
    for i, j in [(0, 0), (3, 1), (n - 1, 2), (n - 1, n - 1), (2, 4)]:
        page.mouse.move(box["x"] + (j + 0.5) * box["width"] / n, box["y"] + (i + 0.5) * box["height"] / n)
        matrix, gi, gj, value, engine = worked(tab)
        assert (matrix, gi, gj) == ("A", i, j) and engine == float(t.attentions[h, i, j])
        assert abs(value - engine) <= 1e-6
    # Z = A·V: component c of row i, the products A[i, j]·v_j[c] summed over the keys
    page.click(".qkv-p-box[data-box='z']")
    press(tab, "Z", ["ArrowDown"] * 2 + ["ArrowRight"] * 7)
    matrix, i, c, value, engine = worked(tab)
    assert matrix == "Z" and i == n - 1 and c == 7                            # the row starts at the chosen token
    assert engine == float(t.heads[h, i, c]) and abs(value - engine) <= 1e-6
    assert abs(value - t.attentions[h, i].astype(np.float64) @ v[:, c]) <= 1e-9
    assert tab.errors == [] and tab.dialogs == []
    assert_offline(tab)


def test_the_products_light_up_one_by_one_with_the_running_sum(tab, llama, tmp_path):
    """The page's clock is Playwright's, stopped: the animation moves only as the test moves the clock (the real one
    would let a busy machine's page finish it between two of the test's looks)."""
    page = tab.page
    page.clock.install(time=0)
    page.clock.pause_at(1000)                                                   # before the page exists
    open_page(tab, save_pipeline(llama, SENTENCE, tmp_path / "p.html", box="scores"))
    lit = lambda: page.locator(".qkv-p-term.qkv-p-lit").count()
    terms = page.locator(".qkv-p-term").count()
    assert lit() == 0 and terms > 2
    page.clock.run_for(130)                                                     # ≥ 2 steps (8–60 ms each)
    assert 0 < lit() < terms and "/" in page.text_content(".qkv-p-running")     # part way through, summing
    page.clock.run_for(1600)                                                    # all of it takes 1.5 s at most
    assert lit() == terms and page.text_content(".qkv-p-running") == ""
    page.click(".qkv-p-replay")
    assert lit() < terms
    page.emulate_media(reduced_motion="reduce")                                 # no animation at all
    page.reload()
    page.wait_for_selector(READY)
    page.clock.run_for(5000)
    assert lit() == 0 and page.text_content(".qkv-p-running") == ""
    assert tab.errors == []


def test_a_layer_the_page_does_not_hold_says_how_to_get_it(tab, llama, tmp_path, monkeypatch):
    monkeypatch.setattr(pipeline_payload, "ARITHMETIC_MB", 0)                   # room for the start layer only
    open_page(tab, save_pipeline(llama, SENTENCE, tmp_path / "p.html", layer=1, box="attn"))
    page = tab.page
    assert page.locator(PANEL).count() == 1
    page.select_option(".qkv-p-layer", "0")
    assert page.locator(PANEL).count() == 0
    note = page.text_content(".qkv-p-ar-missing")
    assert "layers 1–1" in note and "--layer 0" in note and page.locator(".qkv-p-ar-load").count() == 0
    page.click(".qkv-p-lang")
    assert "--layer 0" in page.text_content(".qkv-p-ar-missing") and state(tab)["lang"] == "ko"
    assert tab.errors == []


def test_the_web_app_asks_the_engine_for_a_layer_it_lacks(tab, monkeypatch):
    monkeypatch.setattr(pipeline_payload, "ARITHMETIC_MB", 0)
    model = qkv.load(str(MODELS / "gpt2"))
    trace = model.run(SENTENCE)
    with running_server(str(MODELS / "gpt2")) as srv:
        page = tab.page
        page.goto(srv.url)
        page.click(".qkv-mode[data-mode='pipeline']")
        page.wait_for_selector(READY)
        page.select_option(".qkv-p-layer", "1")
        page.click(".qkv-p-box[data-box='attn']")
        page.evaluate("() => { document.querySelector('[data-qkv-pipeline]').dataset.ready = ''; }")
        page.click(".qkv-p-ar-load")
        page.wait_for_selector(READY)
        assert state(tab).items() >= {"layer": "1", "box": "attn"}.items()
        matrix, i, j, value, engine = worked(tab)
        assert matrix == "A" and engine == float(trace.layers[1].attentions[0, i, j]) and abs(value - engine) <= 1e-6
    assert tab.errors == [] and tab.dialogs == []


def test_korean_a_phone_and_the_flow_drawn_with_its_arrays(tab, llama, tmp_path):
    page = tab.page
    page.set_viewport_size({"width": 390, "height": 844})
    open_page(tab, save_pipeline(llama, SENTENCE, tmp_path / "p.html", lang="ko", box="z"))
    assert page.text_content(".qkv-p-diagram-title") == TEXTS["ko"]["p_ar_title"]
    assert page.evaluate("() => document.documentElement.scrollWidth") <= 390         # nothing sideways
    for grid in page.locator(".qkv-p-grid").all():
        b = grid.bounding_box()
        assert b["x"] >= 0 and b["x"] + b["width"] <= 390
    press(tab, "Z", ["ArrowLeft"])
    assert arith(tab)["matrix"] == "Z"
    # the flow: vector boxes carry every token's |x| as a strip, S, mask and A boxes the head's n × n
    thumbs = page.eval_on_selector_all(".qkv-p-box", "bs => bs.map(b => [b.dataset.box, "
                                       "b.querySelector('canvas') ? b.querySelector('canvas').width : 0])")
    drawn = dict(thumbs)
    assert drawn["embed"] == drawn["res1"] == drawn["ffn"] == 96 and drawn["scores"] == drawn["attn"] == 36
    assert drawn["tokens"] == 0 and drawn["probs"] == 0
    assert tab.errors == []


@pytest.mark.parametrize("name", ["gemma2", "bloom"])                 # a soft-cap; ALiBi's bias
def test_a_familys_own_terms_are_in_the_sum(tab, name, tmp_path):
    model = qkv.load(str(MODELS / name))
    trace = model.run(SENTENCE)
    open_page(tab, save_pipeline(model, trace, tmp_path / "p.html", layer=1, head=1, box="scores"))
    press(tab, "S", ["Home", "ArrowLeft"])
    text = tab.page.text_content(PANEL)
    assert ("tanh" in text) == (name == "gemma2") and ("ALiBi" in text) == (name == "bloom")
    n = len(trace.tokens)
    for _ in range(n):
        matrix, i, j, value, engine = worked(tab)
        assert engine == float(trace.layers[1].scores[1, i, j]) and abs(value - engine) <= 1e-5
        tab.page.keyboard.press("ArrowRight")
    assert tab.errors == []


def test_cross_attention_is_worked_out_over_the_source(tab, tmp_path):
    model = qkv.load("ko-en-tiny")
    open_page(tab, save_pipeline(model, "나는 학교에 간다", tmp_path / "p.html", layer=1, head=2, box="xattn"))
    page = tab.page
    ids = [int(i) for i in page.evaluate("() => JSON.parse(document.querySelector('.qkv-pipeline-data').textContent)"
                                         ".stacks.decoder.ids")]
    trace = model.run("나는 학교에 간다", ids)
    t, m = trace.cross.layers[1], len(trace.encoder.tokens)
    assert page.eval_on_selector(".qkv-p-grid[data-matrix='S']", "c => c.qkvData.cols") == m
    press(tab, "A", ["End"])
    matrix, i, j, value, engine = worked(tab)
    assert (matrix, j) == ("A", m - 1) and engine == float(t.attentions[2, i, j]) and abs(value - engine) <= 1e-6
    page.click(".qkv-p-box[data-box='xz']")
    press(tab, "Z", ["ArrowRight"] * 3)
    matrix, i, c, value, engine = worked(tab)
    assert (matrix, c) == ("Z", 3) and engine == float(t.heads[2, i, c]) and abs(value - engine) <= 1e-6
    page.click(".qkv-p-stack[data-stack='encoder']")                  # the encoder's own self-attention
    page.click(".qkv-p-box[data-box='scores']")
    press(tab, "S", ["ArrowUp"])
    matrix, i, j, value, engine = worked(tab)
    assert engine == float(trace.encoder.layers[1].scores[2, i, j]) and abs(value - engine) <= 1e-5
    assert tab.errors == []
