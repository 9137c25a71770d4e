"""Influence, pruning and the graph's scores ("Circuit Tracing", Ameisen et al. 2025, §§ pruning and evaluation;
circuit-tracer's graph.py defines them the same way).

    Â            |A| with each row divided by its sum: the share of a target's direct inputs each source has
    influence    w·(Â + Â² + Â³ + …): the logits' probabilities w, carried back along every path; A is a DAG
                 (nodes only feed later layers), so the series ends after at most L + 1 terms
    pruning      keep the nodes carrying NODE_THRESHOLD of the total influence (embeddings and logits always),
                 then the edges carrying EDGE_THRESHOLD of the edge scores Âp ⊙ (influence_p + w) (Âp: Â of the
                 graph restricted to the kept nodes), then drop, until nothing changes, the features and errors
                 left without an outgoing edge and the features left without an incoming one
    replacement  the embeddings' influence / (the embeddings' + the errors'): how much of what reaches the
                 logits starts at the tokens rather than at what the transcoders miss
    completeness Σ_nodes (1 − the errors' share of the node's inputs) · (its influence + w) / Σ (influence + w)

The pruned graph's scores treat every node pruning dropped as an error node: its incoming edges are cut (it becomes
a source, as an error is) and its influence counts as the errors' (what the pruned graph leaves unexplained).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..runtime.errors import QkvError

NODE_THRESHOLD = 0.8
EDGE_THRESHOLD = 0.98


def normalized(A: np.ndarray) -> np.ndarray:
    """Â = |A| / (its row sums, at least 1e-10) (N, N): a new array."""
    out = np.abs(A)
    out /= np.maximum(out.sum(axis=1, keepdims=True), 1e-10)
    return out


def influence(A_hat: np.ndarray, weights: np.ndarray, most: int = 10_000) -> np.ndarray:
    """(N,) w·(Â + Â² + …) for weights w (N,): each node's influence on what w weighs. Â must be a DAG's (its
    powers reach exactly 0); plain form: w·((I − Â)⁻¹ − I)."""
    step = weights.astype(A_hat.dtype) @ A_hat                                   # (N,) in Â's dtype: no N × N cast
    total = step.astype(np.float64)
    for _ in range(most):
        if not step.any():
            return total
        step = step @ A_hat
        total += step
    raise QkvError("the graph's adjacency has a cycle (influence does not die out); it is not an attribution graph")


def threshold(scores: np.ndarray, fraction: float, block: int = 1 << 20) -> float:
    """The score above which the largest SCORES (flattened, ≥ 0) carry FRACTION of their sum (≥ it is kept).
    Plain form: ranked = sorted(scores, largest first); ranked[first i where cumsum(ranked)[i] ≥ fraction·Σ].
    The running sum is taken in float64 a BLOCK at a time (a graph's edges are ~10⁸ float32 numbers: their
    cumulative sums in float64 at once would double the memory the sort takes)."""
    ranked = np.sort(scores, axis=None)[::-1]                                     # (M,) largest first
    if len(ranked) == 0:
        return 0.0
    total = float(ranked.sum(dtype=np.float64))
    if total <= 0:
        return float(ranked[0])
    goal, before = fraction * total, 0.0
    for lo in range(0, len(ranked), block):
        cum = np.cumsum(ranked[lo:lo + block], dtype=np.float64) + before        # (≤ block,)
        if cum[-1] >= goal:
            return float(ranked[lo + min(int(np.searchsorted(cum, goal)), len(cum) - 1)])
        before = float(cum[-1])
    return float(ranked[-1])


@dataclass
class Pruned:
    """What pruning keeps: node_mask (N,), edge_mask (N, N) [target, source], and each node's influence (N,)
    and its place in the cumulative share of influence (N,) (the largest's share first, 1 for the last)."""

    node_mask: np.ndarray
    edge_mask: np.ndarray
    influence: np.ndarray
    cumulative: np.ndarray


def check_threshold(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.floating, np.integer)) \
            or not 0.0 <= float(value) <= 1.0:
        raise QkvError(f"the {name} threshold must be a number from 0 to 1, got {value!r}")
    return float(value)


def prune(A: np.ndarray, weights: np.ndarray, n_features: int, n_fixed: int,
          node_threshold: float = NODE_THRESHOLD, edge_threshold: float = EDGE_THRESHOLD,
          node_influence: np.ndarray | None = None) -> Pruned:
    """Prune the graph of adjacency A (N, N) [target, source] whose last N_FIXED nodes (embeddings, logits) are
    always kept and whose first N_FEATURES are features; WEIGHTS (N,): the logits' probabilities (module docstring).
    node_influence: influence(normalized(A), weights) if already computed."""
    node_threshold = check_threshold("node", node_threshold)
    edge_threshold = check_threshold("edge", edge_threshold)
    N = len(A)
    inf = influence(normalized(A), weights) if node_influence is None else node_influence   # (N,)
    keep = inf >= threshold(inf, node_threshold)
    keep[N - n_fixed:] = True
    kept = np.abs(A)                                                             # (N, N) the kept nodes' graph
    kept[~keep] = 0
    kept[:, ~keep] = 0
    kept /= np.maximum(kept.sum(axis=1, keepdims=True), 1e-10)                  # Âp
    kept *= (influence(kept, weights) + weights)[:, None]                       # edge scores
    edges = kept > 0                                                             # (N, N) the edges there are
    edges &= kept >= threshold(kept[edges], edge_threshold)
    del kept
    inner = slice(0, N - n_fixed)                                                # features and errors
    while True:
        before = keep.copy()
        edges[~keep] = False
        edges[:, ~keep] = False
        keep[inner] &= edges[:, inner].any(axis=0)                               # an outgoing edge
        keep[:n_features] &= edges[:n_features].any(axis=1)                      # an incoming edge
        if np.array_equal(keep, before):
            break
    order = np.argsort(-inf, kind="stable")
    cumulative = np.empty(N)
    total = inf.sum()
    cumulative[order] = np.cumsum(inf[order]) / (total if total > 0 else 1.0)
    return Pruned(keep, edges, inf, cumulative)


def scores(A: np.ndarray, weights: np.ndarray, errors: np.ndarray, embeddings: np.ndarray) -> tuple[float, float]:
    """(replacement, completeness) of adjacency A (N, N) with the error nodes ERRORS (N,) bool and the embedding
    nodes EMBEDDINGS (N,) bool, WEIGHTS (N,) the logits' probabilities (module docstring)."""
    return scores_of(normalized(A), weights, errors, embeddings)


def scores_of(A_hat: np.ndarray, weights: np.ndarray, errors: np.ndarray, embeddings: np.ndarray,
              inf: np.ndarray | None = None) -> tuple[float, float]:
    """`scores` given Â = normalized(A) (and its influence, if computed)."""
    inf = influence(A_hat, weights) if inf is None else inf
    from_tokens, from_errors = inf[embeddings].sum(), inf[errors].sum()
    replacement = float(from_tokens / (from_tokens + from_errors)) if from_tokens + from_errors > 0 else 0.0
    explained = 1.0 - A_hat @ errors.astype(A_hat.dtype)                        # (N,) 1 − the errors' share
    out = inf + weights
    completeness = float((explained * out).sum() / out.sum())
    return replacement, completeness


def pruned_scores(A: np.ndarray, weights: np.ndarray, errors: np.ndarray, embeddings: np.ndarray,
                  keep: np.ndarray) -> tuple[float, float]:
    """`scores` of the pruned graph: the nodes not in KEEP (N,) bool become error nodes (their incoming edges cut)."""
    dropped = ~keep & ~embeddings
    cut = A.copy()
    cut[dropped] = 0
    return scores(cut, weights, errors | dropped, embeddings)


def prune_graph(graph, node_threshold: float = NODE_THRESHOLD, edge_threshold: float = EDGE_THRESHOLD
                ) -> tuple[Pruned, dict[str, float]]:
    """(what pruning keeps, the scores {"replacement", "completeness", "replacement_pruned",
    "completeness_pruned"}) of a qkv.graphs.graph.Graph."""
    at = graph.slices()
    N = len(graph.adjacency)
    weights = graph.logit_weights()
    errors, embeddings = np.zeros(N, bool), np.zeros(N, bool)
    errors[at["error"]] = True
    embeddings[at["embedding"]] = True
    A_hat = normalized(graph.adjacency)                                          # (N, N)
    inf = influence(A_hat, weights)
    full = scores_of(A_hat, weights, errors, embeddings, inf)
    del A_hat                                                                    # (memory: one N × N at a time)
    kept = prune(graph.adjacency, weights, graph.n_features, N - at["embedding"].start, node_threshold, edge_threshold,
                 node_influence=inf)
    dropped = ~kept.node_mask & ~embeddings
    A_hat = normalized(graph.adjacency)
    A_hat[dropped] = 0                # = normalized(A with those rows cut): `pruned_scores`, without another copy
    part = scores_of(A_hat, weights, errors | dropped, embeddings)
    return kept, {"replacement": full[0], "completeness": full[1],
                  "replacement_pruned": part[0], "completeness_pruned": part[1]}
