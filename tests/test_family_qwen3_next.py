"""Qwen3-Next (core/delta.py, checkpoints/qwen3_next.py) on the committed fixture (tests/fixtures/make_fixtures.py's
make_qwen3_next: layers linear / full / linear): its config's knobs, a left-padded batch written as each row alone, and
the attention each linear layer implies against the delta rule it stands for, exactly. What it shares with the other
scan and linear-attention families (the padded batch and greedy ids against transformers, cached steps, refusals,
save, the views, the pipeline page): tests/test_scan_families.py."""

from __future__ import annotations

import json

import numpy as np
import pytest

import qkv
from conftest import MODELS, reference
from qkv.core.cache import KVCache
from qkv.core.delta import attention_summary, channel_groups, delta_parts, implied_attention
from qkv.core.stack import transformer
from qkv.core.trace import Recorder
from qkv.runtime.errors import QkvError

NAME = "qwen3_next"
PATH = MODELS / NAME
TOL_IDENTITY = 1e-9        # float64: the implied attention applied to the values is the delta rule's output
LINEAR = (0, 2)            # the fixture's linear-attention layers; layer 1 attends with softmax


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


def test_the_saved_file_holds_every_tensor_of_the_checkpoint(model, tmp_path):
    """qkv's save writes every tensor as the checkpoint holds it (the fused projections regrouped by head; a model
    saved and read back: tests/test_scan_families.py)."""
    from safetensors.numpy import load_file

    saved = model.save(tmp_path / "m")
    ours, theirs = load_file(saved / "model.safetensors"), load_file(PATH / "model.safetensors")
    assert ours.keys() == theirs.keys()
    for k in theirs:                       # an RMSNorm's w is read as γ = 1 + w and written as γ − 1: float32 rounds
        assert np.abs(ours[k] - theirs[k]).max() <= (1e-7 if "norm" in k and "linear_attn" not in k else 0), k


def test_layer_types_default_to_every_fourth_layer_full():
    from qkv.checkpoints.families import config_of

    hf = json.loads((PATH / "config.json").read_text())
    hf = {k: v for k, v in hf.items() if k not in ("layer_types", "mlp_only_layers")} | {"num_hidden_layers": 8}
    assert config_of(hf).delta.layers == (0, 1, 2, 4, 5, 6)
