"""Mamba (core/mamba.py, checkpoints/mamba.py) on the committed fixture (tests/fixtures/make_fixtures.py's
make_mamba): its config's knobs, and the attention each layer implies (Ali et al. 2024) against the scan it stands
for, exactly. What it shares with the other scan and linear-attention families (the padded batch and greedy ids
against transformers, cached steps, refusals, save, the views): tests/test_scan_families.py."""

from __future__ import annotations

import json

import numpy as np
import pytest

from conftest import MODELS, reference
from qkv.core.mamba import causal_conv, conv_mixing, hidden_attention, mixer_parts
from qkv.runtime.errors import QkvError

PATH = MODELS / "mamba"
TOL_IDENTITY = 1e-9        # float64: the implied attention applied to the scan's input is its output


def test_the_config_reads_every_knob(model):
    cfg, hf = model.config, json.loads((PATH / "config.json").read_text())
    m = cfg.mamba
    assert (m.d_state, m.d_inner, m.conv_kernel, m.dt_rank) == (hf["state_size"], hf["expand"] * hf["hidden_size"],
                                                                hf["conv_kernel"], hf["time_step_rank"])
    assert (m.conv_bias, m.bias, cfg.tied_embeddings, cfg.n_heads, cfg.d_head) == (True, False, True, 1, m.d_inner)
    assert cfg.norm == "rms" and cfg.norm_eps == hf["layer_norm_epsilon"] and cfg.activation == "silu"


def _layer_parts(model, ids, layer):
    """The layer's mixer parts on ids (1, n), from what its norm gave (the trace's attn_in)."""
    trace = model.run(ids[0].tolist(), keep=("attn_in", "heads", "attentions"))
    w = model.weights.blocks[layer].mixer
    return trace, w, mixer_parts(trace.layer(layer).attn_in[None], w, model.config)


@pytest.mark.parametrize("layer", [0, 1])
def test_the_implied_attention_is_the_scan(model64, layer):
    """yₜ = Σₛ α[c, t, s]·x̃ₛ + D·x̃ₜ for every channel, to 1e-9 in float64 (the paper's identity), and the conv a
    banded matrix of its own: conv_k(u) = K·u + b."""
    ids = reference("mamba")["single_input_ids"]
    trace, w, f = _layer_parts(model64, ids, layer)
    alpha = hidden_attention(f.dt, f.A, f.Bm, f.Cm)                 # (1, E, n, n)
    assert np.all(np.triu(alpha[0], 1) == 0)                        # causal: lower-triangular
    y = np.einsum("bcts,bsc->btc", alpha, f.x) + f.x * w.D          # (1, n, E)
    assert np.abs(y - (f.y + f.x * w.D)).max() < TOL_IDENTITY
    assert np.abs(f.y).max() > 1e-2                                  # (a scan that does something)
    heads = trace.layer(layer).heads                                 # (H, n, E/H) what W_out read
    assert np.abs(heads.transpose(1, 0, 2).reshape(len(ids[0]), -1) - f.gated(w.D)[0]).max() < 1e-12
    K = conv_mixing(w.conv, f.u.shape[1])                            # (E, n, n)
    conv = np.einsum("cts,bsc->btc", K, f.u) + w.b_conv
    past = np.zeros((1, w.conv.shape[1] - 1, w.conv.shape[0]))
    assert np.abs(conv - causal_conv(f.u, w.conv, w.b_conv, past)).max() < 1e-12


@pytest.mark.parametrize("groups", [1, 4])
def test_the_trace_holds_the_summed_absolute_attention(model64, groups):
    """The layer's "attentions": per group of channels, Σ_c |α[c]| with each row divided by its sum."""
    E = model64.config.mamba.d_inner
    m = model64.with_config(n_heads=groups, d_head=E // groups)
    ids = reference("mamba")["single_input_ids"]
    trace, w, f = _layer_parts(m, ids, 1)
    alpha = np.abs(hidden_attention(f.dt, f.A, f.Bm, f.Cm)[0])      # (E, n, n)
    per = alpha.reshape(groups, E // groups, *alpha.shape[1:]).sum(axis=1)   # (H, n, n)
    want = per / per.sum(axis=-1, keepdims=True)
    A = trace.layer(1).attentions
    assert A.shape == (groups, ids.shape[1], ids.shape[1]) and np.abs(A - want).max() < 1e-12
    assert np.allclose(A.sum(axis=-1), 1)


def test_hooks_and_ablation_act_on_the_channel_groups(model):
    E = model.config.mamba.d_inner
    m = model.with_config(n_heads=4, d_head=E // 4)
    ids = reference("mamba")["single_input_ids"]
    ablated = m.forward(ids, ablate=[(1, 2)]).logits
    hooked = m.forward(ids, hooks={"1.heads.2": lambda z, layer: np.zeros_like(z)}).logits
    assert np.array_equal(ablated, hooked) and np.abs(ablated - m.forward(ids).logits).max() > 1e-4
    zero = model.forward(ids, hooks={"0.attn_out": lambda v, layer: 0}).logits
    alone = model.forward(ids, ablate=[(0, 0)]).logits                 # one group: the whole mixer
    assert np.abs(zero - alone).max() < 1e-6
    with pytest.raises(QkvError, match="no such point"):
        model.forward(ids, hooks={"0.q": lambda v, layer: None})
