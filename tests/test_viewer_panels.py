"""One registry of viewer panels (`viz.panels.PANELS`): the payload's list of panels, the page's tabs and the
scripts the page inlines all come from it, so a panel declared there alone (its entry, its renderer, its title)
reaches the payload and the page. In a real browser as test_browser.py (Debian's Chromium, the network blocked).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import qkv
from test_browser import assert_offline, browser, open_viewer, tab  # noqa: F401  (fixtures)
from test_viewer import XSS, data_of, random_trace
from qkv.runtime.errors import QkvError
from qkv.viz import html, panels
from qkv.viz.payload import trace_payload
from qkv.viz.words import en

ASSETS = Path(qkv.__file__).parent / "viz" / "assets"

# a panel's renderer, as a new panel's asset would hold it (the interface: the top of viewer_panels.js)
COUNTS_JS = """(function (global) {
  const QKV = global.QKV, {el} = QKV.util;
  QKV.panels.counts = {
    meta: (v) => [`counted ${v.p.counts.values.length} tokens`],
    build: (v) => {
      const box = v.panels.counts;
      box.append(...v.p.counts.values.map((x, i) => el("span", "qkv-count", v.tokens[i] + "=" + x)));
      return {draw() { box.dataset.layer = String(v.p.layers[v.state.layer]); }};
    },
  };
})(window);"""


def counts_section(values: list[int]) -> dict:
    """A made-up panel's section: one number per token."""
    return {"values": [int(x) for x in values]}


@pytest.fixture
def counts(monkeypatch):
    """A panel declared in the registry only: its entry, its title among the viewer's words and its renderer's
    asset; nothing in payload.py, html.py or viewer.js names it."""
    panel = panels.Panel("counts", title="panel_counts", build=counts_section, tokens=lambda s: len(s["values"]),
                         renderer="counts", script="viewer_counts.js", layer=True)
    monkeypatch.setattr(panels, "PANELS", panels.PANELS + (panel,))
    monkeypatch.setitem(en.VIEWER, "panel_counts", "Counts")
    real = html.asset
    monkeypatch.setattr(html, "asset", lambda name: COUNTS_JS if name == "viewer_counts.js" else real(name))
    return panel


def test_the_payload_ships_every_panel_in_the_registrys_order():
    data = trace_payload(random_trace(["a", "b", "c"]))
    assert [p["id"] for p in data["panels"]] == [p.id for p in panels.PANELS]
    assert [p["id"] for p in data["panels"]] == ["lens", "rollout", "patch", "attribute", "causal_trace", "features",
                                                 "router", "diff", "path_patch", "probe", "disentangled",
                                                 "contacts"]
    assert [p["title"] for p in data["panels"]] == ["Logit lens", "Rollout", "Patching", "Attribution",
                                                    "Causal trace", "Features", "Experts", "Model diff",
                                                    "Path patching", "Probes", "Disentangled", "Contacts"]
    assert all(data[p.id] is None for p in panels.PANELS)                # no section given: every one null
    assert {p["id"]: p["layer"] for p in data["panels"]} == {p.id: p.layer for p in panels.PANELS}


def test_a_panel_declared_in_the_registry_alone_reaches_the_payload(counts):
    data = trace_payload(random_trace(["a", "b", "c"]), sections={"counts": counts_section([3, 1, 4])}, view="counts")
    assert data["panels"][-1] == {"id": "counts", "title": "Counts", "renderer": "counts", "layer": True}
    assert data["counts"] == {"values": [3, 1, 4]} and data["view"] == "counts"
    with pytest.raises(QkvError, match="the counts section is about 2 tokens and the trace has 3"):
        trace_payload(random_trace(["a", "b", "c"]), sections={"counts": counts_section([3, 1])})
    assert html.viewer_js().endswith(COUNTS_JS)                          # its renderer's asset, inlined once


def test_a_section_no_panel_declares_is_refused():
    with pytest.raises(QkvError, match=r"unknown viewer sections \['counts'\]; choose from \['lens'"):
        trace_payload(random_trace(["a", "b"]), sections={"counts": counts_section([1, 2])})


def test_each_renderer_is_registered_by_the_asset_its_panel_names():
    registered = {}
    for name in panels.scripts():
        for renderer in re.findall(r"QKV\.panels\.(\w+) = \{", (ASSETS / name).read_text(encoding="utf-8")):
            registered[renderer] = name
    assert registered == {p.renderer: p.script for p in panels.PANELS}
    viewer = (ASSETS / "viewer.js").read_text(encoding="utf-8")
    assert not re.search(r"\[\s*\"lens\",\s*\"rollout\"", viewer)      # no second list of the panels in the page


def test_the_lens_panel_keeps_what_the_lens_needs():
    from qkv.analysis.lens import KEEP

    assert panels.panel("lens").keep == KEEP and panels.panel("rollout").keep == ("attentions",)


def test_a_panel_declared_in_the_registry_alone_shows_on_the_page(counts, tab, tmp_path):
    trace = random_trace(["a", XSS, "c"], L=2, H=2)
    path = html.save_viewer(trace, tmp_path / "counts.html", sections={"counts": counts_section([3, 1, 4])})
    data = data_of(path.read_text())
    assert data["counts"] == {"values": [3, 1, 4]}
    open_viewer(tab, path)
    page = tab.page
    tabs = page.eval_on_selector_all(".qkv-tab", "bs => bs.map(b => b.textContent)")
    assert tabs == ["Head view", "Matrix", "Model view", "Counts"]
    page.click(".qkv-tab[data-view=counts]")
    assert tab.state()["view"] == "counts"
    shown = page.eval_on_selector_all(".qkv-count", "cs => cs.map(c => c.textContent)")
    assert shown == [f"{label}={x}" for label, x in zip(data["labels"], [3, 1, 4])]      # hostile tokens: text
    assert page.is_visible(".qkv-field >> nth=0") and not page.is_visible(".qkv-field >> nth=1")   # layer: True
    page.select_option(".qkv-field select >> nth=0", "1")
    assert page.get_attribute(".qkv-panel.qkv-counts", "data-layer") == str(trace.layer_ids[1])
    assert "counted 3 tokens" in page.text_content(".qkv-meta")
    assert page.evaluate("() => document.querySelectorAll('img').length") == 0
    assert tab.dialogs == [] and tab.errors == []
    assert_offline(tab)


def test_a_panel_whose_renderer_is_missing_fails_with_a_clear_message(counts, tab, tmp_path, monkeypatch):
    real = html.asset
    monkeypatch.setattr(html, "asset", lambda name: "" if name == "viewer_counts.js" else real(name))
    path = html.save_viewer(random_trace(["a", "b"]), tmp_path / "none.html",
                            sections={"counts": counts_section([1, 2])})
    tab.page.goto(path.as_uri())
    tab.page.wait_for_selector("[data-qkv-root][data-ready=error]")
    assert tab.page.text_content(".qkv-error") == ('qkv viewer: this page lacks the renderer "counts" of the "counts" '
                                                   "view: load the script that registers it (qkv/viz/panels.py names "
                                                   "it) after viewer.js")
