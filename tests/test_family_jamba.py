"""Jamba (checkpoints/jamba.py; core/mamba.py's `mamba_layer` among core/layer.py's attention blocks) on the
committed fixture (tests/fixtures/make_fixtures.py's make_jamba: layers Mamba / attention / Mamba / attention, FFNs
routed in layers 0 and 3): its config's knobs, its hybrid cache, and the attention each Mamba layer implies against the
scan it stands for, exactly. What it shares with the other scan and linear-attention families (the padded batch and
greedy ids against transformers, cached steps, refusals, save, the views, the pipeline page):
tests/test_scan_families.py."""

from __future__ import annotations

import json

import numpy as np
import pytest

import qkv
from conftest import MODELS, TOL_ATTENTION, edited, reference, run_main
from qkv.core.cache import KVCache
from qkv.core.mamba import MambaBlockWeights, hidden_attention, mixer_parts
from qkv.core.weights import FFNWeights, MoEWeights
from qkv.runtime.errors import QkvError

PATH = MODELS / "jamba"
MAMBA, ATTENTION = (0, 2), (1, 3)
TOL_IDENTITY = 1e-9        # float64: the implied attention applied to the scan's input is its output


def test_the_config_reads_every_knob(model):
    cfg, hf = model.config, json.loads((PATH / "config.json").read_text())
    m = cfg.mamba
    assert cfg.layer_kinds == ("mamba", "attention", "mamba", "attention")
    assert (cfg.n_experts, cfg.experts_per_token, cfg.norm_top_k, cfg.dense_layers) == (4, 2, False, (1, 2))
    assert (m.d_state, m.d_inner, m.conv_kernel, m.dt_rank) == (hf["mamba_d_state"], 2 * hf["hidden_size"],
                                                                hf["mamba_d_conv"], hf["mamba_dt_rank"])
    assert (m.conv_bias, m.bias, m.inner_norms) == (True, False, True)
    assert (cfg.n_heads, cfg.n_kv_heads, cfg.d_head, cfg.d_ff, cfg.position, cfg.tied_embeddings) == (
        4, 2, 8, 48, "learned", False)
    assert model.weights.pos_embed is None                              # no positions anywhere
    blocks = model.weights.blocks
    assert [isinstance(b, MambaBlockWeights) for b in blocks] == [True, False, True, False]
    assert [isinstance(b.ffn, MoEWeights) for b in blocks] == [True, False, False, True]
    assert all(isinstance(blocks[i].ffn, FFNWeights) for i in (1, 2))
    assert blocks[0].mixer.dt_norm.weight.shape == (2,) and blocks[2].mixer.c_norm.weight.shape == (8,)


def test_one_sequence_attention_layers_weights_are_the_references(model):
    ref = reference("jamba")
    out = model.forward(ref["single_input_ids"])
    assert np.abs(out.attentions[list(ATTENTION)] - ref["single_attentions"]).max() < TOL_ATTENTION


def test_the_hybrid_cache_keeps_k_v_of_the_attention_layers_alone(model):
    """After a prompt of 5 and one-token steps (tests/test_scan_families.py checks their logits): K, V rows for the
    attention layers alone, the Mamba layers' scan states written; the cache's bytes a token count the attention
    layers' K, V alone."""
    ids = reference("jamba")["greedy_ids"]
    cache = KVCache(model.config, 1, ids.shape[1], dtype=model.dtype)
    model.last_logits(ids[:, :5], np.ones((1, 5), np.int64), cache=cache)
    for t in range(5, ids.shape[1]):
        model.last_logits(ids[:, t:t + 1], np.ones((1, t + 1), np.int64), cache=cache)
    assert np.abs(cache.k[cache.row(1), 0, :, :3] - model.run(ids[0, :3].tolist(), keep=("k",)).layer(1).k).max() < 1e-5
    assert cache.layers == ATTENTION and cache.k.shape[0] == len(ATTENTION)   # no K, V rows for the Mamba layers
    assert cache.state.ssm[list(MAMBA)].any()
    assert KVCache.bytes_per_token(model.config) == 2 * 2 * (2 * 8) * 4     # 2 layers × 2 K/V heads × (d_k + d_k)


@pytest.mark.parametrize("layer", MAMBA)
def test_the_implied_attention_is_the_scan(model64, layer):
    """yₜ = Σₛ α[c, t, s]·x̃ₛ + D·x̃ₜ for every channel of a Mamba layer (its Δ, B, C after Jamba's norms), to 1e-9 in
    float64, and the trace's "heads" are (y + D·x̃) ⊙ SiLU(z), what W_out read."""
    ids = reference("jamba")["single_input_ids"]
    trace = model64.run(ids[0].tolist(), keep=("attn_in", "heads", "attentions"))
    w = model64.weights.blocks[layer].mixer
    f = mixer_parts(trace.layer(layer).attn_in[None], w, model64.config)
    alpha = hidden_attention(f.dt, f.A, f.Bm, f.Cm)                 # (1, E, n, n)
    assert np.all(np.triu(alpha[0], 1) == 0)                        # causal: lower-triangular
    y = np.einsum("bcts,bsc->btc", alpha, f.x) + f.x * w.D          # (1, n, E)
    assert np.abs(y - (f.y + f.x * w.D)).max() < TOL_IDENTITY
    assert np.abs(f.y).max() > 1e-2                                  # (a scan that does something)
    heads = trace.layer(layer).heads                                 # (H, n, E/H)
    assert heads.shape == (4, ids.shape[1], 16)
    assert np.abs(heads.transpose(1, 0, 2).reshape(ids.shape[1], -1) - f.gated(w.D)[0]).max() < 1e-12


def test_the_norms_on_delta_b_and_c_change_the_scan(model64):
    """Jamba's RMSNorms act: without them (inner_norms false) the same weights give another Δ, B and C."""
    ids = reference("jamba")["single_input_ids"]
    h = model64.run(ids[0].tolist(), keep=("attn_in",)).layer(0).attn_in[None]
    w, cfg = model64.weights.blocks[0].mixer, model64.config
    plain = cfg.with_(mamba=cfg.mamba.__class__(**{**cfg.mamba.__dict__, "inner_norms": False}))
    normed, bare = mixer_parts(h, w, cfg), mixer_parts(h, w, plain)
    rms = np.sqrt((bare.Bm ** 2).mean(-1, keepdims=True) + cfg.norm_eps)
    assert np.abs(normed.Bm - bare.Bm / rms * w.b_norm.weight).max() < 1e-12
    assert np.abs(normed.dt - bare.dt).max() > 1e-3


def test_one_trace_holds_both_kinds_of_attention(model64):
    """model.run: every layer's "attentions" (H, n, n) — the attention layers' softmax, the Mamba layers' Σ|α| per
    group of E/H channels with rows divided by their sum — in one trace, each row summing to 1."""
    ids = reference("jamba")["single_input_ids"]
    n = ids.shape[1]
    trace = model64.run(ids[0].tolist())
    assert trace.attentions.shape == (4, 4, n, n)
    assert np.allclose(trace.attentions.sum(-1), 1) and np.all(np.triu(trace.attentions, 1) == 0)
    f = mixer_parts(trace.layer(2).attn_in[None], model64.weights.blocks[2].mixer, model64.config)
    alpha = np.abs(hidden_attention(f.dt, f.A, f.Bm, f.Cm)[0])      # (E, n, n)
    per = alpha.reshape(4, 16, n, n).sum(axis=1)                     # (H, n, n)
    assert np.abs(trace.layer(2).attentions - per / per.sum(-1, keepdims=True)).max() < 1e-12
    assert trace.layer(1).q.shape == (4, n, 8)                       # q, k, v: the attention layers' alone
    with pytest.raises(QkvError, match="not kept"):
        trace.layer(0).q
    routed = [trace.layer(i).experts is not None for i in range(4)]  # the viewer's Experts tab: the routed FFNs'
    assert routed == [True, False, False, True] and trace.layer(0).expert_weights.shape == (n, 2)


def test_a_long_inputs_view_keeps_each_rows_largest_weights_of_both_kinds(model):
    """keep=("attention_top",): each row's 5 largest weights and the rest, in the attention and the Mamba layers."""
    ids = reference("jamba")["single_input_ids"][0].tolist()
    dense = model.run(ids, keep=("attentions",))
    sparse = model.run(ids, keep=("attention_top",), top=5)
    for i in range(4):
        top, A = sparse.layer(i).attention_top, dense.layer(i).attentions      # (H, n, 5), (H, n, n)
        assert np.abs(top.weight - -np.sort(-A, axis=-1)[..., :5]).max() < 1e-6
        assert np.abs(np.take_along_axis(A, top.index.astype(int), -1) - top.weight).max() < 1e-6
        assert np.abs(top.rest - (A.sum(-1) - top.weight.sum(-1))).max() < 1e-5


def test_hooks_and_ablation_on_both_kinds_of_layer(model):
    ids = reference("jamba")["single_input_ids"]
    base = model.forward(ids).logits
    for layer in (0, 1):                                             # a Mamba layer's channel group, a head
        ablated = model.forward(ids, ablate=[(layer, 2)]).logits
        hooked = model.forward(ids, hooks={f"{layer}.heads.2": lambda z, layer: np.zeros_like(z)}).logits
        assert np.array_equal(ablated, hooked) and np.abs(ablated - base).max() > 1e-4
    zero = model.forward(ids, hooks={"2.ffn_out": lambda v, layer: np.zeros_like(v)}).logits
    assert np.abs(zero - base).max() > 1e-4
    q = model.forward(ids, hooks={"1.q": lambda v, layer: 2 * v}).logits
    assert np.abs(q - base).max() > 1e-5
    with pytest.raises(QkvError, match="Mamba layer") as e:
        model.forward(ids, hooks={"0.q": lambda v, layer: None})
    assert "\n" not in str(e.value) and "(1, 3)" in str(e.value)


def test_a_layout_no_period_makes_is_refused_in_one_line():
    from qkv.checkpoints.jamba import hf_config

    cfg = qkv.load(PATH).config
    with pytest.raises(QkvError, match="no such pattern") as e:
        hf_config(cfg.with_(layer_kinds=("attention", "attention", "mamba", "attention")))
    assert "\n" not in str(e.value)


def test_a_checkpoint_without_a_mixer_tensor_is_refused(tmp_path):
    from safetensors.numpy import load_file, save_file

    path = edited(tmp_path, "jamba", {})
    tensors = load_file(str(path / "model.safetensors"))
    del tensors["model.layers.2.mamba.b_layernorm.weight"]
    save_file(tensors, str(path / "model.safetensors"))
    with pytest.raises(QkvError, match="b_layernorm") as e:
        qkv.load(path)
    assert "\n" not in str(e.value)


def test_patching_reads_both_kinds_of_layer(monkeypatch, capsys):
    code, text, err = run_main(monkeypatch, capsys, "patch", "the cat sat on", "the mat sat on", "--token", " the",
                               "--other", " on", "--model", str(PATH))
    assert code == 0 and "L0." in text and "L1." in text, err                 # a Mamba layer's groups, a layer's heads


def test_the_lessons_read_its_attention_layers_or_refuse_in_one_line(monkeypatch, capsys):
    """qkv explain gqa reads its first attention layer (layer 1) and counts the cache of its two attention layers;
    qkv explain kv-cache checks and counts its two attention layers' K, V (256 bytes a token) and its two Mamba
    layers' fixed states (2 × (3·64 + 64·8) × 4 = 5,632 bytes)."""
    code, out, err = run_main(monkeypatch, capsys, "explain", "gqa", "--model", str(PATH))
    assert code == 0, err
    assert "L = 2," in out and "256 (256 B)" in out      # 2 attention layers × 2 K/V heads × (8 + 8) × 4 bytes
    code, out, err = run_main(monkeypatch, capsys, "explain", "kv-cache", "--model", str(PATH))
    assert code == 0, err
    assert "2 of its 4 layers keep a Mamba state" in out and "5,632 bytes" in out and "256 (256 B)" in out
