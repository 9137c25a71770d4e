"""Granite 4 hybrids (checkpoints/granitemoehybrid.py: Mamba-2 layers of core/mamba2.py among attention layers, a
routed FFN and a shared one after each, Granite's multipliers) on the committed fixture (tests/fixtures/
make_fixtures.py's make_granitemoehybrid: layers Mamba-2 / attention / Mamba-2): its config's knobs, each Mamba-2
layer's implied attention, its hooks. What it shares with the other scan and linear-attention families (the padded
batch, the attention layer's weights and greedy ids against transformers, cached steps, refusals, save, the views, the
pipeline page): tests/test_scan_families.py."""

from __future__ import annotations

import json

import numpy as np
import pytest

from conftest import MODELS, reference
from qkv.core.mamba2 import Mamba2, implied_attention, mixer_parts
from qkv.runtime.errors import QkvError

NAME = "granitemoehybrid"
PATH = MODELS / NAME


def test_the_config_reads_every_knob(model):
    cfg, hf = model.config, json.loads((PATH / "config.json").read_text())
    m = cfg.mamba
    assert isinstance(m, Mamba2) and cfg.layer_kinds == ("mamba", "attention", "mamba")
    assert (m.n_heads, m.head_dim, m.d_state, m.n_groups, m.conv_kernel, m.chunk_size) == (
        hf["mamba_n_heads"], hf["mamba_d_head"], hf["mamba_d_state"], hf["mamba_n_groups"], hf["mamba_d_conv"],
        hf["mamba_chunk_size"])
    assert (cfg.n_heads, cfg.n_kv_heads, cfg.d_head, cfg.position) == (4, 2, 8, "learned")   # no positions
    assert (cfg.n_experts, cfg.experts_per_token, cfg.d_ff, cfg.d_shared_expert) == (3, 2, 16, 24)
    assert cfg.norm_top_k and not cfg.shared_expert_gate and cfg.embedding_multiplier == hf["embedding_multiplier"]
    assert (cfg.residual_multiplier, cfg.attn_scale, cfg.logit_scale) == (
        hf["residual_multiplier"], hf["attention_multiplier"], 1 / hf["logits_scaling"])


@pytest.mark.parametrize("layer", [0, 2])
def test_a_mamba2_layer_is_its_implied_attention(model64, layer):
    """Each Mamba-2 layer: α·x̃ is the scan's y to 1e-9 in float64, and its "attentions" each of the 4 views' heads a
    group of 2 Mamba heads, Σ|α| over the group with rows divided by their sums."""
    ids = reference(NAME)["single_input_ids"]
    trace = model64.run(ids[0].tolist(), keep=("attn_in", "attentions"))
    w, m = model64.weights.blocks[layer].mixer, model64.config.mamba
    f = mixer_parts(trace.layer(layer).attn_in[None], w, m, model64.config.activation)
    alpha = implied_attention(f.dt, f.A, f.Bm, f.Cm)                 # (1, 8, n, n)
    assert np.abs(np.einsum("bhts,bshp->bthp", alpha, f.x) - f.y).max() < 1e-9
    per = np.abs(alpha[0]).reshape(4, 2, *alpha.shape[2:]).sum(axis=1)   # (4, n, n)
    assert np.abs(trace.layer(layer).attentions - per / per.sum(axis=-1, keepdims=True)).max() < 1e-12


def test_one_trace_holds_both_kinds(model):
    trace = model.run("The quick brown fox")
    n = len(trace.tokens)
    assert trace.attentions.shape == (3, 4, n, n)
    assert np.allclose(trace.attentions.sum(axis=-1), 1, atol=1e-5)
    assert np.all(np.triu(trace.attentions, 1) == 0)                  # every layer causal


def test_hooks_and_ablation(model):
    ids = reference(NAME)["single_input_ids"]
    plain = model.forward(ids).logits
    for layer in (0, 1):                                              # a Mamba-2 layer's group, an attention head
        ablated = model.forward(ids, ablate=[(layer, 2)]).logits
        hooked = model.forward(ids, hooks={f"{layer}.heads.2": lambda z, i: np.zeros_like(z)}).logits
        assert np.array_equal(ablated, hooked) and np.abs(ablated - plain).max() > 1e-4
    assert np.abs(model.forward(ids, hooks={"1.q": lambda q, i: q * 0}).logits - plain).max() > 1e-4
    with pytest.raises(QkvError, match="Mamba layer") as e:
        model.forward(ids, hooks={"0.q": lambda q, i: q})
    assert "\n" not in str(e.value)


def test_older_and_newer_layer_type_names_read_alike():
    from qkv.checkpoints.families import config_of

    hf = json.loads((PATH / "config.json").read_text())
    hf.pop("layer_types", None)
    new = config_of(hf | {"layer_types": ["linear_attention", "full_attention", "linear_attention"]})
    old = config_of(hf | {"layers_block_type": ["mamba", "attention", "mamba"]})
    assert new.layer_kinds == old.layer_kinds == ("mamba", "attention", "mamba")
    assert config_of(hf | {"position_embedding_type": "nope"}).position == "learned"      # no positions
    assert config_of(hf | {"position_embedding_type": "rope"}).position == "rope"
    assert config_of(hf | {"num_local_experts": 0}).d_ff == hf["shared_intermediate_size"]   # the shared FFN alone
