"""Qwen3-Next (core/delta.py, checkpoints/qwen3_next.py) against transformers' Qwen3NextForCausalLM on the committed
fixture (tests/fixtures/make_fixtures.py's make_qwen3_next: layers linear / full / linear, a batch right- and
left-padded, greedy ids with and without the cache), and the attention each linear layer implies against the delta
rule it stands for, exactly."""

from __future__ import annotations

import json

import numpy as np
import pytest

import qkv
from conftest import MODELS, TOL_ATTENTION, TOL_HIDDEN, reference, run_main
from qkv.core.cache import KVCache
from qkv.core.delta import attention_summary, channel_groups, delta_parts, implied_attention
from qkv.core.stack import transformer
from qkv.core.trace import Recorder
from qkv.runtime.errors import QkvError

NAME = "qwen3_next"
PATH = MODELS / NAME
TOL_IDENTITY = 1e-9        # float64: the implied attention applied to the values is the delta rule's output
LINEAR = (0, 2)            # the fixture's linear-attention layers; layer 1 attends with softmax


@pytest.fixture(scope="module")
def model():
    return qkv.load(PATH)


@pytest.fixture(scope="module")
def model64():
    return qkv.load(PATH, dtype=np.float64)


def test_the_config_reads_every_knob(model):
    cfg, hf = model.config, json.loads((PATH / "config.json").read_text())
    m = cfg.delta
    assert m.layers == LINEAR and [hf["layer_types"][i] for i in LINEAR] == ["linear_attention"] * 2
    assert (m.n_k_heads, m.n_v_heads, m.d_k, m.d_v, m.conv_kernel) == (
        hf["linear_num_key_heads"], hf["linear_num_value_heads"], hf["linear_key_head_dim"],
        hf["linear_value_head_dim"], hf["linear_conv_kernel_dim"])
    assert cfg.attn_output_gate and cfg.qk_norm == "head" and cfg.rotary_dim == hf["head_dim"] // 4
    assert (cfg.n_experts, cfg.experts_per_token, cfg.d_expert, cfg.d_shared_expert, cfg.dense_layers) == (
        hf["num_experts"], hf["num_experts_per_tok"], hf["moe_intermediate_size"],
        hf["shared_expert_intermediate_size"], (1,))
    assert cfg.norm_top_k and not cfg.tied_embeddings and not cfg.qkv_bias
    assert model.weights.final_norm.stored_offset == 1.0     # every RMSNorm multiplies by 1 + w


def test_the_padded_batch_equals_the_reference(model):
    """Three rows (full, right-padded, left-padded): logits, final hidden states, every block's input and the full
    layer's attention weights at the real positions."""
    ref = reference(NAME)
    ids, mask = ref["input_ids"], ref["attention_mask"]
    rec = Recorder(keep=("residual", "attentions"))
    hidden, logits = transformer(model.weights, model.config, ids, mask, rec=rec)
    real = mask.astype(bool)
    assert real[1, -1] == 0 and real[2, 0] == 0                      # both sides padded
    assert np.abs(logits - ref["logits"])[real].max() < TOL_HIDDEN
    assert np.abs(hidden - ref["hidden"])[real].max() < TOL_HIDDEN
    for layer in range(model.config.n_layers):
        assert np.abs(rec.store[layer]["residual"] - ref["hidden_states"][layer])[real].max() < TOL_HIDDEN
    A = rec.store[1]["attentions"]                                   # (B, H, n, n) the full layer's
    assert np.abs(A - ref["full_attentions"][0]).transpose(0, 2, 1, 3)[real].max() < TOL_ATTENTION


def test_one_sequence_and_greedy_ids_with_and_without_the_cache(model):
    ref = reference(NAME)
    out = model.forward(ref["single_input_ids"])
    assert np.abs(out.logits - ref["single_logits"]).max() < TOL_HIDDEN
    new = ref["greedy_ids"].shape[1] - ref["single_input_ids"].shape[1]
    cached = model.generate(ref["single_input_ids"], max_new_tokens=new, stop_at_eos=False)
    plain = model.generate(ref["single_input_ids"], max_new_tokens=new, stop_at_eos=False, use_cache=False)
    assert np.array_equal(cached, ref["greedy_ids"]) and np.array_equal(plain, ref["greedy_ids_no_cache"])


def test_a_left_padded_batch_writes_as_each_row_alone(model):
    """Prompts written together, one left-padded: its pads write nothing into the conv or delta state, so each row's
    greedy ids are its own (with the cache and without)."""
    ref = reference(NAME)
    ids, mask = ref["input_ids"][[0, 2]], ref["attention_mask"][[0, 2]]
    for cache in (True, False):
        both = model.generate(ids, max_new_tokens=6, attention_mask=mask, stop_at_eos=False, use_cache=cache)
        for row in (0, 1):
            alone = model.generate(ids[row:row + 1, mask[row].astype(bool)], max_new_tokens=6, stop_at_eos=False)
            assert np.array_equal(both[row, -6:], alone[0, -6:]), (cache, row)


def test_the_cached_step_equals_the_full_pass(model):
    """A prompt of 5, then one token at a time from the conv and delta states (and the full layer's K, V): each
    step's logits are the full pass's; so is a second pass of several tokens after the first."""
    ids = reference(NAME)["greedy_ids"]
    full = model.forward(ids).logits[0]                             # (n, V)
    cache = KVCache(model.config, 1, ids.shape[1], dtype=model.dtype)
    first = model.last_logits(ids[:, :5], np.ones((1, 5), np.int64), cache=cache)
    assert np.abs(first[0, -1] - full[4]).max() < 1e-5
    for t in range(5, 12):
        step = model.last_logits(ids[:, t:t + 1], np.ones((1, t + 1), np.int64), cache=cache)
        assert np.abs(step[0, -1] - full[t]).max() < 1e-5
    more = model.last_logits(ids[:, 12:], np.ones((1, ids.shape[1]), np.int64), cache=cache)
    assert np.abs(more[0, -1] - full[-1]).max() < 1e-5


def test_recording_over_a_past_kept_without_its_keys_is_refused(model):
    """A plain prefill keeps no implied keys (U: a step stays O(1)); a later pass that records the attention over
    that past is refused in one line, and a recorded prefill keeps them for the steps after it."""
    ids = reference(NAME)["greedy_ids"]
    ones = np.ones((1, ids.shape[1]), np.int64)
    cache = KVCache(model.config, 1, ids.shape[1], dtype=model.dtype)
    transformer(model.weights, model.config, ids[:, :5], ones[:, :5], cache=cache, logits="last")
    assert cache.state.U[0] is None and cache.state.S[0] is not None
    with pytest.raises(QkvError, match="trace=True") as e:
        transformer(model.weights, model.config, ids[:, 5:6], ones[:, :6], cache=cache,
                    rec=Recorder(keep=("attentions",)))
    assert "\n" not in str(e.value)
    cache = KVCache(model.config, 1, ids.shape[1], dtype=model.dtype)
    transformer(model.weights, model.config, ids[:, :5], ones[:, :5], cache=cache, rec=Recorder(keep=("attentions",)))
    assert cache.state.U[0].shape[-1] == 5
    transformer(model.weights, model.config, ids[:, 5:6], ones[:, :6], cache=cache)
    assert cache.state.U[0].shape[-1] == 6                          # kept on, recorded or not


def _parts(model, ids, layer, start=0, stop=None):
    """Layer LAYER's delta rule on ids (1, n) from what its norm gave (the trace's attn_in), positions START..STOP
    − 1 from the state the earlier ones leave (conv inputs and S)."""
    trace = model.run(ids[0].tolist(), keep=("attn_in", "heads", "attentions"))
    w, h = model.weights.blocks[layer].delta, trace.layer(layer).attn_in[None]      # (1, n, d_model)
    before = delta_parts(h[:, :start], w, model.config) if start else None
    k1 = model.config.delta.conv_kernel - 1
    past = None if before is None else np.concatenate([np.zeros((1, k1, before.mixed.shape[2])), before.mixed],
                                                      axis=1)[:, -k1:]
    return trace, w, before, delta_parts(h[:, start:stop], w, model.config, None, past,
                                         None if before is None else before.S)


@pytest.mark.parametrize("layer", LINEAR)
def test_the_implied_attention_is_the_delta_rule(model64, layer):
    """oₜ = Σₛ A[h, t, s]·vₛ for every value head, to 1e-9 in float64; A lower-triangular."""
    ids = reference(NAME)["single_input_ids"]
    _, _, _, f = _parts(model64, ids, layer)
    A, U = implied_attention(f.q, f.k, f.beta, f.g)                 # (1, Hv, n, n)
    assert np.all(np.triu(A[0], 1) == 0)                            # causal
    assert np.abs(np.einsum("bhts,bhsd->bhtd", A, f.v) - f.o).max() < TOL_IDENTITY
    assert np.abs(f.o).max() > 1e-2                                  # (a rule that does something)
    assert np.abs(np.einsum("bhks,bhsd->bhkd", U, f.v) - f.S).max() < TOL_IDENTITY   # the state is U·V


@pytest.mark.parametrize("layer", LINEAR)
def test_the_identity_holds_across_a_cache(model64, layer):
    """From the state a prompt of 6 leaves (S0 = U·V of its values), the next tokens' rows over all keys: A·V of
    every value, past and new, is the continued rule's output."""
    ids = reference(NAME)["single_input_ids"]
    _, _, before, f = _parts(model64, ids, layer, start=6)
    _, U = implied_attention(None, before.k, before.beta, before.g)  # the past's keys only
    A, _ = implied_attention(f.q, f.k, f.beta, f.g, U)              # (1, Hv, n − 6, n)
    v = np.concatenate([before.v, f.v], axis=2)                     # (1, Hv, n, d_v)
    assert A.shape[-1] == ids.shape[1] and np.abs(np.einsum("bhts,bhsd->bhtd", A, v) - f.o).max() < TOL_IDENTITY


def test_the_trace_holds_the_grouped_absolute_attention(model64):
    """The linear layer's "attentions": per group of value channels (here one value head per shown head),
    Σ|A| with each row divided by its sum; its "heads" what out_proj reads."""
    ids = reference(NAME)["single_input_ids"]
    trace, w, _, f = _parts(model64, ids, 2)
    A, _ = implied_attention(f.q, f.k, f.beta, f.g)
    want = np.abs(A[0]) / np.abs(A[0]).sum(axis=-1, keepdims=True)
    got = trace.layer(2).attentions                                  # (H, n, n)
    assert got.shape == (4, ids.shape[1], ids.shape[1]) and np.abs(got - want).max() < 1e-12
    assert np.allclose(got.sum(axis=-1), 1)


def test_a_long_inputs_view_keeps_each_rows_largest_weights(model):
    """keep=("attention_top",) (what `qkv show --out` keeps past LONG_TOKENS): a linear layer's top weights are its
    implied attention's largest, as a full layer's are its softmax's."""
    text = "The quick brown fox jumps over the lazy dog"
    whole = model.run(text, keep=("attentions",))
    top = model.run(text, keep=("attention_top",), top=3)
    for layer in range(model.config.n_layers):
        t, A = top.layer(layer).attention_top, whole.layer(layer).attentions      # (H, n, 3), (H, n, n)
        assert np.allclose(t.weight, -np.sort(-A, axis=-1)[..., :3], atol=1e-6), layer
        assert np.array_equal(np.take_along_axis(A, t.index.astype(np.int64), axis=-1), t.weight)


def test_channel_groups_split_value_heads_or_join_them():
    """H shown heads over Hv value heads of d_v channels: a group holds whole heads, or part of one."""
    assert channel_groups(4, 8, 2).tolist() == [[8, 8, 0, 0], [0, 0, 8, 8]]
    assert channel_groups(2, 8, 4).tolist() == [[4, 0], [4, 0], [0, 4], [0, 4]]
    A = np.abs(np.random.default_rng(0).standard_normal((1, 2, 3, 3)))
    s = attention_summary(A, 4, 8, None)
    assert np.allclose(s[0, 0], A[0, 0] / A[0, 0].sum(-1, keepdims=True)) and np.array_equal(s[0, 0], s[0, 1])


def test_padding_takes_no_attention(model):
    """A left-padded row: the pads' columns are 0, and its real rows are the row alone's (every layer)."""
    ref = reference(NAME)
    ids, mask = ref["input_ids"][2:], ref["attention_mask"][2:]
    real = mask[0].astype(bool)
    out = model.forward(ids, mask)                                   # attentions (L, 1, H, n, n)
    alone = model.forward(ids[:, real]).attentions
    assert np.all(out.attentions[:, 0, :, :, ~real] == 0)
    assert np.abs(out.attentions[:, 0][:, :, real][:, :, :, real] - alone[:, 0]).max() < 1e-5


def test_a_recorded_generation_shows_the_full_pass(model):
    """generate(trace=True): every step's attention row, from the state's keys U, equals model.run's."""
    ids = reference(NAME)["single_input_ids"]
    trace = model.generate(ids, max_new_tokens=5, stop_at_eos=False, trace=True)
    again = model.run(trace.ids.tolist())
    assert np.abs(trace.attentions - again.attentions).max() < 1e-5
    assert np.abs(trace.logits - again.logits).max() < 1e-4


def test_hooks_and_ablation_act_on_the_value_channels(model):
    ids = reference(NAME)["single_input_ids"]
    ablated = model.forward(ids, ablate=[(0, 2)]).logits
    hooked = model.forward(ids, hooks={"0.heads.2": lambda z, layer: np.zeros_like(z)}).logits
    assert np.array_equal(ablated, hooked) and np.abs(ablated - model.forward(ids).logits).max() > 1e-4
    gated = model.forward(ids, ablate=[(1, 3)]).logits                # the full layer's head, after its gate
    zero = model.forward(ids, hooks={"1.heads.3": lambda z, layer: np.zeros_like(z)}).logits
    assert np.array_equal(gated, zero)
    with pytest.raises(QkvError, match="linear-attention layer") as e:
        model.forward(ids, hooks={"0.q": lambda v, layer: None})
    assert "\n" not in str(e.value)
    q = model.forward(ids, hooks={"1.q": lambda v, layer: v}).logits  # the full layer has q
    assert np.array_equal(q, model.forward(ids).logits)


def test_the_gate_multiplies_each_heads_output(model64):
    """The full layer's "heads" are Z_h ⊙ σ(x·W_G)_h (what W_O reads): with W_G zeroed (σ(0) = ½) they are half of
    the ungated Z_h, the gated heads divided by their gate."""
    from qkv.core.ops import sigmoid

    ids = reference(NAME)["single_input_ids"][0].tolist()
    trace = model64.run(ids, keep=("attn_in", "heads"))
    n, H = len(ids), model64.config.n_heads
    gate = sigmoid(trace.layer(1).attn_in @ model64.weights.blocks[1].attn.W_G)     # (n, H·d_k)
    ungated = trace.layer(1).heads / gate.reshape(n, H, -1).transpose(1, 0, 2)      # (H, n, d_k)
    plain = qkv.load(PATH, dtype=np.float64)
    attn = plain.weights.blocks[1].attn
    attn.W_G = np.zeros_like(attn.W_G)
    half = plain.run(ids, keep=("heads",)).layer(1).heads
    assert np.abs(half - 0.5 * ungated).max() < 1e-12 and np.abs(half - trace.layer(1).heads).max() > 1e-3


def test_gradients_are_refused_in_one_line(model):
    from qkv.train.gradients import gradients

    ids = reference(NAME)["single_input_ids"]
    with pytest.raises(QkvError, match="not in qkv") as e:
        gradients(model, ids)
    assert "\n" not in str(e.value)


def test_saved_and_loaded_back(model, tmp_path):
    """qkv's save writes every tensor as the checkpoint holds it (the fused projections regrouped by head), and
    reads back the same model."""
    from safetensors.numpy import load_file

    saved = model.save(tmp_path / "m")
    back = qkv.load(saved)
    ids = reference(NAME)["single_input_ids"]
    assert np.array_equal(back.forward(ids).logits, model.forward(ids).logits)
    ours, theirs = load_file(saved / "model.safetensors"), load_file(PATH / "model.safetensors")
    assert ours.keys() == theirs.keys()
    for k in theirs:                       # an RMSNorm's w is read as γ = 1 + w and written as γ − 1: float32 rounds
        assert np.abs(ours[k] - theirs[k]).max() <= (1e-7 if "norm" in k and "linear_attn" not in k else 0), k
    hf = json.loads((saved / "config.json").read_text())
    original = json.loads((PATH / "config.json").read_text())
    assert hf["model_type"] == NAME and hf["layer_types"] == original["layer_types"]


def test_a_fresh_model_runs():
    hf = json.loads((PATH / "config.json").read_text())
    fresh = qkv.init(hf, seed=1)
    ids = reference(NAME)["single_input_ids"]
    assert np.isfinite(fresh.forward(ids).logits).all()


@pytest.mark.parametrize("change, words", [
    ({"linear_num_value_heads": 3}, "multiple of linear_num_key_heads"),
    ({"layer_types": ["linear_attention", "sliding_attention", "linear_attention"]}, "layer_types"),
    ({"linear_conv_kernel_dim": 0}, "linear_conv_kernel_dim"),
    ({"linear_num_value_heads": 2, "linear_value_head_dim": 3}, "value channels"),
    ({"hidden_act": "tanh"}, "activation"),
    ({"full_attention_interval": 0, "layer_types": None}, "full_attention_interval"),
])
def test_bad_knobs_are_refused_in_one_line(change, words):
    from qkv.checkpoints.families import config_of

    hf = json.loads((PATH / "config.json").read_text()) | change
    with pytest.raises(QkvError, match=words) as e:
        config_of(hf)
    assert "\n" not in str(e.value)


def test_layer_types_default_to_every_fourth_layer_full():
    from qkv.checkpoints.families import config_of

    hf = json.loads((PATH / "config.json").read_text())
    hf = {k: v for k, v in hf.items() if k not in ("layer_types", "mlp_only_layers")} | {"num_hidden_layers": 8}
    assert config_of(hf).delta.layers == (0, 1, 2, 4, 5, 6)


def test_the_views_run_and_the_rest_refuse(model, monkeypatch, capsys, tmp_path):
    from qkv.viz.pipeline import pipeline_html

    out = tmp_path / "views"
    code, text, err = run_main(monkeypatch, capsys, "show", "The quick brown fox", "--model", str(PATH),
                               "--out", str(out))
    assert code == 0, err
    assert (out / "attention.html").is_file() and (out / "heatmap_layer0_head0.png").is_file()
    for command in ("heads", "rollout", "lens", "next", "generate"):
        code, text, err = run_main(monkeypatch, capsys, command, "The quick brown fox", "--model", str(PATH))
        assert code == 0, (command, err)
    for command, more in (("dla", ("--token", "o")), ("attribute", ())):
        code, _, err = run_main(monkeypatch, capsys, command, "The quick brown fox", "--model", str(PATH), *more)
        assert code == 2 and "linear-attention" in err and err.count("\n") == 1, (command, err)
    with pytest.raises(QkvError, match="pipeline page") as e:
        pipeline_html(model, model.run("The quick brown fox"))
    assert "\n" not in str(e.value)
