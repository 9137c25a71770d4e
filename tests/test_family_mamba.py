"""Mamba (core/mamba.py, checkpoints/mamba.py) against transformers' MambaForCausalLM on the committed fixture
(tests/fixtures/make_fixtures.py's make_mamba: a batch right- and left-padded, greedy ids with and without the
cache), and the attention each layer implies (Ali et al. 2024) against the scan it stands for, exactly."""

from __future__ import annotations

import json

import numpy as np
import pytest

import qkv
from conftest import MODELS, TOL_HIDDEN, reference, run_main
from qkv.core.mamba import causal_conv, conv_mixing, hidden_attention, mixer_parts
from qkv.core.stack import transformer
from qkv.core.trace import Recorder
from qkv.runtime.errors import QkvError

PATH = MODELS / "mamba"
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
    assert (m.d_state, m.d_inner, m.conv_kernel, m.dt_rank) == (hf["state_size"], hf["expand"] * hf["hidden_size"],
                                                                hf["conv_kernel"], hf["time_step_rank"])
    assert (m.conv_bias, m.bias, cfg.tied_embeddings, cfg.n_heads, cfg.d_head) == (True, False, True, 1, m.d_inner)
    assert cfg.norm == "rms" and cfg.norm_eps == hf["layer_norm_epsilon"] and cfg.activation == "silu"


def test_the_padded_batch_equals_the_reference(model):
    """Three rows (full, right-padded, left-padded): logits, final hidden states and every layer's output at the
    real positions; transformers zeroes the padding's inputs, and so does qkv."""
    ref = reference("mamba")
    ids, mask = ref["input_ids"], ref["attention_mask"]
    rec = Recorder(keep=("residual_out",))
    hidden, logits = transformer(model.weights, model.config, ids, mask, rec=rec)
    real = mask.astype(bool)
    assert real[1, -1] == 0 and real[2, 0] == 0                      # both sides padded
    assert np.abs(logits - ref["logits"])[real].max() < TOL_HIDDEN
    assert np.abs(hidden - ref["hidden"])[real].max() < TOL_HIDDEN
    for layer in range(model.config.n_layers):
        assert np.abs(rec.store[layer]["residual_out"] - ref["hidden_states"][layer])[real].max() < TOL_HIDDEN


def test_one_sequence_and_greedy_ids_with_and_without_the_cache(model):
    ref = reference("mamba")
    out = model.forward(ref["single_input_ids"])
    assert np.abs(out.logits - ref["single_logits"]).max() < TOL_HIDDEN
    new = ref["greedy_ids"].shape[1] - ref["single_input_ids"].shape[1]
    cached = model.generate(ref["single_input_ids"], max_new_tokens=new, stop_at_eos=False)
    plain = model.generate(ref["single_input_ids"], max_new_tokens=new, stop_at_eos=False, use_cache=False)
    assert np.array_equal(cached, ref["greedy_ids"]) and np.array_equal(plain, ref["greedy_ids_no_cache"])


def test_the_cached_step_equals_the_full_pass(model):
    """Each one-token step from the recurrent state (conv inputs, scan state) gives the full pass's last logits."""
    ids = reference("mamba")["greedy_ids"]
    full = model.forward(ids).logits[0]                             # (n, V)
    cache = qkv.core.cache.KVCache(model.config, 1, ids.shape[1], dtype=model.dtype)
    first = model.last_logits(ids[:, :5], np.ones((1, 5), np.int64), cache=cache)
    assert np.abs(first[0, -1] - full[4]).max() < 1e-5
    for t in range(5, ids.shape[1]):
        step = model.last_logits(ids[:, t:t + 1], np.ones((1, t + 1), np.int64), cache=cache)
        assert np.abs(step[0, -1] - full[t]).max() < 1e-5


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


def test_padding_takes_no_attention(model):
    """A left-padded row: the pads' columns are 0, and its real rows are the row alone's."""
    ref = reference("mamba")
    ids, mask = ref["input_ids"][2:], ref["attention_mask"][2:]
    real = mask[0].astype(bool)
    out = model.forward(ids, mask)                                   # attentions (L, 1, H, n, n)
    alone = model.forward(ids[:, real]).attentions
    assert np.all(out.attentions[:, 0, :, :, ~real] == 0)
    assert np.abs(out.attentions[:, 0][:, :, real][:, :, :, real] - alone[:, 0]).max() < 1e-5


def test_a_recorded_generation_shows_the_full_pass(model):
    """generate(trace=True): every step's attention row from the state's keys equals model.run's over the text."""
    ids = reference("mamba")["single_input_ids"]
    trace = model.generate(ids, max_new_tokens=5, stop_at_eos=False, trace=True)
    again = model.run(trace.ids.tolist())
    assert np.abs(trace.attentions - again.attentions).max() < 1e-5
    assert np.abs(trace.logits - again.logits).max() < 1e-4


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


def test_gradients_are_refused_in_one_line(model):
    from qkv.train.gradients import gradients

    ids = reference("mamba")["single_input_ids"]
    with pytest.raises(QkvError, match="not in qkv") as e:
        gradients(model, ids)
    assert "\n" not in str(e.value)


def test_a_fresh_mamba_is_refused_in_one_line():
    with pytest.raises(QkvError, match="fresh Mamba") as e:
        qkv.init(json.loads((PATH / "config.json").read_text()))
    assert "\n" not in str(e.value)


def test_saved_and_loaded_back(model, tmp_path):
    saved = model.save(tmp_path / "m")
    back = qkv.load(saved)
    ids = reference("mamba")["single_input_ids"]
    assert np.array_equal(back.forward(ids).logits, model.forward(ids).logits)
    hf = json.loads((saved / "config.json").read_text())
    assert hf["model_type"] == "mamba" and hf["expand"] == 2 and hf["time_step_rank"] == 3


@pytest.mark.parametrize("change, words", [({"state_size": 0}, "state_size"), ({"expand": 1.5}, "expand"),
                                           ({"use_conv_bias": "yes"}, "use_conv_bias"),
                                           ({"hidden_act": "tanh"}, "activation")])
def test_bad_knobs_are_refused_in_one_line(tmp_path, change, words):
    from qkv.checkpoints.families import config_of

    hf = json.loads((PATH / "config.json").read_text()) | change
    with pytest.raises(QkvError, match=words):
        config_of(hf)


def test_the_views_run_and_the_rest_refuse(model, monkeypatch, capsys, tmp_path):
    out = tmp_path / "views"
    code, text, _ = run_main(monkeypatch, capsys, "show", "The quick brown fox", "--model", str(PATH),
                             "--out", str(out))
    assert code == 0 and (out / "attention.html").is_file() and (out / "heatmap_layer0_head0.png").is_file()
    code, text, _ = run_main(monkeypatch, capsys, "rollout", "The quick brown fox", "--model", str(PATH))
    assert code == 0
    for command in ("heads", "lens", "next", "generate"):
        code, text, err = run_main(monkeypatch, capsys, command, "The quick brown fox", "--model", str(PATH))
        assert code == 0, (command, err)
    code, _, err = run_main(monkeypatch, capsys, "dla", "The quick brown fox", "--model", str(PATH), "--token", " o")
    assert code == 2 and "Mamba" in err and err.count("\n") == 1
    code, _, err = run_main(monkeypatch, capsys, "attribute", "The quick brown fox", "--model", str(PATH))
    assert code == 2 and "Mamba" in err and err.count("\n") == 1
