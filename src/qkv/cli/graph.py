"""`qkv graph`: the attribution graph of one prompt over per-layer transcoders (qkv.graphs): the nodes with the most
influence on the logits, the strongest direct effects into the target's logit, the replacement and completeness
scores; --json writes the pruned graph (qkv.graphs.files' schema, what `qkv graph-page` draws).

    qkv graph "The capital of Texas is" --model smollm2 --transcoders DIR [--token " Austin"] [--json graph.json]
"""

from __future__ import annotations

from pathlib import Path

import click
import numpy as np

from . import graph_page, graph_tools
from .common import check_json_file, load_model, new_console, progress_bar
from .options import WRITER, model_option, text_argument, token_option
from ..runtime.errors import QkvError

TOP = 12                 # rows of each table


def describe(graph, node: int) -> str:
    """A node of GRAPH (its adjacency index) in words: 'F L12 @5 #881', 'error L3 @2', 'emb @0 " cat"', 'logit'."""
    at, rep = graph.slices(), graph.rep
    if node < at["error"].start:
        layer, p, f = graph.features[node]
        return f"feature L{layer} #{f} @{p} {_token(rep.model, rep.ids[p])!r}"
    if node < at["embedding"].start:
        layer, p = divmod(node - at["error"].start, graph.n_pos)
        return f"error L{layer} @{p} {_token(rep.model, rep.ids[p])!r}"
    if node < at["logit"].start:
        p = node - at["embedding"].start
        return f"embedding @{p} {_token(rep.model, rep.ids[p])!r}"
    return f"logit {_token(rep.model, graph.logit_ids[node - at['logit'].start])!r}"


def _token(model, i) -> str:
    return str(int(i)) if model.tokenizer is None else model.tokenizer.decode([int(i)])


@click.command(name="graph")
@text_argument()
@model_option(WRITER)
@click.option("--transcoders", "transcoders_dir", required=True, metavar="DIR",
              help="The model's per-layer transcoders (one for every layer).")
@token_option("A next token whose logit node is kept whatever its probability, e.g. ' Austin' (its edges are "
              "the ones printed) [default: the most probable].", was="--target")
@click.option("--json", "json_path", default=None, type=click.Path(dir_okay=False), metavar="FILE",
              help="Write the pruned graph as JSON (what `qkv graph-page` draws).")
@click.option("--page", "page_path", default=None, type=click.Path(dir_okay=False), metavar="FILE.html",
              help=graph_page.PAGE_HELP)
@click.option("--page-corpus", "page_corpus", default=None, metavar="CORPUS", help=graph_page.CORPUS_HELP)
@click.option("--png", "png_path", default=None, type=click.Path(dir_okay=False), metavar="FILE.png",
              help="Also draw the pruned graph as a still picture (.png, .svg or .pdf): its most influential nodes "
                   "and strongest edges.")
@click.option("--node-threshold", "node_threshold", type=float, default=0.8, show_default=True,
              help="Pruning keeps the nodes carrying this share of the influence on the logits.")
@click.option("--edge-threshold", "edge_threshold", type=float, default=0.98, show_default=True,
              help="…and the edges carrying this share of the edge scores.")
@click.option("--max-logits", "max_logits", type=int, default=10, show_default=True,
              help="Logit nodes: the most probable tokens covering 95 % of the probability, at most this many.")
@click.option("--keep-first", "keep_first", is_flag=True,
              help="Give the first token its feature and error nodes too. By default a causal model's first token "
                   "(the attention sink, which the transcoders were not trained on) keeps its FFN outputs as "
                   "constants, as circuit-tracer holds a BOS token.")
@click.option("--intervene", "intervene_spec", default=None, metavar="EDITS", help=graph_tools.INTERVENE_HELP)
@click.option("--qk", "qk_specs", multiple=True, metavar="L:H@I,J", help=graph_tools.QK_HELP)
def graph_cmd(text: str, source: str, transcoders_dir: str, token: str | None, json_path: str | None,
              node_threshold: float, edge_threshold: float, max_logits: int, intervene_spec: str | None = None,
              qk_specs: tuple[str, ...] = (), page_path: str | None = None, page_corpus: str | None = None,
              png_path: str | None = None, keep_first: bool = False) -> None:
    """The attribution graph of TEXT's next token: the local replacement model (patterns and norm scales frozen,
    each FFN read as its transcoder plus an error node), the direct effects between features, errors, token
    embeddings and logits (exact, by the engine's own backward), pruned by influence; prints the scores, the
    most influential nodes and the strongest edges into the target's logit."""
    from ..graphs.files import graph_json, write_graph
    from ..graphs.graph import build_graph
    from ..graphs.prune import check_threshold, prune_graph
    from ..graphs.replacement import prompt_ids, sink_positions

    check_threshold("node", node_threshold), check_threshold("edge", edge_threshold)
    check_json_file(json_path, "graph.json")
    page_texts = graph_page.check_page(page_path, page_corpus)      # --page, --page-corpus: before the work
    if png_path is not None and not graph_page.is_picture(png_path):
        raise QkvError(f"--png {png_path} is not a picture's name; end it in .png, .svg or .pdf")
    from ..features.dictionaries import load_transcoders

    transcoders = load_transcoders(transcoders_dir)
    model = load_model(source)
    held = () if keep_first else sink_positions(model, len(prompt_ids(model, text)[0]))
    extras = graph_tools.prepare(model, text, transcoders, intervene_spec, qk_specs, held)   # before the graph
    with progress_bar("attributing", "batches of targets") as progress:
        graph = build_graph(model, text, transcoders, token, max_logits=max_logits, progress=progress, held=held)
    pruned, scores = prune_graph(graph, node_threshold, edge_threshold)
    if json_path is not None:
        about = (f"{len(transcoders)} per-layer transcoders, {transcoders[0].config.d_sae} latents each "
                 f"({transcoders[0].config.architecture}), from {Path(transcoders_dir).name}")
        path = write_graph(json_path, graph_json(graph, pruned, scores, node_threshold=node_threshold,
                                                 edge_threshold=edge_threshold, prompt=text, transcoders=about))
        click.echo(f"wrote {path} ({int(pruned.node_mask.sum()):,} nodes, {int(pruned.edge_mask.sum()):,} links)",
                   err=True)
    if page_path is not None:                                       # the page of the graph, its features annotated
        graph_page.write_page(graph_json(graph, pruned, scores, node_threshold=node_threshold,
                                         edge_threshold=edge_threshold, prompt=text,
                                         transcoders=f"transcoders from {Path(transcoders_dir).name}"),
                              model, transcoders, page_path, page_texts)
    if png_path is not None:
        graph_page.write_picture(graph_json(graph, pruned, scores, node_threshold=node_threshold,
                                            edge_threshold=edge_threshold, prompt=text, transcoders=""), png_path)
    show(graph, pruned, scores)
    graph_tools.show(graph, pruned, extras, text)                   # --qk tables, --intervene's logits


def show(graph, pruned, scores: dict) -> None:
    """The scores, the most influential nodes, and the strongest direct effects into the target's logit."""
    from rich.table import Table

    console = new_console()
    at = graph.slices()
    console.print(f"{graph.rep.model.name}: {graph.n_features:,} active features, {len(graph.adjacency):,} nodes; "
                  f"pruned to {int(pruned.node_mask.sum()):,} nodes, {int(pruned.edge_mask.sum()):,} edges")
    console.print(f"replacement {scores['replacement']:.3f}, completeness {scores['completeness']:.3f}; pruned: "
                  f"replacement {scores['replacement_pruned']:.3f}, completeness {scores['completeness_pruned']:.3f}")
    logits = Table(title="logit nodes", caption="input: logit − mean logit, before any soft-cap")
    for name in ("token", "probability", "input"):
        logits.add_column(name, justify="left" if name == "token" else "right")
    for k, t in enumerate(graph.logit_ids):
        logits.add_row(repr(_token(graph.rep.model, t)), f"{graph.probabilities[k]:.3f}",
                       f"{graph.inputs[at['logit'].start + k]:+.3f}")
    console.print(logits)
    inner = np.flatnonzero(pruned.node_mask[:at["logit"].start])
    best = inner[np.argsort(-pruned.influence[inner], kind="stable")[:TOP]]
    nodes = Table(title="most influential nodes", caption="influence on the logits, weighted by probability")
    nodes.add_column("node")
    nodes.add_column("influence", justify="right")
    for i in best:
        nodes.add_row(describe(graph, int(i)), f"{pruned.influence[i]:.4f}")
    console.print(nodes)
    k = 0 if graph.target is None else int(np.flatnonzero(graph.logit_ids == graph.target)[0])
    row = at["logit"].start + k
    weights = graph.adjacency[row]
    strongest = np.argsort(-np.abs(weights), kind="stable")[:TOP]
    edges = Table(title=f"strongest direct effects into {describe(graph, row)}",
                  caption=f"all edges sum to {weights.sum():+.3f}, + constant {graph.constants[row]:+.3f} = "
                          f"the input {graph.inputs[row]:+.3f}")
    edges.add_column("source")
    edges.add_column("weight", justify="right")
    for j in strongest:
        if weights[j] != 0:
            edges.add_row(describe(graph, int(j)), f"{weights[j]:+.4f}")
    console.print(edges)
