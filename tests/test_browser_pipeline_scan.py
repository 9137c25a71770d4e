"""The pipeline page of layers without softmax, in a real browser: every box of every layer opens; a scan's or linear
attention's layer shows its own steps instead of q, k, v and softmax, and its output box sums the implied matrix
times the values beside the engine's output; Falcon-H1's viewer switches to its Mamba-2 mixer's heads."""

from __future__ import annotations

import numpy as np
import pytest

import qkv
from qkv.viz.html import save_viewer
from qkv.viz.pipeline import pipeline_trace, save_pipeline
from conftest import MODELS
from test_browser import browser, tab  # noqa: F401 (fixtures)
from test_browser_pipeline import open_page, state
from test_browser_pipeline_families import boxes, open_box

TEXT = "the cat sat on the mat"
SCAN_STEPS = ["mix_x", "mix_dt", "mix_bc", "mix_matrix", "mix_out"]
LINEAR_STEPS = ["mix_qkv", "mix_dt", "mix_matrix", "mix_out"]
ATTENTION = {"qkv", "scores", "attn", "z"}


@pytest.mark.parametrize("name, steps", [("mamba", {0: SCAN_STEPS, 1: SCAN_STEPS}),
                                         ("qwen3_next", {0: LINEAR_STEPS, 1: [], 2: LINEAR_STEPS}),
                                         ("minimax", {0: LINEAR_STEPS, 1: [], 2: LINEAR_STEPS}),
                                         ("falcon_h1", {0: SCAN_STEPS, 1: SCAN_STEPS}),
                                         ("jamba", {0: SCAN_STEPS, 1: [], 2: SCAN_STEPS, 3: []})])
def test_each_layer_shows_its_own_steps_and_the_sums_are_the_engines(tab, name, steps, tmp_path):
    model = qkv.load(str(MODELS / name))
    open_page(tab, save_pipeline(model, TEXT, tmp_path / "p.html"))
    for layer, own in steps.items():
        tab.page.select_option(".qkv-p-layer", str(layer))
        shown = boxes(tab)
        assert [b for b in shown if b.startswith("mix_")] == own
        kind = state(tab)["kind"]
        assert (ATTENTION <= set(shown)) == (kind not in ("mamba", "mamba2", "delta", "lightning"))
        for box in shown:
            text = open_box(tab, box)
            if box == "mix_matrix":
                assert "implied" in text.lower() or "α[t, s]" in text
        if own:
            open_box(tab, "mix_out")
            sums = tab.page.eval_on_selector_all(".qkv-p-mix-sum",
                                                 "ls => ls.map(l => [+l.dataset.sum, +l.dataset.engine])")
            assert sums
            got, engine = np.array(sums).T                     # float64 sums of the engine's float32 numbers
            assert np.all(np.abs(got - engine) <= 1e-5 * np.abs(engine).max() + 1e-9)
    assert tab.errors == [] and tab.dialogs == []


def test_the_matrix_chooser_picks_each_of_the_layers_matrices(tab, tmp_path):
    model = qkv.load(str(MODELS / "mamba2"))
    open_page(tab, save_pipeline(model, TEXT, tmp_path / "p.html"))
    open_box(tab, "mix_matrix")
    options = tab.page.eval_on_selector_all(".qkv-p-mix option", "os => os.map(o => o.textContent)")
    assert options == [f"Mamba head {j}" for j in range(model.config.mamba.n_heads)]
    tab.page.select_option(".qkv-p-mix", "5")
    assert tab.page.eval_on_selector(".qkv-p-detail", "d => d.dataset.mix") == "5"
    assert "Mamba head 5" in tab.page.text_content(".qkv-p-detail")
    assert tab.errors == []


def test_falcon_h1s_viewer_switches_to_its_mixers_heads(tab, tmp_path):
    model = qkv.load(str(MODELS / "falcon_h1"))
    tab.page.goto(save_viewer(pipeline_trace(model, TEXT), tmp_path / "v.html").as_uri())
    tab.page.wait_for_selector("[data-qkv-root][data-ready='1']")
    kinds = tab.page.eval_on_selector_all(".qkv-kind", "bs => bs.map(b => b.dataset.kind)")
    assert kinds == ["attention", "mixer"] and tab.state()["kind"] == "attention"
    tab.page.click(".qkv-kind[data-kind='mixer']")
    assert tab.state()["kind"] == "mixer"
    assert tab.page.locator(".qkv-chip").count() == model.config.mamba.n_heads
    assert tab.errors == []
