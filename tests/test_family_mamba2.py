"""Mamba-2 (core/mamba2.py, checkpoints/mamba2.py) against transformers' Mamba2ForCausalLM on the committed fixture
(tests/fixtures/make_fixtures.py's make_mamba2: a batch right- and left-padded, greedy ids with and without the
cache, transformers' scan in chunks of 4 tokens), and the attention each head implies (SSD's quadratic form) against
the scan it stands for, exactly."""

from __future__ import annotations

import json

import numpy as np
import pytest

import qkv
from conftest import MODELS, TOL_HIDDEN, reference, run_main
from qkv.core.mamba2 import Mamba2, gated_norm, implied_attention, mixer_parts
from qkv.core.stack import transformer
from qkv.core.trace import Recorder
from qkv.runtime.errors import QkvError

PATH = MODELS / "mamba2"
TOL_IDENTITY = 1e-9        # float64: the implied attention applied to the scan's input is its output


@pytest.fixture(scope="module")
def model():
    return qkv.load(PATH)


@pytest.fixture(scope="module")
def model64():
    return qkv.load(PATH, dtype=np.float64)


def test_the_config_reads_every_knob(model):
    cfg, hf = model.config, json.loads((PATH / "config.json").read_text())
    m = cfg.mamba
    assert isinstance(m, Mamba2)
    assert (m.n_heads, m.head_dim, m.d_state, m.n_groups, m.conv_kernel, m.chunk_size) == (
        hf["num_heads"], hf["head_dim"], hf["state_size"], hf["n_groups"], hf["conv_kernel"], hf["chunk_size"])
    assert m.d_inner == hf["expand"] * hf["hidden_size"] and (cfg.n_heads, cfg.d_head) == (m.n_heads, m.head_dim)
    assert (m.conv_bias, m.bias, cfg.tied_embeddings, m.dt_min, m.dt_max) == (True, False, False, 0.0, float("inf"))
    assert cfg.norm == "rms" and cfg.norm_eps == hf["layer_norm_epsilon"] and cfg.activation == "silu"


def test_the_padded_batch_equals_the_reference(model):
    """Three rows (full, right-padded, left-padded): logits, final hidden states and every layer's input at the
    real positions; transformers zeroes the padding's inputs, and so does qkv."""
    ref = reference("mamba2")
    ids, mask = ref["input_ids"], ref["attention_mask"]
    rec = Recorder(keep=("residual",))
    hidden, logits = transformer(model.weights, model.config, ids, mask, rec=rec)
    real = mask.astype(bool)
    assert real[1, -1] == 0 and real[2, 0] == 0                      # both sides padded
    assert ids.shape[1] > 2 * model.config.mamba.chunk_size          # transformers' scan ran over several chunks
    assert np.abs(logits - ref["logits"])[real].max() < TOL_HIDDEN
    assert np.abs(hidden - ref["hidden"])[real].max() < TOL_HIDDEN
    for layer in range(model.config.n_layers):                       # Mamba2's hidden_states: each layer's input
        assert np.abs(rec.store[layer]["residual"] - ref["hidden_states"][layer])[real].max() < TOL_HIDDEN


def test_one_sequence_and_greedy_ids_with_and_without_the_cache(model):
    ref = reference("mamba2")
    out = model.forward(ref["single_input_ids"])
    assert np.abs(out.logits - ref["single_logits"]).max() < TOL_HIDDEN
    new = ref["greedy_ids"].shape[1] - ref["single_input_ids"].shape[1]
    cached = model.generate(ref["single_input_ids"], max_new_tokens=new, stop_at_eos=False)
    plain = model.generate(ref["single_input_ids"], max_new_tokens=new, stop_at_eos=False, use_cache=False)
    assert np.array_equal(cached, ref["greedy_ids"]) and np.array_equal(plain, ref["greedy_ids_no_cache"])


def test_the_cached_steps_equal_the_full_pass(model):
    """A first pass of 5 tokens, one of 3 from its state, then one-token steps: each gives the full pass's logits."""
    ids = reference("mamba2")["greedy_ids"]
    full = model.forward(ids).logits[0]                             # (n, V)
    cache = qkv.core.cache.KVCache(model.config, 1, ids.shape[1], dtype=model.dtype)
    first = model.last_logits(ids[:, :5], np.ones((1, 5), np.int64), cache=cache)
    assert np.abs(first[0, -1] - full[4]).max() < 1e-5
    more = model.last_logits(ids[:, 5:8], np.ones((1, 8), np.int64), cache=cache)
    assert np.abs(more[0, -1] - full[7]).max() < 1e-5
    for t in range(8, ids.shape[1]):
        step = model.last_logits(ids[:, t:t + 1], np.ones((1, t + 1), np.int64), cache=cache)
        assert np.abs(step[0, -1] - full[t]).max() < 1e-5


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


def test_padding_takes_no_attention(model):
    """A left-padded row: the pads' columns are 0, and its real rows are the row alone's."""
    ref = reference("mamba2")
    ids, mask = ref["input_ids"][2:], ref["attention_mask"][2:]
    real = mask[0].astype(bool)
    out = model.forward(ids, mask)                                   # attentions (L, 1, H, n, n)
    alone = model.forward(ids[:, real]).attentions
    assert np.all(out.attentions[:, 0, :, :, ~real] == 0)
    assert np.abs(out.attentions[:, 0][:, :, real][:, :, :, real] - alone[:, 0]).max() < 1e-5


def test_a_recorded_generation_shows_the_full_pass(model):
    """generate(trace=True): every step's attention row from the state's keys equals model.run's over the text."""
    ids = reference("mamba2")["single_input_ids"]
    trace = model.generate(ids, max_new_tokens=5, stop_at_eos=False, trace=True)
    again = model.run(trace.ids.tolist())
    assert np.abs(trace.attentions - again.attentions).max() < 1e-5
    assert np.abs(trace.logits - again.logits).max() < 1e-4


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


def test_gradients_are_refused_in_one_line(model):
    from qkv.train.gradients import gradients

    ids = reference("mamba2")["single_input_ids"]
    with pytest.raises(QkvError, match="Mamba-2.*not in qkv") as e:
        gradients(model, ids)
    assert "\n" not in str(e.value)


def test_a_fresh_mamba2_is_refused_in_one_line():
    with pytest.raises(QkvError, match="fresh Mamba") as e:
        qkv.init(json.loads((PATH / "config.json").read_text()))
    assert "\n" not in str(e.value)


def test_saved_and_loaded_back(model, tmp_path):
    saved = model.save(tmp_path / "m")
    back = qkv.load(saved)
    ids = reference("mamba2")["single_input_ids"]
    assert np.array_equal(back.forward(ids).logits, model.forward(ids).logits)
    hf = json.loads((saved / "config.json").read_text())
    assert hf["model_type"] == "mamba2" and hf["num_heads"] == 8 and hf["n_groups"] == 2
    assert hf["time_step_limit"] == [0.0, {"__float__": "Infinity"}]       # transformers' JSON for ∞


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


@pytest.mark.parametrize("change, words", [({"state_size": 0}, "state_size"), ({"expand": 3}, "expand"),
                                           ({"n_groups": 3}, "n_groups"), ({"use_conv_bias": "yes"}, "use_conv_bias"),
                                           ({"time_step_limit": [0.5, 0.1]}, "time_step_limit"),
                                           ({"time_step_limit": "none"}, "time_step_limit"),
                                           ({"hidden_act": "tanh"}, "activation")])
def test_bad_knobs_are_refused_in_one_line(change, words):
    from qkv.checkpoints.families import config_of

    hf = json.loads((PATH / "config.json").read_text()) | change
    with pytest.raises(QkvError, match=words) as e:
        config_of(hf)
    assert "\n" not in str(e.value)


def test_the_views_run_and_the_rest_refuse(model, monkeypatch, capsys, tmp_path):
    out = tmp_path / "views"
    code, text, _ = run_main(monkeypatch, capsys, "show", "The quick brown fox", "--model", str(PATH),
                             "--out", str(out))
    assert code == 0 and (out / "attention.html").is_file() and (out / "grid_layer0.png").is_file()
    for command in ("rollout", "heads", "lens", "next", "generate"):
        code, text, err = run_main(monkeypatch, capsys, command, "The quick brown fox", "--model", str(PATH))
        assert code == 0, (command, err)
    code, _, err = run_main(monkeypatch, capsys, "dla", "The quick brown fox", "--model", str(PATH), "--token", " o")
    assert code == 2 and "Mamba" in err and err.count("\n") == 1
    code, _, err = run_main(monkeypatch, capsys, "attribute", "The quick brown fox", "--model", str(PATH))
    assert code == 2 and "Mamba" in err and err.count("\n") == 1


def test_the_pipeline_page_draws_its_scan_steps(model):
    """The pipeline page draws a Mamba-2 layer's own steps, ending in its implied matrix (tests/test_pipeline_scan.py
    checks the numbers); a trace without them (Model.run keeps none) is refused in one line naming pipeline_trace."""
    from qkv.viz.pipeline import pipeline_html, pipeline_trace

    assert '"mixers"' in pipeline_html(model, pipeline_trace(model, "The quick brown fox"))
    with pytest.raises(QkvError, match="pipeline_trace") as e:
        pipeline_html(model, model.run("The quick brown fox"))
    assert "\n" not in str(e.value)
