"""Korean renders in Chromium on a machine without a Korean font (this one has none): each Hangul
syllable of a page is its own glyph, not the one missing-glyph box, in the page's text and on its
canvases, in a written page and in `qkv serve` (which serves the whole font once, as hangul.woff)."""

from __future__ import annotations

import qkv
from qkv.viz.html import save_viewer
from qkv.viz.pipeline import save_pipeline
from conftest import MODELS, running_server
from test_browser import browser, tab  # noqa: F401 (fixtures)

GLYPHS = "한국어"


def distinct_glyphs(page, selector: str) -> int:
    """How many different pictures the syllables of GLYPHS make in the font of SELECTOR's element
    (one each: real glyphs; 1: every syllable is the same missing-glyph box)."""
    shots = set()
    for c in GLYPHS:
        page.evaluate("""([sel, c]) => {
            const probe = document.createElement("span");
            probe.id = "probe";
            probe.textContent = c;
            probe.style.cssText = "font-size: 40px; position: fixed; left: 0; top: 0; background: #fff; color: #000";
            document.querySelector(sel).append(probe);
        }""", [selector, c])
        page.evaluate("document.fonts.ready")
        shots.add(page.locator("#probe").screenshot())
        page.evaluate("document.getElementById('probe').remove()")
    return len(shots)


def test_the_pipeline_pages_korean_is_real_glyphs(tab, tmp_path):
    model = qkv.load(str(MODELS / "gpt2"))
    path = save_pipeline(model, model.run("The cat sat on the mat"), tmp_path / "pipeline.html")
    tab.page.goto(path.as_uri())
    tab.page.wait_for_selector("[data-qkv-pipeline][data-ready='1']")
    assert tab.page.text_content(".qkv-p-lang") == GLYPHS            # the language button
    assert distinct_glyphs(tab.page, ".qkv-p-lang") == len(GLYPHS)
    assert tab.errors == []


def test_korean_tokens_on_the_viewers_canvas_are_real_glyphs(tab, tmp_path):
    model = qkv.load("ko-en-tiny")
    from qkv.writing.seq2seq_generate import translation_trace

    path = save_viewer(translation_trace(model, "나는 학교에 간다"), tmp_path / "attention.html",
                       tokenizer=model.tokenizer)
    tab.page.goto(path.as_uri())
    tab.page.wait_for_selector("[data-qkv-root][data-ready='1']")
    loaded = tab.page.evaluate("""async () => (await document.fonts.load('13px "qkv Hangul"', '나')).length""")
    assert loaded == 1                                                  # the canvases draw with it
    probe = "나는학교"
    shots = set()
    for c in probe:
        shots.add(tab.page.evaluate("""(c) => {
            const canvas = document.createElement("canvas"); canvas.width = 48; canvas.height = 48;
            const ctx = canvas.getContext("2d"); ctx.font = '40px system-ui, "qkv Hangul", sans-serif';
            ctx.fillText(c, 2, 40); return canvas.toDataURL();
        }""", c))
    assert len(shots) == len(probe)
    assert tab.errors == []


def test_the_web_app_serves_the_font_and_shows_korean(tab):
    with running_server(str(MODELS / "gpt2")) as srv:
        tab.page.goto(srv.url)
        tab.page.click(".qkv-mode[data-mode='pipeline']")
        tab.page.wait_for_selector("[data-qkv-pipeline][data-ready='1']")
        assert distinct_glyphs(tab.page, ".qkv-pipe-form") == len(GLYPHS)
        assert any(u.endswith("/hangul.woff") for u in tab.requests)
    assert tab.errors == []


def test_the_first_drawing_already_has_the_glyphs(tab, tmp_path):
    """The page draws its Korean only once the Hangul face is ready: what the first render shows equals what
    a second render (after a click) shows (text laid out earlier kept the missing-glyph box)."""
    model = qkv.load(str(MODELS / "gpt2"))
    path = save_pipeline(model, model.run("The cat sat on the mat"), tmp_path / "pipeline.html", lang="ko")
    tab.page.goto(path.as_uri())
    tab.page.wait_for_selector("[data-qkv-pipeline][data-ready='1']")
    first = tab.page.locator(".qkv-p-block-title").screenshot()
    tab.page.click(".qkv-p-box[data-box='tokens']")
    assert tab.page.locator(".qkv-p-block-title").screenshot() == first
    assert tab.errors == []
