"""Attribution graphs (qkv.graphs): the local replacement model reproduces the model; every edge is the exact direct
effect of its source on its target's input in the frozen linear system, checked three ways in float64 on tiny
models of many families: the edges into a node plus its constant give its input; each edge equals the change of
the target's input when the source alone is taken out of a forward pass of the frozen system (the engine's
forward with hooks, not the backward that made the edges); pruning and the scores against a hand computation."""

from __future__ import annotations

import numpy as np
import pytest

import qkv
from conftest import MODELS
from qkv.core.hooks import Hooks
from qkv.core.stack import transformer
from qkv.core.trace import Recorder
from qkv.features.sae import SAE, SAEConfig, pre_acts
from qkv.graphs.graph import build_graph, direct_effects, logit_inputs, top_logits
from qkv.graphs.prune import influence, normalized, prune, prune_graph, pruned_scores, scores
from qkv.graphs.replacement import head_gate, replacement, sink_positions, unembed
from qkv.runtime.errors import QkvError

IDS = np.array([3, 17, 5, 9, 12, 4, 8])
EXACT = 1e-9                                     # float64
DECODERS = ["llama_gqa", "gpt2", "gemma2", "phi", "olmo2", "granite", "mixtral", "roberta", "gptj", "qwen3",
            "falcon", "bloom", "cohere", "gpt_neox", "gemma3_text", "stablelm"]
EDGES = ["llama_gqa", "gpt2", "gemma2", "phi", "olmo2", "granite", "mixtral", "roberta", "gptj", "falcon", "bloom",
         "cohere", "qwen3", "gpt_neox", "stablelm", "gemma3_text", "distilbert", "qwen2_moe", "mpt"]


def load(name: str):
    return qkv.load(MODELS / name, dtype=np.float64)


def transcoders(model, d_sae: int = 48, k: int = 6, skip: bool = False, seed: int = 0) -> dict[int, SAE]:
    """Random TopK transcoders reading ffn_in and writing ffn_out (float64), one per layer; skip: with W_skip."""
    d = model.config.d_model
    rng = np.random.default_rng(seed)
    out = {}
    for layer in range(model.config.n_layers):
        params = {"W_enc": rng.standard_normal((d, d_sae)) / np.sqrt(d), "b_enc": 0.1 * rng.standard_normal(d_sae),
                  "W_dec": rng.standard_normal((d_sae, d)) / np.sqrt(d_sae), "b_dec": 0.1 * rng.standard_normal(d)}
        if skip:
            params["W_skip"] = 0.1 * rng.standard_normal((d, d)) / np.sqrt(d)
        out[layer] = SAE(SAEConfig(d_in=d, d_sae=d_sae, k=k, apply_b_dec_to_input=False, d_out=d), params)
    return out


# ── the replacement model ────────────────────────────────────────────────────────

@pytest.mark.parametrize("held", [(), (0, 2)])
@pytest.mark.parametrize("name", DECODERS)
def test_the_replacement_model_gives_the_models_logits(name, held):
    model = load(name)
    rep = replacement(model, IDS, transcoders(model), held)
    for z, e in zip(rep.acts, rep.errors):                              # a held position: no node at all
        assert not z[list(held)].any() and not e[list(held)].any()
    out = model.forward(IDS[None], hooks=rep.hooks())
    assert np.abs(out.logits[0] - rep.logits).max() <= EXACT
    assert np.abs(out.logits[0] - model.forward(IDS[None]).logits[0]).max() <= EXACT
    assert all(np.abs(e).max() > 1e-3 for e in rep.errors)               # the transcoders do miss: errors matter
    assert sum(int((z != 0).sum()) for z in rep.acts) > 0


def test_the_replacement_model_of_a_post_norm_encoder_gives_its_hidden_states():
    model = load("bert")
    rep = replacement(model, IDS, transcoders(model))
    assert rep.logits is None
    out = model.forward(IDS[None], hooks=rep.hooks())
    assert np.abs(out.hidden[0] - rep.hidden).max() <= EXACT


def test_frozen_patterns_and_scales_are_what_makes_it_linear():
    """With the errors fixed and features frozen, doubling the stream entering block 0 moves the frozen system's
    output by exactly what an affine map would; the real model (nothing frozen) does not."""
    model = load("llama_gqa")
    rep = replacement(model, IDS, transcoders(model))
    held = rep.hooks(ffn_out=[o[None] for o in rep.ffn_out])

    def hidden(scale, hooks):
        spec = dict(hooks) | {"0.residual": lambda x, layer: x * scale}
        return model.forward(IDS[None], hooks=spec).hidden[0, -1]
    h0, h1, h2 = (hidden(s, held) for s in (0.0, 1.0, 2.0))
    assert np.abs((h2 - h1) - (h1 - h0)).max() <= EXACT
    r0, r1, r2 = (hidden(s, {}) for s in (0.0, 1.0, 2.0))
    assert np.abs((r2 - r1) - (r1 - r0)).max() > 1e-3


def test_out_norm_scales_are_recorded_and_hooked():
    """Gemma 2's norm on attention's output: its scale is a point of the pass (attn_out_norm_scale), recorded on
    request and replaced by a hook like every norm's."""
    model = load("gemma2")
    trace = model.run(IDS, keep=("attn_out_norm_scale", "ffn_out_norm_scale", "attn_out"))
    s = trace.layer(0).attn_out_norm_scale
    assert s.shape == (len(IDS),) and (s > 0).all()
    doubled = model.run(IDS, keep=("attn_out",), hooks={"0.attn_out_norm_scale": lambda s, layer: 2 * s})
    assert np.allclose(doubled.layer(0).attn_out, trace.layer(0).attn_out / 2, atol=1e-12)
    plain = load("llama_gqa").run(IDS, keep=("attn_out_norm_scale", "attn_out"))
    assert plain.layers[0].attn_out_norm_scale is None                  # no such norm: nothing recorded


# ── the edges ────────────────────────────────────────────────────────────────────

def frozen_inputs(rep, graph_features, logit_ids, held, stream):
    """Each target's input (features' pre-activations (B, F), logits' logit − mean (B, K)) in B forward passes of
    the frozen system: patterns and scales held, ffn_out = HELD (B, L, n, d) (its features, error and b_dec) +
    ffn_in·W_skip (a skip is a path, not a node; none at the positions the graph holds, whose ffn_out is a
    constant), the stream entering block 0 STREAM (B, n, d). The engine's forward with hooks; no backward."""
    model = rep.model
    B, n = len(stream), len(rep.ids)
    seen = {}

    def ffn_out(x, layer):
        skip = rep.transcoders[layer].params.get("W_skip")
        return held[:, layer] + (0 if skip is None else rep.release(seen[layer] @ skip))   # none at rep.held

    spec = rep.frozen_hooks() | {"0.residual": lambda x, layer: stream, "ffn_out": ffn_out,
                                 "ffn_in": lambda x, layer: seen.__setitem__(layer, x)}
    rec = Recorder(keep=("ffn_in",))
    hidden, _ = transformer(model.weights, model.config, np.repeat(rep.ids[None], B, 0), np.ones((B, n), np.int64),
                            rec=rec, hooks=Hooks(spec, model.config), logits=None)
    feats = np.zeros((B, len(graph_features)))
    for j, (layer, p, f) in enumerate(graph_features):
        sae = rep.transcoders[layer]
        feats[:, j] = pre_acts(sae.params, sae.config, rec.store[layer]["ffn_in"][:, p])[:, f]
    gate = head_gate(rep)
    logits = np.stack([unembed(rep, hidden[b, -1], -1, gate) for b in range(B)]) if len(logit_ids) else None
    return feats, (None if logits is None else logits[:, logit_ids] - logits.mean(axis=1, keepdims=True))


def check_edges(rep, features, acts, A, logit_ids):
    """Every column of A (each source node) against taking that source out of the frozen forward."""
    L, n, F = rep.n_layers, len(rep.ids), len(features)
    K = len(logit_ids)
    real_out = np.stack([o - (0 if rep.transcoders[l].params.get("W_skip") is None
                              else rep.ffn_in[l] @ rep.transcoders[l].params["W_skip"])
                         for l, o in enumerate(rep.ffn_out)])             # (L, n, d) all but the skip
    real_out[:, list(rep.held)] = np.stack(rep.ffn_out)[:, list(rep.held)]   # held: the whole ffn_out, a constant
    cols, outs, streams = [], [], []
    for j, (layer, p, f) in enumerate(features):                          # a feature's a·W_dec[f] taken out
        o = real_out.copy()
        o[layer, p] -= acts[j] * rep.transcoders[layer].params["W_dec"][f]
        cols.append(j), outs.append(o), streams.append(rep.embeddings)
    for layer in range(L):                                                # an error taken out
        for p in range(n):
            o = real_out.copy()
            o[layer, p] -= rep.errors[layer][p]
            cols.append(F + layer * n + p), outs.append(o), streams.append(rep.embeddings)
    for p in range(n):                                                    # an embedding taken out
        e = rep.embeddings.copy()
        e[p] = 0
        cols.append(F + L * n + p), outs.append(real_out), streams.append(e)
    base_f, base_l = frozen_inputs(rep, features, logit_ids, real_out[None], rep.embeddings[None])
    got_f, got_l = frozen_inputs(rep, features, logit_ids, np.stack(outs), np.stack(streams))
    targets = np.r_[0:F, len(A) - K:len(A)]
    expect = np.concatenate([base_f - got_f] + ([base_l - got_l] if K else []), axis=1)   # (sources, targets)
    diff = np.abs(A[np.ix_(targets, cols)] - expect.T)
    return diff.max(), np.abs(expect).max()


@pytest.mark.parametrize("name", EDGES)
def test_edges_plus_constant_give_each_input(name):
    model = load(name)
    graph = build_graph(model, IDS, transcoders(model), chunk=5)      # several sweeps, several starting blocks
    A, F, K = graph.adjacency, graph.n_features, len(graph.logit_ids)
    rows = np.r_[0:F, len(A) - K:len(A)]
    assert np.abs(A[rows].sum(axis=1) + graph.constants[rows] - graph.inputs[rows]).max() <= EXACT
    assert np.abs(graph.inputs[rows]).max() > 0.5
    assert not A[F:len(A) - K].any()                                    # errors and embeddings have no inputs


def test_a_graph_holds_a_causal_models_first_token_unless_told():
    """By default the attention sink (a causal model's position 0) is a constant: no feature or error node there,
    its FFN outputs in the constants; held=() gives it nodes; an encoder holds nothing."""
    model = load("llama_gqa")
    tcs = transcoders(model, skip=True)
    held, kept = build_graph(model, IDS, tcs, target=5), build_graph(model, IDS, tcs, target=5, held=())
    assert held.rep.held == (0,) and kept.rep.held == ()
    assert (held.features[:, 1] > 0).all() and (kept.features[:, 1] == 0).any()
    at = held.slices()
    first_errors = at["error"].start + np.arange(model.config.n_layers) * held.n_pos      # (L,) position 0's
    assert not held.adjacency[:, first_errors].any() and kept.adjacency[:, first_errors - at["error"].start
                                                                        + kept.slices()["error"].start].any()
    for g in (held, kept):                                              # both are exact
        A, F, K = g.adjacency, g.n_features, len(g.logit_ids)
        rows = np.r_[0:F, len(A) - K:len(A)]
        assert np.abs(A[rows].sum(axis=1) + g.constants[rows] - g.inputs[rows]).max() <= EXACT
    worst, scale = check_edges(kept.rep, kept.features, kept.activations, kept.adjacency, kept.logit_ids)
    assert worst <= EXACT and scale > 0.1
    assert sink_positions(load("bert"), len(IDS)) == () and sink_positions(model, 1) == ()
    with pytest.raises(QkvError, match="cannot hold positions"):
        replacement(model, IDS, tcs, (len(IDS),))
    with pytest.raises(QkvError, match="every position"):
        replacement(model, IDS[:2], tcs, (0, 1))


@pytest.mark.parametrize("name", EDGES)
def test_edges_equal_the_frozen_systems_direct_effects(name):
    model = load(name)
    graph = build_graph(model, IDS, transcoders(model, skip=name in ("llama_gqa", "phi")), target=5, chunk=16)
    worst, scale = check_edges(graph.rep, graph.features, graph.activations, graph.adjacency, graph.logit_ids)
    assert worst <= EXACT and scale > 0.1


def test_a_post_norm_encoders_feature_edges():
    """BERT (post-norm, no LM head): the graph of its features alone, checked both ways."""
    model = load("bert")
    rep = replacement(model, IDS, transcoders(model))
    features, acts, A = direct_effects(rep, np.zeros(0, np.int64), chunk=9)
    worst, scale = check_edges(rep, features, acts, A, np.zeros(0, np.int64))
    assert worst <= EXACT and scale > 0.1
    from qkv.graphs.graph import constants
    consts, _ = constants(rep, features, np.zeros(0, np.int64))
    inputs = np.array([pre_acts(rep.transcoders[l].params, rep.transcoders[l].config, rep.ffn_in[l][p])[f]
                       for l, p, f in features])
    assert np.abs(A[:len(features)].sum(axis=1) + consts - inputs).max() <= EXACT


def test_logit_nodes_are_before_the_soft_cap():
    model = load("gemma2")
    graph = build_graph(model, IDS, transcoders(model))
    at = graph.slices()
    capped = graph.rep.logits[-1]
    raw = np.arctanh(capped / model.config.final_softcap) * model.config.final_softcap
    assert np.allclose(graph.inputs[at["logit"]], (raw - raw.mean())[graph.logit_ids], atol=1e-9)
    assert np.allclose(logit_inputs(graph.rep, graph.rep.hidden[-1], graph.logit_ids), graph.inputs[at["logit"]])


def test_the_logits_chosen():
    p = np.array([0.5, 0.05, 0.3, 0.14, 0.01])
    assert top_logits(p).tolist() == [0, 2, 3, 1]                           # 0.94 < 0.95 ≤ 0.99
    assert top_logits(p, cover=0.8).tolist() == [0, 2]                      # 0.8 reached exactly
    assert top_logits(p, most=2).tolist() == [0, 2]
    assert top_logits(p, most=2, target=4).tolist() == [0, 2, 4]
    assert top_logits(p, target=2).tolist() == [0, 2, 3, 1]


def test_chunking_does_not_change_the_graph():
    model = load("phi")
    tc = transcoders(model)
    a, b = build_graph(model, IDS, tc, chunk=1), build_graph(model, IDS, tc, chunk=1000)
    assert np.abs(a.adjacency - b.adjacency).max() <= 1e-12


def test_the_value_paths_two_forms_agree():
    """value_path's product over all rows at once (one pattern, the graph's targets) equals its plain form
    A_hᵀ·dZ_h row by row (a pattern per row), GQA's groups summed."""
    from qkv.core.blocks_backward import AttentionTape, value_path
    from qkv.core.weights import AttentionWeights

    rng = np.random.default_rng(1)
    B, H, Hkv, n, dk, d = 5, 6, 2, 7, 4, 10
    a = rng.random((1, H, n, n))
    w = AttentionWeights(W_Q=None, W_K=None, W_V=rng.standard_normal((d, Hkv * dk)),
                         W_O=rng.standard_normal((H * dk, d)))
    tape = AttentionTape(None, np.zeros((1, H, n, dk)), None, np.zeros((1, Hkv, n, dk)), a, None, None)
    dout = rng.standard_normal((B, n, d))
    one, _ = value_path(dout, w, tape)
    each, _ = value_path(dout, w, AttentionTape(None, tape.q, None, tape.v, np.repeat(a, B, 0), None, None))
    assert np.abs(one - each).max() <= 1e-12
    dz = (dout @ w.W_O.T).reshape(B, n, H, dk)                                   # by the formula, head by head
    dv = np.zeros((B, n, Hkv, dk))
    for h in range(H):
        dv[:, :, h // (H // Hkv)] += np.einsum("ij,bid->bjd", a[0, h], dz[:, :, h])
    assert np.abs(one - dv.reshape(B, n, -1) @ w.W_V.T).max() <= 1e-12


# ── pruning and scores ───────────────────────────────────────────────────────────

def hand_graph() -> tuple[np.ndarray, np.ndarray]:
    """Nodes [f0, f1, e0, t0, l0]: t0 → f0 (2), f0 → f1 (1), e0 → f1 (−1), f1 → l0 (3), t0 → l0 (1); l0's
    probability 1. By hand: Â rows f0 {t0: 1}, f1 {f0: ½, e0: ½}, l0 {f1: ¾, t0: ¼}; influence
    f0 ⅜, f1 ¾, e0 ⅜, t0 ¼ + ⅜ = ⅝, l0 0."""
    A = np.zeros((5, 5))
    A[0, 3], A[1, 0], A[1, 2], A[4, 1], A[4, 3] = 2, 1, -1, 3, 1
    return A, np.array([0, 0, 0, 0, 1.0])


def test_influence_and_scores_by_hand():
    A, w = hand_graph()
    inf = influence(normalized(A), w)
    assert np.allclose(inf, [3 / 8, 3 / 4, 3 / 8, 5 / 8, 0])
    A_hat = normalized(A)
    assert np.allclose(inf, w @ (np.linalg.inv(np.eye(5) - A_hat) - np.eye(5)))   # the series' closed form
    errors, tokens = np.array([0, 0, 1, 0, 0], bool), np.array([0, 0, 0, 1, 0], bool)
    replacement_score, completeness = scores(A, w, errors, tokens)
    assert replacement_score == pytest.approx(5 / 8)                    # ⅝ / (⅝ + ⅜)
    assert completeness == pytest.approx(2.75 / 3.125)                  # f1 half explained, weighted by influence + w


def test_the_threshold_by_blocks_is_the_plain_one():
    from qkv.graphs.prune import threshold

    scores_ = np.random.default_rng(2).random(1000) ** 4
    ranked = np.sort(scores_)[::-1]
    for fraction in (0.0, 0.3, 0.8, 0.98, 1.0):
        plain = ranked[min(int(np.searchsorted(np.cumsum(ranked) / ranked.sum(), fraction)), 999)]
        assert threshold(scores_, fraction, block=7) == threshold(scores_, fraction) == plain
    assert threshold(np.zeros(0), 0.5) == 0.0


def test_pruning_by_hand():
    A, w = hand_graph()
    kept = prune(A, w, n_features=2, n_fixed=2, node_threshold=0.8, edge_threshold=0.98)
    assert kept.node_mask.all()                                         # ⅜ reaches 0.8 of the influence
    kept = prune(A, w, n_features=2, n_fixed=2, node_threshold=0.5, edge_threshold=0.98)
    # f0 and e0 fall under the threshold; f1 is then left without an incoming edge and goes too
    assert kept.node_mask.tolist() == [False, False, False, True, True]
    assert np.argwhere(kept.edge_mask).tolist() == [[4, 3]]
    errors, tokens = np.array([0, 0, 1, 0, 0], bool), np.array([0, 0, 0, 1, 0], bool)
    r, c = pruned_scores(A, w, errors, tokens, kept.node_mask)
    assert r == pytest.approx(0.25) and c == pytest.approx(0.625)       # f1's ¾ now counts as error


def test_pruning_a_real_graph_keeps_the_logits_and_scores_are_fractions():
    model = load("llama_gqa")
    graph = build_graph(model, IDS, transcoders(model))
    kept, s = prune_graph(graph, 0.8, 0.98)
    at = graph.slices()
    assert kept.node_mask[at["logit"]].all() and kept.node_mask[at["embedding"]].all()
    assert 0 < kept.node_mask[at["feature"]].sum() < graph.n_features
    assert all(0 <= s[k] <= 1 for k in s), s
    assert s["replacement_pruned"] <= s["replacement"] + 1e-12
    assert not kept.edge_mask[~kept.node_mask].any() and not kept.edge_mask[:, ~kept.node_mask].any()
    errors, tokens = np.zeros(len(graph.adjacency), bool), np.zeros(len(graph.adjacency), bool)
    errors[at["error"]], tokens[at["embedding"]] = True, True
    w = graph.logit_weights()                                           # the plain forms of what prune_graph shares
    assert (s["replacement"], s["completeness"]) == pytest.approx(scores(graph.adjacency, w, errors, tokens))
    assert (s["replacement_pruned"], s["completeness_pruned"]) == pytest.approx(
        pruned_scores(graph.adjacency, w, errors, tokens, kept.node_mask))
    loose, s1 = prune_graph(graph, 1.0, 1.0)
    assert loose.node_mask.sum() >= kept.node_mask.sum()


def test_mistakes_are_one_error():
    model = load("llama_gqa")
    tc = transcoders(model)
    with pytest.raises(QkvError, match="no transcoder for layer"):
        replacement(model, IDS, {0: tc[0]})
    narrow = SAE(SAEConfig(d_in=3, d_sae=4, k=2, apply_b_dec_to_input=False, d_out=3),
                 {"W_enc": np.zeros((3, 4)), "b_enc": np.zeros(4), "W_dec": np.zeros((4, 3)), "b_dec": np.zeros(3)})
    with pytest.raises(QkvError, match="d_model"):
        replacement(model, IDS, tc | {1: narrow})
    with pytest.raises(QkvError, match="threshold"):
        prune_graph(build_graph(model, IDS, tc), 1.5, 0.9)
    with pytest.raises(QkvError, match="not one token"):
        build_graph(model, "hello", tc, target="definitely not one token")
    with pytest.raises(QkvError, match="outside the vocabulary"):
        build_graph(model, IDS, tc, target=10**9)
    with pytest.raises(QkvError, match="max_logits"):
        build_graph(model, IDS, tc, max_logits=0)
    bert = load("bert")
    with pytest.raises(QkvError, match="no LM head"):
        build_graph(bert, IDS, transcoders(bert))
    with pytest.raises(QkvError, match="single-stack text model"):
        replacement(qkv.load(MODELS / "whisper"), IDS, tc)
