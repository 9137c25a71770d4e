"""The viewer's router panel (mixtures of experts) in a real browser (Debian's Chromium, Playwright, the
network blocked): the Experts tab follows the Layer selector, each token's row names its experts with
their weights as the trace holds them, a dense layer says it has no router, hostile tokens stay text.
Fixtures as in test_browser.py."""

from __future__ import annotations

import numpy as np

import qkv
from conftest import MODELS, reference
from test_browser import assert_offline, browser, open_viewer, tab  # noqa: F401  (fixtures)
from test_viewer import XSS, data_of
from qkv.viz.html import save_viewer


def test_the_router_panel_shows_each_tokens_experts_and_weights(tab, tmp_path):
    model = qkv.load(MODELS / "qwen2_moe")                      # layers 0 and 2 routed, layer 1 dense
    trace = model.run(reference("qwen2_moe")["single_input_ids"][0][:6])
    trace.tokens[1] = XSS
    path = save_viewer(trace, tmp_path / "moe.html", view="router")
    data = data_of(path.read_text())
    assert data["router"]["layers"] == [0, 2]
    open_viewer(tab, path)
    page = tab.page
    assert tab.state()["view"] == "router"
    for layer in (0, 2):
        page.select_option(".qkv-field select >> nth=0", str([0, 1, 2].index(layer)))
        assert tab.state()["layer"] == str(layer)
        rows = page.eval_on_selector_all(".qkv-router-table tr", "rs => rs.slice(1).map(r => r.children[1].textContent)")
        t = trace.layer(layer)
        weights = data["router"]["weights"][data["router"]["layers"].index(layer)]     # as the payload holds them
        np.testing.assert_allclose(weights, t.expert_weights, atol=5e-5)
        assert rows == [" · ".join(f"{e}: {w:.2f}" for e, w in zip(t.experts[i], weights[i]))
                        for i in range(len(trace.tokens))]
        chosen = page.eval_on_selector_all(".qkv-router-chosen", "cs => cs.map(c => [+c.dataset.token, +c.dataset.expert])")
        assert sorted(chosen) == sorted([i, int(e)] for i in range(len(trace.tokens)) for e in t.experts[i])
        page.hover(f".qkv-router-cell[data-token='1'][data-expert='{int(t.experts[1][0])}']")
        assert "chosen (#1)" in page.text_content(".qkv-panel.qkv-router .qkv-readout")
    page.select_option(".qkv-field select >> nth=0", "1")
    assert "dense FFN" in page.text_content(".qkv-panel.qkv-router")
    assert page.evaluate("() => document.querySelectorAll('img').length") == 0
    page.select_option(".qkv-field select >> nth=0", "0")
    assert page.text_content(".qkv-panel.qkv-router .qkv-router-tok >> nth=1").startswith("<img")   # as text
    assert tab.dialogs == [] and tab.errors == []
    assert_offline(tab)
