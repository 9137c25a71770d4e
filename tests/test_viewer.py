"""The HTML viewer without a browser: one safe, self-contained document, and data that round-trips.

tests/test_browser.py drives the same documents in Chromium.
"""

from __future__ import annotations

import html
import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from qkv import QkvError
from qkv.core.trace import LayerTrace, Trace
from qkv.viz import payload
from qkv.viz.html import View, save_viewer, viewer_html
from qkv.viz import wire
from qkv.viz.payload import PRECISION, encode_attention, script_json

XSS = "<img src=x onerror=alert(1)>"


def random_trace(tokens: list[str], L: int = 2, H: int = 3, seed: int = 0, **kw) -> Trace:
    """A trace with random attention rows (softmax of noise), no model needed."""
    n = len(tokens)
    s = np.random.default_rng(seed).normal(size=(L, H, n, n)) * 3           # (L, H, n, n)
    a = np.exp(s - s.max(-1, keepdims=True))
    a /= a.sum(-1, keepdims=True)
    layers = {i: LayerTrace(layer=i, attentions=a[i].astype(np.float32)) for i in range(L)}
    return Trace(tokens=tokens, ids=np.arange(n), hidden=None, logits=None, layers=layers, **kw)


def data_of(document: str) -> dict:
    """The JSON payload inside a viewer document, as the browser's JSON.parse would read it."""
    found = re.findall(r'<script type="application/json" class="qkv-data">(.*?)</script>', document, re.S)
    assert len(found) == 1
    return json.loads(found[0])


def test_attention_round_trips_within_the_documented_precision():
    trace = random_trace(["a", "b", "c", "d", "e"], L=3, H=4)
    decoded = wire.decode(encode_attention(trace.attentions))
    assert decoded.shape == trace.attentions.shape
    err = np.abs(decoded - trace.attentions).max()
    assert err <= PRECISION + 1e-7 and PRECISION == pytest.approx(1 / 510)
    # one byte per weight: exactly the 256 levels k/255
    assert np.allclose(decoded * 255, np.rint(decoded * 255), atol=1e-4)


def test_real_trace_round_trips_and_rows_still_sum_to_one(minilm):
    trace = minilm.run("The cat sat on the mat", keep=("attentions",))
    data = data_of(viewer_html(trace, model_name=minilm.name))
    decoded = wire.decode(data["attention"])                            # (6, 12, 8, 8)
    assert decoded.shape == (6, 12, 8, 8)
    assert np.abs(decoded - trace.attentions).max() <= PRECISION + 1e-7
    assert np.abs(decoded.sum(-1) - 1).max() <= 8 * PRECISION
    assert data["tokens"] == trace.tokens and data["layers"] == list(range(6)) and data["heads"] == 12
    assert data["model"] == "all-MiniLM-L6-v2" and data["text"] == "The cat sat on the mat"
    assert np.argmax(decoded[0, 2, 3]) == 2                                  # head 0.2: sat → cat


def test_out_of_range_and_nan_weights_are_clamped_not_wrapped():
    a = np.array([[[[1.5, -0.2], [np.nan, 0.5]]]], dtype=np.float32)          # (1, 1, 2, 2)
    assert wire.decode(encode_attention(a)).ravel().tolist() == pytest.approx([1.0, 0.0, 0.0, 128 / 255])


def test_script_json_never_closes_the_script_and_parses_back():
    obj = {"tokens": ["</script><script>alert(1)</script>", XSS, "a & b", "line\u2028sep\u2029", "<!--"]}
    text = script_json(obj)
    assert not set("<>&") & set(text)
    assert "\u2028" not in text and "\u2029" not in text
    assert json.loads(text) == obj


def test_hostile_tokens_and_title_stay_text():
    tokens = ["[CLS]", XSS, "</script><script>alert(2)</script>", '" onmouseover="alert(3)', "[SEP]"]
    doc = viewer_html(random_trace(tokens), model_name="<b>m</b>", title="</title><script>alert(4)</script>")
    assert "<img" not in doc and "alert(2)</script>" not in doc and "<b>m</b>" not in doc
    assert "<title>&lt;/title&gt;&lt;script&gt;alert(4)&lt;/script&gt;</title>" in doc
    assert data_of(doc)["tokens"] == tokens                                  # the text itself survives
    assert doc.count("<script") == 3                 # data, wire.js + viewer.js + viewer_panels.js, boot: no more
    js = doc[doc.index("<script>"):]
    assert "innerHTML" not in js and "insertAdjacentHTML" not in js and "eval(" not in js


def test_the_document_needs_no_network():
    doc = viewer_html(random_trace(["x", "y"]))
    assert re.search(r"https?://|//cdn|src=|@import|url\((?!data:)", doc) is None   # the Hangul face: data: only
    csp = re.search(r'http-equiv="Content-Security-Policy" content="([^"]+)"', doc).group(1)
    assert "default-src 'none'" in csp and "connect-src" not in csp
    assert doc.startswith("<!DOCTYPE html>") and doc.rstrip().endswith("</html>")


def test_roles_and_prompt_length_reach_the_page():
    roles = [["previous", None, "[SEP]"], ["broad", "broad", ""]]
    data = data_of(viewer_html(random_trace(list("abcd"), prompt_length=2), roles=roles))
    assert data["roles"] == [["previous", None, "[SEP]"], ["broad", "broad", None]]
    assert data["prompt_length"] == 2


@pytest.mark.parametrize("roles", [[["a", "b", "c"]], [["a", "b"], ["c", "d"]]])
def test_roles_of_the_wrong_shape_say_so(roles):
    with pytest.raises(QkvError, match="roles must be 2 × 3"):
        viewer_html(random_trace(list("abc")), roles=roles)


def test_a_trace_without_attention_says_how_to_keep_it(minilm):
    trace = minilm.run("hi", keep=("q",), layers=[0])
    with pytest.raises(QkvError, match="keep=\\('attentions',\\)"):
        viewer_html(trace)


def test_too_much_attention_for_one_page_keeps_each_rows_largest_weights_and_says_so():
    """Past the budget the page holds each query row's K largest weights (as many as fit), exact within
    the byte, and what the rest of the row holds; the rule is stated for the page to show."""
    trace = random_trace(list("abcdefg"))                                   # 2·3·49 = 294 weights
    assert payload.attention_payload(trace, budget_mb=294e-6)["dtype"] == "u8"        # all of it fits
    got = payload.attention_payload(trace, budget_mb=100e-6)                # (100 − 42) // (42 · 3) = 0 → K = 1
    assert got["format"] == "top" and got["k"] == 1 and got["shape"] == [2, 3, 7, 7]
    assert "each query row's 1 largest weights" in got["rule"] and "budget_mb" in got["rule"]
    trace = random_trace([f"t{i}" for i in range(40)])                     # 2·3·1600 = 9600 weights
    got = payload.attention_payload(trace, budget_mb=5000e-6)               # (5000 − 240) // (240 · 3) = 6
    assert got["k"] == 6
    A = trace.attentions                                                    # (2, 3, 40, 40)
    assert len(got["index"]) == len(got["weight"]) == len(got["rest"]) == 2   # one array per layer
    steps = np.stack([wire.decode(a) for a in got["index"]]).astype(int)     # each row's keys ascending, as steps
    weight = np.stack([wire.decode(a) for a in got["weight"]])              # the bytes, back to weights
    rest = np.stack([wire.decode(a) for a in got["rest"]])
    keys, kept = np.cumsum(steps, -1), weight > 0
    sixth = np.sort(A, -1)[..., -6]                                         # (2, 3, 40)
    for idx in np.ndindex(A.shape[:3]):
        want = {int(j) for j in np.flatnonzero(A[idx] >= sixth[idx]) if A[idx][j] * 255 + 0.5 >= 1}
        k = kept[idx]
        assert (np.diff(keys[idx][k]) > 0).all() and not k[k.sum():].any()   # ascending; dropped ones (q = 0) last
        assert {int(j) for j in keys[idx][kept[idx]]} == want               # the 6 largest that show
        assert np.abs(weight[idx][kept[idx]] - A[idx][keys[idx][kept[idx]]]).max() <= payload.PRECISION
        assert abs(rest[idx] - (A[idx].sum() - A[idx][keys[idx][kept[idx]]].sum())) <= payload.PRECISION
    for bad in (0, -1, float("nan"), 1e9):
        with pytest.raises(QkvError, match="budget_mb must be"):
            payload.attention_payload(trace, budget_mb=bad)


def test_save_viewer_writes_atomically(tmp_path):
    out = save_viewer(random_trace(["a", "b"]), tmp_path / "view.html", model_name="m")
    assert out == tmp_path / "view.html" and data_of(out.read_text())["model"] == "m"
    assert os.listdir(tmp_path) == ["view.html"]                             # no temporary file left


def test_unwritable_path_is_one_clear_error(tmp_path):
    (tmp_path / "a-file").write_text("")                 # a file where a directory should be: even root fails
    with pytest.raises(QkvError, match="cannot write .*Not a directory.*choose a writable path"):
        save_viewer(random_trace(["a"]), tmp_path / "a-file" / "view.html")
    assert os.listdir(tmp_path) == ["a-file"]


def test_missing_directory_and_directory_paths_are_clear_errors(tmp_path):
    with pytest.raises(QkvError, match="cannot write .*No such file"):
        save_viewer(random_trace(["a"]), tmp_path / "nope" / "view.html")
    with pytest.raises(QkvError, match="is a directory"):
        save_viewer(random_trace(["a"]), tmp_path)
    assert os.listdir(tmp_path) == []


def test_a_failed_write_keeps_the_old_file_and_leaves_no_temporary(tmp_path, monkeypatch):
    target = tmp_path / "view.html"
    target.write_text("old")

    def broken_replace(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", broken_replace)
    with pytest.raises(QkvError, match="No space left"):
        save_viewer(random_trace(["a"]), target)
    assert target.read_text() == "old" and os.listdir(tmp_path) == ["view.html"]


def test_notebook_view_is_a_sandboxed_iframe_holding_the_document():
    view = View(random_trace([XSS, "b"]), model_name="m")
    out = view._repr_html_()
    frame, script = out[:out.index("</iframe>") + len("</iframe>")], out[out.index("</iframe>") + len("</iframe>"):]
    assert frame.startswith("<iframe") and frame.count("<") == 2          # the document only inside srcdoc
    assert re.fullmatch(r"<script>[^<]*</script>", script)                # and the frame's own height listener
    assert re.search(r'<iframe id="(qkv-view-[0-9-]+)"', frame).group(1) in script
    assert 'sandbox="allow-scripts"' in out and "allow-same-origin" not in out
    srcdoc = html.unescape(re.search(r'srcdoc="([^"]*)"', out).group(1))
    assert srcdoc == view.html and data_of(srcdoc)["tokens"][0] == XSS


def test_notebook_view_saves_the_same_document(tmp_path):
    view = View(random_trace(["a", "b"]))
    assert view.save(tmp_path / "v.html").read_text() == view.html


def test_importing_qkv_viz_stays_light():
    code = "import sys, qkv.viz, qkv.viz.html; print('matplotlib' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_assets_ship_inside_the_package():
    from importlib import resources

    names = {p.name for p in resources.files("qkv.viz").joinpath("assets").iterdir()}
    assert {"viewer.js", "viewer_panels.js", "viewer.css", "app.js"} <= names
    for name in names:                                  # inlined in <script>/<style>: must not end them early
        text = resources.files("qkv.viz").joinpath("assets", name).read_text()
        assert "</" not in text and "<script" not in text.lower() and "<!--" not in text, name


# the next-token view of a generation (payload "next") --------------------------------

def generation(seed: int = 3, n: int = 12):
    """A sampled continuation by the tiny GPT-2 fixture, traced with its logits."""
    from conftest import MODELS
    import qkv

    model = qkv.load(str(MODELS / "gpt2"))
    return model, model.generate("the cat sat", max_new_tokens=n, temperature=1.5, seed=seed, stop_at_eos=False,
                                 trace=True)


def page_probs(step: dict, T: float) -> tuple[np.ndarray, float]:
    """What viewer.js computes from the page data: P of the kept tokens and the mass of the rest."""
    z = np.array(step["logits"])
    if T == 0:
        return (np.arange(len(z)) == 0).astype(float), 0.0
    rest = step["rest"][payload.NEXT_TEMPERATURES.index(T)]
    m = max(z.max() / T, rest)
    e, er = np.exp(z / T - m), np.exp(rest - m)
    return e / (e.sum() + er), er / (e.sum() + er)


def test_a_generation_carries_each_generated_tokens_candidates():
    from qkv.writing.nexttoken import distribution, token_text

    model, trace = generation()
    p, n = trace.prompt_length, len(trace.ids)
    nx = data_of(viewer_html(trace, tokenizer=model.tokenizer))["next"]
    assert nx["k"] == 10 and nx["vocab"] == 400 and nx["temperatures"] == [round(0.1 * i, 1) for i in range(1, 21)]
    assert [s["position"] for s in nx["steps"]] == list(range(p, n))
    assert [s["chosen"] for s in nx["steps"]] == trace.ids[p:].tolist()
    outside = 0
    for step in nx["steps"]:
        i = step["position"]
        z = trace.logits[i - 1]                                              # row i-1 predicts token i
        assert step["tokens"] == [token_text(model.tokenizer, t) for t in step["ids"]]
        assert step["rank"] == 1 + int((z > z[step["chosen"]]).sum())
        assert step["chosen"] in step["ids"] and len(step["ids"]) == (10 if step["rank"] <= 10 else 11)
        outside += step["rank"] > 10
        for T in (0, 0.1, 0.5, 1.0, 2.0):
            P = distribution(z, T)                                           # the whole vocabulary
            shown, other = page_probs(step, T)
            assert np.abs(shown - P[step["ids"]]).max() < 1e-3               # logits kept to 4 decimals
            assert abs(other - (1 - P[step["ids"]].sum())) < 1e-3
    assert outside > 0                                                       # the chosen-below-top-10 case is covered


def test_the_candidates_need_a_tokenizer_logits_and_a_generation(tmp_path):
    model, trace = generation(n=3)
    assert data_of(viewer_html(trace))["next"] is not None                   # the trace keeps its model's tokenizer
    trace.tokenizer = None
    assert data_of(viewer_html(trace))["next"] is None                       # no tokenizer: nothing to spell them with
    plain = model.run("the cat sat", keep=("attentions",))
    assert data_of(viewer_html(plain, tokenizer=model.tokenizer))["next"] is None        # not a generation
    trace.save(tmp_path)
    loaded = Trace.load(tmp_path)                                            # saved traces keep no logits
    assert data_of(viewer_html(loaded, tokenizer=model.tokenizer))["next"] is None


def test_candidate_tokens_stay_text_and_the_page_stays_small():
    model, trace = generation(n=20)

    class Hostile:                                   # a tokenizer whose tokens are markup
        def decode(self, ids):
            return XSS + str(ids[0])

        def id_to_token(self, i):
            return XSS

    doc = viewer_html(trace, tokenizer=Hostile())
    assert "<img" not in doc and data_of(doc)["next"]["steps"][0]["tokens"][0].startswith(XSS.replace(" ", "␣"))
    size = len(script_json(data_of(viewer_html(trace, tokenizer=model.tokenizer))["next"]))
    assert size / 20 < 1000                                                  # < 1 kB per generated token


def test_the_payload_carries_what_the_trace_knows_and_any_shape():
    a = np.full((2, 3, 4, 6), 1 / 6, dtype=np.float32)                    # (L, H, n_q, n_k)
    t = Trace(tokens=["a", "Ġb", "c", "d"], ids=np.arange(4), hidden=None, logits=None, model="m", family="t5",
              causal=False, spelling="byte-level", source_tokens=["Ġx", "y", "z", "u", "v", "w"],
              layers={i: LayerTrace(layer=i, attentions=a[i]) for i in range(2)})
    data = data_of(viewer_html(t))
    assert data["attention"]["shape"] == [2, 3, 4, 6]
    assert np.abs(wire.decode(data["attention"]) - a).max() <= PRECISION + 1e-7
    assert data["tokens"] == ["a", "Ġb", "c", "d"] and data["labels"] == ["a", "␣b", "c", "d"]
    assert data["key_tokens"] == t.source_tokens and data["key_labels"] == ["␣x", "y", "z", "u", "v", "w"]
    assert (data["model"], data["family"], data["causal"]) == ("m", "t5", False)
    assert data_of(viewer_html(t, model_name="other"))["model"] == "other"
    self_attn = random_trace(["a", "b"])
    assert data_of(viewer_html(self_attn))["key_tokens"] is None and data_of(viewer_html(self_attn))["causal"] is None
