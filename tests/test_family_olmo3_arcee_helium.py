"""OLMo 3, Arcee and Helium (issue 47) beyond tests/test_families.py's comparisons with transformers: backward
against torch autograd (tests/fixtures/grads/), each new knob needed for the reference's numbers, the knobs read
from config.json, a saved model reading back equal, and the knobs qkv refuses in one line.

Fixtures: tests/fixtures/models/{olmo3, arcee, helium}, made by tests/fixtures/make_fixtures.py.
"""

from __future__ import annotations

import numpy as np
import pytest

import qkv
from qkv import QkvError
from conftest import MODELS, check_gradients, check_knob_matters, check_saved_reads_back, edited

NEW = ("olmo3", "arcee", "helium")


@pytest.mark.parametrize("name", NEW)
def test_gradients_equal_autograd(name):
    """The loss within 1e-5 and each tensor's gradient within 1e-4 relative error of torch autograd's."""
    check_gradients(qkv.load(MODELS / name), name)


@pytest.mark.parametrize("name, knobs", [
    ("olmo3", {"layer_windows": None, "sliding_window": None}),      # the sliding layers' window
    ("olmo3", {"local_rope_theta": None, "local_rope_scaling": None}),   # the sliding layers' own RoPE
    ("arcee", {"activation": "relu"}),                                 # ReLU², not ReLU
    ("helium", {"rope_interleaved": False}),                           # RoPE's pairs (0, 1), (2, 3), …
])
def test_each_knob_matters(name, knobs):
    """The fixture's logits are met with the knob and missed without it (by far more than the tolerance)."""
    check_knob_matters(name, knobs)


def test_olmo3_knobs_read():
    cfg = qkv.load(MODELS / "olmo3").config
    assert cfg.family == "olmo3" and cfg.layer_windows == (5, None, 5) and cfg.qk_norm == "all"
    assert cfg.rope_theta == 5e4 and cfg.rope_scaling["rope_type"] == "linear" and cfg.local_rope_theta == 1e4
    assert cfg.local_rope_scaling is None and cfg.norm_eps == 1e-6 and not cfg.tied_embeddings


def test_arcee_knobs_read():
    cfg = qkv.load(MODELS / "arcee").config
    assert cfg.family == "arcee" and cfg.activation == "relu2" and not cfg.gated_ffn and not cfg.ffn_bias
    assert not cfg.qkv_bias and not cfg.out_bias and cfg.n_kv_heads == 2 and cfg.rope_theta == 2e4
    assert cfg.norm_eps == 1e-5


def test_helium_knobs_read(tmp_path):
    cfg = qkv.load(MODELS / "helium").config
    assert cfg.family == "helium" and cfg.rope_interleaved and cfg.qkv_bias and not cfg.out_bias
    assert cfg.norm_eps == 1e-8 and cfg.d_head == 8 and cfg.tied_embeddings and cfg.rope_theta == 3e4
    bare = qkv.load(edited(tmp_path, "helium", {}, drop=("rms_norm_eps", "pad_token_id"))).config
    assert bare.norm_eps == 1e-8 and bare.pad_token_id == 3                # HeliumConfig's defaults


def test_relu2_and_its_backward():
    """ReLU²(x) = max(x, 0)² and its derivative 2·max(x, 0), against central differences (float64; 1e-5: at x = 0
    the difference itself is off by h·dy/2)."""
    from qkv.core.ops import ACTIVATION_BACKWARDS, ACTIVATIONS

    x = np.array([-2.0, -1e-3, 0.0, 0.5, 3.0])
    np.testing.assert_array_equal(ACTIVATIONS["relu2"](x), [0.0, 0.0, 0.0, 0.25, 9.0])
    dy, h = np.array([1.0, 2.0, 3.0, -1.5, 0.5]), 1e-6
    numeric = dy * (ACTIVATIONS["relu2"](x + h) - ACTIVATIONS["relu2"](x - h)) / (2 * h)
    assert np.abs(ACTIVATION_BACKWARDS["relu2"](dy, x) - numeric).max() <= 1e-5


def test_olmo3_defaults_as_transformers_fills_them(tmp_path):
    """No layer_types: three sliding layers then a full one; an older config.json's rope_theta turns the full
    layers only, the sliding ones keep Olmo3Config's 500000 (as Olmo3Config(rope_theta=…) builds them)."""
    path = edited(tmp_path, "olmo3", {"num_hidden_layers": 3, "rope_theta": 1e4},
                   drop=("layer_types", "rope_parameters", "sliding_window"))
    cfg = qkv.load(path).config
    assert cfg.layer_windows is None and cfg.sliding_window == 4096          # 3 layers: all sliding
    assert cfg.rope_theta == 1e4 and cfg.local_rope_theta == 500_000.0 and cfg.norm_eps == 1e-6


@pytest.mark.parametrize("name", NEW)
def test_a_saved_model_reads_back_equal(tmp_path, name):
    assert check_saved_reads_back(tmp_path, name)["model_type"] == name


@pytest.mark.parametrize("name, change, message", [
    ("olmo3", {"layer_types": ["sliding_attention", "chunked_attention", "full_attention"]}, "layer_types"),
    ("olmo3", {"layer_types": ["full_attention"]}, "each of the 3 layers"),
    ("olmo3", {"rope_parameters": {"rope_type": "default", "rope_theta": 1e4}}, "by layer type"),
    ("olmo3", {"rope_parameters": {"full_attention": {"rope_type": "nope"}}}, "type 'nope'"),
    ("olmo3", {"hidden_act": "tanh"}, "activation 'tanh'"),
    ("arcee", {"hidden_act": "relu6"}, "activation 'relu6'"),
    ("arcee", {"rope_parameters": {"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.5}},
     "partial rotary"),
    ("arcee", {"layer_types": ["sliding_attention", "full_attention"]}, "layer_types"),
    ("helium", {"mlp_bias": True}, "gate_proj.bias"),        # honoured: this file lacks the FFN's biases
    ("helium", {"head_dim": 16}, "must equal hidden_size = 32"),
])
def test_refused_in_one_line(tmp_path, name, change, message):
    with pytest.raises(QkvError, match=message) as err:
        qkv.load(edited(tmp_path, name, change))
    assert "\n" not in str(err.value)


def test_helium_without_head_dim_takes_128_and_is_refused_here(tmp_path):
    """No head_dim in config.json: HeliumConfig's 128 (not hidden_size / heads), which o_proj's 32 × 32 cannot hold."""
    with pytest.raises(QkvError, match=r"head_dim · num_attention_heads = 128 · 4 must equal hidden_size = 32"):
        qkv.load(edited(tmp_path, "helium", {}, drop=("head_dim",)))
