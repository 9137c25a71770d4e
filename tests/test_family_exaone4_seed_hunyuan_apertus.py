"""EXAONE 4, Seed-OSS, Hunyuan dense and Apertus (issue 47) beyond tests/test_families.py's comparisons with
transformers (which every fixture of tests/fixtures/models/ goes through: both paddings, attentions, the cache
step, greedy ids): backward against torch autograd (tests/fixtures/grads/), each new knob needed for the reference's
numbers, the knobs read from config.json and the defaults transformers fills in, a saved model reading back equal,
xIELU and its backward, and the knobs qkv refuses in one line.

Fixtures: tests/fixtures/models/{exaone4, seed_oss, hunyuan_v1_dense, apertus}, made by tests/fixtures/make_fixtures.py.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

import qkv
from qkv import QkvError
from conftest import (FIXTURES, MODELS, TOL_HIDDEN, check_gradients, check_knob_matters, check_saved_reads_back,
                      edited, max_abs, reference)

NEW = ("exaone4", "seed_oss", "hunyuan_v1_dense", "apertus")


@pytest.mark.parametrize("name", NEW)
def test_gradients_equal_autograd(name):
    """The loss within 1e-5 and each tensor's gradient within 1e-4 relative error of torch autograd's (Apertus: xIELU's
    learned a_p, a_n too; its β, ε are buffers, with no gradient on either side)."""
    check_gradients(qkv.load(MODELS / name), name)


@pytest.mark.parametrize("name, knobs", [
    ("exaone4", {"no_rope_layers": ()}),                                # the full layer has no RoPE
    ("exaone4", {"layer_windows": None, "sliding_window": None, "no_rope_layers": ()}),   # the sliding layers' window
    ("hunyuan_v1_dense", {"qk_norm_after_rope": False}),                # q/k norms after RoPE, not before
    ("hunyuan_v1_dense", {"rope_theta": 10000.0}),                      # NTK alpha: the base θ·α^(d/(d−2))
    ("apertus", {"activation": "relu"}),                                # xIELU with its scalars
    ("apertus", {"qk_norm": None}),                                     # q/k norms per head
])
def test_each_knob_matters(name, knobs):
    """The fixture's logits are met with the knob and missed without it (by far more than the tolerance)."""
    check_knob_matters(name, knobs)


def test_apertus_reads_each_layers_own_xielu_scalars():
    """Layer 0's scalars given to layer 1 (the two differ by the fixture's noise) miss the reference."""
    ref = reference("apertus")
    model = qkv.load(MODELS / "apertus")
    f0, f1 = model.weights.blocks[0].ffn, model.weights.blocks[1].ffn
    assert f0.xielu.alpha_p[0] != f1.xielu.alpha_p[0]
    f1.xielu = f0.xielu
    assert max_abs(model.forward(ref["single_input_ids"]).logits, ref["single_logits"]) > 10 * TOL_HIDDEN


def test_exaone4_knobs_read():
    cfg = qkv.load(MODELS / "exaone4").config
    assert cfg.family == "exaone4" and cfg.layer_windows == (5, None, 5) and cfg.no_rope_layers == (1,)
    assert cfg.qk_norm == "head" and not cfg.qk_norm_after_rope and cfg.norm_eps == 1e-5 and not cfg.tied_embeddings
    w = qkv.load(MODELS / "exaone4").weights.blocks[0]
    assert w.attn_norm is None and w.ffn_norm is None and w.attn_out_norm is not None and w.ffn_out_norm is not None
    assert w.attn.q_norm.weight.shape == (8,) and cfg.rope_theta == 2e4


def test_seed_oss_knobs_read():
    model = qkv.load(MODELS / "seed_oss")
    cfg, a = model.config, model.weights.blocks[0].attn
    assert cfg.family == "seed_oss" and cfg.qkv_bias and cfg.out_bias and not cfg.ffn_bias and cfg.d_head == 16
    assert a.b_Q.shape == (64,) and a.b_O.shape == (32,) and cfg.rope_theta == 5e4 and not cfg.tied_embeddings


def test_hunyuan_knobs_read():
    cfg = qkv.load(MODELS / "hunyuan_v1_dense").config
    assert cfg.family == "hunyuan_v1_dense" and cfg.qk_norm == "head" and cfg.qk_norm_after_rope
    assert cfg.rope_theta == pytest.approx(1e4 * 1000.0 ** (8 / 6), rel=1e-12) and cfg.rope_scaling is None
    assert cfg.qkv_bias and cfg.out_bias and cfg.tied_embeddings and cfg.d_head == 8


def test_apertus_knobs_read():
    model = qkv.load(MODELS / "apertus")
    cfg, f = model.config, model.weights.blocks[1].ffn
    assert cfg.family == "apertus" and cfg.activation == "xielu" and not cfg.gated_ffn and cfg.qk_norm == "head"
    assert cfg.rope_scaling["rope_type"] == "llama3" and cfg.rope_theta == 5e4 and not cfg.tied_embeddings
    assert f.W_gate is None and f.xielu.alpha_p.shape == (1,) and f.xielu.beta.shape == ()
    assert float(f.xielu.beta) == 0.5 and float(f.xielu.eps) == np.float32(-1e-6)


def test_exaone4_layer_types_from_the_pattern_and_letters_ignored(tmp_path):
    """Without layer_types, Exaone4Config's pattern (every 2nd layer full here); with them, a pattern of letters
    ("LLLG", EXAONE 4.0's own config.json) is not read, as Exaone4Config does not."""
    ref = reference("exaone4")
    for change, drop in (({}, ("layer_types",)), ({"sliding_window_pattern": "LLLG"}, ())):
        model = qkv.load(edited(tmp_path / str(len(drop)), "exaone4", change, drop))
        assert model.config.layer_windows == (5, None, 5) and model.config.no_rope_layers == (1,)
        assert max_abs(model.forward(ref["single_input_ids"]).logits, ref["single_logits"]) <= TOL_HIDDEN


def test_exaone4_without_a_window_turns_every_layer(tmp_path):
    """sliding_window null and every layer full: RoPE in every layer (Exaone4Attention turns q, k when there is no
    window); the same layers with a window and no sliding layer: none turned."""
    types = ["full_attention"] * 3
    cfg = qkv.load(edited(tmp_path, "exaone4", {"layer_types": types, "sliding_window": None})).config
    assert cfg.layer_windows is None and cfg.sliding_window is None and cfg.no_rope_layers == ()
    cfg = qkv.load(edited(tmp_path / "w", "exaone4", {"layer_types": types})).config
    assert cfg.no_rope_layers == (0, 1, 2)
    assert qkv.checkpoints.FAMILIES["exaone4"].hf_config(cfg)["sliding_window"] is not None   # written back as such


def test_exaone4_without_the_window_key_has_exaone4configs_4096(tmp_path):
    """No sliding_window key is Exaone4Config's default 4096 (sliding layers, full layers without RoPE), not null."""
    cfg = qkv.load(edited(tmp_path, "exaone4", {}, ("sliding_window",))).config
    assert cfg.sliding_window == 4096 and cfg.layer_windows == (4096, None, 4096) and cfg.no_rope_layers == (1,)


@pytest.mark.parametrize("name", ["exaone4", "hunyuan_v1_dense", "apertus"])
def test_keys_the_model_does_not_read_are_not_read(tmp_path, name):
    """attention_bias (EXAONE 4) and mlp_bias (all three): their transformers classes build no such biases whatever
    config.json says, so the fixture's numbers stand (and no bias tensor is looked for)."""
    ref = reference(name)
    change = {"mlp_bias": True} | ({"attention_bias": True} if name == "exaone4" else {})
    model = qkv.load(edited(tmp_path, name, change))
    assert not model.config.ffn_bias
    assert max_abs(model.forward(ref["single_input_ids"]).logits, ref["single_logits"]) <= TOL_HIDDEN


def test_defaults_as_transformers_fills_them(tmp_path):
    """Keys config.json leaves out take the config class's defaults: Seed-OSS's head_dim 128 and q/k/v biases,
    Apertus's llama3 RoPE at 1.2e7 over 8192 and pad id 3."""
    seed = qkv.checkpoints.FAMILIES["seed_oss"].config({"model_type": "seed_oss", "vocab_size": 10, "hidden_size": 64,
                                                        "num_hidden_layers": 1, "num_attention_heads": 16,
                                                        "intermediate_size": 8})
    assert seed.d_head == 128 and seed.n_kv_heads == 8 and seed.qkv_bias and not seed.out_bias
    assert seed.pad_token_id == 1
    path = edited(tmp_path, "apertus", {"max_position_embeddings": 65536}, drop=("rope_parameters", "pad_token_id"))
    cfg = qkv.load(path).config
    assert cfg.rope_theta == 1.2e7 and cfg.rope_scaling["factor"] == 8.0 and cfg.pad_token_id == 3
    assert cfg.rope_scaling["original_max_position_embeddings"] == 8192


def test_xielu_and_its_backward():
    """xIELU's two branches as written (α_p = softplus(a_p), α_n = β + softplus(a_n)), and its backward against
    central differences in float64 (dx, and the gradients of a_p and a_n)."""
    from qkv.core.ops import xielu, xielu_backward

    a_p, a_n, beta, eps = np.array([0.3]), np.array([-0.7]), np.array(0.5), np.array(-1e-6)
    sp = lambda v: math.log1p(math.exp(v))                                  # noqa: E731
    x = np.array([-3.0, -0.5, -1e-3, 0.25, 2.0])
    want = [(math.expm1(v) - v) * (0.5 + sp(-0.7)) + 0.5 * v if v <= 0 else sp(0.3) * v * v + 0.5 * v for v in x]
    np.testing.assert_allclose(xielu(x, a_p, a_n, beta, eps), want, rtol=1e-12)
    dy, h = np.array([1.0, -2.0, 0.5, 1.5, -0.25]), 1e-6
    dx, da_p, da_n = xielu_backward(dy, x, a_p, a_n, beta, eps)
    f = lambda x_, p_, n_: float(dy @ xielu(x_, p_, n_, beta, eps))          # noqa: E731
    num_x = [(f(x + h * e, a_p, a_n) - f(x - h * e, a_p, a_n)) / (2 * h * dy[i]) for i, e in enumerate(np.eye(5))]
    assert np.abs(dx / dy - num_x).max() <= 1e-6
    assert abs(da_p[0] - (f(x, a_p + h, a_n) - f(x, a_p - h, a_n)) / (2 * h)) <= 1e-6
    assert abs(da_n[0] - (f(x, a_p, a_n + h) - f(x, a_p, a_n - h)) / (2 * h)) <= 1e-6


def test_a_fresh_apertus_starts_xielu_as_transformers():
    """qkv.init: α_p = 0.8, α_n = β + softplus(a_n) = 0.8, β = 0.5, ε = −1e-6 in each layer (XIELUActivation)."""
    cfg = json.loads((MODELS / "apertus" / "config.json").read_text())
    p = qkv.init(cfg).weights.blocks[1].ffn.xielu
    assert math.log1p(math.exp(float(p.alpha_p[0]))) == pytest.approx(0.8, rel=1e-6)
    assert 0.5 + math.log1p(math.exp(float(p.alpha_n[0]))) == pytest.approx(0.8, rel=1e-6)
    assert float(p.beta) == 0.5 and float(p.eps) == np.float32(-1e-6)


@pytest.mark.parametrize("name", NEW)
def test_a_saved_model_reads_back_equal(tmp_path, name):
    assert check_saved_reads_back(tmp_path, name)["model_type"] == name


@pytest.mark.parametrize("name, change, drop, message", [
    ("exaone4", {"sliding_window_pattern": "LLLG"}, ("layer_types",), "positive whole sliding_window_pattern"),
    ("exaone4", {"sliding_window_pattern": 0}, ("layer_types",), "positive whole sliding_window_pattern"),
    ("exaone4", {"sliding_window": None}, ("layer_types",), "needs a sliding_window"),
    ("exaone4", {"sliding_window": None}, (), "no sliding_window"),
    ("exaone4", {"layer_types": ["sliding_attention", "chunked_attention", "full_attention"]}, (), "layer_types"),
    ("exaone4", {"sliding_window_pattern": "LLLG", "model_type": "gemma3_text"}, (), "sliding_window_pattern"),
    ("seed_oss", {"hidden_act": "tanh"}, (), "activation 'tanh'"),
    ("seed_oss", {"rope_parameters": {"rope_type": "nope", "rope_theta": 1e4}}, (), "nope"),
    ("hunyuan_v1_dense", {}, ("head_dim",), "lacks head_dim"),
    ("hunyuan_v1_dense", {"rope_parameters": {"rope_type": "dynamic", "alpha": "x", "factor": 1.0}}, (), "alpha"),
    ("apertus", {"hidden_act": "xielu2"}, (), "activation 'xielu2'"),
    ("apertus", {"rope_parameters": {"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.5}}, (),
     "partial rotary"),
])
def test_refused_in_one_line(tmp_path, name, change, drop, message):
    with pytest.raises(QkvError, match=message) as err:
        qkv.load(edited(tmp_path, name, change, drop))
    assert "\n" not in str(err.value)


def test_hunyuan_lessons_that_rebuild_q_before_rope_refuse():
    """The attention lesson rebuilds a head's normalised q, k before RoPE: Hunyuan has none (its norms follow RoPE)."""
    from qkv.lessons.attention import head_qk

    model = qkv.load(MODELS / "hunyuan_v1_dense")
    with pytest.raises(QkvError, match="after RoPE"):
        head_qk(np.zeros((3, 32)), model.weights.blocks[0].attn, model.config, slice(0, 8), slice(0, 8))


def _away_from_defaults(model) -> None:
    """Biases and norms of a fresh model moved away from 0 and 1, so that a bias or norm read wrong shows."""
    for b in model.weights.blocks:
        for bias, by in ((b.attn.b_Q, 0.1), (b.attn.b_K, -0.2), (b.attn.b_V, 0.3)):
            if bias is not None:
                bias += by
        b.ffn_norm.weight *= 1.5
        if b.attn.q_norm is not None:
            b.attn.q_norm.weight *= 1.7
            b.attn.k_norm.weight *= 0.6


@pytest.mark.parametrize("name, change, eps", [
    ("seed_oss", {"attention_out_bias": False}, 1e-6),               # llama.cpp's seed_oss: q/k/v biases only
    ("hunyuan_v1_dense", {"attention_bias": False}, 1e-5),          # no biases; NTK alpha 1000 → rope.freq_base
])
def test_gguf_reads_as_its_directory(tmp_path, name, change, eps):
    """llama.cpp's file (tests/fixtures/gguf_convert.py: tensors as stored; Seed-OSS's post_attention_layernorm as
    post_attention_norm, Hunyuan's query_layernorm / key_layernorm as attn_q_norm / attn_k_norm and its NTK alpha
    folded into the base) of a directory gives the directory's logits (1e-5) and config (the norms' ε and the RoPE
    base as the file's float32)."""
    import sys

    sys.path.insert(0, str(FIXTURES))
    import gguf_convert

    hf = json.loads((MODELS / name / "config.json").read_text()) | {"vocab_size": 300} | change   # the file's tokens
    model = qkv.init(hf, seed=3)
    _away_from_defaults(model)
    model.save(tmp_path / "hf")
    ours = qkv.load(gguf_convert.convert(tmp_path / "hf", tmp_path / "model.gguf"))
    assert ours.config.norm_eps == pytest.approx(eps)
    assert ours.config.rope_theta == pytest.approx(model.config.rope_theta)
    assert ours.config.with_(norm_eps=eps, rope_theta=model.config.rope_theta) == model.config
    ids = np.arange(3, 20)[None]
    assert max_abs(ours.forward(ids).logits, model.forward(ids).logits) <= 1e-5


def test_hunyuan_eap_with_qkv_inputs_is_the_first_order_term_of_edge_patching():
    """Edge attribution with q, k, v inputs split (qkv.analysis.edges.head_input_gradients: back through the q/k norms
    before RoPE's turn, Hunyuan's order) against central differences of edge patching, float64 (1e-7 of the largest)."""
    from qkv.analysis.eap import edge_attribution
    from qkv.analysis.edges import EdgePatcher

    model, n = qkv.load(MODELS / "hunyuan_v1_dense", dtype=np.float64), 7
    clean = np.random.default_rng(5).integers(3, model.config.vocab_size, n)
    corrupt = clean.copy()
    corrupt[2], corrupt[4] = (clean[2] + 5) % model.config.vocab_size, (clean[4] + 9) % model.config.vocab_size
    a = edge_attribution(model, clean, corrupt, 3, 5, qkv=True)
    ep = EdgePatcher(model, n, True)
    x, theirs, valid, eps = ep.embed(clean), ep.run(ep.embed(corrupt)), ep.graph.valid(), 1e-5
    fd = np.zeros_like(a.scores)
    for s, r in zip(*np.nonzero(valid)):
        w = np.zeros(valid.shape)
        out = []
        for sign in (1, -1):
            w[s, r] = sign * eps
            logits = ep.run(x, w, theirs).logits
            out.append(float(logits[-1, 3] - logits[-1, 5]))
        fd[s, r] = (out[0] - out[1]) / (2 * eps)
    top = np.abs(a.scores).max()
    assert top > 0.1 and np.abs(fd - a.scores).max() <= 1e-7 * top


def test_hunyuan_qk_table_sums_to_the_heads_score():
    """qkv.graphs.qk's frozen query/key maps with the norm after RoPE (its scale frozen at the real turned q, k): the
    table of a head's score sums to the score the pass had (1e-9)."""
    from qkv.graphs.qk import qk_table
    from qkv.graphs.replacement import replacement
    from test_graph_qk import transcoders

    model = qkv.load(MODELS / "hunyuan_v1_dense", dtype=np.float64)
    ids = np.random.default_rng(3).integers(3, model.config.vocab_size, 9).tolist()
    rep = replacement(model, ids, transcoders(model))
    for head, (i, j) in [(0, (7, 3)), (model.config.n_heads - 1, (5, 5))]:
        t = qk_table(rep, model.config.n_layers - 1, head, i, j)
        assert t.error <= 1e-9 * max(1.0, abs(t.score)) and abs(t.total) > 0


def test_apertus_neurons_are_xielu_of_what_the_activation_reads():
    """blocks.activation_of (what the FFN lesson and the graph lesson call): each layer's own xIELU, applied to the
    recorded ffn_pre, gives the recorded neurons exactly."""
    from qkv.core.blocks import activation_of

    model = qkv.load(MODELS / "apertus")
    trace = model.run(list(range(3, 14)), keep=("ffn_pre", "neurons"))
    for i, block in enumerate(model.weights.blocks):
        lt = trace.layer(i)
        np.testing.assert_array_equal(activation_of(block.ffn, model.config)(lt.ffn_pre), lt.neurons)
