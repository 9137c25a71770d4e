"""The viewer's attribution and causal-tracing panels in a real browser (Debian's Chromium, Playwright, the
network blocked; fixtures as in test_browser.py).

Attribution: `qkv attribute --out` on SmolLM2 writes attribute.html, opened on its panel, whose coloured
tokens carry attribute.json's scores, on the figures' diverging map; hovering or focusing a token reads its
score and id; a translator's page shows its source and target as two rows. Causal tracing: a synthetic
section (shaped as `qkv trace-fact --out` writes it) draws 3 maps of L × n cells, each cell in its kind's
colour of its indirect effect; hover and the arrow keys read a cell's numbers. Hostile tokens stay text.
"""

from __future__ import annotations

import json
import re

import numpy as np
from click.testing import CliRunner

from test_browser import assert_offline, browser, open_viewer, tab  # noqa: F401  (fixtures)
from test_browser_interpret import fmt_p, hover_cell
from test_interpret_payload_panels import causal_data, interpolate
from test_viewer import XSS, random_trace
from qkv.cli.app import cli
from qkv.viz import palette
from qkv.viz.html import save_viewer
from qkv.viz.interpret_payload import CAUSAL_KINDS, attribute_section, causal_section

# the colours of cells at canvas points [[x, y]] (CSS pixels), as [r, g, b]
PIXELS = """([sel, pts]) => { const c = document.querySelector(sel), g = c.getContext('2d');
  const k = c.width / c.getBoundingClientRect().width;     // the canvas's backing pixels per CSS pixel
  return pts.map(([x, y]) => Array.from(g.getImageData(Math.round(x * k), Math.round(y * k), 1, 1).data).slice(0, 3)); }"""


def signed(v: float, d: int) -> str:
    """viewer_panels.js signed: sign, D decimals, never a misleading 0."""
    small = 0.5 * 10 ** -d
    sign = "+" if v > 0 else "−" if v < 0 else ""
    return sign + (f"<{2 * small:.{d}f}" if 0 < abs(v) < small else f"{abs(v):.{d}f}")


def short(token: str, width: int) -> str:
    """viewer.js shown(token, width) of a token that is not whitespace: cut to WIDTH, "…" marking the cut."""
    return token if len(token) <= width else token[:width - 1] + "…"


def rgb(style: str) -> list[int]:
    return [int(x) for x in re.findall(r"\d+", style)[:3]]


def no_html(page) -> None:
    assert page.evaluate("() => document.querySelectorAll('img, b:not(.qkv-patch-line b)').length") == 0
    assert page.evaluate("() => document.scripts.length") == 3


def run_attribute(*args: str):
    r = CliRunner().invoke(cli, ["attribute", *args])
    assert r.exit_code == 0, r.output
    return r


# ── input attribution ───────────────────────────────────────────────────────────

def test_qkv_attribute_writes_a_page_whose_tokens_carry_the_json_scores(tab, tmp_path):
    out = tmp_path / "attr"
    r = run_attribute("The capital of France is", "--model", "smollm2", "--out", str(out))
    assert sorted(p.name for p in out.iterdir()) == ["attribute.html", "attribute.json", "attribute.png", "attribute.svg"]
    assert f"wrote {out / 'attribute.html'}" in r.output
    data = json.loads((out / "attribute.json").read_text(encoding="utf-8"))
    open_viewer(tab, out / "attribute.html")
    page = tab.page
    assert tab.state()["view"] == "attribute"
    assert page.text_content(".qkv-tab[aria-pressed=true]") == "Attribution"
    toks = page.eval_on_selector_all(".qkv-attr-tok", "ts => ts.map(t => [t.textContent, t.dataset.score, "
                                     "t.dataset.id, getComputedStyle(t).backgroundColor])")
    assert [t[0] for t in toks] == data["tokens"] and [int(t[2]) for t in toks] == data["ids"]
    scores = np.array([float(t[1]) for t in toks])
    want = np.array(data["scores"])
    assert np.allclose(scores, want, rtol=1e-5, atol=0), (scores, want)        # 6 significant digits
    m = np.abs(want).max()
    from matplotlib import colormaps

    for (_, _, _, style), s in zip(toks, want):                                # the figure's colour of each score
        t = 0.5 + 0.5 * s / m
        assert np.abs(np.array(rgb(style)) - interpolate(palette.DIVERGING_STOPS, t)).max() <= 1
        assert np.abs(np.array(rgb(style)) - np.array(colormaps[palette.DIVERGING](t)[:3]) * 255).max() <= 4
    lines = page.eval_on_selector_all(".qkv-attribute .qkv-about-line", "ls => ls.map(l => l.textContent)")
    assert lines[0] == f"attributed {data['output']} = {data['logit']:.4f}" and data["target_token"] == "␣Paris"
    assert lines[1].startswith("method gradient × input")
    ticks = page.eval_on_selector_all(".qkv-attribute .qkv-legend-ticks span", "s => s.map(x => x.textContent)")
    assert ticks[1] == "0" and ticks[0] == "−" + ticks[2][1:] and float(ticks[2][1:]) == float(f"{m:.3g}")

    def shown(i: int) -> str:                                                  # the score as stored, its sign
        s = toks[i][1]
        return ("+" + s if float(s) > 0 else "−" + s[1:] if float(s) < 0 else "0") + f" · id {data['ids'][i]}"

    page.hover(".qkv-attr-tok >> nth=3")                                       # "␣France"
    assert page.text_content(".qkv-attribute .qkv-readout") == f"“{data['tokens'][3]}” (token 3): score {shown(3)}"
    assert page.text_content(".qkv-attribute .qkv-tip:not([hidden])") == shown(3)
    assert tab.state()["token"] == "3"
    page.focus(".qkv-attr-tok >> nth=0")                                       # the keyboard: focus, then Tab
    page.keyboard.press("Tab")
    assert page.evaluate("() => document.activeElement.dataset.i") == "1"
    assert page.text_content(".qkv-attribute .qkv-readout") == f"“{data['tokens'][1]}” (token 1): score {shown(1)}"
    no_html(page)
    assert tab.errors == [] and tab.dialogs == []
    assert_offline(tab)


def test_a_translators_page_shows_its_source_and_target_as_two_rows(tab, tmp_path):
    out = tmp_path / "mt"
    run_attribute("나는 학교에 간다", "--model", "ko-en-tiny", "--prefix", "I go to", "--method", "ig", "--steps", "16",
                  "--out", str(out))
    data = json.loads((out / "attribute.json").read_text(encoding="utf-8"))
    open_viewer(tab, out / "attribute.html")
    page = tab.page
    rows = page.eval_on_selector_all(".qkv-attr-row", "rs => rs.map(r => [r.dataset.side, "
                                     "r.querySelector('.qkv-attr-side').textContent, "
                                     "Array.from(r.querySelectorAll('.qkv-attr-tok'), t => t.textContent)])")
    sides = data["sides"]
    assert rows == [["source", "source (encoder)", [t for t, s in zip(data["tokens"], sides) if s == "source"]],
                    ["target", "target (decoder, so far)", [t for t, s in zip(data["tokens"], sides) if s == "target"]]]
    lines = page.eval_on_selector_all(".qkv-attribute .qkv-about-line", "ls => ls.map(l => l.textContent)")
    assert lines[1].startswith("method integrated gradients")
    gap = data["logit"] - data["baseline_logit"]
    assert lines[2] == (f"path baseline {data['baseline']}, 16 steps: Σ scores = {sum(data['scores']):.4f}, "
                        f"z(e) − z(b) = {gap:.4f} ({100 * data['completeness_error']:.2f} % apart)")
    page.hover(".qkv-attr-row[data-side=target] .qkv-attr-tok >> nth=1")        # "I", token 5 of the whole
    assert page.text_content(".qkv-attribute .qkv-readout").startswith("“I” (token 5, target): score ")
    page.click(".qkv-tab[data-view=matrix]")                                   # the decoder's views still work
    assert tab.state()["view"] == "matrix" and "4 tokens" in page.text_content(".qkv-meta")
    assert tab.errors == [] and tab.dialogs == []
    assert_offline(tab)


def test_hostile_tokens_and_words_in_an_attribution_stay_text(tab, tmp_path):
    tokens = ["<s>", XSS, "b</span><script>alert(2)</script>", "d"]
    section = attribute_section({"tokens": tokens, "ids": [1, 2, 3, 4], "scores": [0.0, 1.5, -0.75, 1e-9],
                                 "method": "ig", "logit": 2.0, "baseline_logit": 0.5, "steps": 4, "baseline": XSS,
                                 "completeness_error": 0.01, "output": XSS, "target_token": XSS})
    path = save_viewer(random_trace(tokens), tmp_path / "a.html", sections={"attribute": section}, view="attribute")
    open_viewer(tab, path)
    page = tab.page
    assert page.eval_on_selector_all(".qkv-attr-tok", "ts => ts.map(t => t.textContent)") == [short(t, 32) for t in tokens]
    text = page.text_content(".qkv-attribute .qkv-about")
    assert f"attributed {XSS} = 2.0000" in text and f"baseline {XSS}, 4 steps" in text
    styles = page.eval_on_selector_all(".qkv-attr-tok", "ts => ts.map(t => getComputedStyle(t).backgroundColor)")
    assert rgb(styles[0]) == [247, 247, 247]                                   # a score of 0: white
    page.hover(".qkv-attr-tok >> nth=3")
    assert page.text_content(".qkv-attribute .qkv-tip:not([hidden])") == "+1e-9 · id 4"   # exact, however small
    no_html(page)
    assert tab.errors == [] and tab.dialogs == []
    assert_offline(tab)


# ── causal tracing ──────────────────────────────────────────────────────────────

def test_the_causal_panel_draws_three_maps_of_layers_by_tokens(tab, tmp_path):
    L, n = 4, 6
    data = causal_data(L, n)
    section = causal_section(data)
    path = save_viewer(random_trace(data["tokens"], L=2, H=2), tmp_path / "c.html", sections={"causal_trace": section},
                       view="causal_trace", title=XSS)
    open_viewer(tab, path)
    page = tab.page
    assert tab.state()["view"] == "causal_trace"
    page.focus(".qkv-heat-causal-ffn")                                        # the keyboard: a map's first cell
    assert tab.state()["cell"] == "0,0,ffn"
    page.keyboard.press("ArrowDown")
    assert tab.state()["cell"] == "1,0,ffn"
    page.evaluate("() => document.activeElement.blur()")
    assert tab.state()["cell"] == ""
    pc = data["p_corrupted"]
    cells = 0
    for kind in CAUSAL_KINDS:                                                 # every cell, in its kind's colour
        sel = f".qkv-heat-causal-{kind}"
        d = page.eval_on_selector(sel, "e => Object.assign({}, e.dataset)")
        assert (int(d["rows"]), int(d["cols"]), d["flip"]) == (n, L, "0")     # tokens top to bottom, layers across
        pts = [[int(d["padL"]) + (l + 0.5) * int(d["cw"]), int(d["padT"]) + (t + 0.5) * int(d["ch"])]
               for t in range(n) for l in range(L)]
        got = np.array(page.evaluate(PIXELS, [sel, pts]))
        top = section["top"][kind]
        want = np.array([interpolate(palette.CAUSAL_STOPS[kind], (section["tables"][kind][l][t] - pc) / top)
                         for t in range(n) for l in range(L)])
        assert np.abs(got - want).max() <= 1, kind
        cells += len(pts)
    assert cells == 3 * L * n
    for kind, t, l in [("hidden", 0, 0), ("ffn", 1, 2), ("attn", 5, 3), ("hidden", 2, 1)]:
        hover_cell(page, f".qkv-heat-causal-{kind}", t, l)
        assert tab.state()["cell"] == f"{t},{l},{kind}"
        p = section["tables"][kind][l][t]
        numbers = f"P(answer) = {fmt_p(p)}, indirect effect = {signed(p - pc, 4)}"
        assert page.text_content(f".qkv-causal-map[data-kind={kind}] .qkv-tip:not([hidden])") == \
            f"layer {l}, token {t}: {numbers}"
        readout = page.text_content(".qkv-causal_trace .qkv-readout")
        marked = "*" if 1 <= t < 3 else ""                                    # the subject's rows are starred
        assert readout.endswith(f"layer {l}, token {t} “{short(data['tokens'][t], 24)}”{marked}: {numbers}"), readout
    page.mouse.move(5, 5)
    assert tab.state()["cell"] == ""
    page.focus(".qkv-heat-causal-attn")                                       # the keyboard: the cell the mouse left
    assert tab.state()["cell"] == "5,3,attn"
    for key, cell in [("ArrowUp", "4,3,attn"), ("Home", "4,0,attn"), ("ArrowRight", "4,1,attn"), ("End", "4,3,attn"),
                      ("ArrowDown", "5,3,attn"), ("ArrowDown", "5,3,attn"), ("ArrowLeft", "5,2,attn")]:
        page.keyboard.press(key)
        assert tab.state()["cell"] == cell, key
    p = section["tables"]["attn"][2][5]
    assert page.text_content(".qkv-causal-map[data-kind=attn] .qkv-tip:not([hidden])") == \
        f"layer 2, token 5: P(answer) = {fmt_p(p)}, indirect effect = {signed(p - pc, 4)}"
    lines = page.eval_on_selector_all(".qkv-causal_trace .qkv-about-line", "ls => ls.map(l => l.textContent)")
    assert lines[0] == "answer “␣Paris” (id 42)"
    assert lines[1] == f"text “{data['text']}” · subject “{data['subject']}” (tokens 1..2, marked *)"
    assert lines[2] == "clean P = 0.8000" and lines[3].startswith("corrupted P = 0.1000 · noise 0.134 · 10 draws · seed 3")   # 3 digits of 0.13404731…
    assert lines[4].startswith("window 3 layers")
    scales = page.eval_on_selector_all(".qkv-causal_trace .qkv-legend-ticks", "ls => ls.map(l => l.textContent)")
    assert scales == [f"0{section['top'][k] / 2:.3f}{section['top'][k]:.3f}" for k in CAUSAL_KINDS]
    tops = page.eval_on_selector_all(".qkv-causal-map", "ms => ms.map(m => m.getBoundingClientRect().top)")
    assert len(set(tops)) == 1                                                 # side by side on a wide page
    no_html(page)
    assert page.title() == XSS and tab.errors == [] and tab.dialogs == []
    assert_offline(tab)


def test_the_causal_maps_stack_on_a_narrow_screen(tab, tmp_path):
    data = causal_data(12, 6)
    path = save_viewer(random_trace(data["tokens"]), tmp_path / "c.html", sections={"causal_trace": causal_section(data)},
                       view="causal_trace")
    tab.page.set_viewport_size({"width": 480, "height": 900})
    open_viewer(tab, path)
    tops = tab.page.eval_on_selector_all(".qkv-causal-map", "ms => ms.map(m => m.getBoundingClientRect().top)")
    assert len(tops) == 3 and tops[0] < tops[1] < tops[2]
    widths = tab.page.eval_on_selector_all(".qkv-causal-map", "ms => ms.map(m => m.getBoundingClientRect().right)")
    assert max(widths) <= 480
    assert tab.errors == []
