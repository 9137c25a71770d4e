"""The viewer's Disentangled panel (DeBERTa's three score tables) in a real browser (Debian's Chromium, Playwright,
the network blocked): c2c, c2p, p2c and their sum S drawn side by side for the Layer selector's layer, a cell's
readout giving each term as the trace holds it (to f16's 3 digits) and S their sum, hostile tokens staying text.
Fixtures as in test_browser.py."""

from __future__ import annotations

import re

import pytest

import qkv
from conftest import MODELS, reference
from test_browser import assert_offline, browser, open_viewer, tab  # noqa: F401  (fixtures)
from test_viewer import XSS, data_of
from qkv.analysis.sections import sections_keep
from qkv.viz.html import save_viewer

NUMBER = r"([+−]?[<\d.]+)"


def _readout(page) -> dict[str, float]:
    text = page.text_content(".qkv-panel.qkv-disentangled .qkv-readout")
    return {name: float(v.replace("−", "-")) for name, v in re.findall(rf"(c2c|c2p|p2c|S) {NUMBER}", text)}


def test_the_panel_draws_each_term_and_their_sum(tab, tmp_path):
    model = qkv.load(MODELS / "deberta_v3")
    ids = reference("deberta_v3")["single_input_ids"][0][:7]
    trace = model.run(ids, keep=sections_keep(model, len(ids)))
    trace.tokens[1] = XSS
    path = save_viewer(trace, tmp_path / "deberta.html", view="disentangled")
    data = data_of(path.read_text())
    assert data["disentangled"]["layers"] == [0, 1] and data["disentangled"]["terms"] == ["c2c", "c2p", "p2c"]
    open_viewer(tab, path)
    page = tab.page
    assert tab.state()["view"] == "disentangled"
    assert page.eval_on_selector_all(".qkv-panel.qkv-disentangled canvas.qkv-heat",
                                     "cs => cs.length") == 4                     # c2c, c2p, p2c, S
    for layer in (0, 1):
        page.select_option(".qkv-field select >> nth=0", str(layer))
        canvas = page.locator(".qkv-heat-disentangled-c2p")
        box = canvas.evaluate("c => Object.assign({}, c.dataset)")
        assert tab.state()["layer"] == str(layer)
        x, y = (float(box["padL"]) + 1.5 * float(box["cw"]), float(box["padT"]) + 1.5 * float(box["ch"]))
        canvas.hover(position={"x": x, "y": y})                              # the cell (query 1, key 1)
        got = _readout(page)
        t = trace.layer(layer)
        want = {name: float(getattr(t, f"scores_{name}")[:, 1, 1].mean()) for name in ("c2c", "c2p", "p2c")}
        for name, value in want.items():
            assert abs(got[name] - value) <= 2e-3 + 1e-3 * abs(value), (name, got, want)
        assert abs(got["S"] - sum(want.values())) <= 5e-3                     # S = c2c + c2p + p2c
        assert int(box["rows"]) == int(box["cols"]) == len(ids)
    assert "<img" in page.text_content(".qkv-panel.qkv-disentangled .qkv-readout")   # the hostile token as text
    assert page.evaluate("() => document.querySelectorAll('img').length") == 0
    assert tab.dialogs == [] and tab.errors == []
    assert_offline(tab)


def test_a_model_without_the_terms_has_no_panel(tmp_path):
    model = qkv.load(MODELS / "bert")
    trace = model.run(reference("bert")["input_ids"][0][:5])
    data = data_of(save_viewer(trace, tmp_path / "bert.html").read_text())
    assert data["disentangled"] is None


@pytest.mark.parametrize("name", ["deberta_v3", "deberta_v2"])          # deberta_v2: the first layer's convolution
def test_the_pipeline_page_works_s_out_with_the_terms(tab, tmp_path, name):
    """The pipeline page of DeBERTa: every box opens, and a hovered score is worked out as scale·q·kᵀ plus what S
    adds (c2p + p2c, the page's bias), equal to the engine's S."""
    from qkv.viz.pipeline import save_pipeline
    from test_browser_pipeline import SENTENCE, open_page
    from test_browser_pipeline_diagram import worked, press

    model = qkv.load(MODELS / name)
    trace = model.run(SENTENCE if model.tokenizer else list(range(3, 12)))
    open_page(tab, save_pipeline(model, trace, tmp_path / "p.html", layer=1, head=1, box="scores"))
    press(tab, "S", ["Home", "ArrowLeft"])
    for _ in range(len(trace.tokens)):
        matrix, i, j, value, engine = worked(tab)
        assert engine == float(trace.layers[1].scores[1, i, j]) and abs(value - engine) <= 1e-5
        tab.page.keyboard.press("ArrowRight")
    for layer in range(model.config.n_layers):
        tab.page.select_option(".qkv-p-layer", str(layer))
        for box in tab.page.eval_on_selector_all(".qkv-p-box", "bs => bs.map(b => b.dataset.box)"):
            tab.page.click(f".qkv-p-box[data-box='{box}']")
            assert tab.page.locator(".qkv-p-detail .qkv-error").count() == 0
    assert tab.errors == [] and tab.dialogs == []
