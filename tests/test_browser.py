"""The viewer and the web app in a real browser: Debian's Chromium, driven by Playwright.

Chromium is the system's (`apt-get install chromium`; `make test` installs it), never one
downloaded by `playwright install`. Without it these tests fail: they do not skip.
Timings are measured in the page and printed (pytest -s shows them), never asserted.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page, sync_playwright

import qkv
from qkv.viz.html import View, save_viewer
from conftest import MODELS, PATIENCE, running_server
from test_viewer import XSS, random_trace

from qkv.bench.viewer import ARGS, CHROMIUM, READY, TIMED   # the browser and page helpers `qkv bench viewer` uses

SENTENCE = "The cat sat on the mat"

# In-page helpers (functions, not strings to eval: the pages forbid eval by CSP).
CHECKSUM = """(sel) => { const c = document.querySelector(sel);
  const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
  let s = 0; for (let i = 0; i < d.length; i++) s = (s * 31 + d[i]) >>> 0; return s; }"""


@dataclass
class Tab:
    """A page and what it did: console errors, dialogs, and every request it tried."""
    page: Page
    errors: list[str] = field(default_factory=list)
    dialogs: list[str] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)
    blocked: list[str] = field(default_factory=list)

    def root(self, frame=None):
        return (frame or self.page).locator("[data-qkv-root]").first

    def state(self, frame=None) -> dict:
        return (frame or self.page).eval_on_selector("[data-qkv-root]", "e => Object.assign({}, e.dataset)")


@pytest.fixture(scope="module")
def browser() -> Browser:
    if not Path(CHROMIUM).is_file():
        pytest.fail(f"Chromium is missing at {CHROMIUM}: install it with `apt-get install chromium` "
                    "(make test does), or point QKV_CHROMIUM at it")
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        yield b
        b.close()


@pytest.fixture
def tab(browser):
    """A fresh page with no network: anything but file:, data: and the local test server is blocked."""
    context = browser.new_context(viewport={"width": 1100, "height": 800})
    context.set_default_timeout(PATIENCE * 1000)       # every wait on the page: a hang guard, never a speed limit
    t = Tab(context.new_page())
    allowed = ("file:", "data:", "about:", "http://127.0.0.1:")

    def route(r):
        if r.request.url.startswith(allowed):
            r.continue_()
        else:
            t.blocked.append(r.request.url)
            r.abort()

    context.route("**/*", route)
    context.on("request", lambda r: t.requests.append(r.url))
    t.page.on("console", lambda m: t.errors.append(m.text) if m.type == "error" else None)
    t.page.on("pageerror", lambda e: t.errors.append(str(e)))
    t.page.on("dialog", lambda d: (t.dialogs.append(d.message), d.dismiss()))
    yield t
    context.close()


@pytest.fixture(scope="module")
def cat(minilm):
    return minilm.run(SENTENCE, keep=("attentions",))


def open_viewer(tab: Tab, path: Path) -> None:
    tab.page.goto(path.as_uri())
    tab.page.wait_for_selector(READY)


def assert_offline(tab: Tab) -> None:
    assert tab.blocked == [] and all(u.startswith(("file:", "data:", "about:")) for u in tab.requests), tab.requests


def tokens_shown(where, side: str = "q") -> list[str]:
    return where.eval_on_selector_all(f".qkv-col-{side} .qkv-tok", "ts => ts.map(t => t.textContent)")


# the viewer ---------------------------------------------------------------------

def test_viewer_loads_from_a_file_with_the_network_blocked(tab, cat, tmp_path):
    tab.page.context.set_offline(True)
    open_viewer(tab, save_viewer(cat, tmp_path / "v.html", model_name="all-MiniLM-L6-v2"))
    assert tokens_shown(tab.page, "q") == tokens_shown(tab.page, "k") == cat.tokens
    assert tab.state().items() >= {"view": "head", "layer": "0", "head": "all", "hover": ""}.items()
    assert "all-MiniLM-L6-v2 · 8 tokens · layer 0 · all heads" in tab.page.text_content(".qkv-meta")
    assert_offline(tab)
    assert tab.errors == []


def test_clicking_a_head_and_hovering_a_token_change_what_is_drawn(tab, cat, tmp_path):
    open_viewer(tab, save_viewer(cat, tmp_path / "v.html"))
    page = tab.page
    all_heads = page.evaluate(CHECKSUM, ".qkv-lines")
    page.click(".qkv-chip >> nth=2")
    assert tab.state()["head"] == "2" and page.input_value(".qkv-head") == "2"
    head2 = page.evaluate(CHECKSUM, ".qkv-lines")
    assert head2 != all_heads

    page.hover(".qkv-col-q .qkv-tok >> nth=3")                                 # "sat"
    assert tab.state()["hover"] == "q3" and page.evaluate(CHECKSUM, ".qkv-lines") != head2
    lit = page.eval_on_selector_all(".qkv-col-k .qkv-tok", "ts => ts.map(t => t.style.background !== '')")
    assert lit == [tok == 2 for tok in range(8)]                               # head 0.2: sat → cat only
    assert page.get_attribute(".qkv-col-q .qkv-tok >> nth=3", "class").split().count("qkv-hot") == 1

    page.mouse.move(5, 600)                                                    # away: every line again
    assert tab.state()["hover"] == "" and page.evaluate(CHECKSUM, ".qkv-lines") == head2
    page.click(".qkv-chip >> nth=2")                                           # again: all heads
    assert tab.state()["head"] == "all" and page.evaluate(CHECKSUM, ".qkv-lines") == all_heads

    page.select_option(".qkv-layer", "3")
    assert tab.state()["layer"] == "3" and page.evaluate(CHECKSUM, ".qkv-lines") != all_heads
    assert tab.errors == []


def test_matrix_view_shows_a_cells_weight_as_python_computed_it(tab, cat, tmp_path):
    open_viewer(tab, save_viewer(cat, tmp_path / "v.html"))
    page = tab.page
    page.click(".qkv-tab >> text=Matrix")
    page.select_option(".qkv-head", "2")
    assert tab.state()["view"] == "matrix"
    geo = page.eval_on_selector(".qkv-heat", "c => ({...c.dataset, box: c.getBoundingClientRect().toJSON()})")
    cell, x0, y0 = float(geo["cell"]), geo["box"]["x"] + float(geo["padL"]), geo["box"]["y"] + float(geo["padT"])
    for i, j in [(3, 2), (3, 5), (7, 6)]:
        page.mouse.move(x0 + (j + 0.5) * cell, y0 + (i + 0.5) * cell)
        assert tab.state()["cell"] == f"{i},{j}"
        a = float(cat.attentions[0, 2, i, j])
        value = "0.00" if round(a * 255) == 0 else "<0.01" if a < 0.01 else f"{round(a * 255) / 255:.2f}"
        want = f"“{cat.tokens[i]}” (query {i}) → “{cat.tokens[j]}” (key {j}): {value}"
        assert page.text_content(".qkv-readout") == want
    assert page.is_visible(".qkv-tip")
    assert tab.errors == []


# Each drawn matrix label as the polygon its text covers on the page, measured here in the page's own font: its
# width by measureText, its height the font's line box (textBaseline "middle", as drawn); columns turned by −45°.
LABEL_BOXES = """c => {
  const ctx = document.createElement("canvas").getContext("2d"), d = c.qkvLabels, r = c.getBoundingClientRect();
  ctx.font = d.font;
  ctx.textBaseline = "middle";
  const box = (l, right, turn) => {
    const m = ctx.measureText(l.text), w = m.width, up = m.fontBoundingBoxAscent, down = m.fontBoundingBoxDescent;
    const corners = right ? [[-w, -up], [0, -up], [0, down], [-w, down]] : [[0, -up], [w, -up], [w, down], [0, down]];
    const cos = Math.cos(turn), sin = Math.sin(turn);
    return corners.map(([u, v]) => [r.x + l.x + u * cos - v * sin, r.y + l.y + u * sin + v * cos]);
  };
  return {rows: d.rows.map((l) => box(l, true, 0)), cols: d.cols.map((l) => box(l, false, -Math.PI / 4))};
}"""


def polygons_overlap(a: list, b: list) -> bool:
    """Whether two convex polygons [(x, y), ...] share any area (separating axis theorem)."""
    for poly in (a, b):
        for (x1, y1), (x2, y2) in zip(poly, poly[1:] + poly[:1]):
            nx, ny = y2 - y1, x1 - x2
            pa, pb = [nx * x + ny * y for x, y in a], [nx * x + ny * y for x, y in b]
            if max(pa) <= min(pb) + 1e-6 or max(pb) <= min(pa) + 1e-6:
                return False
    return True


@pytest.mark.parametrize("words, zooms", [(42, [0]), (98, [4, 5, 6, 8])])
def test_matrix_labels_never_overlap(tab, minilm, tmp_path, words, zooms):
    """44 and 100 tokens (the matrix opens at 12 and 5 px a cell; + zooms 1.25× a press): every drawn row label and
    every 45° column label is clear of every other (each polygon its text covers), and enough are drawn to read."""
    text = " ".join(("the cat sat on the mat while the old dog watched from across a quiet garden " * 8).split()[:words])
    trace = minilm.run(text, keep=("attentions",))
    assert len(trace.tokens) == words + 2
    open_viewer(tab, save_viewer(trace, tmp_path / "v.html"))
    page = tab.page
    page.click(".qkv-tab >> text=Matrix")
    page.focus(".qkv-heat")
    pressed = 0
    for presses in zooms:
        for _ in range(presses - pressed):
            page.keyboard.press("=")
        pressed = presses
        geo = page.eval_on_selector(".qkv-heat", "c => c.dataset")
        boxes = page.eval_on_selector(".qkv-heat", LABEL_BOXES)
        cell, cols = float(geo["cell"]), int(geo["cols"])
        assert cell >= 10 and len(boxes["cols"]) >= min(cols, 560 / cell) / 3, geo     # labelled, one in 3 at least
        for side in ("rows", "cols"):
            drawn = boxes[side]
            for k, a in enumerate(drawn):
                for b in drawn[k + 1:k + 6]:                                       # neighbours on the page
                    assert not polygons_overlap(a, b), (side, cell, k)
    assert tab.errors == []


def test_model_view_opens_the_head_you_click(tab, cat, tmp_path):
    roles = [["previous" if (layer, h) == (0, 2) else None for h in range(12)] for layer in range(6)]
    open_viewer(tab, save_viewer(cat, tmp_path / "v.html", roles=roles))
    page = tab.page
    page.click(".qkv-tab >> text=Model view")
    assert page.locator(".qkv-thumb").count() == 6 * 12
    assert page.get_attribute(".qkv-thumb >> nth=2", "title") == "layer 0 · head 2 (previous) · click to open"
    assert page.locator(".qkv-thumb.qkv-hasrole").count() == 1
    page.click(".qkv-thumb[data-layer='4'][data-head='7']")
    assert tab.state().items() >= {"view": "head", "layer": "4", "head": "7"}.items()
    assert page.is_visible(".qkv-headview") and not page.is_visible(".qkv-model")
    assert tab.errors == []


def test_a_decoders_generation_marks_generated_tokens_and_kept_layers(tab, tmp_path):
    model = qkv.load(str(MODELS / "gpt2"))
    generated = model.generate("the cat sat", max_new_tokens=4, temperature=0, trace=True)
    trace = model.run(generated.ids, layers=[1], keep=("attentions",))
    trace.prompt_length = generated.prompt_length
    n, p = len(trace.tokens), trace.prompt_length
    open_viewer(tab, save_viewer(trace, tmp_path / "gen.html"))
    page = tab.page
    assert page.eval_on_selector_all(".qkv-layer option", "os => os.map(o => o.textContent)") == ["1"]
    marked = page.eval_on_selector_all(".qkv-col-q .qkv-tok", "ts => ts.map(t => t.classList.contains('qkv-gen'))")
    assert marked == [i >= p for i in range(n)] and page.is_visible(f"text=tokens from {p} on")
    page.click(".qkv-chip >> nth=0")
    page.hover(".qkv-col-q .qkv-tok >> nth=0")                                 # causal: the first token sees itself only
    lit = page.eval_on_selector_all(".qkv-col-k .qkv-tok", "ts => ts.map(t => t.style.background !== '')")
    assert lit == [True] + [False] * (n - 1)
    assert tab.errors == []


def test_readable_tokens_the_causal_mask_and_cross_attention(tab, tmp_path):
    import numpy as np

    from qkv.core.trace import LayerTrace, Trace

    model = qkv.load(str(MODELS / "gpt2"))
    trace = model.run("the cat\nsat", keep=("attentions",))
    open_viewer(tab, save_viewer(trace, tmp_path / "causal.html"))
    page = tab.page
    assert tokens_shown(page) == trace.labels and "␣c" in trace.labels and "↵" in trace.labels   # never Ġ, Ċ
    assert page.get_attribute(".qkv-col-q .qkv-tok >> nth=2", "title") == "query 2: ␣c (spelled Ġc)"
    page.click(".qkv-tab >> text=Matrix")
    page.select_option(".qkv-head", "0")
    geo = page.eval_on_selector(".qkv-heat", "c => ({...c.dataset, box: c.getBoundingClientRect().toJSON()})")
    cell, x0, y0 = float(geo["cell"]), geo["box"]["x"] + float(geo["padL"]), geo["box"]["y"] + float(geo["padT"])
    page.mouse.move(x0 + 3.5 * cell, y0 + 0.5 * cell)                        # query 0 → key 3: after it
    assert page.text_content(".qkv-readout").endswith("(key 3): masked")
    assert "grey: masked" in page.text_content(".qkv-scale")
    # cross-attention: 3 queries over 5 keys of another text
    a = np.random.default_rng(0).dirichlet(np.ones(5), size=(1, 2, 3)).astype(np.float32)   # (L, H, n_q, n_k)
    cross = Trace(tokens=["a", "b", "c"], ids=np.arange(3), hidden=None, logits=None, causal=False, model="m",
                  source_tokens=["v", "w", "x", "y", "z"], layers={0: LayerTrace(layer=0, attentions=a[0])})
    open_viewer(tab, save_viewer(cross, tmp_path / "cross.html"))
    assert tokens_shown(page, "q") == ["a", "b", "c"] and tokens_shown(page, "k") == ["v", "w", "x", "y", "z"]
    assert "m · 3 × 5 tokens" in page.text_content(".qkv-meta")
    page.hover(".qkv-col-k .qkv-tok >> nth=4")
    page.click(".qkv-tab >> text=Matrix")
    page.select_option(".qkv-head", "1")
    geo = page.eval_on_selector(".qkv-heat", "c => ({...c.dataset, box: c.getBoundingClientRect().toJSON()})")
    cell, x0, y0 = float(geo["cell"]), geo["box"]["x"] + float(geo["padL"]), geo["box"]["y"] + float(geo["padT"])
    page.mouse.move(x0 + 4.5 * cell, y0 + 2.5 * cell)
    assert tab.state()["cell"] == "2,4"
    assert page.text_content(".qkv-readout") == f"“c” (query 2) → “z” (key 4): {round(a[0, 1, 2, 4] * 255) / 255:.2f}"
    page.click(".qkv-tab >> text=Model view")
    assert page.locator(".qkv-thumb").count() == 2
    assert tab.errors == []


def test_hostile_tokens_show_as_text(tab, tmp_path):
    hostile = ["[CLS]", XSS, "</script><script>alert(2)</script>", "<b onmouseover=alert(3)>x</b>", "[SEP]"]
    open_viewer(tab, save_viewer(random_trace(hostile, L=1, H=2), tmp_path / "x.html", model_name=XSS,
                                 title=XSS))
    page = tab.page
    assert tokens_shown(page, "q") == hostile and page.title() == XSS
    assert XSS in page.text_content(".qkv-meta")
    page.hover(".qkv-col-q .qkv-tok >> nth=1")
    page.hover(".qkv-col-k .qkv-tok >> nth=3")
    page.click(".qkv-tab >> text=Matrix")
    page.mouse.move(400, 300)
    page.click(".qkv-tab >> text=Model view")
    assert page.evaluate("() => [document.querySelectorAll('img, b').length, document.scripts.length]") == [0, 3]
    assert tab.dialogs == [] and tab.errors == []


def test_two_views_in_one_notebook_page_work_independently(tab, minilm, cat, tmp_path):
    other = minilm.run("Attention is all you need", keep=("attentions",))
    notebook = tmp_path / "notebook.html"                  # what Jupyter does: outputs side by side in one page
    notebook.write_text("<!DOCTYPE html><meta charset=utf-8><body>"
                        f"<div class=output>{View(cat)._repr_html_()}</div>"
                        f"<div class=output>{View(other)._repr_html_()}</div></body>")
    tab.page.goto(notebook.as_uri())
    frames = [f for f in tab.page.frames if f != tab.page.main_frame]
    assert len(frames) == 2
    for f in frames:
        f.wait_for_selector(READY)
    first, second = frames
    assert tokens_shown(first) == cat.tokens and tokens_shown(second) == other.tokens
    first.click(".qkv-chip >> nth=2")
    second.hover(".qkv-col-k .qkv-tok >> nth=1")
    assert tab.state(first)["head"] == "2" and tab.state(first)["hover"] == ""
    assert tab.state(second)["head"] == "all" and tab.state(second)["hover"] == "k1"
    assert_offline(tab)
    assert tab.dialogs == [] and tab.errors == []


def test_a_notebook_frame_fits_its_viewer(tab, cat, tmp_path):
    """View's iframe starts at an estimated height, then takes the viewer's own height as the viewer reports it
    (no band of empty space below a short viewer); a message from elsewhere never resizes it."""
    view = View(cat, height=1500)                                     # an estimate far too tall
    notebook = tmp_path / "notebook.html"
    notebook.write_text(f"<!DOCTYPE html><meta charset=utf-8><body><div class=output>{view._repr_html_()}</div></body>")
    tab.page.goto(notebook.as_uri())
    frame = next(f for f in tab.page.frames if f != tab.page.main_frame)
    frame.wait_for_selector(READY)
    tab.page.wait_for_function("() => document.querySelector('iframe.qkv-view').style.height !== '1500px'")
    height = tab.page.evaluate("() => document.querySelector('iframe.qkv-view').getBoundingClientRect().height")
    content = frame.evaluate("() => document.body.getBoundingClientRect().bottom")
    assert content <= height <= content + 40, (height, content)      # fits, within the frame's border and margin
    tab.page.evaluate("() => new Promise((done) => {"                       # not from the frame: ignored (the
                      "  addEventListener('message', (e) => e.data === 'after' && done());"   # 'after' message
                      "  postMessage({qkvHeight: 5}, '*'); postMessage('after', '*'); })")  # arrives after it)
    assert tab.page.evaluate("() => document.querySelector('iframe.qkv-view').getBoundingClientRect().height") == height
    assert tab.errors == []


def test_512_tokens_load_and_stay_interactive(tab, minilm, tmp_path):
    ids, _ = minilm.tokenizer.encode("The quick brown fox jumps over the lazy dog near the river bank. " * 50)
    trace = minilm.run(ids[:512], keep=("attentions",))
    path = save_viewer(trace, tmp_path / "long.html")
    open_viewer(tab, path)
    page = tab.page
    state = tab.state()
    assert len(tokens_shown(page)) == 512
    ready = page.evaluate("() => performance.now()")
    before = page.evaluate(CHECKSUM, ".qkv-lines")
    timings = {
        "click head 2": page.evaluate(TIMED, [".qkv-chip:nth-of-type(3)", "click"]),
        "hover a token": page.evaluate(TIMED, [".qkv-col-q .qkv-tok:nth-child(40)", "mouseover"]),
        "all heads again": page.evaluate(TIMED, [".qkv-chip:nth-of-type(3)", "click"]),
        "matrix view": page.evaluate(TIMED, [".qkv-tab:nth-child(2)", "click"]),
        "model view (72 thumbnails)": page.evaluate(TIMED, [".qkv-tab:nth-child(3)", "click"]),
        "open a thumbnail": page.evaluate(TIMED, [".qkv-thumb:nth-of-type(30)", "click"]),
    }
    assert tab.state()["view"] == "head" and tab.state()["head"] == "5"
    assert page.evaluate(CHECKSUM, ".qkv-lines") != before
    print(f"\n512 tokens: {path.stat().st_size / 1e6:.2f} MB of HTML; page ready {ready:.0f} ms after navigation "
          f"(inflate {state['decodeMs']} ms, first draw {state['renderMs']} ms)")
    for what, ms in timings.items():
        print(f"  {what}: {ms:.0f} ms to the next frame")
    assert tab.errors == []


# the web app --------------------------------------------------------------------

PATIENT = 900_000   # ms the web app's pages wait for what they wait on (an answer shown, a state): a hang guard,
                    # not a speed limit (on a busy 2-core machine a SmolLM2 reply and its lens took minutes)


def open_app(tab: Tab, srv) -> Page:
    """The web app of SRV in TAB, every wait of its page bounded by PATIENT only."""
    tab.page.set_default_timeout(PATIENT)
    tab.page.goto(srv.url)
    return tab.page


@pytest.fixture(scope="module")
def app_server():
    with running_server("minilm") as srv:
        yield srv


def test_the_web_app_answers_a_typed_sentence(tab, app_server):
    page = open_app(tab, app_server)
    page.wait_for_selector(READY)                               # the example runs on load
    assert tokens_shown(page) == ["[CLS]", "the", "cat", "sat", "on", "the", "mat", "[SEP]"]
    page.click(".qkv-chip >> nth=2")                                           # a head: kept across texts
    page.fill("textarea", "A dog barked at the mailman")
    page.click("button[type=submit]")
    page.wait_for_function("() => [...document.querySelectorAll('.qkv-col-q .qkv-tok')].some(t => t.textContent === 'dog')")
    assert tokens_shown(page)[:3] == ["[CLS]", "a", "dog"] and tab.state()["head"] == "2"
    assert "all-MiniLM-L6-v2: " in page.text_content(".qkv-status")
    page.select_option(".qkv-layer", "5")
    assert tab.state()["layer"] == "5"
    assert all(u.startswith(app_server.url) or u.startswith("data:") for u in tab.requests), tab.requests
    assert tab.errors == [] and tab.dialogs == []


def test_the_web_app_has_the_viewers_rollout_tab(tab, app_server):
    page = open_app(tab, app_server)
    page.wait_for_selector(READY)
    assert [t.inner_text() for t in page.query_selector_all(".qkv-tab")][-1] == "Rollout"    # an encoder: no lens
    page.click(".qkv-tab >> text=Rollout")
    page.wait_for_selector(".qkv-heat-rollout")
    assert tab.errors == [] and tab.dialogs == []


def test_the_web_app_shows_why_it_refuses_a_long_text(tab, app_server):
    page = open_app(tab, app_server)
    page.wait_for_selector(READY)
    page.fill("textarea", "word " * 600)
    page.click("button[type=submit]")
    page.wait_for_selector(".qkv-error:not([hidden])")
    assert page.text_content(".qkv-error") == "the text has 602 tokens but all-MiniLM-L6-v2 here takes at most 512; shorten it"
    assert page.get_attribute(".qkv-app", "data-state") == "error"
    # the browser itself logs the 413; nothing else may go wrong
    assert all("status of 413" in e for e in tab.errors) and len(tab.errors) == 1, tab.errors
    page.fill("textarea", "Short again.")
    page.click("button[type=submit]")
    page.wait_for_selector(".qkv-error[hidden]", state="attached")
    assert page.get_attribute(".qkv-app", "data-state") == "shown"


# the chat -----------------------------------------------------------------------

@pytest.fixture(scope="module")
def chat_server():
    with running_server("smollm2") as srv:
        yield srv


def test_the_chat_streams_a_reply_then_shows_what_each_token_attended_to(tab, chat_server, monkeypatch):
    """The reply streams in; its views show as it ends, Send works again and the time shown is the reply's,
    while its logit lens is still being computed (held here in a hook); the Logit lens tab joins the view after."""
    import threading

    import qkv.analysis.sections as sections

    lens_top, started, release = sections.lens_top, threading.Event(), threading.Event()

    def held(*args, **kwargs):                       # the first reply's lens waits for the test
        started.set()
        release.wait(PATIENT / 1000)
        return lens_top(*args, **kwargs)

    monkeypatch.setattr(sections, "lens_top", held)
    page = open_app(tab, chat_server)
    page.wait_for_selector(".qkv-app[data-mode='chat']")                       # a chat model: the page opens in chat
    assert page.get_attribute(".qkv-mode[data-mode='chat']", "aria-pressed") == "true"
    # record every text the reply bubble showed while it was being written
    page.evaluate("""() => { window.seen = [];
      new MutationObserver(() => { const r = document.querySelector('.qkv-msg-assistant .qkv-msg-text');
        if (r) window.seen.push(r.textContent); }).observe(document.querySelector('.qkv-chat-log'),
        {subtree: true, childList: true, characterData: true}); }""")
    page.fill("textarea[name=message]", "What is the capital of France?")
    page.press("textarea[name=message]", "Enter")
    try:
        assert started.wait(PATIENT / 1000)          # the reply is written; its lens is being computed, held
        chat_server.app.writer.enter(wait=False)     # the server's writer is free (Busy if the lens held it)
        chat_server.app.writer.leave()
        page.wait_for_selector(".qkv-app[data-state='shown']")                  # the reply's views, at once
        assert page.is_enabled(".qkv-chat-form button[type=submit]") and page.get_attribute(".qkv-app", "data-lens") is None
        assert "Logit lens" not in [t.inner_text() for t in page.query_selector_all(".qkv-tab")]
        assert "a reply of" in page.text_content(".qkv-status")              # its time: the reply's, not the lens's
    finally:
        release.set()
    page.wait_for_selector(".qkv-app[data-lens='shown']")                        # the lens joins the view
    assert "Logit lens" in [t.inner_text() for t in page.query_selector_all(".qkv-tab")]
    model = chat_server.app.model("smollm2")
    question = [{"role": "user", "content": "What is the capital of France?"}]
    reply = model.chat(question, max_new_tokens=160)
    assert page.text_content(".qkv-msg-user .qkv-msg-text") == question[0]["content"]
    assert page.text_content(".qkv-msg-assistant .qkv-msg-text") == reply and "Paris" in reply
    seen = [s for s in page.evaluate("() => window.seen") if s]
    assert len(set(seen)) > 2 and all(reply.startswith(s) for s in seen)      # it grew piece by piece
    prompt = model.tokenizer.apply_chat_template(question, add_generation_prompt=True)
    tokens = tokens_shown(page)
    marked = page.eval_on_selector_all(".qkv-col-q .qkv-tok", "ts => ts.map(t => t.classList.contains('qkv-gen'))")
    assert tokens[0] == "<|im_start|>" and len(tokens) > len(prompt)
    assert marked == [i >= len(prompt) for i in range(len(tokens))]           # the reply's tokens are marked
    assert "a reply of" in page.text_content(".qkv-status")
    # a second turn carries the first one
    page.fill("textarea[name=message]", "And of Italy?")
    page.click(".qkv-chat-form button[type=submit]")
    page.wait_for_function("() => document.querySelectorAll('.qkv-msg').length === 4 && "
                           "document.querySelector('.qkv-app').dataset.state === 'shown'")
    turns = question + [{"role": "assistant", "content": reply}, {"role": "user", "content": "And of Italy?"}]
    assert page.text_content(".qkv-msg-assistant >> nth=1") .endswith(model.chat(turns, max_new_tokens=160))
    page.click(".qkv-new-chat")
    assert page.locator(".qkv-msg").count() == 0
    assert all(u.startswith(chat_server.url) or u.startswith("data:") for u in tab.requests), tab.requests
    assert tab.errors == [] and tab.dialogs == []


def test_the_chat_never_shows_another_answers_view_under_its_reply(tab, app_server):
    """Plain `qkv serve` (MiniLM): after Show attention, the chat mode does not show MiniLM's view under
    a reply being written (it looked like the reply's); the reply's own view appears when it is done, and
    the attention mode shows its own again."""
    page = open_app(tab, app_server)
    page.wait_for_selector(READY)                                 # MiniLM's view of the example
    root = "[data-qkv-root]"
    assert page.is_visible(root)
    page.click(".qkv-mode[data-mode='chat']")
    assert page.is_hidden(root)                                                  # not the chat's view
    page.fill("textarea[name=message]", "Hi")
    page.press("textarea[name=message]", "Enter")
    page.wait_for_selector(".qkv-app[data-state='writing']")
    assert page.is_hidden(root)
    page.wait_for_selector(".qkv-app[data-state='shown']")
    assert page.is_visible(root) and tokens_shown(page)[0] == "<|im_start|>"  # the reply's own view
    page.click(".qkv-mode[data-mode='attention']")
    assert page.is_hidden(root)                                                  # until it shows its own again
    page.click("button[type=submit]")
    # its own view, MiniLM's (a busy machine drew the reply's view first and read it before the new one came)
    page.wait_for_function("() => { const r = document.querySelector('[data-qkv-root]'); "
                           "const t = r && !r.hidden && r.querySelector('.qkv-col-q .qkv-tok'); "
                           "return !!t && t.textContent === '[CLS]'; }")
    page.wait_for_selector(READY)
    assert tokens_shown(page)[0] == "[CLS]"
    assert tab.errors == [] and tab.dialogs == []


def test_the_chat_shows_why_it_refuses(tab, chat_server):
    page = open_app(tab, chat_server)
    page.wait_for_selector(".qkv-app[data-mode='chat']")
    page.select_option(".qkv-chat-model", "minilm")
    page.fill("textarea[name=message]", "Hello")
    page.press("textarea[name=message]", "Enter")
    page.wait_for_selector(".qkv-error:not([hidden])")
    assert "all-MiniLM-L6-v2 is an encoder" in page.text_content(".qkv-error")
    assert page.locator(".qkv-msg").count() == 0                                # the question is taken back
    assert page.input_value("textarea[name=message]") == "Hello"
    assert all("status of 400" in e for e in tab.errors) and len(tab.errors) == 1, tab.errors


# the next-token view ------------------------------------------------------------

def shown_candidates(page) -> list[tuple[int, float]]:
    """(token id, probability) of each candidate row, as the page computed it."""
    rows = page.eval_on_selector_all(".qkv-cands tbody tr[data-id]", "rs => rs.map(r => [+r.dataset.id, +r.dataset.p])")
    return [(int(i), p) for i, p in rows]


def test_the_temperature_slider_renormalises_the_candidates(tab, tmp_path):
    import numpy as np

    from qkv.writing.nexttoken import distribution
    from qkv.viz.payload import NEXT_TEMPERATURES

    model = qkv.load(str(MODELS / "gpt2"))
    trace = model.generate("the cat sat", max_new_tokens=8, temperature=1.5, seed=3, stop_at_eos=False, trace=True)
    open_viewer(tab, save_viewer(trace, tmp_path / "gen.html", tokenizer=model.tokenizer))
    page = tab.page
    page.click(".qkv-tab >> text=Next token")
    p = trace.prompt_length
    assert tab.state()["view"] == "next" and tab.state()["temperature"] == "1" and tab.state()["step"] == str(p)
    assert page.locator(".qkv-step").count() == len(trace.ids) - p

    def check(step: int, T: float) -> list[float]:
        """The rows equal softmax(logits / T) over the whole vocabulary; rows + other tokens = 1."""
        P = distribution(trace.logits[p + step - 1], T)                    # (V,)
        rows = shown_candidates(page)
        top10 = np.argsort(-trace.logits[p + step - 1], kind="stable")[:10]
        assert [i for i, _ in rows][:10] == top10.tolist()
        assert max(abs(q - P[i]) for i, q in rows) < 1e-3                   # page data: logits to 4 decimals
        other = float(page.get_attribute(".qkv-other", "data-p"))
        assert abs(sum(q for _, q in rows) + other - 1) < 1e-9
        chosen = page.eval_on_selector_all(".qkv-cands tr.qkv-chosen", "rs => rs.map(r => +r.dataset.id)")
        assert chosen == [int(trace.ids[p + step])]
        return [q for _, q in rows]

    at_1 = check(0, 1.0)
    page.fill(".qkv-temp-slider", str(NEXT_TEMPERATURES.index(2.0) + 1))     # T = 2: flatter
    assert tab.state()["temperature"] == "2" and page.text_content(".qkv-temp-value") == "T = 2.0"
    at_2 = check(0, 2.0)
    assert at_2[0] < at_1[0]
    page.fill(".qkv-temp-slider", str(NEXT_TEMPERATURES.index(0.3) + 1))     # T = 0.3: sharper
    at_03 = check(0, 0.3)
    assert at_03[0] > at_1[0]
    page.press(".qkv-temp-slider", "ArrowRight")                              # the keyboard moves it too
    assert tab.state()["temperature"] == "0.4"
    check(0, 0.4)
    page.fill(".qkv-temp-slider", "0")                                        # greedy: one-hot on the argmax
    assert page.text_content(".qkv-temp-value") == "T = 0.0 (greedy)"
    assert [q for _, q in shown_candidates(page)][:2] == [1.0, 0.0]
    page.fill(".qkv-temp-slider", str(NEXT_TEMPERATURES.index(0.7) + 1))
    page.click(".qkv-step >> nth=5")                                          # another generated token
    assert tab.state()["step"] == str(p + 5)
    check(5, 0.7)
    ranks = page.eval_on_selector_all(".qkv-rank", "cs => cs.map(c => c.textContent)")
    assert ranks[:10] == [str(r) for r in range(1, 11)]
    assert tab.errors == [] and tab.dialogs == []
    assert_offline(tab)


def test_candidate_tokens_show_as_text(tab, tmp_path):
    model = qkv.load(str(MODELS / "gpt2"))
    trace = model.generate("the cat sat", max_new_tokens=3, temperature=0, stop_at_eos=False, trace=True)

    class Hostile:
        def decode(self, ids):
            return "<b onmouseover=alert(1)>" + str(ids[0]) + "</b>"

        def id_to_token(self, i):
            return XSS

    open_viewer(tab, save_viewer(trace, tmp_path / "x.html", tokenizer=Hostile()))
    page = tab.page
    page.click(".qkv-tab >> text=Next token")
    first = page.text_content(".qkv-cands tbody .qkv-ctok")
    assert first.startswith("<b␣onmouseover=alert(1)>") and first.endswith("</b>")
    page.hover(".qkv-cands tbody tr >> nth=0")
    page.click(".qkv-step >> nth=1")
    assert page.evaluate("() => [document.querySelectorAll('img, b').length, document.scripts.length]") == [0, 3]
    assert tab.dialogs == [] and tab.errors == []
