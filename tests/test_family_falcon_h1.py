"""Falcon-H1 (checkpoints/falcon_h1.py: attention and core/mamba2.py's mixer side by side in every layer, µP
multipliers) against transformers' FalconH1ForCausalLM on the committed fixture (tests/fixtures/make_fixtures.py's
make_falcon_h1: a batch right- and left-padded, the attention weights, greedy ids with and without the cache)."""

from __future__ import annotations

import json

import numpy as np
import pytest

import qkv
from conftest import MODELS, TOL_ATTENTION, TOL_HIDDEN, reference, run_main
from qkv.core.mamba2 import Mamba2, implied_attention, mixer_parts
from qkv.core.stack import transformer
from qkv.core.trace import Recorder
from qkv.runtime.errors import QkvError

NAME = "falcon_h1"
PATH = MODELS / NAME


@pytest.fixture(scope="module")
def model():
    return qkv.load(PATH)


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


def test_the_padded_batch_equals_the_reference(model):
    """Three rows (full, right-padded, left-padded): logits, final hidden states, every layer's input and the attention
    weights at the real positions."""
    ref = reference(NAME)
    ids, mask = ref["input_ids"], ref["attention_mask"]
    rec = Recorder(keep=("residual", "attentions"))
    hidden, logits = transformer(model.weights, model.config, ids, mask, rec=rec)
    real = mask.astype(bool)
    assert real[1, -1] == 0 and real[2, 0] == 0
    assert np.abs(logits - ref["logits"])[real].max() < TOL_HIDDEN
    assert np.abs(hidden - ref["hidden"])[real].max() < TOL_HIDDEN
    for layer in range(model.config.n_layers):
        assert np.abs(rec.store[layer]["residual"] - ref["hidden_states"][layer])[real].max() < TOL_HIDDEN
        for b in range(3):
            got, want = rec.store[layer]["attentions"][b][:, real[b]], ref["attentions"][layer, b][:, real[b]]
            assert np.abs(got - want).max() < TOL_ATTENTION


def test_one_sequence_and_greedy_ids_with_and_without_the_cache(model):
    ref = reference(NAME)
    assert np.abs(model.forward(ref["single_input_ids"]).logits - ref["single_logits"]).max() < TOL_HIDDEN
    new = ref["greedy_ids"].shape[1] - ref["single_input_ids"].shape[1]
    cached = model.generate(ref["single_input_ids"], max_new_tokens=new, stop_at_eos=False)
    plain = model.generate(ref["single_input_ids"], max_new_tokens=new, stop_at_eos=False, use_cache=False)
    assert np.array_equal(cached, ref["greedy_ids"]) and np.array_equal(plain, ref["greedy_ids_no_cache"])


def test_the_cached_steps_equal_the_full_pass(model):
    """A first pass of 5 tokens, one of 3 more, then one-token steps: K, V and the mixers' states carry the past."""
    ids = reference(NAME)["greedy_ids"]
    full = model.forward(ids).logits[0]                             # (n, V)
    cache = qkv.core.cache.KVCache(model.config, 1, ids.shape[1], dtype=model.dtype)
    first = model.last_logits(ids[:, :5], np.ones((1, 5), np.int64), cache=cache)
    assert np.abs(first[0, -1] - full[4]).max() < 1e-5
    more = model.last_logits(ids[:, 5:8], np.ones((1, 8), np.int64), cache=cache)
    assert np.abs(more[0, -1] - full[7]).max() < 1e-5
    for t in range(8, ids.shape[1]):
        step = model.last_logits(ids[:, t:t + 1], np.ones((1, t + 1), np.int64), cache=cache)
        assert np.abs(step[0, -1] - full[t]).max() < 1e-5


@pytest.mark.parametrize("layer", [0, 1])
def test_the_mixer_beside_attention_is_its_implied_attention(layer):
    """Each layer's mixer (its µP multipliers in): α·x̃ is the scan's y to 1e-9 in float64, every head."""
    model64 = qkv.load(PATH, dtype=np.float64)
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


def test_gradients_and_a_fresh_model_are_refused_in_one_line(model):
    from qkv.train.gradients import gradients

    with pytest.raises(QkvError, match="not in qkv") as e:
        gradients(model, reference(NAME)["single_input_ids"])
    assert "\n" not in str(e.value)
    with pytest.raises(QkvError, match="fresh Mamba") as e:
        qkv.init(json.loads((PATH / "config.json").read_text()))
    assert "\n" not in str(e.value)


def test_saved_and_loaded_back(model, tmp_path):
    saved = model.save(tmp_path / "m")
    back = qkv.load(saved)
    ids = reference(NAME)["single_input_ids"]
    assert np.array_equal(back.forward(ids).logits, model.forward(ids).logits)
    hf, mine = json.loads((saved / "config.json").read_text()), json.loads((PATH / "config.json").read_text())
    for key in ("ssm_multipliers", "mlp_multipliers", "attention_in_multiplier", "mamba_norm_before_gate"):
        assert hf[key] == mine[key], key
    assert abs(hf["key_multiplier"] - mine["key_multiplier"]) < 1e-12


def test_a_null_mamba_d_ssm_is_expand_times_hidden():
    from qkv.checkpoints.families import config_of

    hf = json.loads((PATH / "config.json").read_text()) | {"mamba_d_ssm": None, "mamba_expand": 2, "mamba_n_heads": 8}
    assert config_of(hf).mamba.d_inner == 2 * hf["hidden_size"]
    hf |= {"mamba_rms_norm": False}
    assert config_of(hf).mamba.norm == "none"


@pytest.mark.parametrize("change, words", [
    ({"mlp_multipliers": [1.0]}, "mlp_multipliers"), ({"ssm_multipliers": [1, 1, 1, -1, 1]}, "ssm_multipliers"),
    ({"mamba_d_head": 7}, "mamba_d_head"), ({"key_multiplier": 0}, "key_multiplier"),
    ({"mamba_rms_norm": "yes"}, "mamba_rms_norm"), ({"time_step_limit": [2, 1]}, "time_step_limit"),
    ({"hidden_act": "tanh"}, "activation")])
def test_bad_knobs_are_refused_in_one_line(change, words):
    from qkv.checkpoints.families import config_of

    hf = json.loads((PATH / "config.json").read_text()) | change
    with pytest.raises(QkvError, match=words) as e:
        config_of(hf)
    assert "\n" not in str(e.value)


def test_the_views_run_and_the_rest_refuse(model, monkeypatch, capsys, tmp_path):
    text, out = "The quick brown fox", tmp_path / "views"
    code, _, err = run_main(monkeypatch, capsys, "show", text, "--model", str(PATH), "--out", str(out))
    assert code == 0 and (out / "attention.html").is_file() and (out / "grid_layer0.png").is_file(), err
    for command in ("rollout", "heads", "lens", "next", "generate"):
        code, _, err = run_main(monkeypatch, capsys, command, text, "--model", str(PATH))
        assert code == 0, (command, err)
    for command, more in (("dla", ("--token", " o")), ("attribute", ())):
        code, _, err = run_main(monkeypatch, capsys, command, text, "--model", str(PATH), *more)
        assert code == 2 and "Mamba" in err and err.count("\n") == 1, (command, err)


def test_the_pipeline_page_runs_or_refuses_in_one_line(model):
    from qkv.viz.pipeline import pipeline_html

    trace = model.run("The quick brown fox")
    try:
        assert "<html" in pipeline_html(model, trace).lower()
    except QkvError as e:
        assert "\n" not in str(e)
