"""The pipeline page without a browser: every array it embeds, decoded from the HTML's JSON and
compared with the engine's trace (or an independent float64 recomputation), within the documented
precision; its words equal `qkv explain`'s; it is one safe, self-contained file of a stated size.

tests/test_browser_pipeline.py drives the same documents in Chromium.
"""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

import qkv
from qkv import QkvError
from qkv.viz.words import texts
from qkv.writing.sampling import distribution, top_k_filter, top_p_filter
from qkv.viz import wire
from qkv.viz.payload import PRECISION
from qkv.viz.pipeline import pipeline_html, pipeline_payload, save_pipeline
from qkv.viz.pipeline_payload import DIMS, HEAD_DIMS, arithmetic_layers, decode_scores
from qkv.viz.pipeline_text import SHARED_KEYS, TEXTS
from conftest import MODELS
from test_viewer import XSS

SENTENCE = "The cat sat on the mat"


def data_of(document: str) -> dict:
    """The JSON payload inside a pipeline document, as the browser's JSON.parse reads it."""
    found = re.findall(r'<script type="application/json" class="qkv-pipeline-data">(.*?)</script>', document, re.S)
    assert len(found) == 1
    return json.loads(found[0])


@pytest.fixture(scope="module")
def llama():
    return qkv.load(str(MODELS / "llama_gqa"))               # pre-norm, RMSNorm, RoPE, GQA, SwiGLU


@pytest.fixture(scope="module")
def bert():
    return qkv.load(str(MODELS / "bert"))                    # post-norm, LayerNorm, learned positions


def ref_norm(x: np.ndarray, w, cfg) -> np.ndarray:
    """RMSNorm / LayerNorm in float64, written out (not the engine's)."""
    x = x.astype(np.float64)
    if cfg.norm == "rms":
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + cfg.norm_eps) * w.weight
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + cfg.norm_eps) * w.weight + w.bias


def check_summary(s: dict, x: np.ndarray, k: int, f16: bool = False) -> None:
    """A summary's lengths and first k values against the vectors X (…, d)."""
    x = np.asarray(x, dtype=np.float64)
    norm, first = wire.decode(s["norm"]), wire.decode(s["first"]).astype(np.float64)
    np.testing.assert_allclose(norm, np.linalg.norm(x, axis=-1), rtol=2e-5, atol=1e-5)
    if f16:                                                     # float16: 11 significant bits
        np.testing.assert_allclose(first, x[..., :k], rtol=2 ** -11, atol=2 ** -24)
    else:
        np.testing.assert_allclose(first, x[..., :k], rtol=2e-5, atol=1e-5)


@pytest.fixture(scope="module")
def neox():
    return qkv.load(str(MODELS / "gpt_neox"))                # parallel residual, partial RoPE, LayerNorm


@pytest.fixture(scope="module")
def olmo2():
    return qkv.load(str(MODELS / "olmo2"))                   # norms after each box, none before


@pytest.mark.parametrize("which", ["llama", "bert", "neox", "olmo2"])
def test_every_embedded_array_equals_the_engine(which, request):
    model = request.getfixturevalue(which)
    trace = model.run(SENTENCE)
    p = data_of(pipeline_html(model, trace))
    cfg, w, n, L = model.config, model.weights, len(trace.tokens), model.config.n_layers
    assert p["tokens"] == trace.tokens and p["labels"] == trace.labels and p["ids"] == trace.ids.tolist()
    assert (p["arch"]["L"], p["arch"]["H"], p["arch"]["H_kv"]) == (L, cfg.n_heads, cfg.n_kv_heads)

    # the residual stream: rows 0..L-1 are the trace's; row L recomputed independently below
    X = [trace.layers[i].residual.astype(np.float64) for i in range(L)]
    post = cfg.norm_place == "post"
    attn_in, mid, ffn_in = [], [], []
    for i in range(L):
        t, b = trace.layers[i], w.blocks[i]
        attn_in.append(X[i] if post or b.attn_norm is None else ref_norm(X[i], b.attn_norm, cfg))
        mid.append(ref_norm(X[i] + t.attn_out, b.attn_norm, cfg) if post else X[i] + t.attn_out)
        if cfg.parallel_residual:                               # both branches read X[i]
            ffn_in.append(ref_norm(X[i], b.ffn_norm, cfg))
            after = X[i] + t.attn_out + t.ffn_out
        else:
            ffn_in.append(mid[i] if post or b.ffn_norm is None else ref_norm(mid[i], b.ffn_norm, cfg))
            after = ref_norm(mid[i] + t.ffn_out, b.ffn_norm, cfg) if post else mid[i] + t.ffn_out
        if i + 1 < L:                                           # the engine's next residual agrees
            np.testing.assert_allclose(after, X[i + 1], rtol=1e-4, atol=1e-4)
    check_summary(p["stream"], np.stack(X + [after]), DIMS)
    for name, x in (("attn_in", attn_in), ("mid", mid), ("ffn_in", ffn_in),
                    ("attn_out", [trace.layers[i].attn_out for i in range(L)]),
                    ("ffn_out", [trace.layers[i].ffn_out for i in range(L)])):
        check_summary(p["blocks"][name], np.stack(x), DIMS)
    check_summary(p["final"], trace.hidden, DIMS)
    if cfg.final_norm and w.final_norm is not None:             # the final norm of the last stream row
        np.testing.assert_allclose(ref_norm(after, w.final_norm, cfg), trace.hidden, rtol=1e-4, atol=1e-4)

    # per head: q, z (L, H, n, d_k); k, v (L, H_kv, n, d_k)
    for name, field in (("q", "q"), ("k", "k"), ("v", "v"), ("z", "heads")):
        check_summary(p["heads"][name], np.stack([getattr(trace.layers[i], field) for i in range(L)]), HEAD_DIMS, True)
    assert wire.decode(p["heads"]["k"]["norm"]).shape == (L, cfg.n_kv_heads, n)

    # A within the viewer's one byte; S within half a step, masked exactly where the engine's is -inf
    A = np.stack([trace.layers[i].attentions for i in range(L)])
    assert np.max(np.abs(wire.decode(p["attention"]) - A)) <= PRECISION + 1e-7
    S = np.stack([trace.layers[i].scores for i in range(L)]).astype(np.float64)
    got = decode_scores(p["scores"])
    assert np.array_equal(np.isinf(got), np.isinf(S))
    step = np.asarray(p["scores"]["step"])[..., None, None]
    finite = np.isfinite(S)
    assert np.all(np.abs(np.where(finite, got, 0) - np.where(finite, S, 0)) <= step / 2 + 1e-5)
    # and S is the guide's S: Q·Kᵀ/√d_k (+ M), recomputed from the trace's q and k (GQA: head h reads ⌊h/G⌋)
    G = cfg.n_heads // cfg.n_kv_heads
    d_k = trace.layers[0].q.shape[-1]
    for i in range(L):
        q, k = trace.layers[i].q.astype(np.float64), trace.layers[i].k.astype(np.float64)
        s = np.einsum("hqd,hkd->hqk", q, np.repeat(k, G, axis=0)) / np.sqrt(d_k)
        np.testing.assert_allclose(np.where(finite[i], s, 0), np.where(finite[i], S[i], 0), rtol=1e-4, atol=1e-4)


def test_the_output_end_carries_the_whole_vocabulary_and_equals_sampling(llama):
    trace = llama.run(SENTENCE)
    p = pipeline_payload(llama, trace)
    z = wire.decode(p["output"]["logits"])
    assert z.dtype == np.float32 and np.array_equal(z, trace.logits[-1])       # exact: every logit, float32
    assert p["output"]["position"] == len(trace.tokens) - 1
    order = np.lexsort((np.arange(len(z)), -z.astype(np.float64)))
    assert p["output"]["top_ids"] == order[: len(p["output"]["top_ids"])].tolist()
    assert p["output"]["top_labels"][0] == llama.tokenizer.label(int(order[0]))
    # so any exact computation from the page's logits is sampling's own distribution and filters
    for T, k, top_p in [(1.0, None, None), (0.5, 5, None), (1.7, None, 0.9), (0.8, 20, 0.6)]:
        page = distribution(z[None], T, k, top_p)
        engine = distribution(trace.logits[-1:], T, k, top_p)
        assert np.array_equal(page, engine)
    x = z[None].astype(np.float64) / 0.7
    assert np.isfinite(top_p_filter(top_k_filter(x, 10), 0.8)).sum() <= 10


def test_an_encoder_ends_at_its_hidden_states_and_pooled_embedding(bert):
    trace = bert.run(SENTENCE)
    p = pipeline_payload(bert, trace)
    assert p["output"] is None and p["arch"]["encoder"] is True
    mean = trace.hidden.astype(np.float64).mean(0)
    assert p["pooled"]["norm"] == pytest.approx(np.linalg.norm(mean), rel=1e-6)
    np.testing.assert_allclose(p["pooled"]["first"], mean[:DIMS], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(p["pooled"]["unit_first"], (mean / np.linalg.norm(mean))[:DIMS], rtol=1e-5, atol=1e-6)


def test_the_pages_words_are_qkv_explains_in_both_languages(llama):
    assert TEXTS["en"].keys() == TEXTS["ko"].keys()
    for lang in ("en", "ko"):                                # every key the page shares is explain's sentence
        assert all(key in texts("explain")[lang] for key in SHARED_KEYS)
    p = pipeline_payload(llama, llama.run(SENTENCE), lang="ko")
    assert p["lang"] == "ko" and p["text_en"] == TEXTS["en"] and p["text_ko"] == TEXTS["ko"]
    with pytest.raises(QkvError, match="unknown language 'fr'"):
        pipeline_payload(llama, llama.run(SENTENCE), lang="fr")


def test_hostile_text_stays_inside_the_json(llama, tmp_path):
    trace = llama.run(SENTENCE)
    trace.tokens[1] = XSS
    trace.text = XSS + " </script><script>alert(2)</script>"
    document = pipeline_html(llama, trace)
    assert "<img" not in document and "alert(2)</script>" not in document
    p = data_of(document)
    assert p["tokens"][1] == XSS and p["text"] == trace.text
    assert "default-src 'none'" in document and "http://" not in document and "https://" not in document


def test_save_pipeline_runs_a_text_or_takes_a_trace_and_writes_atomically(llama, tmp_path):
    out = save_pipeline(llama, SENTENCE, tmp_path / "pipeline.html")
    assert data_of(out.read_text())["text"] == SENTENCE
    again = save_pipeline(llama, llama.run(SENTENCE), tmp_path / "pipeline.html", lang="ko")
    assert again == out and data_of(out.read_text())["lang"] == "ko"
    assert [f.name for f in tmp_path.iterdir()] == ["pipeline.html"]            # no temporary left behind
    with pytest.raises(QkvError, match="directory"):
        save_pipeline(llama, SENTENCE, tmp_path)
    with pytest.raises(QkvError, match="empty"):
        save_pipeline(llama, "  ", tmp_path / "x.html")


def test_a_trace_missing_intermediates_says_how_to_make_one(llama, bert):
    with pytest.raises(QkvError, match=r"model.run\(text\)"):
        pipeline_payload(llama, llama.run(SENTENCE, keep=("attentions",)))
    with pytest.raises(QkvError, match=r"model.run\(text\)"):
        pipeline_payload(llama, llama.run(SENTENCE, heads=[0]))
    with pytest.raises(QkvError, match="same model"):
        pipeline_payload(llama, bert.run(SENTENCE))


def test_smollm2_at_128_tokens_stays_one_usable_file(tmp_path):
    model = qkv.load("smollm2")
    ids = model.tokenizer.encode("The quick brown fox jumps over the lazy dog. " * 20)[0][:128]
    trace = model.run(list(ids))
    out = save_pipeline(model, trace, tmp_path / "pipeline.html")
    size = out.stat().st_size
    print(f"\nSmolLM2 pipeline page at 128 tokens: {size / 1e6:.2f} MB")
    assert size < 10_000_000          # measured 9.3 MB: scores 2.8, the diagram's layers 0–1 3.4, heads 1.3, A 1.0
    p = data_of(out.read_text())
    assert p["arithmetic"]["layers"] == [0, 1]
    assert (p["arch"]["H"], p["arch"]["H_kv"], p["arch"]["G"]) == (9, 3, 3)
    z = wire.decode(p["output"]["logits"])
    assert np.array_equal(z, trace.logits[-1])


def test_what_opens_first_is_checked(llama):
    trace = llama.run(SENTENCE)
    p = pipeline_payload(llama, trace, layer=-1, head=5, box="attn")
    assert p["start"] == {"layer": llama.config.n_layers - 1, "head": 5, "box": "attn"}
    with pytest.raises(QkvError, match="unknown box 'nope'"):
        pipeline_payload(llama, trace, box="nope")
    with pytest.raises(QkvError, match="head"):
        pipeline_payload(llama, trace, head=99)


@pytest.fixture(scope="module")
def koen():
    return qkv.load("ko-en-tiny")                              # Marian: post-norm, 2 + 2 layers, cross-attention


def test_an_encoder_decoder_shows_both_stacks_and_its_cross_attention(koen, tmp_path):
    out = save_pipeline(koen, "나는 학교에 간다", tmp_path / "p.html")
    p = data_of(out.read_text())
    trace = koen.run("나는 학교에 간다", p["stacks"]["decoder"]["ids"])
    assert p["seq2seq"] and p["text"] == "나는 학교에 간다" and p["target"] == "I go to school"
    eos = koen.config.eos_token_id
    assert trace.ids[-1] not in ([eos] if isinstance(eos, int) else eos)     # the output end predicts it
    cfg, w = koen.config, koen.weights
    enc, dec = p["stacks"]["encoder"], p["stacks"]["decoder"]
    assert enc["labels"] == trace.encoder.labels and dec["labels"] == trace.labels
    assert dec["cross"]["source_labels"] == trace.cross.key_labels
    for part, t in ((enc, trace.encoder), (dec, trace)):
        L = len(t.layers)
        check_summary(part["final"], t.hidden, DIMS)
        stream = wire.decode(part["stream"]["norm"])[:L]
        np.testing.assert_allclose(stream, [np.linalg.norm(t.layers[i].residual.astype(np.float64), axis=-1)
                                            for i in range(L)], rtol=2e-5)
        A = np.stack([t.layers[i].attentions for i in range(L)])
        assert np.max(np.abs(wire.decode(part["attention"]) - A)) <= PRECISION + 1e-7
    # post-norm, with cross-attention between: mid = Norm(X + a), mid2 = Norm(mid + c), next X = Norm(mid2 + f)
    mids, mid2s = [], []
    for i in range(cfg.n_decoder_layers):
        t, c, b = trace.layers[i], trace.cross.layers[i], w.decoder.blocks[i]
        mids.append(ref_norm(t.residual + t.attn_out, b.attn_norm, cfg))
        mid2s.append(ref_norm(mids[i] + c.attn_out, b.cross_norm, cfg))
        after = ref_norm(mid2s[i] + t.ffn_out, b.ffn_norm, cfg)
        if i + 1 < cfg.n_decoder_layers:                          # the engine's next residual agrees
            np.testing.assert_allclose(after, trace.layers[i + 1].residual, rtol=1e-4, atol=1e-4)
    check_summary(dec["blocks"]["mid"], np.stack(mids), DIMS)
    check_summary(dec["blocks"]["mid2"], np.stack(mid2s), DIMS)
    check_summary(dec["blocks"]["cross_in"], np.stack(mids), DIMS)             # post-norm: cross reads mid
    xa = np.stack([trace.cross.layers[i].attentions for i in range(cfg.n_decoder_layers)])   # (L, H, n_tgt, n_src)
    assert np.max(np.abs(wire.decode(dec["cross"]["attention"]) - xa)) <= PRECISION + 1e-7
    xs = np.stack([trace.cross.layers[i].scores for i in range(cfg.n_decoder_layers)]).astype(np.float64)
    step = np.asarray(dec["cross"]["scores"]["step"])[..., None, None]
    assert np.all(np.abs(decode_scores(dec["cross"]["scores"]) - xs) <= step / 2 + 1e-5)
    check_summary(dec["cross"]["heads"]["k"], np.stack([trace.cross.layers[i].k for i in range(cfg.n_decoder_layers)]),
                  HEAD_DIMS, True)
    assert np.array_equal(wire.decode(p["output"]["logits"]), trace.logits[-1])


def test_every_box_the_page_draws_can_be_opened_first():
    """BOXES (what pipeline_payload(box=…) and `qkv show`'s page accept) names every box pipeline.js draws."""
    import re

    from qkv.viz.html import asset
    from qkv.viz.pipeline_payload import BOXES

    drawn = set(re.findall(r'case "([a-z0-9]+)"', asset("pipeline.js"))) - {"en", "ko"}
    assert drawn <= set(BOXES), sorted(drawn - set(BOXES))


def test_the_diagrams_arrays_are_the_engines_whole(llama, koen):
    """The arithmetic of the attention diagram: q, k, v, z, S, A of the layers it holds, float32 as the engine's."""
    trace = llama.run(SENTENCE)
    p = pipeline_payload(llama, trace, layer=1)
    a = p["arithmetic"]
    assert a["layers"] == [0, 1] and a["bias"] is None
    for name, field in (("q", "q"), ("k", "k"), ("v", "v"), ("z", "heads"), ("scores", "scores"), ("weights", "attentions")):
        assert np.array_equal(wire.decode(a[name]), np.stack([getattr(trace.layers[i], field) for i in (0, 1)]))
    t = koen.run("나는 학교에 간다")
    p = pipeline_payload(koen, t)
    x = p["stacks"]["decoder"]["cross"]["arithmetic"]
    assert np.array_equal(wire.decode(x["k"])[0], t.cross.layers[0].k)               # K over the source tokens
    assert np.array_equal(wire.decode(p["stacks"]["encoder"]["arithmetic"]["weights"])[0], t.encoder.layers[0].attentions)


def test_alibis_bias_is_what_the_scores_add_to_the_scaled_dot_products():
    model = qkv.load(str(MODELS / "bloom"))
    trace = model.run(SENTENCE)
    a = pipeline_payload(model, trace)["arithmetic"]
    bias, S = wire.decode(a["bias"]).astype(np.float64), wire.decode(a["scores"]).astype(np.float64)
    q, k = wire.decode(a["q"]).astype(np.float64), wire.decode(a["k"]).astype(np.float64)
    raw = np.einsum("lhnd,lhmd->lhnm", q, k) / np.sqrt(q.shape[-1])
    seen = np.isfinite(S)
    assert np.max(np.abs(raw + bias - S)[seen]) < 1e-5 and np.all(bias[~seen] == 0)
    slopes = pipeline_payload(model, trace)["arch"]["alibi"]
    n = S.shape[-1]
    for h, m in enumerate(slopes):                       # m_h·j, up to a constant per row that softmax ignores
        row = bias[0, h, n - 1]
        np.testing.assert_allclose(np.diff(row), m, rtol=1e-4, atol=1e-6)


def test_the_diagram_keeps_the_start_layer_and_its_neighbours_within_the_budget():
    assert arithmetic_layers(10, 30, 3, 1000) == list(range(30))                     # everything fits
    assert arithmetic_layers(10, 30, 3, 30) == [2, 3, 4]                             # 3, 4, 2
    assert arithmetic_layers(10, 30, 0, 30) == [0, 1, 2]
    assert arithmetic_layers(10, 30, 29, 20) == [28, 29]
    assert arithmetic_layers(10**9, 30, 7, 10) == [7]                                # always the start layer
