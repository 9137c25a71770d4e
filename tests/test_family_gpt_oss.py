"""gpt-oss (issue 47) beyond tests/test_families.py's comparisons with transformers (padding left and right, every
attention weight, the cache step and greedy ids run there on the fixture too): backward against torch autograd
(tests/fixtures/grads/gpt_oss.npz), the new maths against its plain forms (attention sinks in every attention
path, the clamped SwiGLU and both backwards), each knob needed for the reference's numbers, the knobs read from
config.json and transformers' defaults, a saved model reading back equal, and what qkv refuses in one line.

Fixture: tests/fixtures/models/gpt_oss, made by tests/fixtures/make_fixtures.py.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

import qkv
from qkv import QkvError
from qkv.core.attention import (AttentionMask, attention_backward, attention_output, attention_top, attention_weights,
                                causal_attention, scaled_dot_product_attention, sink_backward, top_of)
from qkv.core.kernels import tiled_attention
from qkv.core.ops import clamped_glu, clamped_glu_backward, softmax, softmax_sink_
from conftest import (MODELS, TOL_ATTENTION, TOL_HIDDEN, check_gradients, check_knob_matters, check_saved_reads_back,
                      edited, max_abs, reference)
from test_browser import browser, tab  # noqa: F401  (fixtures: the browser test at the end)

NAME = "gpt_oss"


def test_gradients_equal_autograd():
    """The loss within 1e-5 and each tensor's gradient (the sinks', the router bias', the fused experts' and their
    biases' included) within 1e-4 relative error of torch autograd's."""
    grads = check_gradients(qkv.load(MODELS / NAME), NAME)                # the same names as autograd's
    assert any(k.endswith("self_attn.sinks") for k in grads) and any(k.endswith("router.bias") for k in grads)


def test_knobs_read():
    cfg = qkv.load(MODELS / NAME).config
    assert cfg.family == NAME and cfg.attn_sinks and cfg.glu_limit == 0.6 and cfg.glu_alpha == 1.702
    assert cfg.layer_windows == (5, None, 5) and cfg.n_experts == 4 and cfg.experts_per_token == 2 and cfg.norm_top_k
    assert cfg.d_head == 12 and cfg.n_kv_heads == 2 and cfg.qkv_bias and cfg.out_bias and cfg.ffn_bias
    assert cfg.rope_theta == 2e4 and cfg.rope_scaling["rope_type"] == "yarn" and cfg.rope_scaling["factor"] == 4.0
    assert cfg.rope_scaling["truncate"] is False and not cfg.tied_embeddings and cfg.norm_eps == 1e-6


@pytest.mark.parametrize("knobs", [
    {"attn_sinks": False},                                   # the sinks' share of each row
    {"glu_limit": None},                                     # the clamps and the + 1 (a plain SwiGLU instead)
    {"glu_alpha": 1.0},                                      # σ(α·g), not σ(g)
    {"layer_windows": None, "sliding_window": None},         # the sliding layers' window
    {"rope_scaling": None},                                  # YaRN
])
def test_each_knob_matters(knobs):
    """The fixture's logits are met with the knob and missed without it (by far more than the tolerance)."""
    check_knob_matters(NAME, knobs)


def test_rows_sum_below_one_as_transformers_reports_them():
    """Each head's attention row over the tokens sums to 1 − its sink's share (< 1), as transformers' eager
    attention reports it (probs[..., :-1]); the shares themselves are the reference's to 1e-5."""
    ref = reference(NAME)
    A = qkv.load(MODELS / NAME).forward(ref["single_input_ids"]).attentions          # (L, 1, H, n, n)
    share = 1 - A.sum(axis=-1, dtype=np.float64)
    assert share.min() > 1e-3
    assert max_abs(share, 1 - ref["single_attentions"].sum(axis=-1, dtype=np.float64)) <= TOL_ATTENTION


def _qkv(seed: int = 0, B: int = 2, H: int = 4, Hkv: int = 2, n: int = 9, d: int = 6):
    rng = np.random.default_rng(seed)
    q, k, v = (rng.standard_normal(s) for s in ((B, H, n, d), (B, Hkv, n, d), (B, Hkv, n, d)))
    return q, k, v, rng.standard_normal(H) * 2


def test_softmax_sink_is_the_softmax_with_one_more_column():
    """ops.softmax_sink_ = softmax(concat([S, s_h]))[..., :-1], masked keys and a fully masked row included."""
    rng = np.random.default_rng(1)
    s, sink = rng.standard_normal((2, 3, 4, 5)) * 3, rng.standard_normal(3)
    s[0, :, 1, 2:] = -np.inf
    s[1, :, 3, :] = -np.inf                                                     # a row that sees no key
    full = np.concatenate([s, np.broadcast_to(sink[:, None, None], s.shape[:-1] + (1,))], axis=-1)
    want = softmax(full)[..., :-1]
    got = softmax_sink_(s.copy(), sink)
    assert np.abs(got - want).max() <= 1e-15 and not got[1, :, 3].any()


@pytest.mark.parametrize("window, pad", [(None, False), (3, False), (None, True), (4, True)])
def test_every_attention_path_takes_the_sink(window, pad):
    """The plain path, causal blocks of rows, the tiled kernel, some heads' weights and each row's top weights give
    the same numbers with a sink (float64, 1e-12), and differ from attention without one."""
    q, k, v, sink = _qkv()
    key_mask = np.array([[True] * 9, [False] * 2 + [True] * 7]) if pad else None
    mask = AttentionMask(9, 9, causal=True, window=window, key_mask=key_mask)
    z, a, _ = scaled_dot_product_attention(q, k, v, mask.bias(q.dtype), sink=sink)
    assert (a.sum(axis=-1)[:, :, 2:] < 1 - 1e-6).all()
    for other in (causal_attention(q, k, v, mask, block_size=4, sink=sink),
                  tiled_attention(q, k, v, causal=True, window=window, key_mask=key_mask, block_size=4, sink=sink),
                  attention_output(q, k, v, mask, sink=sink)):
        assert np.abs(other - z).max() <= 1e-12
    assert np.abs(attention_output(q, k, v, mask) - z).max() > 1e-3
    some, _ = attention_weights(q, k, mask, [1, 3], block_size=4, sink=sink)
    assert np.abs(some - a[:, [1, 3]]).max() <= 1e-12
    top, want = attention_top(q, k, mask, 3, block_size=4, sink=sink), top_of(a, 3)
    assert np.abs(top.weight - want.weight).max() <= 1e-6 and np.abs(top.rest - want.rest).max() <= 1e-6


def test_sink_backward_equals_central_differences():
    """d s_h of L = Σ dZ ⊙ Z (sink_backward) against central differences in float64; Q, K, V's gradients with a
    sink are attention_backward's of the sink's A (checked the same way on Q)."""
    q, k, v, sink = _qkv(2)
    mask = AttentionMask(9, 9, causal=True, key_mask=np.array([[True] * 9, [False] * 3 + [True] * 6]))
    dz = np.random.default_rng(3).standard_normal(q.shape)

    def loss(q_, sink_):
        return float((scaled_dot_product_attention(q_, k, v, mask.bias(q.dtype), sink=sink_)[0] * dz).sum())

    z, a, _ = scaled_dot_product_attention(q, k, v, mask.bias(q.dtype), sink=sink)
    d_sink, h = sink_backward(dz, z, a), 1e-6
    for i in range(len(sink)):
        e = np.eye(len(sink))[i] * h
        assert abs((loss(q, sink + e) - loss(q, sink - e)) / (2 * h) - d_sink[i]) <= 1e-7
    dq = attention_backward(dz, q, k, v, a)[0]
    e = np.zeros_like(q)
    e[1, 2, 5, 3] = h
    assert abs((loss(q + e, sink) - loss(q - e, sink)) / (2 * h) - dq[1, 2, 5, 3]) <= 1e-7


def test_clamped_glu_and_its_backward():
    """h = min(g, c)·σ(α·min(g, c)) ⊙ (clip(u, ±c) + 1), at values inside and past the clamps, and its backward
    against central differences (float64; the points stay clear of the kinks at ±c)."""
    g = np.array([-3.0, -0.4, 0.2, 0.55, 0.9, 5.0])
    u = np.array([-2.0, -0.5, 0.1, 0.7, -0.65, 0.3])
    c, alpha = 0.6, 1.702
    gc, uc = np.minimum(g, c), np.clip(u, -c, c)
    np.testing.assert_allclose(clamped_glu(g, u, alpha, c), gc / (1 + np.exp(-alpha * gc)) * (uc + 1), rtol=1e-15)
    dh, h = np.array([1.0, -2.0, 0.5, 1.5, -1.0, 0.25]), 1e-6
    dg, du = clamped_glu_backward(dh, g, u, alpha, c)
    num_g = dh * (clamped_glu(g + h, u, alpha, c) - clamped_glu(g - h, u, alpha, c)) / (2 * h)
    num_u = dh * (clamped_glu(g, u + h, alpha, c) - clamped_glu(g, u - h, alpha, c)) / (2 * h)
    assert np.abs(dg - num_g).max() <= 1e-8 and np.abs(du - num_u).max() <= 1e-8
    assert dg[[4, 5]].tolist() == [0.0, 0.0] and du[[0, 3, 4]].tolist() == [0.0, 0.0, 0.0]


def test_hooked_attention_and_the_cached_step_keep_the_sinks():
    """A hook on the attention weights (the step-by-step path) changes no number, and the cached one-token steps
    write the reference's greedy ids (their logits from the sink's softmax too)."""
    ref = reference(NAME)
    model = qkv.load(MODELS / NAME)
    ids = ref["single_input_ids"]
    hooked = model.with_hooks({"1.attentions": lambda a, layer: a}).forward(ids).logits
    assert max_abs(hooked, ref["single_logits"]) <= TOL_HIDDEN
    np.testing.assert_array_equal(model.generate(ids, max_new_tokens=8), ref["greedy_ids"])
    np.testing.assert_array_equal(model.generate(ids, max_new_tokens=8, use_cache=False), ref["greedy_ids"])


def test_defaults_as_transformers_fills_them(tmp_path):
    """No layer_types: sliding, full, sliding (every other layer); no rope_parameters: θ 150000 with YaRN ×32 over
    4096 positions, truncate false; no swiglu_* or attention_bias: 1.702, 7.0, biases (GptOssConfig's)."""
    path = edited(tmp_path, NAME, {}, drop=("layer_types", "rope_parameters", "swiglu_alpha", "swiglu_limit"))
    cfg = qkv.load(path).config
    assert cfg.layer_windows == (5, None, 5) and cfg.rope_theta == 150000.0
    assert cfg.rope_scaling["rope_type"] == "yarn" and cfg.rope_scaling["factor"] == 32.0
    assert cfg.rope_scaling["original_max_position_embeddings"] == 4096 and cfg.rope_scaling["truncate"] is False
    assert (cfg.glu_alpha, cfg.glu_limit, cfg.qkv_bias) == (1.702, 7.0, True)


def test_a_saved_model_reads_back_equal(tmp_path):
    hf = check_saved_reads_back(tmp_path, NAME)
    assert hf["model_type"] == NAME and hf["layer_types"][1] == "full_attention" and hf["swiglu_limit"] == 0.6


def test_a_fresh_model_draws_sinks_and_router_bias():
    """qkv.init of a gpt_oss config: the sinks and the router's bias drawn N(0, σ²), the experts' biases 0, as
    transformers' _init_weights; it runs and its rows sum to less than 1."""
    cfg = qkv.load(MODELS / NAME).config
    model = qkv.init(cfg, seed=3)
    b = model.weights.blocks[0]
    assert np.abs(b.attn.sinks).min() > 0 and np.abs(b.ffn.b_router).min() > 0
    assert not b.ffn.experts[0].b_gate.any() and not b.ffn.experts[0].b_out.any()
    assert (model.forward(np.array([[5, 6, 7]])).attentions.sum(axis=-1) < 1).all()


@pytest.mark.parametrize("change, message", [
    ({"quantization_config": {"quant_method": "mxfp4"}}, "mxfp4 experts"),
    ({"layer_types": ["sliding_attention", "chunked_attention", "full_attention"]}, "layer_types"),
    ({"layer_types": ["full_attention"]}, "each of the 3 layers"),
    ({"rope_parameters": {"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e4, "partial_rotary_factor": 0.5}},
     "partial rotary"),
    ({"rope_parameters": {"rope_type": "proportional", "factor": 2.0, "rope_theta": 1e4}}, "proportional"),
    ({"num_experts_per_tok": 5}, "num_experts_per_tok 5"),
    ({"swiglu_limit": 0}, "swiglu_limit"),
    ({"swiglu_alpha": "1.7"}, "swiglu_alpha"),
    ({"num_key_value_heads": 3}, "num_key_value_heads 3"),
])
def test_refused_in_one_line(tmp_path, change, message):
    with pytest.raises(QkvError, match=message) as err:
        qkv.load(edited(tmp_path, NAME, change))
    assert "\n" not in str(err.value)


# ── what reads the weights: analyses, saved traces, the views ─────────────────────────────────────────────────

TEXT = "The cat sat on the mat"


def _trace(name: str = NAME):
    return qkv.load(MODELS / name).run(TEXT, keep=("attentions",))


def test_rollout_lets_the_sinks_share_reach_no_token():
    """With sinks Â = ½·mean_h A + ½·I is not renormalised: R_1's rows sum to ½·mean_h Σ_j A + ½ (< 1), and R_l =
    Â_l·R_{l−1}; rows that already sum to 1 give the renormalised rollout itself (1e-12)."""
    from qkv.analysis.rollout import attention_rollout, rollout_of

    trace = _trace()
    A = trace.attentions.astype(np.float64)                                  # (L, H, n, n)
    R = attention_rollout(trace)
    Ahat = 0.5 * A.mean(axis=1) + 0.5 * np.eye(A.shape[-1])
    assert np.abs(R[0] - Ahat[0]).max() <= 1e-12 and np.abs(R[2] - Ahat[2] @ Ahat[1] @ Ahat[0]).max() <= 1e-12
    assert (R[-1].sum(axis=-1) < 1 - 1e-3).all()
    rows = A / A.sum(axis=-1, keepdims=True)                                 # rows of 1: nothing to renormalise
    assert np.abs(rollout_of(rows, sinks=True) - rollout_of(rows)).max() <= 1e-12


def test_entropy_and_js_count_the_sink_as_one_more_outcome():
    """A head's entropy with sinks is the entropy of [A, 1 − Σ A] (each row a distribution again); qkv diff's JS
    divergence compares those rows."""
    from qkv.analysis.diff import js_divergence, with_sink
    from qkv.analysis.stats import entropy
    from qkv.core.ops import entropy as row_entropy

    A = _trace().layer(1).attentions.astype(np.float64)                     # (H, n, n)
    full = with_sink(A, True)                                                # (H, n, n + 1)
    assert np.abs(full.sum(axis=-1) - 1).max() <= 1e-6 and with_sink(A, False) is A
    assert np.abs(entropy(A, sinks=True) - row_entropy(full).mean(-1)).max() <= 1e-12
    assert (entropy(A, sinks=True) > entropy(A) + 1e-3).all()
    B = np.roll(A, 1, axis=0)
    assert np.abs(js_divergence(with_sink(A, True), with_sink(B, True))
                  - js_divergence(full, np.roll(full, 1, axis=0))).max() == 0


def test_atp_star_is_exact_where_the_rest_is_linear():
    """AtP* recomputes each head's pattern with the sink's logit: with the final norm gone and the last layer's
    experts' outputs zeroed (W_out and b_out), the logits are linear in that layer's pattern A, so AtP* equals
    patching each head's queries and keys exactly (1e-9, float64), as tests/test_atp.py checks it for Llama."""
    from dataclasses import replace

    from conftest import patching_pair
    from qkv.analysis.atp import atp, patch_qkv

    model, clean, corrupted, metric = patching_pair(NAME)
    w = model.weights
    last = w.blocks[-1]
    experts = [replace(e, W_out=np.zeros_like(e.W_out), b_out=np.zeros_like(e.b_out)) for e in last.ffn.experts]
    model.weights = replace(w, final_norm=None, blocks=w.blocks[:-1] + [replace(last, ffn=replace(last.ffn,
                                                                                                 experts=experts))])
    e, q = atp(model, clean, corrupted, metric, star=True), patch_qkv(model, clean, corrupted, metric)
    assert np.abs(e.queries_star[-1] - q["queries"][-1]).max() <= 1e-9
    assert np.abs(e.keys_star[-1] - q["keys"][-1]).max() <= 1e-9
    assert np.abs(q["queries"][-1]).max() > 1e-3


def test_a_saved_trace_keeps_its_sinks(tmp_path):
    """trace.json says "rows": "sinks" (rows sum to less than 1, not edited by hooks): read back, the trace knows
    its sinks and their shares; a model without sinks still saves "softmax"."""
    trace = _trace()
    trace.save(tmp_path / "t")
    assert json.loads((tmp_path / "t" / "trace.json").read_text())["rows"] == "sinks"
    back = qkv.Trace.load(tmp_path / "t")
    assert back.sinks and np.abs(back.sink_shares - trace.sink_shares).max() <= 1e-7
    other = _trace("mixtral")
    assert not other.sinks and other.sink_shares is None
    other.save(tmp_path / "m")
    assert json.loads((tmp_path / "m" / "trace.json").read_text())["rows"] == "softmax"


def test_the_page_carries_each_rows_sink_share():
    """The viewer's "sinks": (L, H, n) bytes, each row's 1 − Σ_j A_ij within 1/510; from a long input's top weights
    (each row's kept weights and rest) the same; null for a model without sinks."""
    from qkv.viz.html import viewer_html
    from qkv.viz.wire import decode
    from test_viewer import data_of

    trace = _trace()
    shares = decode(data_of(viewer_html(trace))["sinks"])                             # (L, H, n)
    assert shares.shape == trace.attentions.shape[:3] and np.abs(shares - trace.sink_shares).max() <= 0.5 / 255 + 1e-7
    top = qkv.load(MODELS / NAME).run(TEXT, keep=("attention_top",), top=3)
    from_top = decode(data_of(viewer_html(top, budget_mb=1e-4))["sinks"])
    assert np.abs(from_top - trace.sink_shares).max() <= 0.5 / 255 + 1e-6
    assert data_of(viewer_html(_trace("mixtral")))["sinks"] is None


def test_show_prints_the_sink_column(monkeypatch, capsys):
    """`qkv show --head` prints a head's weights and a last column, sink, each row's 1 − Σ A (2 decimals); without
    --head a row whose sink took the most says "sink"."""
    from conftest import run_main

    code, out, _ = run_main(monkeypatch, capsys, "show", TEXT, "--model", str(MODELS / NAME), "--head", "1",
                            "--layer", "0")
    assert code == 0 and "sink" in out.splitlines()[3]
    A = _trace().layer(0).attentions[1]
    first = next(line for line in out.splitlines() if line.startswith("The "))
    assert first.split("│")[-1].strip() == f"{1 - A[0].sum():.2f}"
    code, out, _ = run_main(monkeypatch, capsys, "show", TEXT, "--model", str(MODELS / NAME), "--layer", "0")
    assert code == 0 and "sink ." in out


def test_matrix_view_draws_the_sink_column(tab, tmp_path):  # noqa: F811  (test_browser's fixture)
    """In a real browser: the matrix view of a gpt-oss trace draws a last column labelled "sink", whose cell of
    row i reads the share head 1's sink took (as Python computed it, ±0.002), and says so in its caption."""
    from test_browser import open_viewer
    from qkv.viz.html import save_viewer

    trace = _trace()
    open_viewer(tab, save_viewer(trace, tmp_path / "v.html"))
    page = tab.page
    page.click(".qkv-tab >> text=Matrix")
    page.select_option(".qkv-head", "1")
    sink = page.eval_on_selector(".qkv-heat", "c => c.qkvLabels.sink")
    assert sink["text"] == "sink"
    geo = page.eval_on_selector(".qkv-heat", "c => ({...c.dataset, box: c.getBoundingClientRect().toJSON()})")
    cell, y0 = float(geo["cell"]), geo["box"]["y"] + float(geo["padT"])
    for i in (0, 4, 8):
        page.mouse.move(geo["box"]["x"] + sink["x"] + sink["width"] / 2, y0 + (i + 0.5) * cell)
        q = round(float(trace.sink_shares[0, 1, i]) * 255)
        value = "0.00" if q == 0 else "<0.01" if q < 2.55 else f"{q / 255:.2f}"
        assert page.text_content(".qkv-readout").startswith(f"“{trace.labels[i]}” (query {i}) → sink: {value} ")
    assert "sink took" in page.text_content(".qkv-matrix")
    assert tab.errors == []


def test_pipeline_page_works_out_A_with_the_sink(tab, tmp_path):  # noqa: F811  (test_browser's fixture)
    """In a real browser: the pipeline page's diagram recomputes each A[i, j] of a gpt-oss head with the sink's
    term in the sum ("sink: exp(…)"), equal to the engine's weight (1e-6); every box of every layer opens."""
    from test_browser_pipeline import open_page
    from test_browser_pipeline_families import boxes, open_box
    from qkv.viz.pipeline import save_pipeline

    model = qkv.load(MODELS / NAME)
    trace = model.run(TEXT)
    open_page(tab, save_pipeline(model, trace, tmp_path / "p.html", layer=1, head=2, box="scores"))
    page = tab.page
    page.focus(".qkv-p-grid[data-matrix='A']")
    page.keyboard.press("Home")
    n = len(trace.tokens)
    for _ in range(n):
        page.keyboard.press("ArrowDown")
        a = page.eval_on_selector(".qkv-p-arith", "e => Object.assign({}, e.dataset)")
        i, j = int(a["i"]), int(a["j"])
        assert a["matrix"] == "A" and float(a["engine"]) == float(trace.layers[1].attentions[2, i, j])
        assert abs(float(a["result"]) - float(a["engine"])) <= 1e-6
    assert "sink: exp(" in page.text_content(".qkv-p-arith")
    for layer in range(model.config.n_layers):
        page.select_option(".qkv-p-layer", str(layer))
        for box in boxes(tab):
            open_box(tab, box)
    assert tab.errors == [] and tab.dialogs == []


def test_the_heatmap_figure_has_the_sink_column():
    """The PNG/SVG heatmap of one head (`qkv show --out`) ends with a column "sink" holding each row's share; a model
    without sinks draws none."""
    from qkv.viz.figures import head_heatmap

    trace = _trace()
    ax = head_heatmap(trace, 0, 1).axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()][-1] == "sink"
    drawn = ax.images[0].get_array()                                          # (n, n + 1)
    assert drawn.shape == (9, 10) and np.abs(drawn[:, -1] - trace.sink_shares[0, 1]).max() <= 1e-6
    other = head_heatmap(_trace("mixtral"), 0, 1).axes[0]
    assert "sink" not in [t.get_text() for t in other.get_xticklabels()]


@pytest.mark.parametrize("topic", ["attention", "flash"])
def test_lessons_that_rebuild_softmax_refuse_the_sinks_in_one_line(monkeypatch, capsys, topic):
    """`qkv explain attention` and `flash` rebuild A = softmax(S) (or its online form) without a sink: refused in one
    line (exit 2), not a failed check."""
    from conftest import run_main

    code, _, err = run_main(monkeypatch, capsys, "explain", topic, "--model", str(MODELS / NAME))
    assert code == 2 and "attention sinks" in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("knobs", [{"glu_limit": -1.0}, {"glu_limit": 0.5, "gated_ffn": False},
                                   {"glu_limit": 0.5, "glu_alpha": float("nan")}])
def test_the_clamped_glu_knobs_are_checked(knobs):
    with pytest.raises(QkvError, match="glu_limit") as err:
        qkv.load(MODELS / NAME).config.with_(**knobs)
    assert "\n" not in str(err.value)


def test_a_null_sliding_window_is_refused_not_read_as_the_default(tmp_path):
    """config.json's "sliding_window": null with sliding layers: transformers cannot build it; qkv says so in one
    line rather than reading GptOssConfig's 128 (an absent key is that default)."""
    from conftest import edited

    with pytest.raises(QkvError, match="no sliding_window") as err:
        qkv.load(edited(tmp_path, "gpt_oss", {"sliding_window": None}))
    assert "\n" not in str(err.value)
    assert qkv.load(edited(tmp_path / "absent", "gpt_oss", {}, ("sliding_window",))).config.sliding_window == 128
