"""The viewer at 4,096 tokens, in a real browser (Debian's Chromium, Playwright, the network blocked; fixtures
as in test_browser.py).

A tiny random Llama (2 layers × 8 heads) reads 4,096 tokens: all its weights would be 268 MB, past the page's
80 MB, so the page holds each query row's 32 largest (payload.attention_payload). The head view, the matrix
(zoomed and panned to the last rows), the model view and the Next token tab work there, what they show is the
engine's attention_top within the page's byte, and the page says what it keeps.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import qkv
from test_browser import assert_offline, browser, open_viewer, tab, tokens_shown  # noqa: F401  (fixtures)
from test_browser_export import copied, export, png_size, svg_of
from conftest import MODELS
from qkv.viz import payload
from qkv.viz.html import save_viewer

N = 4096


class Spelling:
    """A tokenizer for random ids: id 17 is "t17"."""
    def decode(self, ids):
        return "".join(f"t{i}" for i in ids)

    def id_to_token(self, i):
        return f"t{i}"


@pytest.fixture(scope="module")
def long_trace():
    model = qkv.load(MODELS / "llama_gqa").with_config(max_positions=N)
    ids = np.random.default_rng(0).integers(3, model.config.vocab_size, size=N).tolist()
    trace = model.run(ids, keep=("attention_top",), top=payload.MAX_TOP)
    return dataclasses.replace(trace, prompt_length=N - 4)          # read as a prompt and 4 generated tokens


@pytest.fixture(scope="module")
def long_page(long_trace, tmp_path_factory):
    return save_viewer(long_trace, tmp_path_factory.mktemp("long") / "long.html", tokenizer=Spelling())


def shown_weight(trace, layer: int, head: int, i: int, j: int) -> int | None:
    """The byte the page shows for (i, j) of a head: its kept weight, or None when j is not among row i's
    largest (or rounds to 0)."""
    top = trace.layers[layer].attention_top
    where = np.flatnonzero(top.index[0, head, i] == j) if top.index.ndim == 4 else np.flatnonzero(top.index[head, i] == j)
    if not len(where):
        return None
    w = (top.weight[0] if top.weight.ndim == 4 else top.weight)[head, i, where[0]]
    q = int(np.floor(np.clip(w, 0, 1) * 255 + 0.5))
    return q or None


def as_shown(x: float) -> str:
    """A weight as the page writes it: its byte, as viewer.js's fmt."""
    q = int(np.floor(np.clip(x, 0, 1) * 255 + 0.5))
    return "0.00" if q == 0 else "<0.01" if q / 255 < 0.01 else f"{q / 255:.2f}"


def head_top(trace, layer: int):
    """(index, weight, rest) of LAYER, (H, n, K) / (H, n)."""
    t = trace.layers[layer].attention_top
    return (t.index[0], t.weight[0], t.rest[0]) if t.index.ndim == 4 else (t.index, t.weight, t.rest)


def test_a_4096_token_page_opens_says_what_it_keeps_and_the_head_view_shows_the_kept_keys(tab, long_trace,
                                                                                            long_page):
    assert long_page.stat().st_size <= 60e6
    open_viewer(tab, long_page)
    page = tab.page
    page.select_option(".qkv-layer", "1")                  # a layer maybe not inflated yet: the view waits for it
    page.wait_for_selector("[data-qkv-root][data-decoded='all']")   # the rest, after the first paint
    root = tab.state()
    assert int(root["paintedAt"]) >= int(root["readyAt"]) and "waiting" not in root
    assert_offline(tab)
    rule = page.text_content(".qkv-rule")
    assert "each query row's 32 largest weights" in rule and "268.4 MB" in rule and page.is_visible(".qkv-rule")
    assert len(tokens_shown(page)) == N
    page.select_option(".qkv-layer", "1")
    page.select_option(".qkv-head", "3")
    page.eval_on_selector(f".qkv-col-q .qkv-tok:nth-child({N - 95})",
                          "t => t.dispatchEvent(new MouseEvent('mouseover', {bubbles: true}))")
    i = N - 96
    assert tab.state()["hover"] == f"q{i}"
    index, weight, rest = head_top(long_trace, 1)
    shaded = set(page.eval_on_selector_all(".qkv-col-k .qkv-tok", "ts => ts.flatMap((t, j) => t.style.background ? [j] : [])"))
    want = {int(j) for j, w in zip(index[3, i], weight[3, i]) if np.floor(w * 255 + 0.5) >= 1}
    assert shaded == want and len(want) > 1
    hint = page.text_content(".qkv-chips .qkv-hint:last-child")
    left = rest[3, i] + sum(w for w in weight[3, i] if np.floor(w * 255 + 0.5) < 1)
    assert f"keys not drawn hold {as_shown(left)} of this row" in hint
    got = copied(tab)                                                 # the kept pairs, not 4,096² numbers
    assert got["head"] == 3 and "32 largest" in got["kept"] and len(got["attention_top"]) == N
    assert [j for j, _ in got["attention_top"][i]] == sorted(want) and abs(got["rest"][i] - left) <= 0.003
    assert tab.errors == []


def test_the_matrix_zooms_and_pans_to_the_last_rows_and_reads_the_kept_weights(tab, long_trace, long_page):
    open_viewer(tab, long_page)
    page = tab.page
    page.click(".qkv-tab >> text=Matrix")
    page.select_option(".qkv-head", "5")
    geo = lambda: page.eval_on_selector(".qkv-heat", "c => ({...c.dataset, box: c.getBoundingClientRect().toJSON()})")
    g = geo()
    assert (int(g["rows"]), int(g["cols"]), int(g["i0"]), int(g["j0"])) == (N, N, 0, 0) and float(g["cell"]) < 1
    assert "each pixel the largest of" in page.text_content(".qkv-zoom")
    x0, y0 = g["box"]["x"] + float(g["padL"]), g["box"]["y"] + float(g["padT"])
    base = float(g["cell"])
    page.mouse.move(x0 + 4000 * base, y0 + 4050 * base)               # the wheel zooms about the pointer
    for _ in range(40):                                               # to labels (10 px a cell): ~56 rows shown
        page.mouse.wheel(0, -100)
        page.wait_for_timeout(20)
        if float(geo()["cell"]) >= 10:
            break
    g = geo()
    cell, i0, j0, rows = float(g["cell"]), int(g["i0"]), int(g["j0"]), int(g["rows"])
    assert cell >= 10 and abs(i0 - 4050) < rows and abs(j0 - 4000) < int(g["cols"])
    page.focus(".qkv-heat")
    page.keyboard.press("ArrowDown")                                  # pan a quarter of the window down
    g = geo()
    assert int(g["i0"]) > i0 or int(g["i0"]) + int(g["rows"]) >= N
    i0, j0 = int(g["i0"]), int(g["j0"])
    x0, y0 = g["box"]["x"] + float(g["padL"]), g["box"]["y"] + float(g["padT"])
    index, weight, rest = head_top(long_trace, 0)
    seen = {"kept": 0, "not kept": 0}
    shown = [(i, j) for i in range(i0, i0 + int(g["rows"]) - 1)       # cells whole on screen
             for j in range(j0, j0 + int(g["cols"]) - 1)]
    kept = [c for c in shown if shown_weight(long_trace, 0, 5, *c) is not None]
    for i, j in shown[::97] + kept[:8]:
        di, dj = i - i0, j - j0
        page.mouse.move(x0 + (dj + 0.5) * cell, y0 + (di + 0.5) * cell)
        assert tab.state()["cell"] == f"{i},{j}"
        text = page.text_content(".qkv-readout")
        assert text.startswith(f"“{long_trace.labels[i]}” (query {i}) → “{long_trace.labels[j]}” (key {j}): ")
        q = shown_weight(long_trace, 0, 5, i, j)
        if j > i:
            assert text.endswith(": masked")
        elif q is None:
            seen["not kept"] += 1
            left = float(rest[5, i] + sum(w for w in weight[5, i] if np.floor(w * 255 + 0.5) < 1))
            assert "not among the row's 32 largest" in text
            assert text.endswith(f"hold {as_shown(left)} together)")
        else:
            seen["kept"] += 1
            assert text.endswith(f": {as_shown(q / 255)}")
    assert seen["kept"] and seen["not kept"]
    page.keyboard.press("0")                                          # the whole matrix again
    assert (int(geo()["rows"]), int(geo()["i0"])) == (N, 0)
    assert tab.errors == []


def test_the_model_view_and_the_next_token_tab_work_at_4096_tokens(tab, long_trace, long_page):
    open_viewer(tab, long_page)
    page = tab.page
    page.click(".qkv-tab >> text=Model view")
    assert page.locator(".qkv-thumb").count() == 2 * 8
    page.click(".qkv-thumb[data-layer='1'][data-head='6']")
    assert tab.state().items() >= {"view": "head", "layer": "1", "head": "6"}.items()
    page.click(".qkv-tab >> text=Next token")
    assert page.locator(".qkv-step").count() == 4
    best = int(np.argmax(long_trace.logits[N - 5]))                   # what the row before the first new token predicts
    assert page.text_content(".qkv-cands tbody .qkv-ctok") == f"t{best}"
    assert tab.errors == []


@pytest.mark.parametrize("view", ["Head view", "Matrix"])
def test_a_4096_token_view_exports_as_png_and_svg(tab, long_page, view):
    """The head view is 4,096 rows tall: its PNG stays within a canvas's limits (32,000 pixels a side)."""
    open_viewer(tab, long_page)
    tab.page.click(f".qkv-tab >> text={view}")
    name, png = export(tab, "png")
    assert name.endswith(".png")
    w, h, inked = png_size(png)
    assert inked and 600 < max(w, h) <= 32000 and min(w, h) > 200
    name, svg = export(tab, "svg")
    assert name.endswith(".svg") and len(list(svg_of(svg).iter("{http://www.w3.org/2000/svg}image"))) >= 1
    assert tab.errors == []
