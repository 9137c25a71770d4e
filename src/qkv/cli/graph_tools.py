"""What `qkv graph` does besides the graph itself: --intervene (edit features, rerun the real model, the logits'
moves beside the graph's prediction: qkv.graphs.intervene) and --qk (why a head attends where it does, its score
split over the pruned graph's nodes: qkv.graphs.qk). Both are checked against the model and the prompt before the
graph is built, so a mistyped edit costs one line, not an attribution.

    qkv graph "The capital of Texas is" --model smollm2 --transcoders DIR --intervene "L12:F881@5=0" --qk 3:5@7,2
"""

from __future__ import annotations

from dataclasses import dataclass, field

import click
import numpy as np

from ..runtime.errors import QkvError, check_index

ROWS = 10                # top tokens and top table entries printed

INTERVENE_HELP = ("Edit transcoder features and rerun the real model with the edits: LAYER:FEATURE[@POSITION]=VALUE "
                  "(set) or *FACTOR (scale), comma-separated, no position: every position; e.g. 'L12:F881@5=0'. "
                  "Prints how the top logits move beside what the graph predicts.")
QK_HELP = ("Why a head attends where it does: LAYER:HEAD@QUERY,KEY (positions from 0), e.g. '3:5@7,2'; prints the "
           "head's score split over the pruned graph's nodes, query side × key side, and the sum check. Repeatable.")


@dataclass
class Extras:
    """The checked --intervene edits and --qk pairs of one `qkv graph` run."""

    edits: list = field(default_factory=list)          # qkv.graphs.intervene.Edit
    pairs: list[tuple[int, int, int, int]] = field(default_factory=list)   # (layer, head, query, key)


def prepare(model, text: str, transcoders: dict, intervene: str | None, qk: tuple[str, ...],
            held: tuple[int, ...] = ()) -> Extras:
    """--intervene and --qk read and checked against MODEL, TEXT's tokens and TRANSCODERS (and the positions the
    graph will HOLD: no feature to edit there), or one QkvError."""
    from ..graphs.intervene import check_edits, parse_edits
    from ..graphs.qk import parse_pair
    from ..graphs.replacement import prompt_ids

    extras = Extras()
    if intervene is None and not qk:
        return extras
    n = len(prompt_ids(model, text)[0])
    cfg = model.config
    if intervene is not None:
        extras.edits = check_edits(parse_edits(intervene), transcoders, cfg.n_layers, n)
        for e in extras.edits:
            if e.position in held:
                raise QkvError(f"--intervene {e}: position {e.position} is held in the graph (its FFN output a "
                               "constant, the attention sink: no feature there); edit another position, or add "
                               "--keep-first")
    for spec in qk:
        layer, head, i, j = parse_pair(spec)
        layer = check_index("layer", layer, cfg.n_layers, model.name)
        head = check_index("head", head, cfg.n_heads, model.name)
        i, j = (check_index("position", p, n, "the prompt") for p in (i, j))
        if cfg.causal and j > i:
            raise QkvError(f"--qk {spec}: key {j} comes after query {i}, which a causal model never sees; "
                           "give QUERY,KEY with the key at or before the query")
        extras.pairs.append((layer, head, i, j))
    return extras


def show(graph, pruned, extras: Extras, text: str) -> None:
    """Print each --qk table over the pruned graph's nodes, then the --intervene table (the real model's logits
    before and after, the change, the prediction by every path and by the pruned graph's edges)."""
    from ..graphs.files import node_ids
    from ..graphs.intervene import graph_change, intervene
    from ..graphs.qk import qk_table

    rep = graph.rep
    if extras.pairs:
        ids = node_ids(graph)
        kept = [ids[k] for k in np.flatnonzero(pruned.node_mask) if not ids[k].startswith("L:")]
        for layer, head, i, j in extras.pairs:
            click.echo(qk_table(rep, layer, head, i, j, nodes=kept).text(ROWS))
    if extras.edits:
        result = intervene(rep.model, text, rep.transcoders, extras.edits, rep=rep)
        result.graph_ids, result.graph_predicted = graph.logit_ids, graph_change(graph, extras.edits, pruned)
        click.echo(result.text(ROWS))
