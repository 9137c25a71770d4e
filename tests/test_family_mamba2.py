"""Mamba-2 (core/mamba2.py, checkpoints/mamba2.py) on the committed fixture (tests/fixtures/make_fixtures.py's
make_mamba2: transformers' scan in chunks of 4 tokens): its config's knobs, and the attention each head implies (SSD's
quadratic form) against the scan it stands for, exactly. What it shares with the other scan and linear-attention
families (the padded batch and greedy ids against transformers, cached steps, refusals, save, the views, the pipeline
page): tests/test_scan_families.py."""

from __future__ import annotations

import json

import numpy as np
import pytest

from conftest import MODELS, reference
from qkv.core.mamba2 import Mamba2, gated_norm, implied_attention, mixer_parts
from qkv.runtime.errors import QkvError

PATH = MODELS / "mamba2"
TOL_IDENTITY = 1e-9        # float64: the implied attention applied to the scan's input is its output


def test_the_config_reads_every_knob(model):
    cfg, hf = model.config, json.loads((PATH / "config.json").read_text())
    m = cfg.mamba
    assert isinstance(m, Mamba2)
    assert (m.n_heads, m.head_dim, m.d_state, m.n_groups, m.conv_kernel, m.chunk_size) == (
        hf["num_heads"], hf["head_dim"], hf["state_size"], hf["n_groups"], hf["conv_kernel"], hf["chunk_size"])
    assert m.d_inner == hf["expand"] * hf["hidden_size"] and (cfg.n_heads, cfg.d_head) == (m.n_heads, m.head_dim)
    assert (m.conv_bias, m.bias, cfg.tied_embeddings, m.dt_min, m.dt_max) == (True, False, False, 0.0, float("inf"))
    assert cfg.norm == "rms" and cfg.norm_eps == hf["layer_norm_epsilon"] and cfg.activation == "silu"


def test_the_fixtures_batch_spans_several_chunks(model):
    """transformers' scan ran over several chunks of the padded batch that tests/test_scan_families.py compares."""
    assert reference("mamba2")["input_ids"].shape[1] > 2 * model.config.mamba.chunk_size


def _layer_parts(model, ids, layer):
    """The layer's mixer parts on ids (1, n), from what its norm gave (the trace's attn_in)."""
    trace = model.run(ids[0].tolist(), keep=("attn_in", "heads", "attentions"))
    w = model.weights.blocks[layer].mixer
    return trace, w, mixer_parts(trace.layer(layer).attn_in[None], w, model.config.mamba, model.config.activation)


@pytest.mark.parametrize("layer", [0, 1])
def test_the_implied_attention_is_the_scan(model64, layer):
    """yₜ[h] = Σₛ α[h, t, s]·x̃ₛ[h] + D[h]·x̃ₜ[h] for every head and channel, to 1e-9 in float64: one true matrix per
    head (Mamba-2's scalar decay), lower-triangular; and "heads" are the gated norm's output, what W_out read."""
    ids = reference("mamba2")["single_input_ids"]
    trace, w, f = _layer_parts(model64, ids, layer)
    alpha = implied_attention(f.dt, f.A, f.Bm, f.Cm)               # (1, H, n, n)
    assert alpha.shape == (1, 8, ids.shape[1], ids.shape[1]) and np.all(np.triu(alpha[0], 1) == 0)
    y = np.einsum("bhts,bshp->bthp", alpha, f.x)                    # (1, n, H, P)
    assert np.abs(y - f.y).max() < TOL_IDENTITY
    assert np.abs(f.y).max() > 1e-2 and (alpha < 0).any()           # (a scan that does something; α has signs)
    heads = trace.layer(layer).heads                                 # (H, n, P)
    m = model64.config.mamba
    want = gated_norm(f.skipped(w.D), f.z, w.norm, m.n_groups, model64.config.norm_eps)[0]   # (n, E)
    assert np.abs(heads.transpose(1, 0, 2).reshape(len(ids[0]), -1) - want).max() < 1e-12


def test_the_implied_attention_by_its_definition(model64):
    """α[h, t, s] = (Cₜ·Bₛ)·exp(A_h·(Sₜ − Sₛ))·Δₛ[h] written out with loops, B and C of head h's group."""
    ids = reference("mamba2")["single_input_ids"][:, :6]
    _, _, f = _layer_parts(model64, ids, 1)
    alpha = implied_attention(f.dt, f.A, f.Bm, f.Cm)[0]
    S = np.cumsum(f.dt[0], axis=0)                                   # (n, H)
    H, G = f.dt.shape[2], f.Bm.shape[2]
    for h in range(H):
        g = h // (H // G)
        for t in range(6):
            for s in range(t + 1):
                want = f.Cm[0, t, g] @ f.Bm[0, s, g] * np.exp(f.A[h] * (S[t, h] - S[s, h])) * f.dt[0, s, h]
                assert abs(alpha[h, t, s] - want) < 1e-12


def test_the_trace_holds_each_heads_absolute_attention(model64):
    """The layer's "attentions": each head's |α| with each row divided by its sum."""
    ids = reference("mamba2")["single_input_ids"]
    trace, w, f = _layer_parts(model64, ids, 1)
    alpha = np.abs(implied_attention(f.dt, f.A, f.Bm, f.Cm)[0])    # (H, n, n)
    A = trace.layer(1).attentions
    assert np.abs(A - alpha / alpha.sum(axis=-1, keepdims=True)).max() < 1e-12
    assert np.allclose(A.sum(axis=-1), 1)


def test_hooks_and_ablation_act_on_the_heads(model):
    ids = reference("mamba2")["single_input_ids"]
    ablated = model.forward(ids, ablate=[(1, 2)]).logits
    hooked = model.forward(ids, hooks={"1.heads.2": lambda z, layer: np.zeros_like(z)}).logits
    assert np.array_equal(ablated, hooked) and np.abs(ablated - model.forward(ids).logits).max() > 1e-4
    zero = model.forward(ids, hooks={"0.attn_out": lambda v, layer: 0}).logits
    every = model.forward(ids, ablate=[(0, h) for h in range(8)]).logits   # every head: the whole mixer
    assert np.abs(zero - every).max() < 1e-6
    with pytest.raises(QkvError, match="no such point"):
        model.forward(ids, hooks={"0.q": lambda v, layer: None})


def test_a_time_step_limit_clamps_delta(model):
    """time_step_limit (low, high) clamps Δ: a high bound below the fixture's Δ changes the numbers, one above
    every Δ does not."""
    ids = reference("mamba2")["single_input_ids"]
    m = model.config.mamba
    f = _layer_parts(model, ids, 0)[2]
    low = model.with_config(mamba=Mamba2(**{**m.__dict__, "dt_max": float(np.median(f.dt))}))
    high = model.with_config(mamba=Mamba2(**{**m.__dict__, "dt_max": float(f.dt.max()) * 100}))
    plain = model.forward(ids).logits
    assert np.abs(low.forward(ids).logits - plain).max() > 1e-3
    assert np.array_equal(high.forward(ids).logits, plain)
