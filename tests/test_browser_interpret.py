"""The viewer's logit-lens, rollout and patching panels in a real browser (Debian's Chromium,
Playwright, the network blocked): each panel opens, hovering a cell shows the number the payload
holds (decoded here from the page's JSON, formatted as the page documents), hostile tokens and
texts stay text, and no request leaves the page. Fixtures as in test_browser.py.
"""

from __future__ import annotations

import numpy as np

import qkv
from conftest import MODELS
from test_browser import CHECKSUM, assert_offline, browser, open_viewer, tab  # noqa: F401  (fixtures)
from test_viewer import XSS, data_of, random_trace
from test_viewer_interpret import unpack
from qkv.analysis.patch import EMBEDDING, patch
from qkv.analysis.sections import patch_payload, rollout_payload
from qkv.viz.html import save_viewer
from qkv.viz.interpret_payload import lens_section


def fmt_p(p: float) -> str:
    """viewer.js fmtP: a probability to 4 decimals, never a misleading 0."""
    return f"{p:.4f}" if p >= 0.00005 else "<0.0001" if p > 0 else "0"


def fmt_w(q: int) -> str:
    """viewer.js fmt: a one-byte weight q/255 to 2 decimals."""
    return "0.00" if q == 0 else "<0.01" if q / 255 < 0.01 else f"{q / 255:.2f}"


def fmt_e(v: float) -> str:
    """viewer.js fmtE: an effect with its sign, 3 decimals (never a misleading 0.000)."""
    return ("+" if v > 0 else "−" if v < 0 else "") + ("<0.001" if 0 < abs(v) < 0.0005 else f"{abs(v):.3f}")


def hover_cell(page, canvas: str, r: int, c: int) -> None:
    """Move the mouse to data cell (row r, column c) of a panel's heatmap (its data-* say where)."""
    box = page.locator(canvas).bounding_box()
    d = page.eval_on_selector(canvas, "e => Object.assign({}, e.dataset)")
    y = int(d["rows"]) - 1 - r if d["flip"] == "1" else r
    page.mouse.move(box["x"] + int(d["padL"]) + (c + 0.5) * int(d["cw"]),
                    box["y"] + int(d["padT"]) + (y + 0.5) * int(d["ch"]))


def no_html_from_data(page) -> None:
    assert page.evaluate("() => document.querySelectorAll('img, b:not(.qkv-patch-line b)').length") == 0
    assert page.evaluate("() => document.scripts.length") == 3


def test_the_lens_panel_shows_a_cells_probability_rank_and_top_tokens(tab, tmp_path):
    tokens = ["<s>", XSS, "b", "c", "d"]
    L1, n, V, k = 4, len(tokens), 40, 5                              # rows 0..L, a vocabulary of 40
    z = np.random.default_rng(2).normal(size=(L1, n, V)) * 2          # (L+1, n, V) logits
    p = np.exp(z - z.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    final = np.argmax(z[-1], -1)
    at = p[:, np.arange(n), final]
    top = np.argsort(-z, -1)[..., :k]
    spell = lambda i: XSS if i % 3 == 0 else f"tok{i}"                # hostile spellings among the candidates
    section = lens_section(at, 1 + (p > at[..., None]).sum(-1), final, top, np.take_along_axis(p, top, -1), spell, V)
    path = save_viewer(random_trace(tokens, L=3, H=2), tmp_path / "lens.html", sections={"lens": section}, view="lens",
                       title=XSS)
    data = data_of(path.read_text())
    open_viewer(tab, path)
    page = tab.page
    assert tab.state()["view"] == "lens" and tab.state()["lensMode"] == "prob"
    prob, rank = unpack(data["lens"]["prob"]), unpack(data["lens"]["rank"])
    ids, probs = unpack(data["lens"]["top_ids"]), unpack(data["lens"]["top_prob"])
    for r, c in [(0, 0), (2, 1), (L1 - 1, n - 1)]:
        hover_cell(page, ".qkv-heat-lens", r, c)
        assert tab.state()["cell"] == f"{r},{c}"
        text = page.text_content(".qkv-lens .qkv-readout")
        assert text.endswith(f"P = {fmt_p(prob[r, c])}, rank {rank[r, c]}"), text
        assert ("emb" if r == 0 else f"layer {r}") in text and f"“{spell(int(final[c]))}”" in text
        rows = page.eval_on_selector_all(".qkv-lens .qkv-cands tbody tr",
                                         "rs => rs.map(r => [r.children[1].textContent, r.children[3].textContent])")
        assert rows == [[spell(int(i)), fmt_p(q)] for i, q in zip(ids[r, c], probs[r, c])]
    before = page.evaluate(CHECKSUM, ".qkv-heat-lens")
    page.click(".qkv-lens .qkv-mode[data-mode=rank]")
    assert tab.state()["lensMode"] == "rank" and page.evaluate(CHECKSUM, ".qkv-heat-lens") != before
    hover_cell(page, ".qkv-heat-lens", 1, 2)
    page.click(".qkv-heat-lens", position={"x": 1, "y": 1})             # off the cells: nothing pinned
    page.mouse.move(5, 5)
    assert tab.state()["cell"] == ""
    no_html_from_data(page)
    assert page.title() == XSS and tab.dialogs == [] and tab.errors == []
    assert_offline(tab)


def test_the_rollout_panel_shows_raw_rollout_and_flow_side_by_side(tab, minilm, tmp_path):
    text = "The cat sat on the mat " + XSS
    trace = minilm.run(text, keep=("attentions",))
    path = save_viewer(trace, tmp_path / "r.html", sections={"rollout": rollout_payload(trace)})
    data = data_of(path.read_text())
    open_viewer(tab, path)
    page = tab.page
    page.click(".qkv-tab[data-view=rollout]")
    assert tab.state()["view"] == "rollout"
    assert page.locator(".qkv-rollout canvas.qkv-heat").count() == 3
    R, F = unpack(data["rollout"]["rollout"]), unpack(data["rollout"]["flow"])
    A = np.rint(unpack(data["attention"]) * 255)                      # the page's bytes, (L, H, n, n)
    n = len(trace.ids)
    for layer in (0, 5):
        page.select_option(".qkv-layer", str(layer))
        raw = np.floor(A[layer].sum(0) / A.shape[1] + 0.5)             # mean of the heads' bytes: Math.round
        for i, j in [(1, 2), (n - 1, 0)]:
            hover_cell(page, ".qkv-heat-raw", i, j)
            text_shown = page.text_content(".qkv-rollout .qkv-readout")
            want = (f"raw {fmt_w(int(raw[i, j]))} · rollout {fmt_w(int(round(R[layer, i, j] * 255)))} · "
                    f"flow {fmt_w(int(round(F[i, j] * 255)))}")
            assert text_shown.endswith(want), (text_shown, want)
            assert tab.state()["cell"] == f"{i},{j}"
    hover_cell(page, ".qkv-heat-flow", 3, 4)                          # any of the three maps answers
    assert tab.state()["cell"] == "3,4"
    titles = page.eval_on_selector_all(".qkv-rollout .qkv-figcap", "cs => cs.map(c => c.textContent)")
    assert titles == ["raw attention · layer 5, mean of 12 heads", "rollout · layers 0..5", "flow · all 6 layers"]
    no_html_from_data(page)
    assert tab.dialogs == [] and tab.errors == []
    assert_offline(tab)


def test_the_patching_panel_shows_each_effect_centred_at_zero(tab, minilm, tmp_path):
    clean, corrupted = XSS + " the cat sat", XSS + " the dog sat"
    p = patch(minilm, clean, corrupted, EMBEDDING)
    path = save_viewer(minilm.run(clean, keep=("attentions",)), tmp_path / "patch.html",
                       sections={"patch": patch_payload(p)}, view="patch")
    data = data_of(path.read_text())["patch"]
    open_viewer(tab, path)
    page = tab.page
    assert tab.state()["view"] == "patch"
    lines = page.eval_on_selector_all(".qkv-patch-line", "ls => ls.map(l => l.textContent)")
    assert lines[1].startswith(f"clean “{clean}”") and lines[2].startswith(f"corrupted “{corrupted}”")
    assert p.metric in lines[0]
    L, n = p.residual.shape
    for name, r, c in [("heads", 5, 11), ("heads", 0, 0), ("residual", 0, n - 3), ("attn_out", L - 1, 1),
                       ("ffn_out", 2, n - 1)]:
        hover_cell(page, f".qkv-heat-{name}", r, c)
        assert tab.state()["cell"] == f"{r},{c},{name}"
        shown = page.text_content(".qkv-patch .qkv-readout")
        assert shown.endswith(f"layer {r} · " + (f"head {c}" if name == "heads" else f"position {c} “{data['labels'][c]}”")
                              + f": {fmt_e(data['tables'][name][r][c])}"), shown
        assert page.text_content(".qkv-patch .qkv-tip:not([hidden])") == fmt_e(data["tables"][name][r][c])
    # the colour scale is centred at 0: a cell of effect 0 is drawn white
    zero = [(r, c) for r in range(L) for c in range(n) if data["tables"]["residual"][r][c] == 0][0]
    d = page.eval_on_selector(".qkv-heat-residual", "e => Object.assign({}, e.dataset)")
    ratio = page.eval_on_selector(".qkv-heat-residual", "c => c.width / c.getBoundingClientRect().width")
    x = (int(d["padL"]) + (zero[1] + 0.5) * int(d["cw"])) * ratio
    y = (int(d["padT"]) + (L - 1 - zero[0] + 0.5) * int(d["ch"])) * ratio
    pixel = page.eval_on_selector(".qkv-heat-residual", "(c, [x, y]) => Array.from(c.getContext('2d')"
                                  ".getImageData(Math.round(x), Math.round(y), 1, 1).data)", [x, y])
    assert pixel == [247, 247, 247, 255]
    no_html_from_data(page)
    assert tab.dialogs == [] and tab.errors == []
    assert_offline(tab)


def test_a_decoder_page_holds_every_panel_and_the_views_still_work(tab, tmp_path):
    from qkv.analysis.lens import KEEP
    from qkv.analysis.sections import lens_payload

    model = qkv.load(MODELS / "gpt2")
    trace = model.run("the cat sat on the mat", keep=("attentions",) + KEEP)
    path = save_viewer(trace, tmp_path / "all.html", sections={"lens": lens_payload(model, trace),
                                                                "rollout": rollout_payload(trace)})
    open_viewer(tab, path)
    page = tab.page
    tabs = page.eval_on_selector_all(".qkv-tab", "ts => ts.map(t => t.textContent)")
    assert tabs == ["Head view", "Matrix", "Model view", "Logit lens", "Rollout"]
    for view in ("lens", "rollout", "matrix", "model", "head"):
        page.click(f".qkv-tab[data-view={view}]")
        assert tab.state()["view"] == view
    page.click(".qkv-tab[data-view=rollout]")
    hover_cell(page, ".qkv-heat-rollout", 1, 3)                        # a masked cell of a decoder
    assert page.text_content(".qkv-rollout .qkv-readout").endswith("raw masked · rollout masked · flow masked")
    assert tab.errors == [] and tab.dialogs == []
    assert_offline(tab)
