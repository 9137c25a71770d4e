"""The viewer's Contacts panel (ESM-2's contact map, viz.contact_panel) in a real browser (Debian's Chromium,
Playwright, the network blocked; fixtures as in test_browser.py): `qkv show SEQ --model ESM --out` writes a page
whose Contacts tab draws P beside the chosen head's map F and attention; clicking a best-matching head shows it,
a hovered cell reads the residue pair, P, F and the attention as Python computed them, and the drawn cells have
their colours; a hostile residue stays text; `qkv serve` of an ESM model shows the tab too."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from click.testing import CliRunner

import qkv
from conftest import MODELS, running_server
from test_browser import READY, assert_offline, browser, open_app, open_viewer, tab  # noqa: F401  (fixtures)
from test_viewer import XSS
from qkv.analysis.contacts import contacts
from qkv.analysis.sections import sections_keep, viewer_sections
from qkv.cli.app import cli
from qkv.viz.html import save_viewer

ESM = MODELS / "esm"
SEQUENCE = "NLYIQWLKDGGPSSGRPPPS"          # Trp-cage TC5b, the lesson's example
NUMBER = r"([+−]?<?[\d.]+)"

# the pixel at CSS (x, y) of the canvas SEL (its backing store may be larger: device pixels)
PIXEL = """([sel, x, y]) => { const c = document.querySelector(sel), k = c.width / c.clientWidth;
  return Array.from(c.getContext('2d').getImageData(Math.floor(x * k), Math.floor(y * k), 1, 1).data.slice(0, 3)); }"""
# the colours the page's maps use: viridis of a value in [0, 1] (the viewer's LUT), RdBu_r of t in [0, 1]
VIRIDIS = ("(t) => { const q = 3 * Math.round(Math.min(1, Math.max(0, t)) * 255); "
           "return Array.from(QKV.util.LUT.slice(q, q + 3)); }")
RDBU = "(t) => QKV.draw.ramp([[5, 48, 97], [33, 102, 172], [67, 147, 195], [146, 197, 222], [209, 229, 240], " \
       "[247, 247, 247], [253, 219, 199], [244, 165, 130], [214, 96, 77], [178, 24, 43], [103, 0, 31]], t)"


@pytest.fixture(scope="module")
def esm():
    return qkv.load(ESM)


def _number(x: str) -> float:
    return float(x.replace("−", "-").replace("<", ""))


def _readout(page) -> dict:
    text = page.text_content(".qkv-panel.qkv-contacts .qkv-readout")
    m = re.fullmatch(rf"residues (\d+) (\S+) – (\d+) (\S+): P {NUMBER} · L(\d+)\.H(\d+) F {NUMBER} · attention "
                     rf"{NUMBER}", text)
    assert m, text
    return {"i": int(m[1]) - 1, "j": int(m[3]) - 1, "residues": (m[2], m[4]), "P": _number(m[5]),
            "head": (int(m[6]), int(m[7])), "F": _number(m[8]), "A": _number(m[9])}


def _cell(page, name: str, i: int, j: int) -> tuple[float, float]:
    """The CSS position of cell (row i, column j)'s centre on the map NAME."""
    box = page.locator(f".qkv-heat-contacts-{name}").evaluate("c => Object.assign({}, c.dataset)")
    return float(box["padL"]) + (j + 0.5) * float(box["cw"]), float(box["padT"]) + (i + 0.5) * float(box["ch"])


def test_show_page_draws_the_contact_map_beside_a_clicked_head(tab, esm, tmp_path):
    out = tmp_path / "out"
    r = CliRunner().invoke(cli, ["show", SEQUENCE, "--model", str(ESM), "--out", str(out)])
    assert r.exit_code == 0, r.output
    open_viewer(tab, out / "attention.html")
    page = tab.page
    assert tab.state()["view"] == "contacts"                           # a protein's page opens on its Contacts tab
    page.wait_for_selector(".qkv-panel.qkv-contacts canvas.qkv-heat-contacts-predicted", state="visible")
    page.click(".qkv-tab >> text=Contacts")
    assert tab.state()["view"] == "contacts"
    panel = ".qkv-panel.qkv-contacts"
    assert page.eval_on_selector_all(f"{panel} canvas.qkv-heat", "cs => cs.map(c => c.className)") == [
        f"qkv-heat qkv-heat-contacts-{name}" for name in ("predicted", "head", "attention", "r")]
    cm = contacts(esm, SEQUENCE)
    trace = esm.run(SEQUENCE)
    best = cm.best_heads(10)
    assert page.eval_on_selector_all(".qkv-contact-head", "bs => bs.map(b => [+b.dataset.layer, +b.dataset.head])") \
        == [[l, h] for l, h, _ in best]
    for l, h, r_ in best[:3]:                                          # click a head: the panel shows it
        page.click(f".qkv-contact-head[data-layer='{l}'][data-head='{h}']")
        assert (tab.state()["layer"], tab.state()["head"]) == (str(l), str(h))
        assert page.get_attribute(f".qkv-contact-head[data-layer='{l}'][data-head='{h}']", "aria-pressed") == "true"
        said = page.text_content(f"{panel} .qkv-contacts-head")
        assert said.startswith(f"layer {l}, head {h} · r with P {'+' if r_ > 0 else '−'}{abs(r_):.3f}")
        F = cm.features[l, h]
        top = float(np.abs(F).max())
        A = trace.layers[l].attentions[h, 1:-1, 1:-1]                   # (m, m) the residues' rows and columns
        for i, j in ((0, 7), (4, 15), (19, 2), (10, 10)):
            x, y = _cell(page, "head", i, j)
            page.locator(".qkv-heat-contacts-head").hover(position={"x": x, "y": y})
            got = _readout(page)
            assert (got["i"], got["j"], got["head"]) == (i, j, (l, h))
            assert got["residues"] == (SEQUENCE[i], SEQUENCE[j])
            assert abs(got["P"] - cm.predicted[i, j]) <= 5e-5 + 1e-7           # 4 decimals
            assert abs(got["F"] - F[i, j]) <= 5e-5 + 2 ** -11 * abs(F[i, j])      # 4 decimals of float16
            assert abs(got["A"] - A[i, j]) <= 5e-4 + 1 / 510                      # 3 decimals of a byte
            drawn_p = page.evaluate(PIXEL, [".qkv-heat-contacts-predicted", *_cell(page, "predicted", i, j)])
            assert drawn_p == page.evaluate(VIRIDIS, float(cm.predicted[i, j]))
            drawn_f = page.evaluate(PIXEL, [".qkv-heat-contacts-head", x, y])
            want_f = page.evaluate(RDBU, 0.5 + 0.5 * float(F[i, j]) / top)
            assert max(abs(a - b) for a, b in zip(drawn_f, want_f)) <= 1, (drawn_f, want_f)
            drawn_a = page.evaluate(PIXEL, [".qkv-heat-contacts-attention", *_cell(page, "attention", i, j)])
            assert drawn_a == page.evaluate(VIRIDIS, round(float(A[i, j]) * 255) / 255)
    page.click(".qkv-tab >> text=Matrix")                              # the head chosen here is the other views' too
    assert tab.state()["head"] == str(best[2][1])
    assert tab.errors == [] and tab.dialogs == []
    assert_offline(tab)


def test_show_opens_a_proteins_viewer_on_contacts_and_a_text_models_on_its_first_view(tmp_path):
    """`qkv show --out`: ESM's page says "contacts" as the view shown first; a model without a contact head (GPT-2)
    says none (the viewer's Head view), its payload without a contacts section."""
    for model, text, view in ((ESM, SEQUENCE, "contacts"), (MODELS / "gpt2", "The quick brown fox", None)):
        out = tmp_path / model.name
        r = CliRunner().invoke(cli, ["show", text, "--model", str(model), "--out", str(out)])
        assert r.exit_code == 0, r.output
        data = json.loads(re.search(r'class="qkv-data">(.*?)</script>', (out / "attention.html").read_text(),
                                    re.S).group(1))
        assert data["view"] == view and (data["contacts"] is not None) == (view == "contacts")


def test_no_head_chosen_shows_the_layers_best_and_a_grid_cell_picks_one(tab, esm, tmp_path):
    cm = contacts(esm, SEQUENCE)
    trace = esm.run(SEQUENCE, keep=sections_keep(esm, len(SEQUENCE) + 2))
    open_viewer(tab, save_viewer(trace, tmp_path / "v.html", sections=viewer_sections(esm, trace), view="contacts"))
    page = tab.page
    for layer in range(3):
        page.select_option(".qkv-layer", str(layer))
        h = int(np.argmax(cm.scores[layer]))
        assert page.text_content(".qkv-contacts-head").startswith(f"layer {layer}, head {h} (the layer's best-matching")
        assert tab.state()["head"] == "all"
    box = page.locator(".qkv-heat-contacts-r").evaluate("c => Object.assign({}, c.dataset)")
    page.click(".qkv-heat-contacts-r", position={"x": float(box["padL"]) + 2.5 * float(box["cw"]),
                                                 "y": float(box["padT"]) + 1.5 * float(box["ch"])})
    assert (tab.state()["layer"], tab.state()["head"]) == ("1", "2")
    assert page.text_content(".qkv-contacts-head").startswith("layer 1, head 2 · r with P")
    assert tab.errors == []


def test_a_hostile_residue_stays_text(tab, esm, tmp_path):
    trace = esm.run("NLYIQWLKDG", keep=sections_keep(esm, 12))
    trace.tokens[1] = XSS
    open_viewer(tab, save_viewer(trace, tmp_path / "v.html", sections=viewer_sections(esm, trace), view="contacts"))
    page = tab.page
    x, y = _cell(page, "predicted", 0, 3)
    page.locator(".qkv-heat-contacts-predicted").hover(position={"x": x, "y": y})
    assert page.text_content(".qkv-panel.qkv-contacts .qkv-readout").startswith("residues 1 <img")
    assert page.evaluate("() => document.querySelectorAll('img').length") == 0
    assert tab.dialogs == [] and tab.errors == []
    assert_offline(tab)


def test_the_web_app_of_an_esm_model_has_the_contacts_tab(tab, esm):
    with running_server(str(ESM)) as srv:
        page = open_app(tab, srv)
        page.wait_for_selector(READY)                                  # the example, a protein's sequence, at once
        page.click(".qkv-tab >> text=Contacts")
        page.wait_for_selector(".qkv-heat-contacts-predicted")
        assert page.text_content(".qkv-about").startswith(f"residues {len(SEQUENCE)}")
        l, h, _ = contacts(esm, SEQUENCE).best_heads(1)[0]
        page.click(f".qkv-contact-head[data-layer='{l}'][data-head='{h}']")
        assert (tab.state()["layer"], tab.state()["head"]) == (str(l), str(h))
        assert all(u.startswith(srv.url) or u.startswith("data:") for u in tab.requests), tab.requests
    assert tab.errors == [] and tab.dialogs == []
