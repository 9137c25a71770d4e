"""`qkv graph-page`: an attribution graph's JSON (`qkv graph … --json FILE`) drawn as one offline HTML page
(qkv.graphs.page; the page itself: viz/assets/graph.js); and `qkv graph … --page FILE [--page-corpus CORPUS]`'s
part (`check_page`, `write_page`): the page of the graph just made, its feature cards annotated.

    qkv graph-page GRAPH.json --out graph.html [--lang ko]
"""

from __future__ import annotations

import click

from ..runtime.errors import QkvError

PAGE_HELP = ("Also write the graph page (one offline HTML file: hover a feature for the tokens it promotes and "
             "suppresses, click to keep its sub-graph, group supernodes, pin a path, export PNG/SVG/JSON).")
CORPUS_HELP = ("A UTF-8 text file (one text per line) or a named corpus (shakespeare, kjv, english) whose top "
               "activating contexts the page's feature cards show (with --page).")


def check_page(page_path: str | None, corpus: str | None, option: str = "--page"):
    """--page and --page-corpus checked before any work: the page's name, and the corpus opened (None without)."""
    from pathlib import Path

    if page_path is None:
        if corpus is not None:
            raise QkvError("--page-corpus annotates the graph page; give --page FILE.html too")
        return None
    if Path(page_path).is_dir() or not page_path.lower().endswith((".html", ".htm")):
        raise QkvError(f"{option} {page_path} is not an .html file name; give one such as graph.html")
    if corpus is None:
        return None
    from ..features.corpora import NAMES, open_texts

    return open_texts(corpus=corpus) if corpus in NAMES else open_texts(file=corpus)


def write_page(graph: dict, model, transcoders: dict, page_path: str, texts=None, lang: str = "en") -> None:
    """GRAPH (the schema's dict) annotated (`graphs.page.annotate`: the tokens each feature promotes; with TEXTS its
    top contexts) and written as a page to PAGE_PATH."""
    from ..graphs.page import annotate, write_graph_page
    from .common import status

    with status("annotating the graph's features …"):
        annotated = annotate(graph, model, transcoders, texts)
    path = write_graph_page(annotated, page_path, lang=lang)
    click.echo(f"wrote {path}", err=True)


def is_picture(path: str) -> bool:
    from ..viz.drawing import FORMATS

    return path.lower().endswith(tuple("." + f for f in FORMATS))


def write_picture(graph: dict, path: str, lang: str = "en") -> None:
    """GRAPH (the schema's dict) drawn as a still picture at PATH (viz.graph_figures)."""
    from ..viz.graph_figures import save_graph_figure

    click.echo(f"wrote {save_graph_figure(graph, path, lang=lang)}", err=True)


@click.command(name="graph-page")
@click.argument("graph_path", metavar="GRAPH.json", type=click.Path(dir_okay=False))
@click.option("--out", "out_path", required=True, type=click.Path(dir_okay=False), metavar="FILE.html",
              help="The page to write (one self-contained HTML file: no network); FILE.png, .svg or .pdf: a still "
                   "picture of the graph instead (its most influential nodes and strongest edges).")
@click.option("--lang", type=click.Choice(["en", "ko"]), default="en", show_default=True,
              help="The language the page opens in (it has both, and a button to switch).")
def graph_page_cmd(graph_path: str, out_path: str, lang: str) -> None:
    """Draw an attribution graph's JSON as a page: nodes by layer × position, edges by weight and sign; hover a
    feature for its card, click to keep its sub-graph, group nodes into supernodes, pin a path, export PNG, SVG
    and JSON. With --out FILE.png (.svg, .pdf): the graph as a still picture, for a README or a paper."""
    from ..graphs.page import read_graph, write_graph_page

    if is_picture(out_path):
        write_picture(read_graph(graph_path), out_path, lang)
        return
    check_page(out_path, None, "--out")
    graph = read_graph(graph_path)
    path = write_graph_page(graph, out_path, lang=lang)
    click.echo(f"wrote {path} ({len(graph['nodes']):,} nodes, {len(graph['links']):,} links)")
