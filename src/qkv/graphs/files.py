"""An attribution graph as JSON: what `qkv graph … --json FILE` writes (atomically) and what the graph page draws,
read back with every key checked.

    graph_json(graph, pruned, scores, …)  → dict    the pruned graph in the schema below
    write_graph(path, data)               → Path    written atomically (a link at PATH is replaced, not followed)
    read_graph_file(path, limit=LIMIT)    → dict    read bounded, every key checked (one QkvError naming it)

The schema, version 1:

    {
     "qkv_graph": 1,
     "model": "smollm2", "prompt": "...", "tokens": ["The", " cat", ...], "ids": [..],
     "layers": 30, "d_model": 576, "transcoders": "<one line: what they are, where they came from>",
     "target": {"token": " Austin", "id": 1234} or null,
     "scores": {"replacement": 0.7, "completeness": 0.9, "replacement_pruned": 0.55, "completeness_pruned": 0.86},
     "thresholds": {"node": 0.8, "edge": 0.98},
     "held": [0],        (positions whose FFN outputs the graph holds as constants: no feature or error node there)
     "nodes": [
       {"id": "E:5",        "kind": "embedding", "layer": -1, "position": 5, "token": " cat", "influence": 0.1},
       {"id": "F:12:5:881", "kind": "feature",   "layer": 12, "position": 5, "feature": 881,
                            "activation": 3.2, "influence": 0.12},
       {"id": "R:12:5",     "kind": "error",     "layer": 12, "position": 5, "norm": 1.3, "influence": 0.02},
       {"id": "L:1234",     "kind": "logit",     "layer": 30, "position": 9, "token": " Austin", "token_id": 1234,
                            "probability": 0.41, "logit": 17.2, "influence": 0.41}
     ],
     "links": [{"source": "F:12:5:881", "target": "L:1234", "weight": 0.53}, ...],   (source → target, direct effect)
     "features": {"12:881": {"promotes": [[" Austin", 2.1], ...], "suppresses": [[" the", -1.0], ...],
                             "contexts": [{"tokens": ["…"], "values": [0.0, 3.1, …]}, ...]}}   (optional annotations)
    }

Node ids: E = token embedding (layer -1), F = transcoder feature (layer, position, feature), R = error node of a
layer's FFN at a position ("residue"), L = a logit (layer = the number of layers). Positions count from 0.
"influence" is the node's share of the graph's influence on the logits (pruning's number: its influence over the
sum of every node's; a logit's is its probability). Links carry the direct effect of the source on the target's
input: a feature's pre-activation, a logit (the target token's logit minus the mean logit, before any soft-cap).
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import numpy as np

from ..runtime.errors import QkvError
from ..runtime.io import write_text
from ..runtime.io_json import Fields, read_json
from .prune import Pruned

VERSION = 1
LIMIT = 1 << 30                  # bytes of a graph's JSON read back
FIX = "make it again with qkv graph … --json FILE"
SCORES = ("replacement", "completeness", "replacement_pruned", "completeness_pruned")
KINDS = ("embedding", "feature", "error", "logit")
MAX = 1 << 24                    # nodes, links, tokens


def token_text(model, i: int) -> str:
    """Token id I as text (" cat"), or its number without a tokenizer."""
    tok = model.tokenizer
    return str(int(i)) if tok is None else tok.decode([int(i)])


def _finite(x) -> float:
    x = float(x)
    if not math.isfinite(x):
        raise QkvError("the graph has a number that is not finite (the model overflowed); run it in float64")
    return x


def node_ids(graph) -> list[str]:
    """Every node's id in adjacency order (module docstring)."""
    n, L = graph.n_pos, graph.n_layers
    return ([f"F:{l}:{p}:{f}" for l, p, f in graph.features] + [f"R:{l}:{p}" for l in range(L) for p in range(n)]
            + [f"E:{p}" for p in range(n)] + [f"L:{int(t)}" for t in graph.logit_ids])


def graph_json(graph, pruned: Pruned, scores: dict[str, float], *, node_threshold: float, edge_threshold: float,
               prompt: str = "", transcoders: str = "") -> dict:
    """The pruned GRAPH (a qkv.graphs.graph.Graph) as the schema's dict: the kept nodes and links."""
    rep, model = graph.rep, graph.rep.model
    n, L = graph.n_pos, graph.n_layers
    ids = node_ids(graph)
    at = graph.slices()
    total = pruned.influence[:at["logit"].start].sum()
    share = pruned.influence / (total if total > 0 else 1.0)
    model_logits = rep.logits[-1]
    nodes = []
    for i in np.flatnonzero(pruned.node_mask).tolist():
        node = {"id": ids[i]}
        if i < at["error"].start:
            l, p, f = (int(v) for v in graph.features[i])
            node |= {"kind": "feature", "layer": l, "position": p, "feature": f,
                     "activation": _finite(graph.activations[i])}
        elif i < at["embedding"].start:
            l, p = divmod(i - at["error"].start, n)
            node |= {"kind": "error", "layer": l, "position": p, "norm": _finite(np.linalg.norm(rep.errors[l][p]))}
        elif i < at["logit"].start:
            p = i - at["embedding"].start
            node |= {"kind": "embedding", "layer": -1, "position": p, "token": token_text(model, rep.ids[p])}
        else:
            k = i - at["logit"].start
            t = int(graph.logit_ids[k])
            node |= {"kind": "logit", "layer": L, "position": n - 1, "token": token_text(model, t), "token_id": t,
                     "probability": _finite(graph.probabilities[k]), "logit": _finite(model_logits[t])}
        node["influence"] = _finite(graph.probabilities[i - at["logit"].start] if i >= at["logit"].start else share[i])
        nodes.append(node)
    targets, sources = np.nonzero(pruned.edge_mask)
    links = [{"source": ids[s], "target": ids[t], "weight": _finite(graph.adjacency[t, s])}
             for t, s in zip(targets.tolist(), sources.tolist())]
    target = None if graph.target is None else {"token": token_text(model, graph.target), "id": int(graph.target)}
    return {"qkv_graph": VERSION, "model": str(model.name), "prompt": prompt,
            "tokens": [token_text(model, i) for i in rep.ids], "ids": [int(i) for i in rep.ids],
            "layers": L, "d_model": int(model.config.d_model), "transcoders": transcoders, "target": target,
            "scores": {k: _finite(scores[k]) for k in SCORES},
            "thresholds": {"node": float(node_threshold), "edge": float(edge_threshold)},
            "held": list(rep.held), "nodes": nodes, "links": links}


def write_graph(path: str | os.PathLike, data: dict) -> Path:
    """DATA (`graph_json`) as JSON into PATH, atomically; checked first (`check_graph_json`)."""
    check_graph_json(data, str(path))
    return write_text(path, json.dumps(data, ensure_ascii=False, separators=(",", ":")) + "\n")


def read_graph_file(path: str | os.PathLike, limit: int = LIMIT) -> dict:
    """The graph in the JSON file PATH, read bounded (LIMIT bytes) and with every key of the schema checked."""
    data = read_json(path, what=f"the graph {path}", fix=FIX, limit=limit)
    check_graph_json(data, f"the graph {path}")
    return data


# ── the checks ───────────────────────────────────────────────────────────────────

def check_graph_json(data: dict, source: str = "the graph") -> None:
    """Every key of the schema, its type and range; the nodes' ids unique and each link between two of them.
    One QkvError naming the key."""
    top = Fields(data, source, FIX)
    if top.integer("qkv_graph", 0, 1 << 20) != VERSION:
        raise QkvError(f"{source} is version {data['qkv_graph']} of qkv's graph JSON; this qkv reads version {VERSION}")
    top.text("model"), top.text("prompt", max_len=1 << 20), top.text("transcoders")
    tokens = top.array("tokens", max_len=MAX)
    ids = top.array("ids", max_len=MAX)
    if not all(isinstance(t, str) for t in tokens):
        raise QkvError(f"{source}: tokens must be a list of texts; {FIX}")
    if len(ids) != len(tokens) or not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids):
        raise QkvError(f"{source}: ids must be one whole number ≥ 0 per token; {FIX}")
    L = top.integer("layers", 1, 1 << 20)
    top.integer("d_model", 1, 1 << 20)
    n = len(tokens)
    if "target" not in data:
        raise QkvError(f"{source} has no target (null when none was asked for); {FIX}")
    if data["target"] is not None:
        target = top.object("target")
        target.text("token"), target.integer("id", 0, 1 << 40)
    scores = top.object("scores")
    for k in SCORES:
        scores.number(k, 0.0, 1.0)
    thresholds = top.object("thresholds")
    thresholds.number("node", 0.0, 1.0), thresholds.number("edge", 0.0, 1.0)
    if "held" in data:                                              # optional: files before it hold nothing
        held = top.array("held", max_len=MAX)
        if not all(isinstance(p, int) and not isinstance(p, bool) and 0 <= p < n for p in held):
            raise QkvError(f"{source}: held must list positions of the prompt (0 to {n - 1}); {FIX}")
    known = set()
    for i, raw in enumerate(top.array("nodes", max_len=MAX)):
        known.add(_check_node(top.sub(f"nodes[{i}]", raw), L, n))
    if len(known) != len(data["nodes"]):
        raise QkvError(f"{source}: two nodes have the same id; {FIX}")
    for i, raw in enumerate(top.array("links", max_len=MAX * 16)):
        link = top.sub(f"links[{i}]", raw)
        for end in ("source", "target"):
            if link.text(end) not in known:
                raise QkvError(f"{source}: links[{i}].{end} {raw[end]!r} is not a node of the graph; {FIX}")
        link.number("weight", -math.inf, math.inf)                  # JSON read here holds no inf or NaN
    if data.get("features") is not None:
        top.object("features")


def _check_node(node: Fields, L: int, n: int) -> str:
    """One node's keys by its kind; its id (which must say the same layer, position, feature)."""
    kind = node.text("kind", choices=KINDS)
    nid = node.text("id", max_len=200)
    position = node.integer("position", 0, max(n - 1, 0))
    node.number("influence", -math.inf, math.inf)
    if kind == "embedding":
        node.integer("layer", -1, -1), node.text("token")
        want = f"E:{position}"
    elif kind == "feature":
        layer, feature = node.integer("layer", 0, L - 1), node.integer("feature", 0, 1 << 40)
        node.number("activation", -math.inf, math.inf)
        want = f"F:{layer}:{position}:{feature}"
    elif kind == "error":
        layer = node.integer("layer", 0, L - 1)
        node.number("norm", 0.0, math.inf)
        want = f"R:{layer}:{position}"
    else:
        node.integer("layer", L, L), node.text("token"), node.number("probability", 0.0, 1.0)
        node.number("logit", -math.inf, math.inf)
        want = f"L:{node.integer('token_id', 0, 1 << 40)}"
    if nid != want:
        raise QkvError(f"{node.source}: its id {nid!r} does not match its {kind} fields ({want!r}); {FIX}")
    return nid
