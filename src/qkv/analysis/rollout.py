"""Attention rollout (Abnar & Zuidema 2020): how much each input token reaches each position,
following attention through every layer and the residual connections around it.

    Â_l = ½·mean_h A_l + ½·I, rows renormalised        (the residual as attention to oneself)
    R_1 = Â_1,   R_l = Â_l · R_{l−1}                     (R_l[i, j]: token j's share in position i after l layers)

Encoders and decoders alike; a decoder's R_l stays lower-triangular (causal Â, causal products).
With attention sinks (gpt-oss: a row's weights sum to 1 − its sink's share, the sink has no value) Â's rows are
not renormalised: the sinks' share reaches no token, so R_l's rows sum to less than 1 (what the tokens reach).

Attention flow (below): the same Â as capacities of a layered graph, and the maximum flow from
each output position down to each input token (`attention_flow`).
Both drawn beside raw attention: `viz.interpret_figures.rollout_figure`; the viewer's panel:
`sections.rollout_payload`.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING

import numpy as np

from ..runtime.errors import QkvError, check_index

if TYPE_CHECKING:
    from ..core.trace import Trace


def rollout_of(attentions: np.ndarray, sinks: bool = False) -> np.ndarray:
    """(L, H, n, n) attention weights → (L, n, n) rollout R_1..R_L (float64). sinks: the weights' rows sum to less
    than 1 by the sinks' share (gpt-oss), which reaches no token: Â = ½·mean_h A + ½·I as it is (a row seeing no
    key, ½·I, still renormalised to I)."""
    A = np.asarray(attentions)                                        # (L, H, n, n)
    if A.ndim != 4 or A.shape[-1] != A.shape[-2]:
        raise QkvError(f"attention rollout needs self-attention weights (L, H, n, n), not {A.shape}")
    n = A.shape[-1]
    Ahat = 0.5 * A.mean(axis=1, dtype=np.float64) + 0.5 * np.eye(n)   # (L, n, n) summed in float64
    Ahat /= Ahat.sum(axis=-1, keepdims=True) if not sinks else \
        np.where(A.sum(axis=(1, -1), dtype=np.float64)[..., None] > 0, 1.0, 0.5)   # rows sum to 1 (a padding query
                                                                                      # too); sinks: ≤ 1
    R = np.empty_like(Ahat)                                           # (L, n, n)
    R[0] = Ahat[0]
    for l in range(1, len(Ahat)):
        R[l] = Ahat[l] @ R[l - 1]
    return R


def attention_rollout(trace: "Trace") -> np.ndarray:
    """(L, n, n): row i of R_l is how much each token j reaches position i after layers 1..l.

    The trace must keep every head's attention weights of every layer from 0
    (`model.run(text, keep=("attentions",))`); rows sum to 1 (less with attention sinks: `rollout_of`).
    """
    if trace.source_tokens is not None:
        raise QkvError("attention rollout follows self-attention; this trace holds cross-attention")
    if not trace.layers or trace.layer_ids != list(range(len(trace.layers))):
        raise QkvError(f"attention rollout needs every layer from 0, not layers {trace.layer_ids}; "
                       "run the model without layers=")
    if trace.head_ids is not None:
        raise QkvError("attention rollout averages every head; run the model without heads=")
    A = trace.attentions
    if A is None:
        raise QkvError('attention rollout needs the attention weights; run with keep=("attentions",)')
    return rollout_of(A, sinks=trace.sinks)


# ── attention flow ───────────────────────────────────────────────────────────────
#
# Abnar & Zuidema's second method: the attention graph as a flow network. Nodes (l, i): token i
# after l layers (l = 0: the input tokens); an edge from (l, i) down to (l−1, j) with capacity
# Â_l[i, j] (the same Â as rollout). flow[i, j] = the maximum flow from (L, i) to (0, j): how much
# can pass from position i down to input token j when every edge carries at most its weight.
# Rollout multiplies weights along paths; flow takes the bottleneck of the best set of paths.
#
# Cost: one max-flow (Dinic: shortest augmenting paths, one BFS per path length) per (output
# position, input token) pair, n² of them, each over at most L·n² edges; only the nodes on some
# path from the source to the sink are kept (in a decoder, positions j..i). Pure Python, growing
# as n⁴·L — hence MAX_FLOW_WORK.

MAX_FLOW_WORK = 2_000_000       # Σ over pairs of the edges their graph keeps: beyond, one clear error
EPS = 1e-12                     # residual capacity below this is spent


def flow_work(n_layers: int, n: int, positions: int | None = None) -> int:
    """The bound `flow_of` compares with MAX_FLOW_WORK: (positions · n) max-flow problems of up
    to L·n² edges each (positions: default all n)."""
    return (n if positions is None else positions) * n * n_layers * n * n


def flow_fits(n_layers: int, n: int) -> bool:
    """Whether the attention flow of every position of n tokens through L layers is within
    MAX_FLOW_WORK, the limit `attention_flow` (and `qkv rollout --flow`) enforces."""
    return flow_work(n_layers, n) <= MAX_FLOW_WORK


def max_flow(cap: dict[int, dict[int, float]], source: int, sink: int) -> float:
    """The maximum flow from SOURCE to SINK through capacities cap[u][v] ≥ 0 (Dinic: shortest
    augmenting paths too, as Edmonds–Karp, but every path of one length found in one BFS phase,
    walking the level graph with a pointer per node: far fewer BFS than one per path)."""
    out: dict[int, list[int]] = {}                                      # node → its edges (ids)
    head: list[int] = []                                                # edge e: → head[e], residual res[e]
    res: list[float] = []                                               # edge e ^ 1 is e's reverse
    for u, edges in cap.items():
        for v, c in edges.items():
            out.setdefault(u, []).append(len(head))
            head.append(v)
            res.append(float(c))
            out.setdefault(v, []).append(len(head))
            head.append(u)
            res.append(0.0)
    total = 0.0
    while True:
        level = {source: 0}                                             # BFS: distances in the residual graph
        queue = deque([source])
        while queue:
            u = queue.popleft()
            for e in out.get(u, ()):
                if res[e] > EPS and head[e] not in level:
                    level[head[e]] = level[u] + 1
                    queue.append(head[e])
        if sink not in level:
            return total
        ptr = dict.fromkeys(level, 0)                                   # the next edge to try at each node
        while True:                                                     # the paths of this length, one by one
            path, u = [], source
            while u != sink:
                edges = out.get(u, ())
                while ptr[u] < len(edges):
                    e = edges[ptr[u]]
                    if res[e] > EPS and level.get(head[e], -1) == level[u] + 1:
                        break
                    ptr[u] += 1
                if ptr[u] < len(edges):                                 # forward along e
                    path.append(edges[ptr[u]])
                    u = head[path[-1]]
                elif u == source:                                       # no path left of this length
                    break
                else:                                                   # a dead end: back up, skip it
                    u = head[path.pop() ^ 1]
                    ptr[u] += 1
            if u != sink:
                break
            push = min(res[e] for e in path)                            # the bottleneck
            for e in path:
                res[e] -= push
                res[e ^ 1] += push
            total += push


def _flow_graph(Ahat: np.ndarray, i: int, j: int) -> tuple[dict[int, dict[int, float]], int, int, int]:
    """The layered graph from (L, i) down to (0, j), only nodes on some path between them:
    (capacities, source, sink, edges kept). Node (l, k) is l·n + k."""
    L, n, _ = Ahat.shape
    live = Ahat > 0                                                      # (L, n, n) the edges
    down = np.zeros((L + 1, n), bool)                                    # reachable from the source
    down[L, i] = True
    for l in range(L, 0, -1):
        down[l - 1] = live[l - 1][down[l]].any(axis=0)
    up = np.zeros((L + 1, n), bool)                                      # reaching the sink
    up[0, j] = True
    for l in range(1, L + 1):
        up[l] = live[l - 1][:, up[l - 1]].any(axis=1)
    keep = down & up                                                     # (L+1, n)
    cap: dict[int, dict[int, float]] = {}
    edges = 0
    for l in range(L, 0, -1):
        for a in np.flatnonzero(keep[l]):
            bs = np.flatnonzero(keep[l - 1] & live[l - 1, a])
            cap[l * n + a] = {(l - 1) * n + int(b): float(Ahat[l - 1, a, b]) for b in bs}
            edges += len(bs)
    return cap, L * n + i, j, edges


def flow_of(attentions: np.ndarray, positions: list[int] | None = None) -> np.ndarray:
    """(L, H, n, n) attention weights → (p, n) attention flow from each of POSITIONS (default all)
    after the last layer to each input token (float64; 0 where no path leads)."""
    A = np.asarray(attentions, dtype=np.float64)                        # (L, H, n, n)
    if A.ndim != 4 or A.shape[-1] != A.shape[-2]:
        raise QkvError(f"attention flow needs self-attention weights (L, H, n, n), not {A.shape}")
    L, _, n, _ = A.shape
    rows = list(range(n)) if positions is None else [check_index("position", p, n, "the text") for p in positions]
    if flow_work(L, n, len(rows)) > MAX_FLOW_WORK:
        raise QkvError(f"attention flow over {L} layers of {n} tokens is {len(rows) * n} max-flow problems of up to "
                       f"{L * n * n:,} edges each, too slow in Python; give a shorter text, fewer positions, "
                       "or use attention_rollout")
    Ahat = 0.5 * A.mean(axis=1) + 0.5 * np.eye(n)                       # (L, n, n) as rollout
    Ahat /= Ahat.sum(axis=-1, keepdims=True)
    out = np.zeros((len(rows), n))
    for r, i in enumerate(rows):
        for j in range(n):
            cap, s, t, _ = _flow_graph(Ahat, i, j)
            out[r, j] = max_flow(cap, s, t) if cap else 0.0
    return out


def attention_flow(trace: "Trace", positions: list[int] | None = None) -> np.ndarray:
    """(p, n): how much can flow from each of POSITIONS (default every one) after the last layer
    down to each input token, through every layer's Â (see above). Each entry is at most 1
    (the capacity out of the position). The trace must keep every layer's attention weights."""
    if trace.source_tokens is not None:
        raise QkvError("attention flow follows self-attention; this trace holds cross-attention")
    if not trace.layers or trace.layer_ids != list(range(len(trace.layers))) or trace.head_ids is not None:
        raise QkvError("attention flow needs every head of every layer from 0; run the model without layers= or heads=")
    A = trace.attentions
    if A is None:
        raise QkvError('attention flow needs the attention weights; run with keep=("attentions",)')
    return flow_of(A, positions)
