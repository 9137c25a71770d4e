"""The pipeline page draws each family's own boxes, with the engine's numbers: q/k norms, RoPE by layer
kind (none, a sliding layer's own base), Gemma 2's soft-cap and sliding windows, norms after each box,
a parallel residual, the MoE router's choice — and every box of every family opens without an error."""

from __future__ import annotations

import numpy as np
import pytest

import qkv
from qkv.viz.pipeline import save_pipeline
from conftest import MODELS
from test_browser import browser, tab  # noqa: F401 (fixtures)
from test_browser_pipeline import READY, SENTENCE, open_page, state

FAMILIES = ["gemma2", "gemma3_text", "smollm3", "gpt_neox", "olmo2", "qwen3", "mixtral", "qwen2_moe", "granite",
            "gptj", "roberta", "opt", "bloom", "falcon", "modernbert_local"]


def boxes(tab) -> list[str]:
    return tab.page.eval_on_selector_all(".qkv-p-box", "bs => bs.map(b => b.dataset.box)")


def open_box(tab, box: str) -> str:
    tab.page.click(f".qkv-p-box[data-box='{box}']")
    assert state(tab)["box"] == box and tab.page.locator(".qkv-p-detail .qkv-error").count() == 0
    return tab.page.text_content(".qkv-p-detail")


@pytest.mark.parametrize("name", FAMILIES)
def test_every_box_of_every_family_opens(tab, name, tmp_path):
    model = qkv.load(str(MODELS / name))
    open_page(tab, save_pipeline(model, SENTENCE if model.tokenizer else model.run(list(range(3, 12))), tmp_path / "p.html"))
    for layer in range(model.config.n_layers):
        tab.page.select_option(".qkv-p-layer", str(layer))
        for box in boxes(tab):
            open_box(tab, box)
    assert tab.errors == [] and tab.dialogs == []


def test_gemma2_shows_its_soft_cap_windows_and_norms(tab, tmp_path):
    model = qkv.load(str(MODELS / "gemma2"))
    cfg = model.config
    open_page(tab, save_pipeline(model, SENTENCE, tmp_path / "p.html"))
    assert "softcap" in boxes(tab) and "qknorm" not in boxes(tab)
    assert f"c = {cfg.attn_softcap:g}" in open_box(tab, "softcap")
    assert "Norm(Concat(Z)·W_O)" in open_box(tab, "out")
    assert f"c = {cfg.final_softcap:g}" in open_box(tab, "logits")
    n = len(model.run(SENTENCE).tokens)
    for layer in range(cfg.n_layers):
        tab.page.select_option(".qkv-p-layer", str(layer))
        text, w = open_box(tab, "mask"), cfg.window(layer)
        assert (f"sees the last {w} keys" in text) == (w is not None)
        masked = (np.arange(n)[None] > np.arange(n)[:, None]) | (w is not None and
                                                                 np.arange(n)[None] <= np.arange(n)[:, None] - (w or 0))
        A = model.run(SENTENCE).layers[layer].attentions
        assert np.all(A[:, masked] == 0)                                       # the page's mask is the engine's
    assert tab.errors == []


def test_rope_by_layer_kind_and_q_k_norms(tab, tmp_path):
    smol = qkv.load(str(MODELS / "smollm3"))
    open_page(tab, save_pipeline(smol, smol.run(list(range(3, 12))), tmp_path / "s.html"))
    for layer in range(smol.config.n_layers):
        tab.page.select_option(".qkv-p-layer", str(layer))
        assert ("has no RoPE" in open_box(tab, "rope")) == (smol.config.rope_kind(layer) is None)
    gemma3 = qkv.load(str(MODELS / "gemma3_text"))
    open_page(tab, save_pipeline(gemma3, SENTENCE, tmp_path / "g.html"))
    assert "over each head's d_k" in open_box(tab, "qknorm")
    for layer in range(gemma3.config.n_layers):
        tab.page.select_option(".qkv-p-layer", str(layer))
        assert ("is a sliding layer" in open_box(tab, "rope")) == (gemma3.config.rope_kind(layer) == "local")
    olmo = qkv.load(str(MODELS / "olmo2"))
    open_page(tab, save_pipeline(olmo, SENTENCE, tmp_path / "o.html"))
    assert "over the whole projection" in open_box(tab, "qknorm")
    neox = qkv.load(str(MODELS / "gpt_neox"))
    open_page(tab, save_pipeline(neox, SENTENCE, tmp_path / "n.html"))
    assert "parallel: the FFN reads X" in open_box(tab, "res2")
    assert tab.errors == []


def test_alibi_shows_each_heads_slope(tab, tmp_path):
    model = qkv.load(str(MODELS / "bloom"))
    open_page(tab, save_pipeline(model, SENTENCE, tmp_path / "p.html"))
    assert "alibi" in boxes(tab) and "rope" not in boxes(tab)
    from qkv.viz.pipeline_payload import arch_of

    slopes = arch_of(model)["alibi"]
    for h in range(model.config.n_heads):
        tab.page.select_option(".qkv-p-head-pick", str(h))
        text = open_box(tab, "alibi")
        import re

        shown = float(re.search(r"m_h = ([0-9.]+) for head (\d+)", text).group(1))
        assert f"for head {h})" in text and abs(shown - slopes[h]) <= 5.1e-6    # 5 decimals
    assert tab.errors == []


def test_the_router_box_is_the_engines_choice(tab, tmp_path):
    model = qkv.load(str(MODELS / "qwen2_moe"))
    trace = model.run(SENTENCE)
    open_page(tab, save_pipeline(model, trace, tmp_path / "p.html"))
    assert "router" in boxes(tab)
    page = tab.page
    page.click(".qkv-p-tok >> nth=2")
    for layer in range(model.config.n_layers):
        page.select_option(".qkv-p-layer", str(layer))
        text = open_box(tab, "router")
        lt = trace.layers[layer]
        if lt.experts is None:
            assert f"Layer {layer} is dense" in text
            continue
        rows = page.eval_on_selector_all(".qkv-p-detail .qkv-p-table tr",
                                         "rs => rs.slice(1).map(r => [...r.children].map(c => c.textContent))")
        assert [int(e) for e, _ in rows] == lt.experts[2].tolist()
        np.testing.assert_allclose([float(w) for _, w in rows], lt.expert_weights[2], atol=1e-4)
        assert "shared expert" in text
    assert tab.errors == []
