"""The viewer's path patching panel (`qkv path-patch --out` writes path_patch.html, viz.path_patch_panel): the page's
data equals the PathTable Python computes, a hovered cell reads its number (NaN: "no path", painted grey), a hostile
text stays text, no request leaves the page. In a real browser as test_browser.py (Debian's Chromium, the network
blocked); the section builder's own checks without one."""

from __future__ import annotations

import re

import numpy as np
import pytest
from click.testing import CliRunner

import qkv
from conftest import MODELS
from test_browser import assert_offline, browser, open_viewer, tab  # noqa: F401  (fixtures)
from test_browser_interpret import hover_cell
from test_viewer import XSS, data_of
from qkv.analysis.path_patch import pair_table, sender_table
from qkv.cli.app import cli
from qkv.runtime.errors import QkvError
from qkv.viz.path_patch_panel import path_patch_section

MODEL = MODELS / "gpt2"                                   # 2 layers × 4 heads: layer 1's senders reach no receiver
CLEAN, CORRUPTED = f"a {XSS} c d e", f"a {XSS} d d e"     # the same token count; the answer " e" against " d"
METRIC = (" e", " d")
RECEIVERS, CHANNEL = "1.0,1.2", "v"

# the canvas pixel at the centre of data cell (r, c) of a heatmap (its data-* say where; device pixels)
PIXEL = """([sel, r, c]) => { const cv = document.querySelector(sel), d = cv.dataset, k = cv.width / cv.clientWidth;
  const y = d.flip === "1" ? +d.rows - 1 - r : r;
  const x0 = (+d.padL + (c + 0.5) * +d.cw) * k, y0 = (+d.padT + (y + 0.5) * +d.ch) * k;
  return Array.from(cv.getContext("2d").getImageData(Math.floor(x0), Math.floor(y0), 1, 1).data.slice(0, 3)); }"""
MASKED = [212, 212, 212]                                  # viewer.js MASKED = palette.MASKED: no path


def number(text: str) -> float:
    """The page's signed number ("−0.0845", "+0.0152") as a float."""
    return float(re.findall(r"[−+]?\d+\.\d+", text)[-1].replace("−", "-"))


def as_page(x: float) -> float | None:
    return None if np.isnan(x) else x


def test_path_patch_page_holds_the_tables_numbers_and_reads_them_on_hover(tab, tmp_path):
    out = tmp_path / "paths"
    r = CliRunner().invoke(cli, ["path-patch", CLEAN, CORRUPTED, "--model", str(MODEL), "--token", METRIC[0],
                                 "--other", METRIC[1], "--receivers", RECEIVERS, "--channel", CHANNEL,
                                 "--out", str(out)])
    assert r.exit_code == 0, r.output
    table = sender_table(qkv.load(MODEL), CLEAN, CORRUPTED, METRIC, receivers=RECEIVERS, channel=CHANNEL)
    P = data_of((out / "path_patch.html").read_text(encoding="utf-8"))["path_patch"]
    L, H = table.shape
    heads = table.heads()                                                        # (L, H), NaN: no path
    assert np.isnan(heads[1]).all() and not np.isnan(heads[0]).any()             # layer 1 is the receivers' own
    got = np.array([[np.nan if x is None else x for x in row] for row in P["heads"]])
    np.testing.assert_allclose(got, heads, rtol=0, atol=1e-6, equal_nan=True)    # 6 decimals on the page
    by_name = {str(s): v for s, v in zip(table.senders, table.values[:, 0])}
    for l in range(L):
        assert P["ffn"][l] == pytest.approx(as_page(by_name[f"{l}.ffn"]), abs=1e-6)
    assert P["embed"] == pytest.approx(by_name["embed"], abs=1e-6)
    assert (P["receivers"], P["channel"], P["clean"], P["corrupted"]) == (RECEIVERS, CHANNEL, CLEAN, CORRUPTED)
    assert P["max"] == pytest.approx(np.nanmax(np.abs(table.values)), abs=1e-6)

    open_viewer(tab, out / "path_patch.html")
    page = tab.page
    assert tab.state()["view"] == "path_patch"
    assert page.text_content(".qkv-tab[aria-pressed=true]") == "Path patching"
    for name, shape in (("heads", (L, H)), ("ffn", (L, 1)), ("embed", (1, 1))):
        d = page.eval_on_selector(f".qkv-heat-path-{name}", "e => Object.assign({}, e.dataset)")
        assert (int(d["rows"]), int(d["cols"])) == shape
    about = page.eval_on_selector_all(".qkv-path_patch .qkv-about-line", "ls => ls.map(l => l.textContent)")
    assert about[0] == f"receivers {RECEIVERS} ({CHANNEL})"
    assert about[2].startswith(f"clean “{CLEAN}” → ")                           # the hostile text, as text
    assert page.evaluate("() => document.querySelectorAll('img').length") == 0

    readout = ".qkv-path_patch .qkv-readout"
    layer, head = np.unravel_index(np.nanargmax(np.abs(heads)), heads.shape)     # the strongest sender head
    hover_cell(page, ".qkv-heat-path-heads", layer, head)
    text = page.text_content(readout)
    assert text.startswith(f"sender {layer}.{head} → {RECEIVERS} ({CHANNEL}): "), text
    assert number(text) == pytest.approx(heads[layer, head], abs=5e-5)          # 4 decimals shown
    assert number(page.text_content(".qkv-path_patch .qkv-tip")) == pytest.approx(heads[layer, head], abs=5e-5)
    hover_cell(page, ".qkv-heat-path-ffn", 0, 0)
    assert number(page.text_content(readout)) == pytest.approx(by_name["0.ffn"], abs=5e-5)
    hover_cell(page, ".qkv-heat-path-embed", 0, 0)
    assert page.text_content(readout).startswith(f"sender embed → {RECEIVERS}")
    assert number(page.text_content(readout)) == pytest.approx(by_name["embed"], abs=5e-5)
    hover_cell(page, ".qkv-heat-path-heads", 1, 0)                               # no path: said, and grey
    assert page.text_content(readout) == f"sender 1.0 → {RECEIVERS} ({CHANNEL}): no path (not a sender, or not " \
                                         "before a receiver)"
    assert page.evaluate(PIXEL, [".qkv-heat-path-heads", 1, 0]) == MASKED
    assert page.evaluate(PIXEL, [".qkv-heat-path-ffn", 1, 0]) == MASKED
    assert page.evaluate(PIXEL, [".qkv-heat-path-heads", 0, 0]) != MASKED
    assert tab.errors == [] and tab.dialogs == []
    assert_offline(tab)


def test_the_section_reads_any_column_of_a_pair_table_and_the_senders_set():
    model = qkv.load(MODEL)
    table = pair_table(model, CLEAN, CORRUPTED, METRIC, receivers="1.1,1.3", channel="q")
    data = {**table.as_json(), "set": {"senders": ["embed", "0.1"], "effect": -0.25}}
    for j, receiver in enumerate(("1.1", "1.3")):
        P = path_patch_section(data, table.shape, column=j)
        got = np.array([[np.nan if x is None else x for x in row] for row in P["heads"]])
        np.testing.assert_allclose(got, table.heads(j), rtol=0, atol=1e-6, equal_nan=True)
        assert P["receivers"] == receiver and P["set"] == {"senders": ["embed", "0.1"], "effect": -0.25}
        top = [t["effect"] for t in P["top"]]
        assert top == sorted(top, key=abs, reverse=True) and len(top) == 6          # embed, 4 heads, 0.ffn
    with pytest.raises(QkvError, match="sender '2.0' is not a head"):
        path_patch_section({**data, "senders": ["embed", "2.0", *data["senders"][2:]]}, table.shape)
    with pytest.raises(QkvError, match="receiver set 2"):
        path_patch_section(data, table.shape, column=2)
