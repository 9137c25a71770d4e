"""The pipeline page in a real browser (Debian's Chromium, driven by Playwright, as tests/test_browser.py):
every box opens, the numbers it shows are the engine's, the temperature / top-k / top-p controls give
qkv.writing.sampling's probabilities and filters, the language switches, hostile tokens stay text, no request
leaves the page; and in `qkv serve`, the Pipeline mode and its "next token"."""

from __future__ import annotations

import numpy as np
import pytest

import qkv
from qkv.writing.sampling import distribution, top_k_filter, top_p_filter
from qkv.viz.pipeline import save_pipeline
from qkv.viz.pipeline_payload import decode_scores, pipeline_payload
from qkv.viz.pipeline_text import TEXTS
from conftest import MODELS, running_server
from test_browser import assert_offline, browser, tab  # noqa: F401 (fixtures)
from test_viewer import XSS

READY = "[data-qkv-pipeline][data-ready='1']"
SENTENCE = "The cat sat on the mat"
SET = "(e, v) => { e.value = v; e.dispatchEvent(new Event('input', {bubbles: true})); }"


@pytest.fixture(scope="module")
def llama():
    return qkv.load(str(MODELS / "llama_gqa"))                  # 2 layers, 8 query heads, 2 K/V heads


def open_page(tab, path) -> None:
    tab.page.goto(path.as_uri())
    tab.page.wait_for_selector(READY)


def state(tab) -> dict:
    return tab.page.eval_on_selector("[data-qkv-pipeline]", "e => Object.assign({}, e.dataset)")


def values(tab, sel: str) -> list[float]:
    return [float(v) for v in tab.page.eval_on_selector_all(sel, "rs => rs.map(r => r.dataset.value)")]


def test_every_box_opens_and_shows_the_engines_numbers(tab, llama, tmp_path):
    trace = llama.run(SENTENCE)
    tab.page.context.set_offline(True)
    open_page(tab, save_pipeline(llama, trace, tmp_path / "p.html"))
    page = tab.page
    boxes = page.eval_on_selector_all(".qkv-p-box", "bs => bs.map(b => [b.dataset.box, b.textContent])")
    assert [b for b, _ in boxes] == ["tokens", "embed", "norm1", "qkv", "rope", "gqa", "scores", "mask", "attn", "z",
                                     "out", "res1", "norm2", "ffn", "res2", "final", "logits", "probs", "stream"]
    numbered = [title for b, title in boxes if b != "stream"]                # the page's own numbers, in order
    assert [t.split(". ")[0] for t in numbered] == [str(k) for k in range(1, len(numbered) + 1)]
    assert not any(c in "".join(numbered) for c in "⓪①②③④⑤⑥⑦⑧")
    for box, title in boxes:
        page.click(f".qkv-p-box[data-box='{box}']")
        assert state(tab)["box"] == box and page.text_content(".qkv-p-detail-title") == title
        assert page.locator(".qkv-p-detail .qkv-error").count() == 0
    n = len(trace.tokens)
    page.select_option(".qkv-p-layer", "1")
    page.select_option(".qkv-p-head-pick", "5")
    page.click(".qkv-p-tok >> nth=3")
    assert state(tab).items() >= {"layer": "1", "head": "5", "token": "3"}.items()
    page.click(".qkv-p-box[data-box='attn']")
    A = trace.layers[1].attentions[5, 3]                                    # (n,) the row of token 3
    assert np.max(np.abs(np.array(values(tab, ".qkv-p-weights .qkv-p-bar")) - A)) <= 0.5 / 255 + 1e-7
    assert page.eval_on_selector(".qkv-p-heat", "c => [c.dataset.rows, c.dataset.cols]") == [str(n), str(n)]
    page.click(".qkv-p-box[data-box='scores']")
    S = trace.layers[1].scores[5, 3].astype(np.float64)
    got = np.array(values(tab, ".qkv-p-scores .qkv-p-bar"))
    step = pipeline_payload(llama, trace)["scores"]["step"][1][5]
    assert np.array_equal(np.isinf(got), np.isinf(S)) and np.isinf(S).sum() == n - 4          # causal: keys 4.. masked
    assert np.max(np.abs(got[:4] - S[:4])) <= step / 2 + 1e-5
    rows = page.eval_on_selector_all(".qkv-p-detail .qkv-p-table tr",
                                     "rs => rs.slice(1).map(r => [...r.children].map(c => c.textContent))")
    assert len(rows) == 3 and [int(r[0].split(" · ")[0]) for r in rows] == list(np.argsort(-S[:4])[:3])
    for key, s_shown, a_shown in rows:                          # S and the weight softmax gives it
        j = int(key.split(" · ")[0])
        assert abs(float(s_shown) - S[j]) <= step / 2 + 5e-4 and abs(float(a_shown) - A[j]) <= 0.5 / 255 + 5e-4
    page.click(".qkv-p-box[data-box='rope']")                               # |q'|, |k'| of token 3: the engine's
    shown = [float(r) for r in page.eval_on_selector_all(".qkv-p-detail .qkv-p-table tr",
                                                          "rs => rs.slice(1).map(r => r.children[1].textContent)")]
    np.testing.assert_allclose(shown, [np.linalg.norm(trace.layers[1].q[5, 3]), np.linalg.norm(trace.layers[1].k[1, 3])],
                               rtol=2e-3)
    page.click(".qkv-p-box[data-box='norm1']")
    assert "ε = 0.00001" in page.text_content(".qkv-p-formula") or "ε = 0.000001" in page.text_content(".qkv-p-formula")
    page.click(".qkv-p-box[data-box='attn']")
    assert page.get_attribute(".qkv-p-heat", "data-labels") == "true"       # the tokens along both sides
    page.click(".qkv-p-box[data-box='gqa']")                                # GQA: head 5 reads K/V head 5 // 4 = 1
    assert page.get_attribute(".qkv-p-group.qkv-p-hot", "data-kv") == "1"
    assert "reads K/V head 1" in page.text_content(".qkv-p-gqa")
    page.click(".qkv-p-box[data-box='embed']")                              # |x| of each token entering layer 0
    np.testing.assert_allclose(values(tab, ".qkv-p-norms .qkv-p-bar"),
                               np.linalg.norm(trace.layers[0].residual.astype(np.float64), axis=-1), rtol=1e-5)
    page.click(".qkv-p-box[data-box='final']")
    np.testing.assert_allclose(values(tab, ".qkv-p-norms .qkv-p-bar"),
                               np.linalg.norm(trace.hidden.astype(np.float64), axis=-1), rtol=1e-5)
    page.click(".qkv-p-box[data-box='logits']")
    ids = [int(i) for i in page.eval_on_selector_all(".qkv-p-logits .qkv-p-bar", "rs => rs.map(r => r.dataset.id)")]
    assert values(tab, ".qkv-p-logits .qkv-p-bar") == [float(trace.logits[-1, i]) for i in ids]
    assert_offline(tab)
    assert tab.errors == [] and tab.dialogs == []


def shown_probs(tab) -> dict[int, float]:
    rows = tab.page.eval_on_selector_all(".qkv-p-prob-bars .qkv-p-bar", "rs => rs.map(r => [r.dataset.id, r.dataset.p])")
    return {int(i): float(p) for i, p in rows}


def test_temperature_top_k_and_top_p_equal_qkv_sampling(tab, tmp_path):
    model = qkv.load("smollm2")
    trace = model.run(SENTENCE)
    z = trace.logits[-1:]                                                    # (1, V) the engine's, whole vocabulary
    open_page(tab, save_pipeline(model, trace, tmp_path / "p.html"))
    page = tab.page
    assert state(tab)["box"] == "probs"
    for T, k, p in [(1.0, 0, 1.0), (0.5, 0, 1.0), (1.5, 0, 1.0), (0.7, 8, 1.0), (1.2, 0, 0.6), (0.9, 30, 0.8), (0.0, 0, 1.0)]:
        page.eval_on_selector(".qkv-p-temp", SET, str(T))
        page.fill(".qkv-p-topk", str(k))
        page.eval_on_selector(".qkv-p-topp", SET, str(p))
        assert (float(state(tab)["T"]), int(state(tab)["topk"]), float(state(tab)["topp"])) == (T, k, p)
        shown = shown_probs(tab)
        if T == 0:                                                           # greedy: one-hot on the argmax
            want = np.zeros(z.shape[1])
            want[np.argmax(z[0])] = 1
            kept = 1
        else:
            want = distribution(z, T, k or None, p if p < 1 else None)[0]
            x = z.astype(np.float64) / T
            x = top_k_filter(x, k) if k else x
            kept = int(np.isfinite(top_p_filter(x, p) if p < 1 else x).sum())
        for i, prob in shown.items():
            assert prob == pytest.approx(want[i], rel=1e-9, abs=1e-300), (T, k, p, i)
        assert int(state(tab)["remain"]) == kept, (T, k, p)
    assert tab.errors == []
    assert_offline(tab)


def test_tiny_probabilities_read_as_they_are_and_bars_agree(tab, tmp_path):
    """A random Gemma 2 with a large vocabulary (soft-capped logits: nearly uniform over 60,000 tokens, each far
    below 0.01 %): every shown percent is the probability to 2 significant digits (never "0.00%"), and every
    bar's length is the probability itself (full width = 100 %), so number and bar agree."""
    config = qkv.load(MODELS / "gemma2").config.with_(vocab_size=60_000)
    model = qkv.init(config, seed=3)
    trace = model.run([5, 17, 400, 9])
    open_page(tab, save_pipeline(model, trace, tmp_path / "p.html"))
    assert state(tab)["box"] == "probs"
    rows = tab.page.eval_on_selector_all(".qkv-p-prob-bars .qkv-p-bar", """rs => rs.map(r => [
        +r.dataset.p, r.querySelector('.qkv-p-bar-value').textContent,
        r.querySelector('.qkv-p-bar-fill').getBoundingClientRect().width /
        r.querySelector('.qkv-p-bar-track').getBoundingClientRect().width])""")
    assert len(rows) == 20 and max(p for p, _, _ in rows) < 1e-4                   # each below 0.01 %
    for p, text, width in rows:
        assert text.endswith("%") and float(text[:-1]) == pytest.approx(100 * p, rel=0.05), (p, text)
        assert width == pytest.approx(p, abs=2e-3), (p, width)                  # a sliver, as its number says
    summary = tab.page.text_content(".qkv-p-remain")
    assert f"({rows[0][1]})" in summary and "0.00%" not in summary
    assert "full width = 100%" in tab.page.text_content(".qkv-p-detail")
    assert tab.errors == []


def test_the_language_switches_and_back(tab, llama, tmp_path):
    open_page(tab, save_pipeline(llama, SENTENCE, tmp_path / "p.html"))
    page = tab.page
    page.click(".qkv-p-box[data-box='qkv']")
    assert page.text_content(".qkv-p-detail-title") == "4. " + TEXTS["en"]["s_qkv"]
    page.click(".qkv-p-lang")
    assert state(tab)["lang"] == "ko" and page.get_attribute("[data-qkv-pipeline]", "lang") == "ko"
    assert page.text_content(".qkv-p-detail-title") == "4. " + TEXTS["ko"]["s_qkv"]
    assert page.text_content(".qkv-p-title") == TEXTS["ko"]["p_title"].format(model=llama.name)
    assert page.text_content(".qkv-p-lang") == "English"
    page.click(".qkv-p-lang")
    assert state(tab)["lang"] == "en" and page.text_content(".qkv-p-detail-title") == "4. " + TEXTS["en"]["s_qkv"]
    assert tab.errors == []


def test_an_encoder_ends_at_hidden_states_and_says_why(tab, tmp_path):
    bert = qkv.load(str(MODELS / "bert"))
    open_page(tab, save_pipeline(bert, SENTENCE, tmp_path / "p.html", lang="ko"))
    page = tab.page
    boxes = page.eval_on_selector_all(".qkv-p-box", "bs => bs.map(b => b.dataset.box)")
    assert "logits" not in boxes and "probs" not in boxes and "norm1" not in boxes
    assert boxes[-3:] == ["hidden", "pooled", "stream"]
    page.click(".qkv-p-box[data-box='pooled']")
    assert page.text_content(".qkv-p-encoder") == TEXTS["ko"]["p_encoder_end"].format(model=bert.name)
    page.click(".qkv-p-box[data-box='mask']")
    assert page.text_content(".qkv-p-detail p") == TEXTS["ko"]["p_mask_none"].format(model=bert.name)
    assert tab.errors == []


def test_hostile_tokens_and_text_stay_text(tab, llama, tmp_path):
    trace = llama.run(SENTENCE)
    trace.tokens[1] = XSS
    trace.text = XSS + " </script><script>alert(2)</script>"
    open_page(tab, save_pipeline(llama, trace, tmp_path / "p.html"))
    page = tab.page
    assert page.text_content(".qkv-p-tok >> nth=1") == trace.labels[1] and "<img" in trace.labels[1]
    assert page.text_content(".qkv-p-text") == trace.text
    for box in ("tokens", "attn", "scores", "logits"):
        page.click(f".qkv-p-box[data-box='{box}']")
    assert page.locator("img").count() == 0 and page.locator("script").count() == 3
    assert tab.dialogs == [] and tab.errors == []
    assert_offline(tab)


# qkv serve: the Pipeline mode ------------------------------------------------------

def test_the_web_apps_pipeline_writes_the_next_token(tab):
    model = qkv.load(str(MODELS / "gpt2"))
    with running_server(str(MODELS / "gpt2")) as srv:
        page = tab.page
        page.goto(srv.url)
        page.click(".qkv-mode[data-mode='pipeline']")                       # fetched only now
        page.wait_for_selector(READY)
        trace = model.run("The cat sat on the mat")
        assert page.eval_on_selector_all(".qkv-p-tok", "ts => ts.map(t => t.textContent)") == trace.labels
        page.select_option(".qkv-p-layer", "1")
        page.eval_on_selector(".qkv-p-temp", SET, "0")                      # greedy: the engine's argmax
        page.click(".qkv-p-next")
        page.wait_for_function(f"() => document.querySelectorAll('.qkv-p-tok').length === {len(trace.tokens) + 1}")
        page.wait_for_selector(READY)
        new = int(np.argmax(trace.logits[-1]))
        assert page.text_content(".qkv-p-tok >> nth=-1") == model.tokenizer.label(new)
        assert state(tab)["layer"] == "1" and state(tab)["T"] == "0"       # the choices stay
        assert page.input_value(".qkv-pipe-form textarea") == "The cat sat on the mat" + model.tokenizer.decode([new])
        assert all(u.startswith(srv.url) or u.startswith("data:") for u in tab.requests), tab.requests
    assert tab.errors == [] and tab.dialogs == []


def test_the_web_apps_language_picker_sets_the_pages_language(tab):
    """Choosing 한국어 (or back English) in the form and pressing Show pipeline redraws the page in that
    language, though the page drawn before was in the other one."""
    with running_server(str(MODELS / "gpt2")) as srv:
        page = tab.page
        page.goto(srv.url)
        page.click(".qkv-mode[data-mode='pipeline']")
        page.wait_for_selector(READY)
        assert state(tab)["lang"] == "en"
        english = page.text_content(".qkv-p-title")
        for lang in ("ko", "en", "ko"):
            page.select_option(".qkv-pipe-lang", lang)
            page.evaluate("() => { document.querySelector('[data-qkv-pipeline]').dataset.ready = ''; }")
            page.click(".qkv-pipe-form button[type=submit]")
            page.wait_for_selector(READY)
            assert state(tab)["lang"] == lang
            assert (page.text_content(".qkv-p-title") == english) == (lang == "en")
    assert tab.errors == [] and tab.dialogs == []


def test_the_page_opens_where_it_is_told(tab, llama, tmp_path):
    open_page(tab, save_pipeline(llama, SENTENCE, tmp_path / "p.html", lang="ko", layer=1, head=6, box="gqa"))
    assert state(tab).items() >= {"layer": "1", "head": "6", "box": "gqa", "lang": "ko"}.items()
    assert tab.page.get_attribute(".qkv-p-group.qkv-p-hot", "data-kv") == "1"          # 6 // (8 / 2)
    assert tab.errors == []


def test_an_encoder_decoder_shows_both_stacks_and_cross_attention(tab, tmp_path):
    model = qkv.load("ko-en-tiny")
    open_page(tab, save_pipeline(model, "나는 학교에 간다", tmp_path / "p.html"))
    page = tab.page
    ids = [int(i) for i in page.evaluate("() => JSON.parse(document.querySelector('.qkv-pipeline-data').textContent)"
                                         ".stacks.decoder.ids")]
    trace = model.run("나는 학교에 간다", ids)
    assert state(tab)["stack"] == "decoder" and state(tab)["box"] == "probs"
    for stack in ("decoder", "encoder"):
        page.click(f".qkv-p-stack[data-stack='{stack}']")
        assert state(tab)["stack"] == stack
        boxes = page.eval_on_selector_all(".qkv-p-box", "bs => bs.map(b => b.dataset.box)")
        assert ("xattn" in boxes) == (stack == "decoder") and ("probs" in boxes) == (stack == "decoder")
        tokens = page.eval_on_selector_all(".qkv-p-tok", "ts => ts.map(t => t.textContent)")
        assert tokens == (trace.labels if stack == "decoder" else trace.encoder.labels)
        for box in boxes:
            page.click(f".qkv-p-box[data-box='{box}']")
            assert state(tab)["box"] == box
    page.click(".qkv-p-stack[data-stack='decoder']")
    page.select_option(".qkv-p-layer", "1")
    page.select_option(".qkv-p-head-pick", "2")
    page.click(".qkv-p-tok >> nth=2")
    page.click(".qkv-p-box[data-box='xattn']")
    n, m = len(trace.tokens), len(trace.encoder.tokens)
    assert page.eval_on_selector(".qkv-p-heat", "c => [c.dataset.rows, c.dataset.cols]") == [str(n), str(m)]
    A = trace.cross.layers[1].attentions[2, 2]                                # (n_src,) target token 2's row
    assert np.max(np.abs(np.array(values(tab, ".qkv-p-xweights .qkv-p-bar")) - A)) <= 0.5 / 255 + 1e-7
    page.click(".qkv-p-lang")
    assert state(tab)["stack"] == "decoder" and page.text_content(".qkv-p-detail-title").split(". ", 1)[1] == TEXTS["ko"]["p_xattn"]
    assert tab.errors == [] and tab.dialogs == []
    assert_offline(tab)
