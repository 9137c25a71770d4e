"""Falcon-H1 (checkpoints/falcon_h1.py: attention and core/mamba2.py's mixer side by side in every layer, µP
multipliers) on the committed fixture (tests/fixtures/make_fixtures.py's make_falcon_h1): its config's multipliers,
each mixer's implied attention, its hooks. What it shares with the other scan and linear-attention families (the
padded batch, its attention weights and greedy ids against transformers, cached steps, refusals, save, the views, the
pipeline page): tests/test_scan_families.py."""

from __future__ import annotations

import json

import numpy as np
import pytest

from conftest import MODELS, reference
from qkv.core.mamba2 import Mamba2, implied_attention, mixer_parts

NAME = "falcon_h1"
PATH = MODELS / NAME


def test_the_config_reads_every_multiplier(model):
    cfg, hf = model.config, json.loads((PATH / "config.json").read_text())
    m, b = cfg.mamba, cfg.mamba.beside
    assert isinstance(m, Mamba2) and cfg.layer_kinds == ("attention", "attention") and cfg.position == "rope"
    assert (m.n_heads, m.head_dim, m.d_inner, m.n_groups, m.d_state, m.norm) == (6, 8, 48, 2, 8, "then_gate")
    assert (m.in_scale, m.mup) == (hf["ssm_in_multiplier"], tuple(hf["ssm_multipliers"]))
    assert (b.attn_in, b.attn_out, b.ssm_out, b.ffn_out) == (
        hf["attention_in_multiplier"], hf["attention_out_multiplier"], hf["ssm_out_multiplier"],
        hf["mlp_multipliers"][1])
    assert cfg.ffn_gate_scale == hf["mlp_multipliers"][0] and cfg.logit_scale == hf["lm_head_multiplier"]
    assert cfg.embedding_multiplier == hf["embedding_multiplier"]
    assert abs(cfg.attn_scale - hf["key_multiplier"] / np.sqrt(cfg.d_head)) < 1e-15


@pytest.mark.parametrize("layer", [0, 1])
def test_the_mixer_beside_attention_is_its_implied_attention(model64, layer):
    """Each layer's mixer (its µP multipliers in): α·x̃ is the scan's y to 1e-9 in float64, every head."""
    ids = reference(NAME)["single_input_ids"]
    trace = model64.run(ids[0].tolist(), keep=("attn_in",))
    f = mixer_parts(trace.layer(layer).attn_in[None], model64.weights.blocks[layer].mixer, model64.config.mamba,
                    model64.config.activation)
    alpha = implied_attention(f.dt, f.A, f.Bm, f.Cm)                 # (1, 6, n, n)
    assert np.abs(np.einsum("bhts,bshp->bthp", alpha, f.x) - f.y).max() < 1e-9 and np.abs(f.y).max() > 1e-2


def test_hooks_and_ablation_act_on_the_attention_heads(model):
    ids = reference(NAME)["single_input_ids"]
    plain = model.forward(ids).logits
    ablated = model.forward(ids, ablate=[(1, 2)]).logits
    hooked = model.forward(ids, hooks={"1.heads.2": lambda z, i: np.zeros_like(z)}).logits
    assert np.array_equal(ablated, hooked) and np.abs(ablated - plain).max() > 1e-4
    assert np.abs(model.forward(ids, hooks={"0.q": lambda q, i: q * 0}).logits - plain).max() > 1e-4
    trace = model.run(ids[0].tolist(), keep=("residual", "attn_out", "residual_mid"))
    for layer in range(2):                                           # attn_out: both boxes, what joins the stream
        got = trace.layer(layer).residual + trace.layer(layer).attn_out
        assert np.abs(got - trace.layer(layer).residual_mid).max() < 1e-5


def test_a_null_mamba_d_ssm_is_expand_times_hidden():
    from qkv.checkpoints.families import config_of

    hf = json.loads((PATH / "config.json").read_text()) | {"mamba_d_ssm": None, "mamba_expand": 2, "mamba_n_heads": 8}
    assert config_of(hf).mamba.d_inner == 2 * hf["hidden_size"]
    hf |= {"mamba_rms_norm": False}
    assert config_of(hf).mamba.norm == "none"
