"""The lens panel's logit/tuned switch in a real browser (Debian's Chromium, Playwright, the network blocked; fixtures
as in test_browser.py): a page made with a tuned lens (analysis.sections.lens_payload(…, tuned=…)) shows both
buttons; a hovered cell reads the logit lens's P and rank, then, after a click on "tuned lens", the tuned lens's
(decoded here from the page's JSON), and the heatmap is redrawn. A page without a tuned lens has no switch.
"""

from __future__ import annotations

import numpy as np

import qkv
from conftest import MODELS
from test_browser import CHECKSUM, assert_offline, browser, open_viewer, tab  # noqa: F401  (fixtures)
from test_browser_interpret import fmt_p, hover_cell
from test_viewer import data_of
from test_viewer_interpret import unpack
from qkv.analysis import tuned_lens as tl
from qkv.analysis.lens import KEEP
from qkv.analysis.sections import lens_payload
from qkv.viz.html import save_viewer


def test_the_lens_panel_switches_between_the_logit_and_the_tuned_lens(tab, tmp_path):
    model = qkv.load(MODELS / "llama_gqa")
    trace = model.run("the cat sat on the mat", keep=("attentions",) + KEEP)
    lens = tl.identity_lens(model)
    rng = np.random.default_rng(0)
    lens.A[:] = rng.normal(0, 0.3, lens.A.shape)                          # a lens far from the logit lens
    lens.b[:] = rng.normal(0, 0.3, lens.b.shape)
    path = save_viewer(trace, tmp_path / "lens.html", sections={"lens": lens_payload(model, trace, tuned=lens)},
                       view="lens")
    data = data_of(path.read_text())["lens"]
    open_viewer(tab, path)
    page = tab.page
    assert page.eval_on_selector_all(".qkv-lens .qkv-mode[data-lens]", "bs => bs.map(b => b.textContent)") == \
        ["logit lens", "tuned lens"]
    assert page.get_attribute(".qkv-lens", "data-lens") == "logit"
    r, c = 1, 2
    for kind, section in (("logit", data), ("tuned", data["tuned"])):
        if kind == "tuned":
            before = page.evaluate(CHECKSUM, ".qkv-heat-lens")
            page.click(".qkv-lens .qkv-mode[data-lens=tuned]")
            assert page.get_attribute(".qkv-lens", "data-lens") == "tuned"
            assert page.get_attribute(".qkv-lens .qkv-mode[data-lens=tuned]", "aria-pressed") == "true"
            assert page.evaluate(CHECKSUM, ".qkv-heat-lens") != before
        prob, rank = unpack(section["prob"]), unpack(section["rank"])
        hover_cell(page, ".qkv-heat-lens", r, c)
        text = page.text_content(".qkv-lens .qkv-readout")
        assert text.endswith(f"P = {fmt_p(prob[r, c])}, rank {rank[r, c]}"), (kind, text)
    assert unpack(data["prob"])[r, c] != unpack(data["tuned"]["prob"])[r, c]  # the two readouts differ
    assert tab.errors == [] and tab.dialogs == []
    assert_offline(tab)
    plain = save_viewer(trace, tmp_path / "plain.html", sections={"lens": lens_payload(model, trace)}, view="lens")
    open_viewer(tab, plain)
    assert page.eval_on_selector_all(".qkv-lens .qkv-mode[data-lens]", "bs => bs.length") == 0
