"""Granite 4 hybrids (checkpoints/granitemoehybrid.py: Mamba-2 layers of core/mamba2.py among attention layers, a
routed FFN and a shared one after each, Granite's multipliers) against transformers' GraniteMoeHybridForCausalLM on the
committed fixture (tests/fixtures/make_fixtures.py's make_granitemoehybrid: layers Mamba-2 / attention / Mamba-2, a
batch right- and left-padded, greedy ids with and without the cache, the attention layer's weights)."""

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

NAME = "granitemoehybrid"
PATH = MODELS / NAME


@pytest.fixture(scope="module")
def model():
    return qkv.load(PATH)


@pytest.fixture(scope="module")
def model64():
    return qkv.load(PATH, dtype=np.float64)


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


def test_the_padded_batch_equals_the_reference(model):
    """Three rows (full, right-padded, left-padded): logits, final hidden states, every layer's input and the
    attention layer's weights at the real positions."""
    ref = reference(NAME)
    ids, mask = ref["input_ids"], ref["attention_mask"]
    rec = Recorder(keep=("residual", "attentions"))
    hidden, logits = transformer(model.weights, model.config, ids, mask, rec=rec)
    real = mask.astype(bool)
    assert real[1, -1] == 0 and real[2, 0] == 0
    assert np.abs(logits - ref["logits"])[real].max() < TOL_HIDDEN
    assert np.abs(hidden - ref["hidden"])[real].max() < TOL_HIDDEN
    for layer in range(model.config.n_layers):                       # GraniteMoeHybrid's hidden_states: layer inputs
        assert np.abs(rec.store[layer]["residual"] - ref["hidden_states"][layer])[real].max() < TOL_HIDDEN
    for b in range(3):
        got, want = rec.store[1]["attentions"][b][:, real[b]], ref["attentions"][0, b][:, real[b]]
        assert np.abs(got - want).max() < TOL_ATTENTION


def test_one_sequence_and_greedy_ids_with_and_without_the_cache(model):
    ref = reference(NAME)
    out = model.forward(ref["single_input_ids"])
    assert np.abs(out.logits - ref["single_logits"]).max() < TOL_HIDDEN
    new = ref["greedy_ids"].shape[1] - ref["single_input_ids"].shape[1]
    cached = model.generate(ref["single_input_ids"], max_new_tokens=new, stop_at_eos=False)
    plain = model.generate(ref["single_input_ids"], max_new_tokens=new, stop_at_eos=False, use_cache=False)
    assert np.array_equal(cached, ref["greedy_ids"]) and np.array_equal(plain, ref["greedy_ids_no_cache"])


def test_the_cached_steps_equal_the_full_pass(model):
    """A first pass of 5 tokens, one of 3 more, then one-token steps: the attention layer's K, V and the Mamba-2
    layers' conv and scan states carry the past, each step giving the full pass's logits."""
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


def test_a_recorded_generation_shows_the_full_pass(model):
    """generate(trace=True): the attention layer's rows and the Mamba-2 layers' implied rows equal model.run's."""
    ids = reference(NAME)["single_input_ids"]
    trace = model.generate(ids, max_new_tokens=5, stop_at_eos=False, trace=True)
    again = model.run(trace.ids.tolist())
    assert np.abs(trace.attentions - again.attentions).max() < 1e-5
    assert np.abs(trace.logits - again.logits).max() < 1e-4


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
    hf = json.loads((saved / "config.json").read_text())
    assert hf["layer_types"] == ["mamba", "attention", "mamba"] and hf["num_local_experts"] == 3


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


@pytest.mark.parametrize("change, words", [
    ({"position_embedding_type": "alibi"}, "position_embedding_type"),
    ({"layer_types": ["mamba", "moe", "mamba"]}, "layer_types"),
    ({"layer_types": ["mamba"]}, "layer_types"),
    ({"mamba_n_heads": 2, "mamba_d_head": 32}, "attention heads must divide"),
    ({"mamba_d_head": 4}, "mamba_d_head"),
    ({"mamba_n_groups": 3}, "n_groups"),
    ({"num_experts_per_tok": 4}, "num_experts_per_tok"),
    ({"time_step_limit": [1, 0]}, "time_step_limit"),
    ({"logits_scaling": 0}, "logits_scaling"),
    ({"hidden_act": "tanh"}, "activation")])
def test_bad_knobs_are_refused_in_one_line(change, words):
    from qkv.checkpoints.families import config_of

    hf = json.loads((PATH / "config.json").read_text()) | change
    with pytest.raises(QkvError, match=words) as e:
        config_of(hf)
    assert "\n" not in str(e.value)


def test_the_views_run_and_the_rest_refuse(model, monkeypatch, capsys, tmp_path):
    out = tmp_path / "views"
    code, text, err = run_main(monkeypatch, capsys, "show", "The quick brown fox", "--model", str(PATH),
                               "--out", str(out))
    assert code == 0 and (out / "attention.html").is_file() and (out / "grid_layer0.png").is_file(), err
    for command in ("rollout", "heads", "lens", "next", "generate"):
        code, text, err = run_main(monkeypatch, capsys, command, "The quick brown fox", "--model", str(PATH))
        assert code == 0, (command, err)
    for command, more in (("dla", ("--token", " o")), ("attribute", ())):
        code, _, err = run_main(monkeypatch, capsys, command, "The quick brown fox", "--model", str(PATH), *more)
        assert code == 2 and "Mamba" in err and err.count("\n") == 1, (command, err)


def test_the_pipeline_page_draws_its_mamba2_layers_steps(model):
    """The pipeline page draws a Mamba-2 layer's own steps, ending in its implied matrix (tests/test_pipeline_scan.py
    checks the numbers); a trace without them (Model.run keeps none) is refused in one line naming pipeline_trace."""
    from qkv.viz.pipeline import pipeline_html, pipeline_trace

    assert '"mixers"' in pipeline_html(model, pipeline_trace(model, "The quick brown fox"))
    with pytest.raises(QkvError, match="pipeline_trace") as e:
        pipeline_html(model, model.run("The quick brown fox"))
    assert "\n" not in str(e.value)
