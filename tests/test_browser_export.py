"""Export from every panel (export.js) in a real browser (Debian's Chromium, Playwright, the network blocked;
fixtures as in test_browser.py): each view of the viewer and both panels of the pipeline page save a PNG and
an SVG of what they show and copy their numbers as JSON.

The files are checked as files: the SVG parses as XML, is as large as what the panel drew, holds the tokens as
text (Korean too, with the page's Hangul font inside it) and the canvases as images; the PNG is a PNG twice the
SVG's size whose pixels are not all white. The JSON's attention is the engine's (within the page's one byte a
weight), the pipeline's heatmap the engine's A row for row. Hostile tokens stay text in the SVG.
"""

from __future__ import annotations

import json
import struct
import xml.etree.ElementTree as ET
import zlib

import numpy as np
import pytest

import qkv
from test_browser import assert_offline, browser, open_viewer, tab  # noqa: F401  (fixtures)
from test_viewer import XSS, random_trace
from qkv.viz.html import save_viewer
from qkv.writing.seq2seq_generate import translation_trace
from qkv.viz.pipeline import save_pipeline

SVG = "{http://www.w3.org/2000/svg}"
SENTENCE = "The cat sat on the mat"


def export(tab, kind: str, scope: str = "") -> tuple[str, bytes]:
    """Click SCOPE's export button KIND ("png", "svg"): (the file's suggested name, its bytes)."""
    with tab.page.expect_download() as d:
        tab.page.locator(f"{scope} .qkv-export-btn[data-export={kind}]").first.click()
    return d.value.suggested_filename, open(d.value.path(), "rb").read()


def copied(tab, scope: str = "") -> dict:
    tab.page.context.grant_permissions(["clipboard-read", "clipboard-write"])
    note = tab.page.locator(f"{scope} .qkv-export-note").first
    tab.page.locator(f"{scope} .qkv-export-btn[data-export=json]").first.click()
    note.filter(has_text="copied").wait_for()
    text = tab.page.evaluate("navigator.clipboard.readText()")
    tab.page.evaluate("() => document.querySelectorAll('.qkv-export-note').forEach(n => { n.textContent = ''; })")
    return json.loads(text)


def png_size(data: bytes) -> tuple[int, int, bool]:
    """(width, height, whether any pixel is not white) of an 8-bit RGBA PNG, read by hand."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    at, idat, w, h = 8, b"", 0, 0
    while at < len(data):
        size, kind = struct.unpack(">I4s", data[at:at + 8])
        chunk = data[at + 8:at + 8 + size]
        if kind == b"IHDR":
            w, h, depth, colour = struct.unpack(">IIBB", chunk[:10])
            assert (depth, colour) == (8, 6)
        elif kind == b"IDAT":
            idat += chunk
        at += 12 + size
    raw = zlib.decompress(idat)
    stride = 1 + 4 * w
    # filter bytes aside, a row of any non-white pixel differs from the all-white row under every filter but
    # "Up"/"Paeth" on identical rows: count the distinct bytes instead (white is only 255, with filters 0)
    inked = len(set(raw) - {0, 255}) > 0
    assert len(raw) == stride * h
    return w, h, inked


def svg_of(data: bytes) -> ET.Element:
    root = ET.fromstring(data.decode("utf-8"))
    assert root.tag == SVG + "svg"
    return root


def texts(root: ET.Element) -> list[str]:
    return [t.text or "" for t in root.iter(SVG + "text")]


@pytest.fixture(scope="module")
def cat(minilm):
    return minilm.run(SENTENCE, keep=("attentions",))


@pytest.mark.parametrize("view", ["head", "matrix", "model"])
def test_each_attention_view_saves_png_svg_and_its_numbers(tab, cat, tmp_path, view):
    open_viewer(tab, save_viewer(cat, tmp_path / "v.html", model_name="all-MiniLM-L6-v2"))
    tab.page.click(f".qkv-tab[data-view={view}]")
    tab.page.select_option(".qkv-layer", "3")
    if view != "model":
        tab.page.click(".qkv-chip >> text='7'")
    name, data = export(tab, "svg")
    assert name == f"all-MiniLM-L6-v2-{view}" + ("" if view == "model" else "-layer3-head7") + ".svg"
    root = svg_of(data)
    w, h = int(root.get("width")), int(root.get("height"))
    panel = tab.page.locator(f".qkv-panel.qkv-{'headview' if view == 'head' else view}").bounding_box()
    assert 40 < w <= panel["width"] + 1 and 40 < h <= panel["height"] + 1
    shown = texts(root)
    if view == "head":                                      # the token columns are text (the others: drawn on canvas)
        for token in ("cat", "sat", "mat", "[CLS]"):
            assert any(token in t for t in shown), (token, shown[:20])
    else:
        assert any("attention weight" in t or "layer" in t for t in shown), shown[:20]
    canvases = tab.page.locator(".qkv-panel:not([hidden]) canvas").count()
    assert canvases >= 1 and len(list(root.iter(SVG + "image"))) == canvases
    name, data = export(tab, "png")
    assert name.endswith(".png") and png_size(data) == (2 * w, 2 * h, True)
    got = copied(tab)
    assert got["model"] == "all-MiniLM-L6-v2" and got["view"] == view and got["tokens"][1] == "the"
    A = np.array([cat.layer(i).attentions for i in range(len(cat.layers))])            # (L, H, n, n)
    if view == "model":
        assert np.abs(np.array(got["attention"]) - A).max() <= 0.0025 and got["layers"] == list(range(6))
    else:
        assert got["layer"] == 3 and got["head"] == 7
        assert np.abs(np.array(got["attention"]) - A[3, 7]).max() <= 0.0025
    assert_offline(tab)


def test_the_next_token_and_lens_views_export_what_they_show(tab, tmp_path):
    model = qkv.load("smollm2")
    trace = model.generate("The capital of France is", 3, temperature=0, trace=True)
    from qkv.analysis.sections import lens_payload
    open_viewer(tab, save_viewer(trace, tmp_path / "g.html", tokenizer=model.tokenizer,
                                 sections={"lens": lens_payload(model, trace)}))
    tab.page.click(".qkv-tab[data-view=next]")
    got = copied(tab)
    assert got["view"] == "next" and got["temperature"] == 1 and got["position"] == len(trace.labels) - 3
    p = np.array([c["p"] for c in got["candidates"]])
    z = np.array([c["logit"] for c in got["candidates"]])
    assert got["candidates"][0]["token"] == "␣Paris" and p[0] == p.max()
    assert np.allclose(p / p[0], np.exp(z - z[0]), rtol=1e-9)                 # softmax(z / 1), the same mass
    name, data = export(tab, "svg")
    assert "next-token" in name and any("Paris" in t for t in texts(svg_of(data)))
    tab.page.click(".qkv-tab[data-view=lens]")
    got = copied(tab)
    assert got["view"] == "lens" and got["section"]["rows"] == model.config.n_layers + 1
    assert len(got["arrays"]["prob"]) == (model.config.n_layers + 1) * len(trace.labels)
    name, data = export(tab, "png")
    assert name.endswith("-lens.png") and png_size(data)[2]


def test_korean_labels_are_text_in_the_svg_with_the_pages_own_font(tab, tmp_path):
    model = qkv.load("ko-en-tiny")
    trace = translation_trace(model, "나는 학교에 간다")
    open_viewer(tab, save_viewer(trace, tmp_path / "k.html", tokenizer=model.tokenizer))
    tab.page.click(".qkv-tab[data-view=head]")
    root = svg_of(export(tab, "svg")[1])
    assert any("학교에" in t for t in texts(root))
    style = "".join(s.text or "" for s in root.iter(SVG + "style"))
    assert "@font-face" in style and "qkv Hangul" in style and "data:font" in style
    assert png_size(export(tab, "png")[1])[2]


def test_hostile_tokens_stay_text_in_the_svg(tab, tmp_path):
    trace = random_trace(["<b>", XSS, "a&b", "]]>", "\"'"], L=1, H=2)
    open_viewer(tab, save_viewer(trace, tmp_path / "x.html"))
    root = svg_of(export(tab, "svg")[1])                                     # parses: everything escaped
    shown = texts(root)
    assert any(XSS in t for t in shown) and any("a&b" in t for t in shown) and any("]]>" in t for t in shown)
    assert not [e for e in root.iter() if e.tag.split("}")[-1] in ("script", "foreignObject", "img")]
    assert tab.dialogs == [] and tab.errors == []


def test_both_panels_of_the_pipeline_page_export(tab, tmp_path, minilm):
    trace = minilm.run(SENTENCE)
    open_viewer_pipeline = save_pipeline(minilm, SENTENCE, tmp_path / "p.html")
    tab.page.goto(open_viewer_pipeline.as_uri())
    tab.page.wait_for_selector("[data-qkv-pipeline][data-ready='1']")
    tab.page.click(".qkv-p-box[data-box=attn]")
    tab.page.select_option(".qkv-p-layer", "2")
    tab.page.select_option(".qkv-p-head-pick", "5")
    name, data = export(tab, "svg", ".qkv-p-detail")
    assert name == "all-MiniLM-L6-v2-attn-token7-layer2-head5.svg"
    root = svg_of(data)
    assert any("softmax" in t.lower() for t in texts(root)) and list(root.iter(SVG + "image"))
    assert png_size(export(tab, "png", ".qkv-p-detail")[1])[2]
    got = copied(tab, ".qkv-p-detail")
    assert (got["box"], got["layer"], got["head"], got["token"]) == ("attn", 2, 5, 7)
    heat = next(h for h in got["heatmaps"] if "highlighted_row" in h)          # the box's own heatmap
    A = trace.layer(2).attentions[5]                                            # (n, n)
    assert (heat["rows"], heat["cols"]) == A.shape and heat["highlighted_row"] == 7
    assert np.abs(np.array(heat["values"], dtype=float).reshape(A.shape) - A).max() <= 0.0025
    drawn = {h["label"]: h for h in got["heatmaps"] if "highlighted_row" not in h}   # the diagram's, float32 whole
    assert sorted(drawn) == sorted(["Q", "Kᵀ", "S", "A", "V", "Z"])
    assert np.array_equal(np.array(drawn["A"]["values"], dtype=np.float32).reshape(A.shape), A)
    assert any(t.startswith("A[7, ") for t in texts(root))                      # the cell's arithmetic, as text
    assert [v["label"] for v in got["values"]] == trace.labels
    flow = svg_of(export(tab, "svg", ".qkv-p-flow")[1])
    assert any("Softmax" in t for t in texts(flow))
    boxes = copied(tab, ".qkv-p-flow")["boxes"]
    assert [b["id"] for b in boxes if b["open"]] == ["attn"]
    assert_offline(tab)
