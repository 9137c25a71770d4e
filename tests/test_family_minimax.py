"""MiniMax (core/lightning.py, checkpoints/minimax.py) against transformers' MiniMaxForCausalLM on the committed
fixture (tests/fixtures/make_fixtures.py's make_minimax: lightning / softmax / lightning layers, every α, β ≠ 1, a
batch right- and left-padded, greedy ids with and without the cache), and the attention each lightning layer
implies against the blocked sum it stands for, exactly."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

import qkv
from conftest import MODELS, TOL_ATTENTION, TOL_HIDDEN, check_knob_matters, reference, run_main
from qkv.core.cache import KVCache
from qkv.core.lightning import LightningBlockWeights, implied_attention, lightning_core, slopes
from qkv.core.stack import transformer
from qkv.core.trace import Recorder
from qkv.runtime.errors import QkvError

NAME = "minimax"
PATH = MODELS / NAME
TOL_IDENTITY = 1e-9        # float64: the implied attention times V is the blocked sum


@pytest.fixture(scope="module")
def model():
    return qkv.load(PATH)


@pytest.fixture(scope="module")
def model64():
    return qkv.load(PATH, dtype=np.float64)


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


def test_the_padded_batch_equals_the_reference(model):
    """Three rows (full, right-padded, left-padded): logits, final hidden states, every layer's output and the
    softmax layer's attention weights at the real positions."""
    ref = reference(NAME)
    ids, mask = ref["input_ids"], ref["attention_mask"]
    rec = Recorder(keep=("residual_out", "attentions"))
    hidden, logits = transformer(model.weights, model.config, ids, mask, rec=rec)
    real = mask.astype(bool)
    assert real[1, -1] == 0 and real[2, 0] == 0                      # both sides padded
    assert np.abs(logits - ref["logits"])[real].max() < TOL_HIDDEN
    assert np.abs(hidden - ref["hidden"])[real].max() < TOL_HIDDEN
    for layer in range(model.config.n_layers - 1):                  # (the last layer's: hidden, after the norm)
        assert np.abs(rec.store[layer]["residual_out"] - ref["hidden_states"][layer + 1])[real].max() < TOL_HIDDEN
    A, want = rec.store[1]["attentions"], ref["full_attentions"][0]  # (B, H, n, n) layer 1, softmax
    for row in range(3):
        keep = real[row]
        assert np.abs(A[row][:, keep][:, :, keep] - want[row][:, keep][:, :, keep]).max() < TOL_ATTENTION


def test_the_lightning_state_is_transformers(model):
    """A pass with a cache keeps each lightning layer's state S = Σₛ λ^(n−1−s)·kₛᵀ·vₛ: transformers' own (what its
    lightning layers return as their attentions), padding's decay included."""
    ref = reference(NAME)
    ids, mask = ref["input_ids"], ref["attention_mask"]
    cache = KVCache(model.config, ids.shape[0], ids.shape[1], dtype=model.dtype)
    transformer(model.weights, model.config, ids, mask, cache=cache)
    for j, layer in enumerate(model.config.lightning.linear_layers):
        assert np.abs(cache.state.S[layer] - ref["states"][j]).max() < TOL_HIDDEN


def test_one_sequence_and_greedy_ids_with_and_without_the_cache(model):
    ref = reference(NAME)
    out = model.forward(ref["single_input_ids"])
    assert np.abs(out.logits - ref["single_logits"]).max() < TOL_HIDDEN
    new = ref["greedy_ids"].shape[1] - ref["single_input_ids"].shape[1]
    cached = model.generate(ref["single_input_ids"], max_new_tokens=new, stop_at_eos=False)
    plain = model.generate(ref["single_input_ids"], max_new_tokens=new, stop_at_eos=False, use_cache=False)
    assert np.array_equal(cached, ref["greedy_ids"]) and np.array_equal(plain, ref["greedy_ids_no_cache"])


def test_the_cached_steps_equal_the_full_pass(model):
    """A prompt of 6 (two blocks), then a pass of 3 tokens and one-token steps from the state: each the full pass's
    logits."""
    ids = reference(NAME)["greedy_ids"]
    full = model.forward(ids).logits[0]                             # (n, V)
    cache = KVCache(model.config, 1, ids.shape[1], dtype=model.dtype)
    first = model.last_logits(ids[:, :6], np.ones((1, 6), np.int64), cache=cache)
    assert np.abs(first[0, -1] - full[5]).max() < 1e-5
    more = model.last_logits(ids[:, 6:9], np.ones((1, 9), np.int64), cache=cache)
    assert np.abs(more[0, -1] - full[8]).max() < 1e-5
    for t in range(9, ids.shape[1]):
        step = model.last_logits(ids[:, t:t + 1], np.ones((1, t + 1), np.int64), cache=cache)
        assert np.abs(step[0, -1] - full[t]).max() < 1e-5


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


def test_padding_takes_no_attention(model):
    """A left-padded row: the pads' columns are 0 in every layer, and its real rows are the row alone's."""
    ref = reference(NAME)
    ids, mask = ref["input_ids"][2:], ref["attention_mask"][2:]
    real = mask[0].astype(bool)
    out = model.forward(ids, mask)                                  # attentions (L, 1, H, n, n)
    alone = model.forward(ids[:, real]).attentions
    assert np.all(out.attentions[:, 0, :, real][:, :, :, ~real] == 0)
    assert np.abs(out.attentions[:, 0][:, :, real][:, :, :, real] - alone[:, 0]).max() < 1e-5


def test_a_recorded_generation_shows_the_full_pass(model):
    """generate(trace=True): every step's lightning row from the state's keys equals model.run's over the text."""
    ids = reference(NAME)["single_input_ids"]
    trace = model.generate(ids, max_new_tokens=5, stop_at_eos=False, trace=True)
    again = model.run(trace.ids.tolist())
    assert np.abs(trace.attentions - again.attentions).max() < 1e-5
    assert np.abs(trace.logits - again.logits).max() < 1e-4


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


def test_gradients_are_refused_in_one_line(model):
    from qkv.train.gradients import gradients

    ids = reference(NAME)["single_input_ids"]
    with pytest.raises(QkvError, match="not in qkv") as e:
        gradients(model, ids)
    assert "\n" not in str(e.value)


def test_the_factors_matter():
    """Each α, β is read: the fixture's logits are missed with it set to 1."""
    for knob in ("linear_alpha", "full_beta", "ffn_alpha"):
        check_knob_matters(NAME, lambda m, k=knob: m.with_config(lightning=replace(m.config.lightning, **{k: 1.0})))


def test_saved_and_loaded_back(model, tmp_path):
    """The same config, logits to the bit, and the tensors of transformers' file but the decay buffers it makes."""
    from safetensors.numpy import load_file

    saved = model.save(tmp_path / "m")
    back = qkv.load(saved)
    ids = reference(NAME)["single_input_ids"]
    assert back.config == model.config and np.array_equal(back.forward(ids).logits, model.forward(ids).logits)
    ours, theirs = load_file(saved / "model.safetensors"), load_file(PATH / "model.safetensors")
    assert ours.keys() == {k for k in theirs if not k.endswith(("_decay", "slope_rate"))}
    assert all(np.array_equal(ours[k], theirs[k]) for k in ours)
    hf = json.loads((saved / "config.json").read_text())
    assert hf["layer_types"] == ["linear_attention", "full_attention", "linear_attention"] and hf["block_size"] == 4


def test_a_fresh_minimax_runs():
    m = qkv.init(json.loads((PATH / "config.json").read_text()))
    out = m.forward(np.array([[5, 6, 7, 8, 9]]))
    assert np.isfinite(out.logits).all() and out.attentions.shape == (3, 1, 4, 5, 5)


@pytest.mark.parametrize("change, words", [({"layer_types": ["linear_attention", "sliding_attention",
                                                              "full_attention"]}, "layer_types"),
                                           ({"block_size": 0}, "block_size"),
                                           ({"mlp_beta_factor": "big"}, "mlp_beta_factor"),
                                           ({"num_experts_per_tok": 5}, "num_experts_per_tok")])
def test_bad_knobs_are_refused_in_one_line(change, words):
    from qkv.checkpoints.families import config_of

    hf = json.loads((PATH / "config.json").read_text()) | change
    with pytest.raises(QkvError, match=words) as e:
        config_of(hf)
    assert "\n" not in str(e.value)


def test_the_views_run_and_the_rest_refuse(model, monkeypatch, capsys, tmp_path):
    """show (the viewer, figures and the pipeline page, lightning's own steps drawn: a trace without them refused in
    one line), heads, rollout, lens, next, generate run; direct logit attribution and input attribution refuse in
    one line."""
    from qkv.viz.pipeline import pipeline_html

    out = tmp_path / "views"
    code, text, err = run_main(monkeypatch, capsys, "show", "The quick brown fox", "--model", str(PATH),
                               "--out", str(out))
    assert code == 0, err
    assert (out / "attention.html").is_file() and '"mixers"' in (out / "pipeline.html").read_text()
    with pytest.raises(QkvError, match="pipeline_trace") as e:
        pipeline_html(model, model.run("The quick brown fox"))
    assert "\n" not in str(e.value)
    for command in ("heads", "rollout", "lens", "next", "generate"):
        code, text, err = run_main(monkeypatch, capsys, command, "The quick brown fox", "--model", str(PATH))
        assert code == 0, (command, err)
    for command, more in (("dla", ("--token", " o")), ("attribute", ())):
        code, _, err = run_main(monkeypatch, capsys, command, "The quick brown fox", "--model", str(PATH), *more)
        assert code == 2 and "MiniMax" in err and err.count("\n") == 1, (command, err)


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
