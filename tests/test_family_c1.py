"""GPT-J, Cohere and Granite beyond the shared fixture tests (test_families.py runs their forward,
layers, padding and float64 checks; test_generate their greedy ids): interleaved RoPE against its
plain form, gradients against the committed autograd fixtures, knobs read back, refusals in one line,
the lessons and the CLI on the fixtures.
"""

from __future__ import annotations

import numpy as np
import pytest

import qkv
from qkv import QkvError
from qkv.core.positions import apply_rope, apply_rope_backward, rope_cos_sin, rope_inv_freq
from conftest import MODELS, TOL_HIDDEN, edited, max_abs, reference, run_main
from test_grads import test_gradients_equal_autograd as gradients_equal_autograd

C1 = ("gptj", "cohere", "granite")


def test_interleaved_rope_turns_each_pair_2i_2i_plus_1():
    """RoPE with interleaved pairs: (x_2i, x_2i+1) → (x_2i·cos θ_i − x_2i+1·sin θ_i, x_2i·sin θ_i + x_2i+1·cos θ_i),
    the numbers past d_rot unchanged; its backward is the transpose (⟨dy, J·x⟩ = ⟨Jᵀ·dy, x⟩)."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 2, 5, 10))                              # (B, H, n, d_k)
    pos = np.arange(5)[None]
    omega = rope_inv_freq(6, 10000.0, dtype=np.float64)                 # d_rot 6 of 10
    cos, sin = rope_cos_sin(pos, omega, interleaved=True)
    y = apply_rope(x, cos, sin, interleaved=True)
    theta = pos[0][:, None] * omega                                     # (n, 3)
    a, b = x[..., 0:6:2], x[..., 1:6:2]
    np.testing.assert_allclose(y[..., 0:6:2], a * np.cos(theta) - b * np.sin(theta), atol=1e-12)
    np.testing.assert_allclose(y[..., 1:6:2], a * np.sin(theta) + b * np.cos(theta), atol=1e-12)
    np.testing.assert_array_equal(y[..., 6:], x[..., 6:])
    dy = rng.standard_normal(x.shape)
    dx = apply_rope_backward(dy, cos, sin, interleaved=True)
    assert abs(np.sum(dy * y) - np.sum(dx * x)) < 1e-10


@pytest.mark.parametrize("name", C1)
def test_gradients_equal_autograd(name):
    gradients_equal_autograd(name)


@pytest.mark.parametrize("name", C1)
def test_knobs_read_back_and_save_round_trip(name, tmp_path):
    model = qkv.load(MODELS / name)
    cfg = model.config
    assert cfg.rope_interleaved == (name != "granite")
    model.save(tmp_path / "m")
    again = qkv.load(tmp_path / "m")
    assert again.config == cfg
    ids = reference(name)["single_input_ids"]
    assert max_abs(again.forward(ids).logits, model.forward(ids).logits) == 0


def test_the_fixtures_hold_their_non_default_knobs():
    gptj, cohere, granite = (qkv.load(MODELS / n).config for n in C1)
    assert (gptj.rotary_dim, gptj.d_head, gptj.parallel_residual, gptj.tied_embeddings) == (6, 16, True, False)
    assert (cohere.qk_norm, cohere.logit_scale, cohere.n_kv_heads, cohere.tied_embeddings) == ("head", 0.35, 2, True)
    assert (granite.embedding_multiplier, granite.residual_multiplier, granite.attn_scale) == (3.0, 0.6, 0.2)
    assert granite.logit_scale == 1 / 1.7


@pytest.mark.parametrize("name, change, message", [
    ("gptj", {"rotary_dim": None}, "rotary_dim null"),
    ("gptj", {"rotary_dim": 24}, "wider than a head"),
    ("gptj", {"rotary_dim": 5}, "even number"),
    ("gptj", {"rotary_dim": "6"}, "positive integer"),
    ("cohere", {"use_qk_norm": "yes"}, "true or false"),
    ("cohere", {"logit_scale": 0}, "positive number"),
    ("cohere", {"rope_parameters": {"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.5}},
     "partial_rotary_factor"),
    ("cohere", {"rope_parameters": {"rope_type": "proportional", "rope_theta": 1e4, "factor": 2.0}}, "proportional"),
    ("granite", {"mlp_bias": True}, "gate_proj.bias"),       # honoured: this file lacks the FFN's biases
    ("granite", {"residual_multiplier": -1}, "positive number"),
    ("granite", {"logits_scaling": "8"}, "positive number"),
])
def test_refusals_in_one_line(tmp_path, name, change, message):
    with pytest.raises(QkvError, match=message) as e:
        qkv.load(edited(tmp_path, name, change)).forward([[3, 4, 5]])
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("name", C1)
def test_the_lessons_follow_the_family(name):
    """The walkthrough and the positions lesson recompute q, k with interleaved RoPE, per-head q/k norms
    and Granite's score scale and multiplier, each checked against the model's trace."""
    from qkv.lessons import flash, positions
    from qkv.lessons.attention import walkthrough

    model = qkv.load(MODELS / name)
    walkthrough(model, "The cat sat on the mat", layer=1)
    assert positions.build(model, "The cat sat on the mat").rope.diff_trace < 1e-4
    flash.build(model, "The cat sat on the mat")


@pytest.mark.parametrize("name", C1)
def test_cli_runs_on_the_fixture(name, monkeypatch, capsys, tmp_path):
    code, out, _ = run_main(monkeypatch, capsys, "generate", "--model", str(MODELS / name), "--max-new-tokens", "4",
                            "--temperature", "0", "The cat")
    assert code == 0 and out.startswith("The cat")
    code, out, _ = run_main(monkeypatch, capsys, "lens", "--model", str(MODELS / name), "The cat sat on the mat")
    assert code == 0
    code, out, _ = run_main(monkeypatch, capsys, "show", "--model", str(MODELS / name), "--out", str(tmp_path),
                            "The cat sat")
    assert code == 0 and (tmp_path / "pipeline.html").is_file()


def test_granite_logits_are_divided_by_logits_scaling():
    """logits = Z·W_vocab / logits_scaling: the model's logits are 1/1.7 of the same model's with scaling 1."""
    model = qkv.load(MODELS / "granite")
    ids = reference("granite")["single_input_ids"]
    plain = model.with_config(logit_scale=1.0).forward(ids).logits
    assert max_abs(model.forward(ids).logits, plain / 1.7) <= TOL_HIDDEN
