"""The KV cache of a stack of layers of different kinds (core.cache: KVCache.layers, row, bytes_per_token,
state_bytes).

K and V are kept for the attention layers alone: Jamba's and Granite 4's Mamba layers, Qwen3-Next's gated delta
layers and MiniMax's lightning layers keep a fixed state instead (KVCache.state), and a Mamba stack keeps no K, V at
all; Falcon-H1 attends in every layer, beside its Mamba-2 mixers. Checked on the committed fixtures: which rows the
arrays hold, that each holds its layer's K and V as a full pass computes them, greedy ids with and without the cache,
bytes per token and state bytes against a count by hand and against the arrays a pass leaves behind.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from rich.console import Console

import qkv
from qkv.checkpoints.families import config_of
from qkv.core.cache import KVCache
from qkv.writing.generate import decode
from conftest import MODELS

# family: (its attention layers, K/V bytes a token in float32 by hand, state bytes by hand)
KINDS = {
    # 2 attention layers × (K + V) × 2 K/V heads × d_k 8 × 4 bytes; 2 Mamba layers × (conv 3·64 + scan 64·8) × 4
    "jamba": ((1, 3), 2 * 2 * 2 * 8 * 4, 2 * (3 * 64 + 64 * 8) * 4),
    # 1 × 2 × 2 × 16 × 4; 2 delta layers × (conv 3·(2·2·8 + 4·8) + state 4·8·8) × 4
    "qwen3_next": ((1,), 1 * 2 * 2 * 16 * 4, 2 * (3 * 64 + 4 * 8 * 8) * 4),
    # 1 × 2 × 2 × 8 × 4; 2 lightning layers × state 4 heads · 8 · 8 × 4
    "minimax": ((1,), 1 * 2 * 2 * 8 * 4, 2 * 4 * 8 * 8 * 4),
    # 1 × 2 × 2 × 8 × 4; 2 Mamba-2 layers × (conv 3·(64 + 2·2·8) + scan 8·8·8) × 4
    "granitemoehybrid": ((1,), 1 * 2 * 2 * 8 * 4, 2 * (3 * 96 + 8 * 8 * 8) * 4),
    # attention in both layers, 2 × 2 × 2 × 8 × 4; and a Mamba-2 beside it in both: conv 3·(48 + 2·2·8) + scan 6·8·8
    "falcon_h1": ((0, 1), 2 * 2 * 2 * 8 * 4, 2 * (3 * 80 + 6 * 8 * 8) * 4),
    # no attention: no K, V; 2 Mamba layers × (conv 3·64 + scan 64·8) × 4
    "mamba": ((), 0, 2 * (3 * 64 + 64 * 8) * 4),
    "mamba2": ((), 0, 2 * (3 * 96 + 8 * 8 * 8) * 4),
    # a transformer: every layer, no state
    "llama4_text": ((0, 1, 2), 3 * 2 * 2 * 12 * 4, 0),
}
PROMPT = np.array([[5, 17, 42, 9, 33, 7]])       # (1, 6)


@pytest.fixture(scope="module", params=sorted(KINDS))
def family(request):
    return request.param, qkv.load(MODELS / request.param)


def prefilled(model, n: int = PROMPT.shape[1], room: int = 4) -> KVCache:
    """A cache after one pass over the first n tokens of PROMPT, with room for ROOM more."""
    cache = KVCache(model.config, 1, n + room, dtype=model.dtype)
    model.last_logits(PROMPT[:, :n], np.ones((1, n), np.int64), cache=cache)
    return cache


def test_the_arrays_hold_rows_for_the_attention_layers_alone(family):
    """k and v have one row per attention layer (none for a Mamba, delta or lightning layer), and each row holds its
    layer's K and V as a full pass over the same tokens computes them (1e-5); asking a row of another layer is a
    bug, told."""
    name, model = family
    attention, _, _ = KINDS[name]
    cache = prefilled(model)
    assert cache.layers == attention and cache.k.shape[0] == cache.v.shape[0] == len(attention)
    trace = model.run(PROMPT[0].tolist(), keep=("k", "v"))
    for layer in attention:
        r = cache.row(layer)
        assert np.abs(cache.k[r, 0, :, :6] - trace.layer(layer).k).max() < 1e-5
        assert np.abs(cache.v[r, 0, :, :6] - trace.layer(layer).v).max() < 1e-5
    for layer in set(range(model.config.n_layers)) - set(attention):
        with pytest.raises(ValueError, match=f"layer {layer} keeps no K, V"):
            cache.row(layer)


def test_bytes_per_token_and_state_bytes_equal_a_count_by_hand(family):
    """bytes_per_token is the attention layers' K, V (a count by hand, and the arrays' own bytes over their
    positions); state_bytes is the others' fixed state (by hand, and the arrays a pass leaves in cache.state)."""
    name, model = family
    _, per_token, state = KINDS[name]
    cache = prefilled(model)
    assert KVCache.bytes_per_token(model.config) == per_token == cache.nbytes // cache.max_len
    assert KVCache.state_bytes(model.config) == state == held_state_bytes(cache.state, model.config)
    longer = prefilled(model, n=3, room=40)                  # the same after 3 tokens as after 6: fixed
    assert held_state_bytes(longer.state, model.config) == state and longer.nbytes == per_token * 43


def held_state_bytes(state, cfg) -> int:
    """Bytes of the fixed part of a cache's state (not the past tokens' keys a recorded generation keeps)."""
    if state is None:
        return 0
    kind = type(state).__name__
    if kind == "MambaState":                                 # (L, B, …) arrays: the Mamba layers' rows
        layers = [i for i in range(cfg.n_layers) if cfg.layer_kind(i) == "mamba"]
        return sum(state.conv[i].nbytes + state.ssm[i].nbytes for i in layers)
    if kind == "Mamba2State":                                # dicts by layer
        return sum(a.nbytes for a in list(state.conv.values()) + list(state.ssm.values()))
    if kind == "DeltaState":                                 # lists by layer, None for an attention layer
        return sum(a.nbytes for a in state.conv + state.S if a is not None)
    assert kind == "LightningState"
    return sum(a.nbytes for a in state.S.values())


def test_greedy_ids_with_and_without_the_cache_are_the_same(family):
    """Six new tokens greedily, with the cache (K, V rows of the attention layers alone) and without."""
    _, model = family
    mask = np.ones_like(PROMPT)
    ids = {use: np.stack([s.ids for s in decode(model, PROMPT, mask, 6, temperature=0, stop_at_eos=False,
                                                use_cache=use)], axis=1) for use in (True, False)}
    assert ids[True].tolist() == ids[False].tolist()


def test_a_real_jamba_caches_k_and_v_in_an_eighth_of_its_layers():
    """Jamba-v0.1's sizes (32 layers, attention every 8th from 4, 8 K/V heads of 128, E = 8192, N = 16): 4 layers
    of K, V a token, 16,384 bytes in bfloat16 (131,072 if every layer kept them), and 28 Mamba layers' states of
    (3·8192 + 8192·16)·2 bytes whatever the length."""
    hf = json.loads((MODELS / "jamba" / "config.json").read_text())
    hf.update(hidden_size=4096, num_hidden_layers=32, attn_layer_period=8, attn_layer_offset=4,
              num_attention_heads=32, num_key_value_heads=8, mamba_d_state=16, mamba_dt_rank=256,
              intermediate_size=14336, expert_layer_period=2, expert_layer_offset=1, num_experts=16)
    cfg = config_of(hf)
    assert KVCache.kv_layers(cfg) == (4, 12, 20, 28)
    assert KVCache.bytes_per_token(cfg, np.float16) == 4 * 2 * 8 * 128 * 2 == 16_384
    assert KVCache.bytes_per_token(cfg.with_(layer_kinds=("attention",) * 32), np.float16) == 131_072
    assert KVCache.state_bytes(cfg, np.float16) == 28 * (3 * 8192 + 8192 * 16) * 2


def test_a_transformer_keeps_a_row_for_every_layer():
    """Nothing changes for a transformer: a row per layer, row(i) = i."""
    model = qkv.load(MODELS / "llama_gqa")
    cache = KVCache(model.config, 1, 4, dtype=model.dtype)
    assert cache.layers == tuple(range(model.config.n_layers)) == tuple(cache.row(i) for i in cache.layers)
    assert cache.k.shape == (model.config.n_layers, 1, model.config.n_kv_heads, 4, model.config.d_head)
    assert KVCache.state_bytes(model.config) == 0



# ── qkv explain kv-cache on these models ─────────────────────────────────────────

def printed(module, lesson, lang: str) -> str:
    """The page as a reader sees it, 250 columns wide."""
    console = Console(record=True, width=250, highlight=False)
    for part in module.render(lesson, lang):
        console.print(part)
    return console.export_text()


@pytest.mark.parametrize("name", ["jamba", "qwen3_next", "minimax", "granitemoehybrid", "falcon_h1"])
def test_the_lesson_checks_the_attention_layers_and_counts_the_states(name):
    """The lesson runs on every hybrid: its K, V checked against a full pass in the attention layers, the same
    tokens with the cache and without, its FLOPs over the attention layers, and both memories on the page — the
    K, V a token (a count by hand) and the states' fixed bytes (by hand)."""
    from qkv.lessons import kvcache

    attention, per_token, state = KINDS[name]
    model = qkv.load(MODELS / name)
    lesson = kvcache.build(model, "the cat sat on", new_tokens=3, repeats=2)   # 2 repeats: each from the same state
    assert lesson.L_attn == len(attention) and lesson.state_bytes == state and lesson.diff_cache < 1e-4
    assert all(st.same for st in lesson.steps) and max(st.diff for st in lesson.steps) < 1e-4
    assert kvcache.own_layout(lesson.layouts, lesson.H_kv).bytes_per_token == per_token
    text = " ".join(printed(kvcache, lesson, "en").split())
    assert f"{state:,} bytes in all" in text and f"grow by {per_token:,} bytes a token" in text
    assert f"L = {len(attention)} counts the layers that attend, of {model.config.n_layers}" in text
    assert "states still" in text and "상태" in printed(kvcache, lesson, "ko")


def test_the_lesson_draws_the_states_beside_the_k_and_v(tmp_path):
    """The memory panel has the fixed states' line beside the K, V lines (the figure is written)."""
    from qkv.lessons import kvcache

    lesson = kvcache.build(qkv.load(MODELS / "jamba"), "the cat", new_tokens=2, repeats=1)
    written = kvcache.figures(lesson, tmp_path)
    assert {p.suffix for p in written} == {".png", ".svg"} and all(p.stat().st_size for p in written)
    assert "Mamba states (fixed)" in next(p for p in written if p.suffix == ".svg").read_text()


@pytest.mark.parametrize("name", ["mamba", "mamba2"])
def test_the_lesson_refuses_a_stack_without_attention_in_one_line(name):
    """A Mamba stack keeps no K, V at all: one line naming its fixed state and what to run instead."""
    from qkv.lessons import kvcache
    from qkv.runtime.errors import QkvError

    with pytest.raises(QkvError, match=f"keeps no K and V: each of its 2 layers keeps a .*{KINDS[name][2]:,} bytes"):
        kvcache.build(qkv.load(MODELS / name), "the cat")


@pytest.mark.parametrize("name", ["mamba", "jamba", "mamba2", "granitemoehybrid"])
def test_a_scan_keeps_past_tokens_rows_only_when_a_pass_records(name):
    """An unrecorded pass keeps O(1) per scan layer (the conv, the state, the clock S's last row); a pass that
    records keeps each token's Δ, S, B (the keys of its attention rows) for the passes after it; recording over a past
    kept without them is refused in one line. The logits are the same either way."""
    from qkv.core.trace import Recorder
    from qkv.runtime.errors import QkvError

    model = qkv.load(MODELS / name)
    layer = next(i for i in range(model.config.n_layers) if model.config.layer_kind(i) == "mamba")
    one, nxt = np.ones((1, PROMPT.shape[1]), np.int64), np.array([[11]])

    def rows(cache):
        dt = cache.state.dt.get(layer) if isinstance(cache.state.dt, dict) else cache.state.dt[layer]
        return 0 if dt is None else dt.shape[1]

    plain = KVCache(model.config, 1, 8, dtype=model.dtype)
    a = model.last_logits(PROMPT, one, cache=plain)
    b = model.last_logits(nxt, np.ones((1, 7), np.int64), cache=plain)
    assert rows(plain) == 0
    kept = KVCache(model.config, 1, 8, dtype=model.dtype)
    a2 = model.last_logits(PROMPT, one, cache=kept, rec=Recorder(keep=("attentions",)))
    rec = Recorder(keep=("attentions",))
    b2 = model.last_logits(nxt, np.ones((1, 7), np.int64), cache=kept, rec=rec)
    assert rows(kept) == 7 and rec.store[layer]["attentions"].shape[-1] == 7
    np.testing.assert_allclose(a2, a, atol=1e-6), np.testing.assert_allclose(b2, b, atol=1e-6)
    late = KVCache(model.config, 1, 8, dtype=model.dtype)
    model.last_logits(PROMPT, one, cache=late)
    with pytest.raises(QkvError, match="only a recorded pass keeps"):
        model.last_logits(nxt, np.ones((1, 7), np.int64), cache=late, rec=Recorder(keep=("attentions",)))
