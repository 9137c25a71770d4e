"""MiniMax (core/lightning.py, checkpoints/minimax.py) on the committed fixture (tests/fixtures/make_fixtures.py's
make_minimax: lightning / softmax / lightning layers, every α, β ≠ 1): its config's knobs, the lightning state against
transformers', and the attention each lightning layer implies against the blocked sum it stands for, exactly. What it
shares with the other scan and linear-attention families (the padded batch and greedy ids against transformers,
cached steps, refusals, save, the views, the pipeline page): tests/test_scan_families.py."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from conftest import MODELS, TOL_HIDDEN, check_knob_matters, reference
from qkv.core.cache import KVCache
from qkv.core.lightning import LightningBlockWeights, implied_attention, lightning_core, slopes
from qkv.core.stack import transformer
from qkv.core.trace import Recorder
from qkv.runtime.errors import QkvError

NAME = "minimax"
PATH = MODELS / NAME
TOL_IDENTITY = 1e-9        # float64: the implied attention times V is the blocked sum


def test_the_config_reads_every_knob(model):
    cfg, hf = model.config, json.loads((PATH / "config.json").read_text())
    m = cfg.lightning
    assert m.linear_layers == (0, 2) and m.block_size == hf["block_size"] == 4
    assert (m.full_alpha, m.full_beta, m.linear_alpha, m.linear_beta, m.ffn_alpha, m.ffn_beta) == (
        hf["full_attn_alpha_factor"], hf["full_attn_beta_factor"], hf["linear_attn_alpha_factor"],
        hf["linear_attn_beta_factor"], hf["mlp_alpha_factor"], hf["mlp_beta_factor"])
    assert (cfg.n_heads, cfg.n_kv_heads, cfg.d_head, cfg.n_experts, cfg.experts_per_token) == (4, 2, 8, 4, 2)
    assert cfg.norm_top_k and cfg.rope_theta == 10000.0 and not cfg.tied_embeddings
    blocks = model.weights.blocks
    assert isinstance(blocks[0], LightningBlockWeights) and blocks[0].attn is None and blocks[1].attn is not None
    np.testing.assert_allclose(blocks[2].lightning.slopes, slopes(4, 2, 3))


def test_the_lightning_state_is_transformers(model):
    """A pass with a cache keeps each lightning layer's state S = Σₛ λ^(n−1−s)·kₛᵀ·vₛ: transformers' own (what its
    lightning layers return as their attentions), padding's decay included."""
    ref = reference(NAME)
    ids, mask = ref["input_ids"], ref["attention_mask"]
    cache = KVCache(model.config, ids.shape[0], ids.shape[1], dtype=model.dtype)
    transformer(model.weights, model.config, ids, mask, cache=cache)
    for j, layer in enumerate(model.config.lightning.linear_layers):
        assert np.abs(cache.state.S[layer] - ref["states"][j]).max() < TOL_HIDDEN


@pytest.mark.parametrize("layer", [0, 2])
def test_the_implied_attention_is_the_layer(model64, layer):
    """A[h, t, s] = (qₜ·kₛ)·λₕ^(t−s), recorded as the layer's scores, times V is the blocked sum (its "heads") to
    1e-9 in float64 — and so is the sum in blocks of any size; its attentions are |A| as shares of each row."""
    ids = reference(NAME)["greedy_ids"][0]                          # 25 tokens: 7 blocks of 4
    t = model64.run(ids.tolist(), keep=("q", "k", "v", "scores", "attentions", "heads")).layer(layer)
    q, k, v = t.q[None], t.k[None], t.v[None]                       # (1, H, n, d_k)
    rate = model64.weights.blocks[layer].lightning.slopes
    n = len(ids)
    gap = np.arange(n)[:, None] - np.arange(n)[None, :]
    want = np.einsum("hte,hse->hts", t.q, t.k) * np.where(gap >= 0, np.exp(-rate[:, None, None] * gap), 0)
    assert np.abs(t.scores - want).max() < 1e-12 and np.all(np.triu(t.scores, 1) == 0)
    assert np.abs(t.scores @ t.v - t.heads).max() < TOL_IDENTITY and np.abs(t.heads).max() > 1e-2
    assert (t.scores < 0).any() and (t.attentions >= 0).all()       # signed A; its shares
    assert np.abs(t.attentions - np.abs(want) / np.abs(want).sum(-1, keepdims=True)).max() < 1e-12
    for block in (1, 3, 64):
        o, _ = lightning_core(q, k, v, rate, block)
        assert np.abs(o[0] - t.heads).max() < TOL_IDENTITY
    A = implied_attention(q[:, :, 10:], k, rate, past=10)           # the rows of later queries over every key
    assert np.abs(A[0] - t.scores[:, 10:]).max() < 1e-12


def test_hooks_and_ablation_on_a_lightning_layer(model):
    """Ablating a head zeroes its o; a hook on the implied matrix (scores) is what mixes V (identity: no change); its
    shares (attentions) are read beside it, not hooked."""
    ids = reference(NAME)["single_input_ids"]
    plain = model.forward(ids).logits
    ablated = model.forward(ids, ablate=[(0, 2)]).logits
    hooked = model.forward(ids, hooks={"0.heads.2": lambda z, layer: np.zeros_like(z)}).logits
    assert np.array_equal(ablated, hooked) and np.abs(ablated - plain).max() > 1e-4
    same = model.forward(ids, hooks={"2.scores": lambda a, layer: a}).logits
    assert np.abs(same - plain).max() < 1e-5
    blind = model.forward(ids, hooks={"2.scores": lambda a, layer: np.tril(a, -1)}).logits   # no token reads
    assert np.abs(blind - plain).max() > 1e-4                      # itself (a scale alone: undone by the norm)
    for name in ("attentions", "q_pre_rope"):
        with pytest.raises(QkvError, match="lightning attention") as e:
            model.forward(ids, hooks={f"0.{name}": lambda s, layer: s})
        assert "\n" not in str(e.value)


def test_the_factors_matter():
    """Each α, β is read: the fixture's logits are missed with it set to 1."""
    for knob in ("linear_alpha", "full_beta", "ffn_alpha"):
        check_knob_matters(NAME, lambda m, k=knob: m.with_config(lightning=replace(m.config.lightning, **{k: 1.0})))


def test_the_saved_file_holds_transformers_tensors_but_the_decay_buffers(model, tmp_path):
    """qkv's save writes the tensors of transformers' file but the decay buffers it makes, each to the bit."""
    from safetensors.numpy import load_file

    saved = model.save(tmp_path / "m")
    ours, theirs = load_file(saved / "model.safetensors"), load_file(PATH / "model.safetensors")
    assert ours.keys() == {k for k in theirs if not k.endswith(("_decay", "slope_rate"))}
    assert all(np.array_equal(ours[k], theirs[k]) for k in ours)


def test_a_saved_trace_loads_back(model, tmp_path):
    """The views' weights of every layer are shares (≥ 0, rows summing to 1): a trace saved loads back."""
    from qkv.core.trace import Trace

    trace = model.run("the cat sat on the mat")
    back = Trace.load(trace.save(tmp_path / "t"))
    assert np.abs(back.attentions - trace.attentions).max() < 1e-6


def test_the_state_keeps_no_keys_unless_a_recorded_generation_asks(model):
    """Writing keeps S alone (O(1) a token); the keys, for attention rows, only when the first pass records them —
    a row over a cached past asked for later is refused in one line."""
    ids = reference(NAME)["single_input_ids"]
    cache = KVCache(model.config, 1, ids.shape[1] + 1, dtype=model.dtype)
    model.last_logits(ids, np.ones_like(ids), cache=cache)
    assert cache.state.keys == {} and set(cache.state.S) == {0, 2}
    with pytest.raises(QkvError, match="kept only when the first pass records") as e:
        model.last_logits(ids[:, :1], np.ones((1, ids.shape[1] + 1), np.int64), cache=cache,
                          rec=Recorder(keep=("attentions",)))
    assert "\n" not in str(e.value)
