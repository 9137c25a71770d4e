"""`qkv explain circuits`: one small attribution graph walked step by step (README "Circuits"), every number
recomputed another way and checked before it prints.

    ① the FFN box at one layer and position: what it reads h (after its norm), what joins the stream y;
      the transcoder's reconstruction ŷ = z·W_dec + b_dec (+ h·W_skip) and the error e = y − ŷ
    ② the active features there: each activation z_f and the tokens its decoder row W_dec[f] promotes
      (through the final norm's γ and W_vocab, as the logit lens reads the stream)
    ③ the local replacement model: patterns and norm scales frozen, each FFN read as transcoder + error:
      its logits equal the model's
    ④ one edge: the strongest direct effect into the top logit, A[t, s] = (what s writes) · ∂input_t/∂(where it
      writes), and the check Σ_s A[t, s] + constant_t = input_t
    ⑤ the graph's replacement and completeness scores

The lesson lives in graphs/ (it needs qkv.graphs and qkv.features, which come after lessons/ in the folders'
order); cli/explain.py registers it as the topic "circuits" (qkv.lessons.register). It exposes what every topic
module does: DEFAULT_MODEL, build, render, figures (none: the graph's page is `qkv graph … --page`).

The checks, each against a computation that shares nothing with the number it checks but the weights:
    ① the FFN's output redone in float64 from the layer's weights against the engine's ffn_out; the transcoder's
      activations and reconstruction redone in float64 (TopK by argsort); ŷ + e = y
    ② each feature's promoted logits redone in float64 from W_vocab
    ③ the replacement model's logits against the model's
    ④ the edge redone by a forward pass of the frozen system with every FFN output held and the source's vector
      taken out (the difference in the logit's input is the edge: the system is linear in what is held);
      the logit's input against the model's own logit − mean logit
    ⑤ the scores redone by one pass over the layers from the top (influence_s = Σ_t (w_t + influence_t)·Â[t, s]),
      instead of the engine's power series
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
from rich.text import Text

from ..core.blocks import activation_of, linear, unembed_in
from ..core.hooks import Hooks
from ..core.layer import joined as into_stream
from ..core.stack import transformer
from ..core.weights import MoEWeights
from ..lessons import Page, same
from ..lessons.attention import DEFAULT_TEXT, norm_of
from ..runtime.errors import QkvError
from ..runtime.stored import StoredMatrix
from ..viz.words import texts
from ..writing.nexttoken import token_text
from .graph import Graph, build_graph, logit_inputs
from .prune import scores

TEXTS = texts("circuits")          # {language: its words}
DEFAULT_MODEL = "smollm2"
TOP = 5                            # features listed in ②
TOKENS = 4                         # tokens each feature promotes
MAX_LOGITS = 3                     # logit nodes of the graph
TOL = 1e-3                         # the engine's float32 against float64, relative to the largest value
TRAIN = "qkv transcoders train --model smollm2 --corpus english --tokens 3000000 --latents 4608 --k 32 --out DIR"
MISSING = ("qkv explain circuits reads one transcoder per layer of the model: give --transcoders DIR (any layout "
           "qkv graph reads); to train them: " + TRAIN)


@dataclass
class Feature:
    index: int
    z: float                                   # its activation
    promoted: list[tuple[str, float]]          # the tokens W_dec[f] raises most, with their logits


@dataclass
class Edge:
    kind: str                                  # "feature", "error", "embedding"
    layer: int | None                          # None: an embedding
    pos: int
    feature: int | None
    value: float                               # a feature's activation; an error's or embedding's ‖vector‖
    gradient: float                            # ∂input_t/∂value: the edge per unit of value
    weight: float                              # A[t, s] = value · gradient
    share: float                               # |A[t, s]| / Σ_s |A[t, s]|
    held: float                                # the edge redone by taking the source out of the frozen pass


@dataclass
class Lesson:
    model: str
    text: str
    tokens: list[str]
    layer: int
    L: int
    pos: int
    d_model: int
    d_sae: int
    k: int | None
    architecture: str
    skip: bool
    h: np.ndarray                              # (d_model,) what the FFN reads
    y: np.ndarray                              # (d_model,) what joins the stream
    recon: np.ndarray                          # (d_model,) the transcoder's ŷ
    error: np.ndarray                          # (d_model,) y − ŷ
    n_active: int
    features: list[Feature]
    logit_token: str
    logit_value: float                         # logit − mean logit of the top token
    probability: float
    constant: float
    edges_sum: float
    n_sources: int                             # non-zero incoming edges of the logit
    edge: Edge                                 # the strongest incoming edge
    feature_edge: Edge | None                  # the strongest from a feature, when the strongest is not one
    n_nodes: dict[str, int]
    replacement: float
    completeness: float
    diffs: dict[str, float]


def build(model, text: str | None = None, *, transcoders=None, layer: int | None = None) -> Lesson:
    """The lesson on TEXT (default the guide's sentence) with TRANSCODERS ({layer: SAE}, one per layer), following
    the FFN of LAYER (default the middle one) at the last token; every number checked (RuntimeError: a bug)."""
    if transcoders is None:
        raise QkvError(MISSING)
    text = text or DEFAULT_TEXT
    cfg = model.config
    if not hasattr(model.weights, "blocks") or getattr(cfg, "encoder_decoder", False):
        raise QkvError(f"{model.name} is not a single-stack text model; qkv explain circuits reads a decoder, "
                       "e.g. --model smollm2")
    layer = cfg.n_layers // 2 if layer is None else model.check_layer(layer)
    if isinstance(model.weights.blocks[layer].ffn, MoEWeights):
        raise QkvError(f"layer {layer} of {model.name} is a routed FFN (MoE); choose a model with dense FFNs")
    graph = build_graph(model, text, transcoders, max_logits=MAX_LOGITS)
    rep = graph.rep
    pos = len(rep.ids) - 1
    sae = rep.transcoders[layer]
    diffs: dict[str, float] = {}

    h, y = rep.ffn_in[layer][pos].astype(np.float64), rep.ffn_out[layer][pos].astype(np.float64)
    diffs["ffn"] = same("the FFN's output redone from its weights, against the engine's ffn_out",
                        _ffn(model, layer, h), y, TOL, rel=True)
    z32, recon32 = rep.transcode(layer, rep.ffn_in[layer][pos:pos + 1])
    z, recon = _transcoder64(sae, h)
    diffs["z"] = same("the transcoder's activations redone in float64", z, z32[0], TOL, rel=True)
    diffs["recon"] = same("the transcoder's reconstruction redone in float64", recon, recon32[0], TOL, rel=True)
    error = rep.errors[layer][pos].astype(np.float64)
    diffs["sum"] = same("reconstruction + error against the FFN's output", recon + error, y, TOL, rel=True)

    active = np.flatnonzero(z)
    top = active[np.argsort(-z[active], kind="stable")][:TOP]
    features = _features(model, sae, z, top, diffs)

    hooks = Hooks(rep.hooks(), cfg)
    _, logits = transformer(model.weights, cfg, rep.ids[None], np.ones((1, len(rep.ids)), np.int64), hooks=hooks)
    diffs["logits"] = same("the replacement model's logits against the model's", logits[0, -1], rep.logits[-1],
                           TOL, rel=True)

    at = graph.slices()
    t = at["logit"].start                                     # the most probable token's node
    tid = int(graph.logit_ids[0])
    real = rep.logits[-1].astype(np.float64)
    diffs["input"] = same("the top logit's input against the model's logit − mean logit", graph.inputs[t],
                          real[tid] - real.mean(), TOL, rel=True)
    row = graph.adjacency[t].astype(np.float64)               # (N,)
    diffs["edges"] = same("Σ incoming edges + constant against the logit's input", row.sum() + graph.constants[t],
                          graph.inputs[t], TOL, rel=True)
    before = row[:at["logit"].start]
    edge = _edge(graph, int(np.argmax(np.abs(before))), tid, row)
    diffs["edge"] = same("the strongest edge redone by a held forward pass", edge.held, edge.weight, TOL,
                         rel=True)
    feature_edge = None
    if edge.kind != "feature" and np.any(before[at["feature"]]):
        feature_edge = _edge(graph, int(np.argmax(np.abs(before[at["feature"]]))), tid, row)
        diffs["feature_edge"] = same("the strongest feature's edge redone by a held forward pass", feature_edge.held,
                                     feature_edge.weight, TOL, rel=True)

    errs, embs = _masks(graph)
    rep_score, comp_score = scores(graph.adjacency, graph.logit_weights(), errs, embs)
    mine = _scores64(graph, errs, embs)
    diffs["scores"] = same("replacement and completeness redone layer by layer", mine, (rep_score, comp_score), 1e-4)

    probs = np.exp(real - real.max())
    probs /= probs.sum()
    return Lesson(model=model.name, text=text, tokens=[_label(model, i) for i in rep.ids], layer=layer, L=cfg.n_layers, pos=pos,
                  d_model=cfg.d_model, d_sae=sae.config.d_sae, k=sae.config.k, architecture=sae.config.architecture,
                  skip="W_skip" in sae.params, h=h, y=y, recon=recon, error=error, n_active=len(active),
                  features=features, logit_token=_label(model, tid), logit_value=float(graph.inputs[t]),
                  probability=float(probs[tid]), constant=float(graph.constants[t]), edges_sum=float(row.sum()),
                  n_sources=int(np.count_nonzero(row)), edge=edge, feature_edge=feature_edge,
                  n_nodes={k: s.stop - s.start for k, s in at.items()}, replacement=rep_score,
                  completeness=comp_score, diffs=diffs)


# ── ① the FFN and its transcoder, in float64 ─────────────────────────────────────

def _ffn(model, layer: int, h: np.ndarray) -> np.ndarray:
    """What the FFN of LAYER adds to the stream for its input h (d_model,), from its weights in float64."""
    cfg, w = model.config, model.weights.blocks[layer]
    f = w.ffn

    def dense(m):
        return None if m is None else np.asarray(m.dequantized() if isinstance(m, StoredMatrix) else m, np.float64)

    W_in, W_gate, W_out = dense(f.W_in), dense(f.W_gate), dense(f.W_out)
    u = h @ W_in + (0 if f.b_in is None else np.asarray(f.b_in, np.float64))          # (d_ff,)
    act = activation_of(f, cfg)                                                        # xIELU: its own scalars
    g = None if W_gate is None else h @ W_gate + (0 if f.b_gate is None else np.asarray(f.b_gate, np.float64))
    a = act(u) if g is None else act(g) * u                                            # (d_ff,)
    y = a @ W_out + (0 if f.b_out is None else np.asarray(f.b_out, np.float64))         # (d_model,)
    if w.ffn_out_norm is not None:
        nw = w.ffn_out_norm
        y = norm_of(y, np.asarray(nw.weight, np.float64), None if nw.bias is None else np.asarray(nw.bias, np.float64),
                    cfg.norm, cfg.norm_eps)
    return into_stream(y, cfg)


def _transcoder64(sae, h: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(z (d_sae,), ŷ (d_out,)) of SAE on h (d_in,) in float64, written out: pre = h·W_enc + b_enc (− b_dec first
    where the config says so), then TopK (the k largest, ReLU), JumpReLU (above θ) or ReLU."""
    p = {k: np.asarray(v, np.float64) for k, v in sae.params.items()}
    cfg = sae.config
    pre = (h - p["b_dec"] if cfg.apply_b_dec_to_input else h) @ p["W_enc"] + p["b_enc"]    # (d_sae,)
    z = np.zeros_like(pre)
    if cfg.architecture == "topk":
        keep = np.argsort(-pre, kind="stable")[:cfg.k]
        z[keep] = np.maximum(pre[keep], 0)
    elif cfg.architecture == "jumprelu":
        z = np.where(pre > p["threshold"], pre, 0.0)
    else:
        z = np.maximum(pre, 0)
    recon = z @ p["W_dec"] + p["b_dec"] + (h @ p["W_skip"] if "W_skip" in p else 0)
    return z, recon


# ── ② what the top features write ────────────────────────────────────────────────

def _features(model, sae, z: np.ndarray, top: np.ndarray, diffs: dict) -> list[Feature]:
    """The TOP features with their promoted tokens: W_dec[f]·γ·W_vocab (the engine's float32 product), checked
    against the same in float64."""
    w, cfg = model.weights, model.config
    rows = np.asarray(sae.params["W_dec"])[top]                                         # (k, d)
    if len(top) == 0 or w.W_vocab is None or getattr(w, "W_head", None) is not None:
        return [Feature(int(f), float(z[f]), []) for f in top]
    v = rows.astype(np.float32)
    gamma = None if w.final_norm is None else np.asarray(w.final_norm.weight, np.float64)
    if w.final_norm is not None:
        v = v - v.mean(axis=-1, keepdims=True) if cfg.norm == "layer" else v
        v = v * w.final_norm.weight
    zs = linear(unembed_in(v, w), w.W_vocab) * np.float32(cfg.logit_scale)              # (k, V)
    r64 = rows.astype(np.float64)
    if cfg.norm == "layer" and gamma is not None:
        r64 = r64 - r64.mean(axis=-1, keepdims=True)
    W = w.W_vocab
    W64 = np.asarray(W.dequantized() if isinstance(W, StoredMatrix) else W, np.float64)  # (d, V)
    z64 = ((r64 if gamma is None else r64 * gamma) @ W64) * cfg.logit_scale
    diffs["promoted"] = same("the features' promoted logits redone in float64", zs, z64, TOL, rel=True)
    out = []
    for r, f in enumerate(top):
        best = np.argsort(-z64[r], kind="stable")[:TOKENS]
        out.append(Feature(int(f), float(z[f]), [(_label(model, i), float(z64[r, i])) for i in best]))
    return out


def _label(model, i) -> str:
    return token_text(model.tokenizer, int(i)) if model.tokenizer is not None else f"#{int(i)}"


# ── ④ one edge, redone by a held forward pass ────────────────────────────────────

def _edge(graph: Graph, s: int, tid: int, row: np.ndarray) -> Edge:
    """The edge from node S into the logit node of token TID, ROW that node's incoming edges (N,): what it is, and
    the edge redone as input_t(every FFN output held) − input_t(the same, the source's vector taken out)."""
    rep, at = graph.rep, graph.slices()
    n = len(rep.ids)
    if s < at["error"].start:
        layer, pos, f = (int(v) for v in graph.features[s])
        a = float(graph.activations[s])
        vector = a * np.asarray(rep.transcoders[layer].params["W_dec"][f], np.float64)
        kind, value = "feature", a
    elif s < at["embedding"].start:
        layer, pos = divmod(s - at["error"].start, n)
        f, kind = None, "error"
        vector = rep.errors[layer][pos].astype(np.float64)
        value = float(np.linalg.norm(vector))
    else:
        layer, pos, f, kind = None, s - at["embedding"].start, None, "embedding"
        vector = rep.embeddings[pos].astype(np.float64)
        value = float(np.linalg.norm(vector))
    held = _held_input(rep, tid, None, None, None) - _held_input(rep, tid, layer, pos, vector)
    weight = float(row[s])
    return Edge(kind, layer, pos, f, value, weight / value if value else 0.0, weight,
                float(abs(row[s]) / max(np.abs(row).sum(), 1e-300)), float(held))


def _held_input(rep, tid: int, layer: int | None, pos: int | None, vector: np.ndarray | None) -> float:
    """logit_tid − mean logit of the frozen pass with every FFN output held at the real pass's; with VECTOR (d,)
    taken out at POS of LAYER's FFN output (LAYER None: of the stream entering block 0)."""
    model = rep.model
    outs = [o[None].copy() for o in rep.ffn_out]                                        # L × (1, n, d)
    extra = {}
    if vector is not None and layer is not None:
        outs[layer][0, pos] -= vector.astype(outs[layer].dtype)
    elif vector is not None:
        def less(x, _):
            x = x.copy()
            x[:, pos] -= vector.astype(x.dtype)
            return x
        extra = {"0.residual": less}
    hooks = Hooks(rep.hooks(extra=extra, ffn_out=outs), model.config)
    n = len(rep.ids)
    hidden, _ = transformer(model.weights, model.config, rep.ids[None], np.ones((1, n), np.int64), hooks=hooks,
                            logits=None)
    return float(logit_inputs(rep, hidden[0, -1].astype(np.float64), np.array([tid]))[0])


# ── ⑤ the scores, layer by layer ─────────────────────────────────────────────────

def _masks(graph: Graph) -> tuple[np.ndarray, np.ndarray]:
    at, N = graph.slices(), len(graph.adjacency)
    errors, embeddings = np.zeros(N, bool), np.zeros(N, bool)
    errors[at["error"]] = True
    embeddings[at["embedding"]] = True
    return errors, embeddings


def _scores64(graph: Graph, errors: np.ndarray, embeddings: np.ndarray) -> tuple[float, float]:
    """(replacement, completeness) in float64 by one pass from the top layer down: a node's influence is
    Σ_t (w_t + influence_t)·Â[t, s] over its targets t, which all sit in higher layers (or are logits)."""
    A, at, L = graph.adjacency, graph.slices(), graph.n_layers
    N = len(A)
    level = np.full(N, L)                                                               # logits: above every layer
    level[at["feature"]] = graph.features[:, 0]
    level[at["error"]] = np.repeat(np.arange(L), graph.n_pos)
    level[at["embedding"]] = -1
    sums = np.maximum(np.abs(A).sum(axis=1, dtype=np.float64), 1e-10)                   # (N,)
    w = graph.logit_weights()
    inf = np.zeros(N)
    for lv in range(L - 1, -2, -1):
        cols, upper = np.flatnonzero(level == lv), np.flatnonzero(level > lv)
        if len(cols):
            inf[cols] = ((w + inf)[upper] / sums[upper]) @ np.abs(A[np.ix_(upper, cols)].astype(np.float64))
    tok, err = inf[embeddings].sum(), inf[errors].sum()
    replacement = tok / (tok + err) if tok + err > 0 else 0.0
    explained = 1 - np.abs(A[:, errors]).sum(axis=1, dtype=np.float64) / sums
    return float(replacement), float((explained * (inf + w)).sum() / (inf + w).sum())


# ── the page ─────────────────────────────────────────────────────────────────────

def _vec(x: np.ndarray, k: int = 4) -> str:
    return "[" + ", ".join(f"{v:+.3f}" for v in x[:k]) + (", …" if len(x) > k else "") + "]"


def render(lesson: Lesson, lang: str = "en") -> list:
    """The lesson's page in LANG: rules, sentences and tables (rich renderables)."""
    p, le = Page(TEXTS, lang), lesson
    tok = le.tokens[le.pos]
    ny, nr, ne = (float(np.linalg.norm(v)) for v in (le.y, le.recon, le.error))
    out = [p.rule("title", bold=True, model=le.model, layer=le.layer, L=le.L, token=tok), p.say("intro"), Text("")]

    arch = f"TopK, k = {le.k}" if le.architecture == "topk" else le.architecture
    out += [p.rule("s_box", layer=le.layer, token=tok),
            p.say("box", d_model=le.d_model, d_sae=le.d_sae, arch=arch),
            p.say("box_skip" if le.skip else "box_plain"),
            Text(f"  h  = {_vec(le.h)}   ‖h‖ = {np.linalg.norm(le.h):.3f}"),
            Text(f"  y  = {_vec(le.y)}   ‖y‖ = {ny:.3f}"),
            Text(f"  ŷ  = {_vec(le.recon)}   ‖ŷ‖ = {nr:.3f}"),
            Text(f"  e  = {_vec(le.error)}   ‖e‖ = {ne:.3f}"),
            p.say("box_error", rel=ne / max(ny, 1e-300), fvu=ne ** 2 / max(ny ** 2, 1e-300)),
            p.say("box_check", ffn=le.diffs["ffn"], recon=le.diffs["recon"], sum=le.diffs["sum"]), Text("")]

    out += [p.rule("s_features"), p.say("features", n=le.n_active, d_sae=le.d_sae, top=len(le.features))]
    tab = p.table("col_feature", "col_z", "col_promoted")
    for f in le.features:
        p.row(tab, f.index, f"{f.z:.3f}", "  ".join(f"{t} {v:+.2f}" for t, v in f.promoted), bold_first=True)
    out += [tab, p.say("features_end"), Text("")]

    out += [p.rule("s_replacement"), p.say("replacement_model"),
            p.say("replacement_check", diff=le.diffs["logits"], token=le.logit_token, prob=le.probability), Text("")]

    e = le.edge
    out += [p.rule("s_edge", token=le.logit_token),
            p.say("edge_target", token=le.logit_token, value=le.logit_value, n=le.n_sources),
            p.say("edge_strongest", source=_source(p, le, e), share=e.share), _product(e),
            p.say("edge_means"),
            p.say("edge_held", held=e.held, moved=-e.held, diff=le.diffs["edge"])]
    if le.feature_edge is not None:
        f = le.feature_edge
        out += [p.say("edge_feature", source=_source(p, le, f), share=f.share), _product(f),
                p.say("edge_held", held=f.held, moved=-f.held, diff=le.diffs["feature_edge"])]
    out += [
            p.say("edge_sum", edges=le.edges_sum, const=le.constant, total=le.edges_sum + le.constant,
                  value=le.logit_value, diff=le.diffs["edges"]),
            p.say("error_nodes"), Text("")]

    out += [p.rule("s_scores"),
            p.say("nodes", features=le.n_nodes["feature"], errors=le.n_nodes["error"],
                  embeddings=le.n_nodes["embedding"], logits=le.n_nodes["logit"]),
            p.say("score_replacement", v=le.replacement), p.say("score_completeness", v=le.completeness),
            p.say("scores_check", diff=le.diffs["scores"]), p.say("next")]
    return out


def _source(p: Page, le: Lesson, e: Edge) -> str:
    """An edge's source node, in words."""
    token = le.tokens[e.pos]
    if e.kind == "feature":
        return p.t["src_feature"].format(layer=e.layer, pos=e.pos, token=token, f=e.feature)
    if e.kind == "error":
        return p.t["src_error"].format(layer=e.layer, pos=e.pos, token=token)
    return p.t["src_embedding"].format(pos=e.pos, token=token)


def _product(e: Edge) -> Text:
    """The edge as value × gradient: a feature's activation a times ∂input/∂a; an error's (an embedding's) vector v
    dotted with the gradient g, as ‖v‖ × g·v/‖v‖."""
    if e.kind == "feature":
        return Text(f"  A = a · ∂input/∂a = {e.value:.4f} × {e.gradient:+.4f} = {e.weight:+.4f}")
    v = "e" if e.kind == "error" else "x₀"
    return Text(f"  A = {v}·g = ‖{v}‖ × g·{v}/‖{v}‖ = {e.value:.4f} × {e.gradient:+.4f} = {e.weight:+.4f}")


def figures(lesson: Lesson, out_dir: Path, lang: str = "en") -> list[Path]:
    """None: the graph's own page is `qkv graph TEXT --transcoders DIR --page FILE.html` (the CLI refuses --out)."""
    return []
