"""Edge attribution patching (EAP, Syed et al. 2023) and EAP with integrated gradients (EAP-IG, Hanna et al. 2024):
a score for every edge of the graph of heads, FFNs, the embedding and the logits (qkv.analysis.edges), the top
edges as a circuit, and the circuit's faithfulness curve by real edge patching.

A clean input ("… John gave a drink to" → " Mary") and a corrupt one of the same length; m = logit(token) −
logit(other) at the last position. An edge s → r patched (r reads s's corrupt output instead of its own) moves m
by about

    EAP      (out_s(corrupt) − out_s(clean)) · ∂m/∂in_r(clean)
    EAP-IG   (out_s(corrupt) − out_s(clean)) · Σ_k w_k ∂m/∂in_r(x_k),   x_k = X_corrupt + α_k (X_clean − X_corrupt)

in_r being receiver r's own copy of the residual stream, x_k the pass whose token embeddings lie on the straight
path from the corrupt input's to the clean one's (Hanna et al. interpolate the input embeddings), α_k, w_k the
STEPS Gauss–Legendre nodes on [0, 1] (qkv.analysis.quadrature, Captum's rule). EAP is exactly the first-order term
of edge patching at the clean run (d m/d w_sr, tests/test_eap.py checks it by finite differences on the
patching pass); EAP-IG with one node is the same formula with the gradient taken at the midpoint α = ½; with
enough nodes the embedding's edges add up to m(corrupt) − m(clean) (the path's own integral).

The circuit of the top k edges by |score|: every edge outside it is patched from the corrupt run, every edge in it
carries this run's values (`edges.EdgePatcher.run`, the model's own boxes); its faithfulness is

    F(k) = (m(circuit) − m(corrupt)) / (m(clean) − m(corrupt))       1 with every edge kept, 0 with none.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Sequence

import numpy as np

from ..runtime.errors import QkvError
from ..runtime.threads import blas_one_thread
from .attribution import token_id
from .edges import EdgeGraph, EdgePatcher, EdgeRun
from .input_attribution import float_model
from .quadrature import ig_nodes

if TYPE_CHECKING:
    from ..models.model import Model

MAX_STEPS = 256                        # EAP-IG's nodes at most (each one forward and one backward)
MAX_TOKENS = 256                       # the longest input: the receivers' gradients are R · n · d float64 (SmolLM2
                                       # split into q, k, v: 841 · 256 · 576 · 8 B ≈ 1 GB), the tape L · H · n²
# ONE_THREAD: the passes' products have n rows (a prompt's tokens) and run on one BLAS thread: SmolLM2's EAP of a
# 14-token pair took 0.86 s so, 5.5–11 s on two threads, and an edge-patched pass 0.35 s against 1.3–2.6 s
# (the shared 2-core machine, measured alternately).


@dataclass
class EdgeAttribution:
    """Every edge's score; `top`, `circuit` and `to_json` read it (see the module)."""

    graph: EdgeGraph
    scores: np.ndarray                 # (S, R) float64; 0 where s → r is no edge
    method: str                        # "eap" or "eap-ig"
    steps: int                         # EAP-IG's nodes (0: EAP)
    clean: float                       # m(clean)
    corrupted: float                   # m(corrupt)
    target: int
    other: int | None
    metric: str                        # m in words, "logit(␣Mary) − logit(␣John)"
    ids: tuple[list[int], list[int]]   # the clean and corrupt token ids
    labels: list[str] = field(default_factory=list)   # (n,) the clean tokens, "clean/corrupt" where they differ
    seconds: float = 0.0
    model: str = ""
    texts: tuple[str, str] = ("", "")

    def order(self) -> np.ndarray:
        """(E, 2) the edges (s, r), largest |score| first (ties: in the graph's order)."""
        s, r = np.nonzero(self.graph.valid())
        rank = np.argsort(-np.abs(self.scores[s, r]), kind="stable")
        return np.stack([s[rank], r[rank]], axis=1)

    def top(self, k: int) -> list[tuple[str, str, float]]:
        """The K edges of largest |score|: (sender, receiver, score)."""
        senders, receivers = self.graph.node_names()
        return [(senders[s], receivers[r], float(self.scores[s, r])) for s, r in self.order()[:k]]

    def circuit(self, k: int) -> np.ndarray:
        """(S, R) bool: the K edges of largest |score| (all of them when K ≥ the graph's count)."""
        keep = np.zeros(self.scores.shape, bool)
        chosen = self.order()[:max(0, int(k))]
        keep[chosen[:, 0], chosen[:, 1]] = True
        return keep

    def to_json(self, top: int = 100) -> dict:
        senders, receivers = self.graph.node_names()
        return {"model": self.model, "clean": self.texts[0], "corrupted": self.texts[1], "labels": self.labels,
                "metric": self.metric, "metric_clean": self.clean, "metric_corrupted": self.corrupted,
                "method": self.method, "steps": self.steps, "qkv": self.graph.qkv, "senders": senders,
                "receivers": receivers,
                "n_edges": self.graph.n_edges, "seconds": round(self.seconds, 3),
                "top_edges": [{"sender": s, "receiver": r, "score": round(v, 6)} for s, r, v in self.top(top)]}


@dataclass
class Faithfulness:
    """The metric of circuits of the top k edges, every other edge patched from the corrupt run."""

    ks: list[int]                      # edges kept (clipped to the graph's count)
    metric: list[float]                # m(circuit of the top k)
    normalised: list[float]            # (m − m(corrupt)) / (m(clean) − m(corrupt))
    n_edges: int
    seconds: float = 0.0

    def to_json(self) -> dict:
        return {"n_edges": self.n_edges, "seconds": round(self.seconds, 3),
                "points": [{"edges": k, "metric": round(m, 6), "faithfulness": round(f, 6)}
                           for k, m, f in zip(self.ks, self.metric, self.normalised)]}


# ── the inputs ───────────────────────────────────────────────────────────────────

@dataclass
class _Pair:
    """What every pass of one clean/corrupt pair shares."""

    model: "Model"
    patcher: EdgePatcher
    clean: np.ndarray                  # (n,) ids
    corrupt: np.ndarray                # (n,) ids
    target: int
    other: int | None

    def metric(self, logits: np.ndarray) -> float:
        """m of a pass's logits (n, V)."""
        z = float(logits[-1, self.target])
        return z if self.other is None else z - float(logits[-1, self.other])

    def dlogits(self) -> np.ndarray:
        """(n, V) ∂m/∂logits."""
        d = np.zeros((len(self.clean), self.model.config.vocab_size))
        d[-1, self.target] = 1.0
        if self.other is not None:
            d[-1, self.other] = -1.0
        return d

    def tokens(self, ids: np.ndarray) -> np.ndarray:
        """(1, n, d_embed) the token embeddings E[ids]·s (before positions), the path's ends."""
        w, s = self.model.weights, self.model.config.embed_scale
        rows = np.asarray(w.tok_embed[ids[None]])                                  # (1, n, d_embed)
        return rows if s is None else rows * np.asarray(s, rows.dtype)


def _ids(model: "Model", text: str | Sequence[int]) -> np.ndarray:
    return model.encode(text)[0] if isinstance(text, str) else model.check_ids(text)[0][0]


def _pair(model: "Model", clean, corrupted, token, other, qkv: bool = False) -> _Pair:
    """The checked pair: the same token count, a token and another different from it, a decoder edges.py takes."""
    model = float_model(model)
    a, b = np.asarray(_ids(model, clean), np.int64), np.asarray(_ids(model, corrupted), np.int64)
    if len(a) != len(b):
        raise QkvError(f"clean has {len(a)} tokens and corrupted {len(b)}; edge patching reads the same positions "
                       "in both: reword the corrupted input so its tokens line up")
    if len(a) > MAX_TOKENS:
        raise QkvError(f"the input has {len(a)} tokens; edge attribution takes at most {MAX_TOKENS}: shorten it")
    if token is None:
        raise QkvError("give --token, the clean input's answer (and --other, the corrupt one's)")
    t = token_id(model, token)
    o = None if other is None else token_id(model, other)
    if o is not None and o == t:
        raise QkvError("the token and the other token are the same; give two different tokens")
    return _Pair(model, EdgePatcher(model, len(a), qkv), a, b, t, o)


def _labels(model: "Model", a: np.ndarray, b: np.ndarray) -> list[str]:
    label = model.tokenizer.label if model.tokenizer else str
    return [label(int(x)) if x == y else f"{label(int(x))}/{label(int(y))}" for x, y in zip(a, b)]


def _metric_name(model: "Model", t: int, o: int | None) -> str:
    label = model.tokenizer.label if model.tokenizer else str
    return f"logit({label(t)})" + ("" if o is None else f" − logit({label(o)})")


# ── the scores ───────────────────────────────────────────────────────────────────

def edge_attribution(model: "Model", clean: str | Sequence[int], corrupted: str | Sequence[int],
                     token: str | int, other: str | int | None = None, *, ig_steps: int = 0, qkv: bool = False,
                     progress: Callable[[int, int], None] | None = None) -> EdgeAttribution:
    """Every edge's EAP score (IG_STEPS 0), or EAP-IG's with IG_STEPS Gauss–Legendre nodes (see the module), of
    m = logit(TOKEN) − logit(OTHER) (OTHER None: logit(TOKEN)) at the last position, CLEAN and CORRUPTED texts
    or ids of one length. QKV: each head's q, k and v inputs are receivers of their own (edges.EdgeGraph).
    progress(done, total) after each gradient pass."""
    if isinstance(ig_steps, bool) or not isinstance(ig_steps, (int, np.integer)) or not 0 <= ig_steps <= MAX_STEPS:
        raise QkvError(f"--ig-steps must be a whole number from 0 (EAP) to {MAX_STEPS}, got {ig_steps!r}")
    started = time.perf_counter()
    p = _pair(model, clean, corrupted, token, other, qkv)
    with blas_one_thread():                                                        # see ONE_THREAD
        x_clean, x_corrupt = p.patcher.embed(p.clean), p.patcher.embed(p.corrupt)
        mine, theirs = p.patcher.run(x_clean), p.patcher.run(x_corrupt)
        grads = _gradients(p, int(ig_steps), progress)                            # (R, n, d)
    m_clean, m_corrupt = p.metric(mine.logits), p.metric(theirs.logits)
    delta = (theirs.outputs - mine.outputs).astype(np.float64)                     # (S, n, d) out_s(corrupt) − out_s
    S, R = delta.shape[0], grads.shape[0]
    scores = (delta.reshape(S, -1) @ grads.reshape(R, -1).T) * p.patcher.graph.valid()   # (S, R)
    texts = tuple(x if isinstance(x, str) else "" for x in (clean, corrupted))
    return EdgeAttribution(p.patcher.graph, scores, "eap-ig" if ig_steps else "eap", int(ig_steps), m_clean, m_corrupt,
                           p.target, p.other, _metric_name(p.model, p.target, p.other),
                           ([int(i) for i in p.clean], [int(i) for i in p.corrupt]),
                           _labels(p.model, p.clean, p.corrupt),
                           time.perf_counter() - started, p.model.name, texts)


def _gradients(p: _Pair, steps: int, progress) -> np.ndarray:
    """(R, n, d) float64 ∂m/∂in_r at the clean run (STEPS 0), or Σ_k w_k ∂m/∂in_r on the path's nodes."""
    dlogits = p.dlogits()
    if steps == 0:
        grads, _ = p.patcher.receiver_gradients(p.clean, dlogits)
        if progress is not None:
            progress(1, 1)
        return grads
    alphas, weights = ig_nodes(steps)
    e_clean, e_corrupt = p.tokens(p.clean), p.tokens(p.corrupt)                   # (1, n, d_embed) each
    total = 0.0
    for k, (a, w) in enumerate(zip(alphas, weights)):
        tokens = e_corrupt + np.asarray(a, e_clean.dtype) * (e_clean - e_corrupt)  # (1, n, d_embed) on the path
        grads, _ = p.patcher.receiver_gradients(p.clean, dlogits, tokens)
        total = total + w * grads
        if progress is not None:
            progress(k + 1, steps)
    return total


# ── circuits ─────────────────────────────────────────────────────────────────────

def patched_metric(model: "Model", attribution: EdgeAttribution, keep: np.ndarray) -> float:
    """m of the edge-patched pass in which the edges KEEP (S, R) bool carry this run's values and every other
    edge the corrupt run's (edges.EdgePatcher.run)."""
    return faithfulness(model, attribution, [keep]).metric[0]


def faithfulness(model: "Model", attribution: EdgeAttribution, ks: Sequence[int | np.ndarray],
                 progress: Callable[[int, int], None] | None = None) -> Faithfulness:
    """The faithfulness curve of ATTRIBUTION's circuits: for each k of KS (a count of top edges, or an (S, R) bool
    mask of edges to keep), one edge-patched pass (see the module). A model stored quantised is dequantised
    first (input_attribution.float_model): give it dequantised to do that once."""
    started = time.perf_counter()
    gap = attribution.clean - attribution.corrupted
    if math.isclose(attribution.clean, attribution.corrupted, rel_tol=1e-6, abs_tol=1e-9):
        raise QkvError(f"clean and corrupt give the same metric ({attribution.clean:.4g}), so there is nothing for a "
                       "circuit to recover; give a corrupt input that changes the answer")
    clean, corrupt = attribution.ids
    p = _pair(model, clean, corrupt, attribution.target, attribution.other, attribution.graph.qkv)
    graph = p.patcher.graph
    x_clean = p.patcher.embed(p.clean)
    with blas_one_thread():
        theirs: EdgeRun = p.patcher.run(p.patcher.embed(p.corrupt))
    valid = graph.valid()
    masks = [np.asarray(k, bool) if isinstance(k, np.ndarray) else attribution.circuit(int(k)) for k in ks]
    values, shares = [], []
    for i, keep in enumerate(masks):
        w = (valid & ~keep).astype(x_clean.dtype)                                  # (S, R) 1: from the corrupt run
        with blas_one_thread():                                                    # see ONE_THREAD
            m = p.metric(p.patcher.run(x_clean, w, theirs).logits)
        values.append(m)
        shares.append((m - attribution.corrupted) / gap + 0.0)                    # + 0.0: never −0
        if progress is not None:
            progress(i + 1, len(masks))
    counts = [int((keep & valid).sum()) for keep in masks]
    return Faithfulness(counts, values, shares, graph.n_edges, time.perf_counter() - started)


def curve_points(spec: str | Sequence[int], n_edges: int) -> list[int]:
    """The edge counts of a curve: "10,50,100" or a list; each clipped to N_EDGES, "all" = N_EDGES; 0 and all
    added (the curve's two ends), sorted, each once."""
    items = spec.split(",") if isinstance(spec, str) else list(spec)
    ks = {0, n_edges}
    for item in items:
        text = str(item).strip()
        if text.lower() == "all":
            ks.add(n_edges)
            continue
        try:
            k = int(text)
        except ValueError:
            raise QkvError(f"--curve takes edge counts separated by commas, e.g. 10,100,1000,all; "
                           f"got {text!r}") from None
        if k < 0:
            raise QkvError(f"--curve's edge counts are ≥ 0, got {k}")
        ks.add(min(k, n_edges))
    return sorted(ks)


PAGE_EDGES = 500                       # the top edges a circuit page holds (its slider's range)


def circuit_data(attribution: EdgeAttribution, curve: Faithfulness | None = None, edges: int = PAGE_EDGES) -> dict:
    """What the circuit page draws (viz.eap_figures.circuit_page): the graph's shape, the top EDGES edges
    [sender, receiver, score] largest |score| first, and the faithfulness curve [k, faithfulness, m]."""
    g = attribution.graph
    return {"model": attribution.model, "metric": attribution.metric, "method": attribution.method,
            "steps": attribution.steps, "clean": attribution.texts[0], "corrupted": attribution.texts[1],
            "metric_clean": attribution.clean, "metric_corrupted": attribution.corrupted, "n_layers": g.n_layers,
            "n_heads": g.n_heads, "parallel": g.parallel, "qkv": g.qkv, "n_edges": g.n_edges,
            "edges": [[s, r, round(v, 6)] for s, r, v in attribution.top(edges)],
            "curve": [] if curve is None else [[k, round(f, 6), round(m, 6)] for k, f, m in
                                               zip(curve.ks, curve.normalised, curve.metric)]}
