"""GLM, GLM-4 and Llama's mlp_bias (issue 47) beyond tests/test_families.py's comparisons with transformers: backward
against torch autograd (tests/fixtures/grads/), each new knob needed for the reference's numbers, the knobs read from
config.json (GlmConfig's defaults where it leaves them out), a saved model reading back equal, the FFN's gate bias
through every place that redoes the FFN from its weights, and the knobs refused in one line.

Fixtures: tests/fixtures/models/{glm, glm4, llama_mlp_bias}, made by tests/fixtures/make_fixtures.py.
"""

from __future__ import annotations

import numpy as np
import pytest

import qkv
from qkv import QkvError
from qkv.checkpoints.families import config_of, weights_from_tensors
from qkv.checkpoints import llama
from conftest import (FIXTURES, MODELS, TOL_HIDDEN, check_gradients, check_knob_matters, check_saved_reads_back,
                      edited, max_abs, reference)

NEW = ("glm", "glm4", "llama_mlp_bias")


@pytest.mark.parametrize("name", NEW)
def test_gradients_equal_autograd(name):
    """The loss within 1e-5 and each tensor's gradient within 1e-4 relative error of torch autograd's (b_gate's
    among them for llama_mlp_bias; GLM's fused gate_up_proj as one tensor)."""
    grads = check_gradients(qkv.load(MODELS / name), name)
    if name == "llama_mlp_bias":
        assert "model.layers.0.mlp.gate_proj.bias" in grads


@pytest.mark.parametrize("name, knobs", [
    ("glm", {"rope_interleaved": False}),                 # RoPE's pairs (0, 1), (2, 3), …
    ("glm", {"rotary_dim": None}),                        # on half of each head only
    ("glm4", {"rotary_dim": 8}),                          # on 12 of 16 (partial_rotary_factor 0.75)
])
def test_each_knob_matters(name, knobs):
    """The fixture's logits are met with the knob and missed without it (by far more than the tolerance)."""
    check_knob_matters(name, knobs)


@pytest.mark.parametrize("name, path", [("glm4", "attn_out_norm"), ("glm4", "ffn_out_norm"),
                                        ("llama_mlp_bias", "ffn.b_gate")])
def test_each_tensor_matters(name, path):
    """GLM-4's norms after each box and Llama's gate bias are read and used: without one, the logits move."""
    ref = reference(name)
    model = qkv.load(MODELS / name)
    *outer, last = path.split(".")
    for block in model.weights.blocks:
        holder = block
        for key in outer:
            holder = getattr(holder, key)
        assert getattr(holder, last) is not None
        setattr(holder, last, None)
    assert max_abs(model.forward(ref["single_input_ids"]).logits, ref["single_logits"]) > 100 * TOL_HIDDEN


def test_glm_knobs_read():
    cfg = qkv.load(MODELS / "glm").config
    assert cfg.family == "glm" and cfg.rope_interleaved and cfg.rotary_dim == 6 and cfg.d_head == 12
    assert cfg.qkv_bias and not cfg.out_bias and not cfg.ffn_bias and cfg.gated_ffn and cfg.n_kv_heads == 2
    assert cfg.rope_theta == 3e4 and cfg.rope_scaling is None and not cfg.tied_embeddings and cfg.norm_eps == 1e-6
    w = qkv.load(MODELS / "glm").weights.blocks[0]
    assert w.attn_out_norm is None and w.ffn_out_norm is None and w.attn.b_O is None


def test_glm4_knobs_read():
    model = qkv.load(MODELS / "glm4")
    cfg = model.config
    assert cfg.family == "glm4" and cfg.rope_interleaved and cfg.rotary_dim == 12 and cfg.d_head == 16
    assert not cfg.qkv_bias and not cfg.out_bias and cfg.n_kv_heads == 1 and cfg.tied_embeddings
    assert cfg.rope_theta == 2e4 and cfg.rope_scaling["rope_type"] == "linear" and cfg.rope_scaling["factor"] == 2.0
    assert all(b.attn_out_norm is not None and b.ffn_out_norm is not None for b in model.weights.blocks)


def test_glm_defaults_as_glm_config_fills_them():
    """A config.json with only the sizes: GlmConfig's defaults (head_dim 128, 2 K/V heads, ε 1.5625e-7, RoPE on half
    of each head with base 10000, q/k/v biases, its pad and eos ids)."""
    for kind in ("glm", "glm4"):
        cfg = config_of({"model_type": kind, "vocab_size": 64, "hidden_size": 256, "num_attention_heads": 4,
                         "num_hidden_layers": 1, "intermediate_size": 32})
        assert (cfg.d_head, cfg.n_kv_heads, cfg.norm_eps, cfg.rotary_dim) == (128, 2, 1.5625e-7, 64)
        assert cfg.rope_theta == 1e4 and cfg.qkv_bias and not cfg.out_bias and not cfg.tied_embeddings
        assert cfg.pad_token_id == 151329 and cfg.eos_token_id == [151329, 151336, 151338]
        assert cfg.max_positions == 131072 and cfg.activation == "silu"


@pytest.mark.parametrize("name, change, drop", [
    ("glm", {"rope_theta": 3e4, "partial_rotary_factor": 0.5}, ("rope_parameters",)),      # the older keys
    ("glm", {"rope_theta": 3e4}, ("rope_parameters",)),                                    # the default factor
    ("glm4", {"rope_scaling": {"rope_type": "linear", "factor": 2.0}, "rope_theta": 2e4,
              "partial_rotary_factor": 0.75}, ("rope_parameters",)),
    ("glm4", {"rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 2e4},
              "partial_rotary_factor": 0.75}, ()),                          # the factor beside rope_parameters
])
def test_older_rope_keys_give_the_same_numbers(tmp_path, name, change, drop):
    """A config.json before transformers 5's rope_parameters (or with the factor beside it), read as GlmConfig reads
    it, gives the fixture's logits exactly."""
    ref = reference(name)
    logits = qkv.load(edited(tmp_path, name, change, drop)).forward(ref["single_input_ids"]).logits
    np.testing.assert_array_equal(logits, qkv.load(MODELS / name).forward(ref["single_input_ids"]).logits)


@pytest.mark.parametrize("name", NEW)
def test_a_saved_model_reads_back_equal(tmp_path, name):
    hf = check_saved_reads_back(tmp_path, name)
    assert hf["model_type"] == name.removesuffix("_mlp_bias")
    assert hf.get("mlp_bias", False) == (name == "llama_mlp_bias")


def test_mlp_bias_through_the_unfused_ffn():
    """Weights as the table reads them (W_gate and W_in apart, no fast layout) run the gate bias on the other
    branch of the FFN box: the same logits as transformers."""
    model = qkv.load(MODELS / "llama_mlp_bias")
    plain = weights_from_tensors(llama.tensors(model.weights, model.config), model.config)
    assert plain.blocks[0].ffn.W_gate_in is None and plain.blocks[0].ffn.b_gate is not None
    ref = reference("llama_mlp_bias")
    model.weights = plain                                   # as training runs them (views of its tensors)
    assert max_abs(model.forward(ref["single_input_ids"]).logits, ref["single_logits"]) <= TOL_HIDDEN


def test_mlp_bias_in_a_fresh_model():
    """qkv.init of a Llama config with mlp_bias: gate, up and down biases, written back under LlamaMLP's names."""
    cfg = config_of({"model_type": "llama", "vocab_size": 64, "hidden_size": 32, "num_attention_heads": 4,
                     "num_hidden_layers": 1, "intermediate_size": 48, "mlp_bias": True})
    model = qkv.init(cfg, seed=3)
    f = model.weights.blocks[0].ffn
    assert f.b_gate.shape == f.b_in.shape == (48,) and f.b_out.shape == (32,)
    names = set(llama.tensors(model.weights, cfg))
    assert {f"model.layers.0.mlp.{p}.bias" for p in ("gate_proj", "up_proj", "down_proj")} <= names
    assert llama.hf_config(cfg)["mlp_bias"] is True


def test_ffn_lesson_and_the_graphs_lesson_redo_the_gate_bias():
    """`qkv explain ffn` and the attribution-graph lesson redo the FFN from its weights in float64: with the gate
    bias, they meet the engine's ffn_out (without it they would not: b_gate moves it)."""
    from qkv.graphs.lesson import _ffn
    from qkv.lessons import ffn

    model = qkv.load(MODELS / "llama_mlp_bias")
    le = ffn.build(model)
    assert le.diffs["ffn_out"] < 1e-4 * np.abs(le.joined).max()
    assert ("b_gate", (model.config.d_ff,)) in le.params
    trace = model.run("The cat sat on the mat", layers=[1], keep=("ffn_in", "ffn_out"))
    h, y = trace.layer(1).ffn_in[-1].astype(np.float64), trace.layer(1).ffn_out[-1]
    assert max_abs(_ffn(model, 1, h), y) <= 1e-5
    model.weights.blocks[1].ffn.b_gate = None
    assert max_abs(_ffn(model, 1, h), y) > 1e-3


@pytest.mark.parametrize("name, change, message", [
    ("glm", {"rope_parameters": {"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.1}},
     "even count"),
    ("glm", {"partial_rotary_factor": 1.5}, r"\(0, 1\]"),
    ("glm", {"rope_parameters": {"rope_type": "proportional", "factor": 2.0, "rope_theta": 1e4}}, "proportional"),
    ("glm", {"hidden_act": "tanh"}, "activation 'tanh'"),
    ("glm", {"attention_bias": False}, "q_proj.bias"),                  # biases the config says it has not
    ("glm4", {"num_key_value_heads": 3}, "does not divide"),
    ("qwen2", {"mlp_bias": True}, "mlp_bias=true"),
    ("llama_gqa", {"mlp_bias": True}, "gate_proj.bias"),                 # the config says biases the file lacks
])
def test_refused_in_one_line(tmp_path, name, change, message):
    with pytest.raises(QkvError, match=message) as err:
        qkv.load(edited(tmp_path, name, change))
    assert "\n" not in str(err.value)


def test_glm4_gguf_file_runs_as_its_directory(tmp_path):
    """llama.cpp's `glm4` file of the fixture (tests/fixtures/gguf_convert.py, F32; its RoPE scaling left out, which
    that writer does not store) holds the directory's weights: the same config and logits as the directory.
    tests/live/test_live_glm.py checks such files against transformers."""
    import sys

    sys.path.insert(0, str(FIXTURES))
    import gguf_convert

    path = edited(tmp_path, "glm4", {"rope_parameters": {"rope_type": "default", "rope_theta": 2e4,
                                                          "partial_rotary_factor": 0.75}})
    directory = qkv.load(path)
    model = qkv.load(gguf_convert.convert(path, tmp_path / "glm4.gguf"))
    assert model.config.family == "glm4" and model.config.d_head == 16 and model.config.rotary_dim == 12
    assert model.config.tied_embeddings and not model.config.qkv_bias
    ids = reference("glm4")["single_input_ids"]
    assert max_abs(model.forward(ids).logits, directory.forward(ids).logits) <= 1e-6


@pytest.mark.parametrize("name", NEW)
def test_the_pipeline_page_shows_its_rope(name):
    """The pipeline page of each builds from a trace and draws RoPE as the model turns it (part of each head, by
    neighbouring pairs: GLM, GLM-4)."""
    from qkv.viz.pipeline import pipeline_html
    from qkv.viz.pipeline_payload import pipeline_payload

    model = qkv.load(MODELS / name)
    trace = model.run(reference(name)["single_input_ids"][0, :6].tolist())
    arch = pipeline_payload(model, trace)["arch"]
    assert (arch["rotary_dim"], arch["rope_interleaved"]) == (model.config.rotary_dim, name != "llama_mlp_bias")
    assert "<html" in pipeline_html(model, trace).lower()
