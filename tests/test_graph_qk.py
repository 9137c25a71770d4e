"""QK attribution (qkv.graphs.qk): a head's score at (query i, key j) split into a bilinear table over the graph's
nodes, in float64.

Checks: the table sums to the score the real pass recorded ("scores") on families of every kind of position and
norm (RoPE with GQA, learned positions with biases, q/k norms per head and over the projection, ALiBi, a soft-cap,
local and global rotations, per-head LayerNorm q/k norms, a parallel block with partial rotary, a post-norm
encoder); each entry equals the product of the query and key parts a hand-built pass gives (the engine's own
frozen pass, run with every node held and one node taken out); the backward sweep (the default) gives the plain
forward rows' table; naming some nodes sums the others in "rest" and leaves their entries as they were; a key the
query cannot see is one line.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import qkv
from conftest import MODELS
from qkv.core.hooks import Hooks
from qkv.core.stack import transformer
from qkv.core.trace import Recorder
from qkv.features.sae import SAE, SAEConfig
from qkv.graphs.qk import BIAS, REST, parse_pair, qk_table
from qkv.graphs.replacement import replacement
from qkv.runtime.errors import QkvError

TEXT = "the cat sat on the mat"
ARCHS = ("relu", "topk", "jumprelu")


def transcoders(model, seed: int = 0, skip: bool = True, d_sae: int = 40) -> dict[int, SAE]:
    """Random per-layer transcoders of MODEL (ffn_in → ffn_out), the layers' architectures in turn ReLU, TopK and
    JumpReLU, each with a skip W_skip if SKIP: the decomposition must not depend on what they have learnt."""
    rng = np.random.default_rng(seed)
    d = model.config.d_model
    out = {}
    for layer in range(model.config.n_layers):
        arch = ARCHS[layer % 3]
        cfg = SAEConfig(d_in=d, d_sae=d_sae, k=8 if arch == "topk" else None, architecture=arch,
                        apply_b_dec_to_input=False, d_out=d, site="ffn_in", site_out="ffn_out", layer=layer)
        p = {"W_enc": rng.normal(size=(d, d_sae)) / math.sqrt(d), "b_enc": rng.normal(size=d_sae) * 0.1,
             "W_dec": rng.normal(size=(d_sae, d)) * 0.1, "b_dec": rng.normal(size=d) * 0.05}
        if arch == "jumprelu":
            p["threshold"] = np.full(d_sae, 0.05)
        if skip:
            p["W_skip"] = rng.normal(size=(d, d)) * 0.02
        out[layer] = SAE(cfg, p)
    return out


def rep_of(family: str, skip: bool = True, held: tuple[int, ...] = ()):
    model = qkv.load(MODELS / family, dtype=np.float64)
    return replacement(model, TEXT, transcoders(model, skip=skip), held)


@pytest.mark.parametrize("family", ["llama_gqa", "gpt2", "qwen3", "olmo2", "bloom", "gemma2", "gemma3_text",
                                    "stablelm", "phi", "bert"])
def test_the_table_sums_to_the_heads_score(family):
    _sums_to_the_score(rep_of(family))


@pytest.mark.parametrize("family", ["llama_gqa", "gpt2", "gemma2", "phi"])
def test_the_table_sums_to_the_heads_score_with_the_first_token_held(family):
    """Position 0 held (its FFN outputs constants, as a graph holds the attention sink): they join the bias row
    and column, no node of position 0 but its embedding appears, and the table still sums to the score."""
    rep = rep_of(family, held=(0,))
    _sums_to_the_score(rep)
    t = qk_table(rep, rep.model.config.n_layers - 1, 0, 3, 0)          # a key at the sink itself
    assert not any(s.startswith(("F:", "R:")) and s.split(":")[2] == "0" for s in t.queries + t.keys)
    assert t.error <= 1e-9 * max(1.0, abs(t.score))


def _sums_to_the_score(rep):
    cfg, n = rep.model.config, len(rep.ids)
    layer = cfg.n_layers - 1
    for head, (i, j) in [(0, (7, 3)), (cfg.n_heads - 1, (5, 5))]:
        t = qk_table(rep, layer, head, i, j)
        assert t.error <= 1e-9 * max(1.0, abs(t.score))
        assert t.table.shape == (len(t.queries), len(t.keys))
        assert any(s.startswith("F:") for s in t.queries) and any(s.startswith("R:") for s in t.keys)
        assert t.queries[-1] == t.keys[-1] == BIAS
        assert abs(t.total) > 0 and np.count_nonzero(t.table) > 10          # not vacuous
        if not cfg.causal:                                                # an encoder: every position reaches both
            assert f"E:{n - 1}" in t.queries and f"E:{n - 1}" in t.keys
            continue
        # a causal pass: nothing after the query (or the key) reaches its side
        assert all(int(s.split(":")[1 if s[0] == "E" else 2]) <= i for s in t.queries[:-1])
        assert all(int(s.split(":")[1 if s[0] == "E" else 2]) <= j for s in t.keys[:-1])
    if cfg.attn_softcap is not None:
        assert t.rebuilt != pytest.approx(t.total)                        # the cap is applied, not ignored
    if cfg.position == "alibi":
        assert t.position_bias != 0


def held(rep, layer: int, drop: str | None = None, nothing: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """(q (H, n, d_k), k (Hkv, n, d_k)) at LAYER as the engine computes them in the frozen replacement model with
    every node held at its value (the stream entering block 0, each ffn_out; a skip transcoder's x·W_skip on the
    pass's own ffn_in) and the node DROP taken out; NOTHING: every node taken out (only the biases drive it)."""
    model, n = rep.model, len(rep.ids)
    emb = np.zeros_like(rep.embeddings) if nothing else rep.embeddings.copy()
    outs = []
    for l in range(rep.n_layers):
        p = rep.transcoders[l].params
        skip = 0 if "W_skip" not in p else rep.ffn_in[l] @ p["W_skip"]
        outs.append(p["b_dec"] + 0 * rep.ffn_out[l] if nothing else rep.ffn_out[l] - skip)   # (n, d) skip on top
    if drop is not None:
        kind, *at = drop.split(":")
        if kind == "E":
            emb[int(at[0])] = 0
        elif kind == "F":
            l, p, f = map(int, at)
            outs[l][p] -= rep.acts[l][p, f] * rep.transcoders[l].params["W_dec"][f]
        else:
            l, p = map(int, at)
            outs[l][p] -= rep.errors[l][p]
    seen = {}

    def read(x, l):
        seen[l] = x

    def write(_, l):
        w = rep.transcoders[l].params.get("W_skip")
        return outs[l][None] + (0 if w is None else seen[l] @ w)

    spec = rep.frozen_hooks() | {"0.residual": lambda x, l: emb[None], "ffn_in": read, "ffn_out": write}
    rec = Recorder(layers=[layer], keep=("q", "k"))
    transformer(model.weights, model.config, rep.ids[None], np.ones((1, n), np.int64), rec=rec,
                hooks=Hooks(spec, model.config), logits=None)
    return rec.store[layer]["q"][0], rec.store[layer]["k"][0]


@pytest.mark.parametrize("family", ["llama_gqa", "gpt2"])
def test_each_entry_is_the_product_of_a_hand_built_passs_parts(family):
    """T[s, t] = scale·(q − q without s)·(k − k without t): the engine's own q and k (its projections, RoPE and
    GQA), from frozen passes with a node taken out; the constant entry is the pass with every node taken out."""
    rep = rep_of(family)
    cfg = rep.model.config
    layer, head, i, j = 1, cfg.n_heads - 1, 6, 2
    g = head // (cfg.n_heads // cfg.n_kv_heads)
    t = qk_table(rep, layer, head, i, j)
    scale = 1 / math.sqrt(cfg.d_head)
    q_all, k_all = held(rep, layer)
    assert np.allclose(scale * q_all[head, i] @ k_all[g, j], t.score, atol=1e-12)   # the held pass is the real one
    feats_i = [s for s in t.queries if s.startswith("F:0:")][:3]
    feats_j = [s for s in t.keys if s.startswith("F:0:")][:3]
    picks_q = [f"E:{i}", "E:0", f"R:0:{i}", *feats_i]
    picks_k = [f"E:{j}", f"R:0:{j}", *feats_j]
    assert feats_i and feats_j
    q_part = {s: q_all[head, i] - held(rep, layer, s)[0][head, i] for s in picks_q}
    k_part = {s: k_all[g, j] - held(rep, layer, s)[1][g, j] for s in picks_k}
    for s in picks_q:
        for u in picks_k:
            want = scale * q_part[s] @ k_part[u]
            got = t.table[t.queries.index(s), t.keys.index(u)]
            assert got == pytest.approx(want, rel=1e-9, abs=1e-12)
    for s in picks_q:                                                   # a row: that source with the whole key
        assert t.table[t.queries.index(s)].sum() == pytest.approx(scale * q_part[s] @ k_all[g, j], rel=1e-9, abs=1e-12)
    q0, k0 = held(rep, layer, nothing=True)
    assert t.table[-1, -1] == pytest.approx(scale * q0[head, i] @ k0[g, j], rel=1e-9, abs=1e-12)


def test_named_nodes_keep_their_entries_and_the_rest_is_one_row():
    rep = rep_of("llama_gqa")
    full = qk_table(rep, 1, 3, 7, 4)
    named = [s for s in full.queries if s.startswith("F:")][:4] + ["E:4", "R:0:4", "E:7"]
    part = qk_table(rep, 1, 3, 7, 4, nodes=named)
    assert part.error <= 1e-9 and part.queries[-2:] == [REST, BIAS] and part.keys[-2:] == [REST, BIAS]
    assert set(part.queries[:-2]) <= set(named) and len(part.queries) < len(full.queries)
    for a in part.queries[:-2]:
        for b in part.keys[:-2]:
            assert part.table[part.queries.index(a), part.keys.index(b)] == pytest.approx(
                full.table[full.queries.index(a), full.keys.index(b)], rel=1e-9, abs=1e-13)
    assert part.table[-1, -1] == pytest.approx(full.table[-1, -1], rel=1e-9)   # the constant does not move
    assert part.total == pytest.approx(full.total, rel=1e-9)
    text = part.text(5)
    assert "sum check" in text and "rest" in text


def test_top_entries_are_the_largest():
    t = qk_table(rep_of("gpt2"), 1, 0, 5, 1)
    top = t.top(6)
    assert [abs(v) for _, _, v in top] == sorted((abs(v) for _, _, v in top), reverse=True)
    assert abs(top[0][2]) == np.abs(t.table).max()
    rows, cols = t.sides(3)
    assert rows[0][1] == pytest.approx(t.table[t.queries.index(rows[0][0])].sum())


def test_refusals_are_one_line():
    rep = rep_of("llama_gqa", skip=False)
    for args, message in [((1, 0, 2, 5), "cannot see key 5"), ((2, 0, 5, 1), "layer 2 does not exist"),
                          ((1, 9, 5, 1), "head 9 does not exist"), ((1, 0, 50, 1), "position 50 does not exist")]:
        with pytest.raises(QkvError, match=message) as e:
            qk_table(rep, *args)
        assert "\n" not in str(e.value)
    with pytest.raises(QkvError, match="outside the window"):             # Gemma 2's sliding layer: a window of 5
        qk_table(rep_of("gemma2"), 2, 0, 9, 2)
    assert parse_pair("3:5@7,2") == (3, 5, 7, 2)
    for bad in ("3:5", "3@7,2", "a:b@c,d", "3:5@7"):
        with pytest.raises(QkvError, match="LAYER:HEAD@QUERY,KEY"):
            parse_pair(bad)


@pytest.mark.parametrize("family", ["llama_gqa", "gpt2", "qwen3", "olmo2", "gemma2", "phi"])
def test_the_backward_sweep_equals_the_plain_forward_rows(family):
    """backward_parts (one frozen backward sweep, the default) and stream_parts (a batch row per source, the plain
    form) give the same table, for every node and for some named nodes with the rest."""
    rep = rep_of(family)
    layer = rep.model.config.n_layers - 1
    plain = qk_table(rep, layer, 1, 7, 4, method="forward")
    fast = qk_table(rep, layer, 1, 7, 4)
    assert fast.queries == plain.queries and fast.keys == plain.keys
    assert np.abs(fast.table - plain.table).max() <= 1e-12 * max(1.0, np.abs(plain.table).max())
    named = plain.queries[:6] + plain.keys[-8:-1]
    a, b = qk_table(rep, layer, 1, 7, 4, nodes=named, method="forward"), qk_table(rep, layer, 1, 7, 4, nodes=named)
    assert a.queries == b.queries and REST in a.queries
    assert np.abs(a.table - b.table).max() <= 1e-12 * max(1.0, np.abs(a.table).max())
    with pytest.raises(QkvError, match="method"):
        qk_table(rep, layer, 1, 7, 4, method="sideways")
