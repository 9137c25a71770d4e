"""An SAE's views in a real browser (Debian's Chromium, Playwright, the network blocked; fixtures as in
test_browser.py): the viewer's Features panel (`qkv sae show --out`) and the feature page's search
(`qkv sae features --out`), on an SAE made on the committed GPT-2 fixture (test_steer.make_sae).

The panel: the tokens are the JSON's; hovering or focusing a token lists its top features with their
activations; clicking a feature (or Enter on it) colours every token by that feature's activation there on
the figures' diverging map (white where it does not fire). The page: typing filters the cards by their top
tokens, "#index" finds one card. Hostile tokens stay text.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

import qkv
from conftest import MODELS
from test_browser import assert_offline, browser, open_viewer, tab  # noqa: F401  (fixtures)
from test_browser_attribution import rgb, short
from test_interpret_payload_panels import interpolate
from test_steer import make_sae
from test_viewer import XSS, random_trace
from qkv.cli.app import cli
from qkv.viz import palette
from qkv.viz.html import save_viewer
from qkv.viz.interpret_payload import features_section

TEXT = "the cat saw the dog and the cat ran"
CORPUS = ["the cat sat on the mat", "a dog ran to the park and back", "the cat saw the dog",
          "birds fly south in winter", "we went to the market", "rain fell on the quiet town"]


@pytest.fixture(scope="module")
def sae_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("sae") / "gpt2-l1"
    make_sae(directory, qkv.load(MODELS / "gpt2"), name=str(MODELS / "gpt2"))
    return directory


def invoke(*args: str):
    r = CliRunner().invoke(cli, list(args))
    assert r.exit_code == 0, r.output
    return r


def test_the_features_panel_lists_a_tokens_features_and_colours_a_picked_one(tab, sae_dir, tmp_path):
    out = tmp_path / "show"
    invoke("sae", "show", TEXT, "--sae", str(sae_dir), "--top", "3", "--out", str(out))
    data = json.loads((out / "features.json").read_text(encoding="utf-8"))
    open_viewer(tab, out / "features.html")
    page = tab.page
    assert tab.state()["view"] == "features"
    assert page.text_content(".qkv-tab[aria-pressed=true]") == "Features"
    assert page.eval_on_selector_all(".qkv-feat-tok", "ts => ts.map(t => t.textContent)") == data["tokens"]

    def listed() -> list[str]:
        return page.eval_on_selector_all(".qkv-feat-btn", "bs => bs.map(b => b.textContent)")

    page.hover(".qkv-feat-tok >> nth=3")
    assert tab.state()["token"] == "3"
    fs, zs = data["features"][3], data["acts"][3]
    assert listed() == [f"#{j}  z = {float(f'{z:.5g}')}" for j, z in zip(fs[:3], zs)]
    assert page.text_content(".qkv-features .qkv-readout") == f"“{data['tokens'][3]}” (token 3): {len(fs)} features fire, the top 3:"
    page.hover(".qkv-feat-tok >> nth=0")                                       # the first position: not read
    assert listed() == [] and "not read by the SAE" in page.text_content(".qkv-features .qkv-readout")

    page.hover(".qkv-feat-tok >> nth=3")
    j = fs[0]
    page.click(".qkv-feat-btn >> nth=0")
    assert tab.state()["feature"] == str(j)
    z = np.array([dict(zip(f, a)).get(j, 0.0) for f, a in zip(data["features"], data["acts"])])
    toks = page.eval_on_selector_all(".qkv-feat-tok", "ts => ts.map(t => [t.dataset.z, getComputedStyle(t).backgroundColor])")
    assert np.allclose([float(t[0]) for t in toks], z, rtol=1e-4, atol=0)
    m = z.max()
    for (_, style), v in zip(toks, z):
        assert np.abs(np.array(rgb(style)) - interpolate(palette.DIVERGING_STOPS, 0.5 + 0.5 * v / m)).max() <= 1
    assert [rgb(s) for (_, s), v in zip(toks, z) if v == 0] == [[247, 247, 247]] * int((z == 0).sum())
    assert page.text_content(".qkv-feat-picked") == \
        f"feature {j} fires on {int((z > 0).sum())} of {len(z)} tokens, at most z = {float(f'{m:.5g}')}"

    page.focus(".qkv-feat-tok >> nth=4")                                       # the keyboard: focus, Tab, Enter
    assert tab.state()["token"] == "4"
    page.keyboard.press("Tab")
    assert page.evaluate("() => document.activeElement.dataset.i") == "5"
    k = data["features"][5][1]
    page.focus(".qkv-feat-btn >> nth=1")
    page.keyboard.press("Enter")
    assert tab.state()["feature"] == str(k)
    page.click(".qkv-feat-clear")
    assert "feature" not in tab.state()
    assert tab.errors == [] and tab.dialogs == []
    assert_offline(tab)


def test_hostile_tokens_in_the_features_panel_stay_text(tab, tmp_path):
    tokens = ["<s>", XSS, "b</span><script>alert(2)</script>", "d"]
    section = features_section({"tokens": tokens, "ids": [1, 2, 3, 4], "features": [[], [3, 1], [1], []],
                                "acts": [[], [2.0, 0.5], [1.25], []], "skipped": [0], "layer": 1, "site": "resid",
                                "d_sae": 8, "k": 2, "sae": XSS})
    open_viewer(tab, save_viewer(random_trace(tokens), tmp_path / "f.html", sections={"features": section},
                                 view="features"))
    page = tab.page
    assert page.eval_on_selector_all(".qkv-feat-tok", "ts => ts.map(t => t.textContent)") == [short(t, 32) for t in tokens]
    assert XSS in page.text_content(".qkv-features .qkv-about")
    page.hover(".qkv-feat-tok >> nth=2")
    page.click(".qkv-feat-btn >> nth=0")
    z = page.eval_on_selector_all(".qkv-feat-tok", "ts => ts.map(t => t.dataset.z)")
    assert z == ["0", "0.5", "1.25", "0"]
    assert page.evaluate("() => document.querySelectorAll('img, script:not([type]), b').length") == 2   # ours: 2 scripts
    assert tab.errors == [] and tab.dialogs == []
    assert_offline(tab)


def test_the_feature_page_filters_its_cards_by_top_token(tab, sae_dir, tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(CORPUS) + "\n", encoding="utf-8")
    out = tmp_path / "pages"
    invoke("sae", "features", "--sae", str(sae_dir), "--file", str(corpus), "--top", "12", "--out", str(out))
    data = json.loads((out / "features.json").read_text(encoding="utf-8"))
    tab.page.goto((out / "features.html").as_uri())
    page = tab.page
    cards = lambda: page.eval_on_selector_all(".card", "cs => cs.filter(c => !c.hidden).map(c => +c.dataset.index)")
    assert cards() == [f["index"] for f in data["features"]]
    assert page.text_content(".search .shown") == "12 of 12 features"
    word = data["features"][0]["promotes"][0]["token"]                         # the first card's top token
    query = word.replace("␣", " ").strip().lower() or word.lower()
    page.fill(".search input", query)
    want = [f["index"] for f in data["features"] if any(
        query in t.lower().replace("␣", " ") or query in t.lower()
        for t in [p["token"] for p in f["promotes"][:5]] + [c["token"] for c in f["contexts"][:5]])]
    assert data["features"][0]["index"] in cards() and cards() == want
    page.fill(".search input", f"#{data['features'][3]['index']}")
    assert cards() == [data["features"][3]["index"]] and page.text_content(".search .shown") == "1 of 12 features"
    page.fill(".search input", "")
    assert len(cards()) == 12
    assert tab.errors == [] and tab.dialogs == []
    assert_offline(tab)
