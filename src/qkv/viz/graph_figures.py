"""An attribution graph as a still picture (for a README or a paper), drawn from its JSON (qkv.graphs.files'
schema: viz comes before graphs, so this reads the plain dict and computes nothing of the graph):

    graph_figure(data)     nodes at (position, layer) as the graph page lays them out — the prompt's tokens along
                           the bottom (their embeddings), the logits on top, features as dots sized by influence,
                           error nodes as grey squares — and the strongest edges (red adds to the target's input,
                           blue takes away, width ∝ |weight| over the target's incoming |weight|)
    save_graph_figure      the figure written atomically to FILE.png / .svg / .pdf

Only the most influential nodes are drawn (most_nodes, besides every token and logit) and the strongest edges among
them (most_edges): the page has the rest.
"""

from __future__ import annotations

import os
from collections import defaultdict
from pathlib import Path
from typing import TYPE_CHECKING

from ..runtime.errors import QkvError
from ..runtime.io import write_atomic
from .drawing import FORMATS, drawable, figure_title, new_figure, render_figure, styled

if TYPE_CHECKING:
    from matplotlib.figure import Figure

RED, BLUE = "#b2182b", "#2166ac"
KIND_STYLE = {"feature": dict(marker="o", color="#e08214"), "error": dict(marker="s", color="#8c8c8c"),
              "embedding": dict(marker="s", color="#4d4d4d"), "logit": dict(marker="D", color="#542788")}
WORDS = {"en": {"title": "attribution graph", "layer": "layer", "scores": "replacement {r:.2f}, completeness {c:.2f} "
                "(pruned {rp:.2f}, {cp:.2f})", "feature": "feature", "error": "error node", "embedding": "token",
                "logit": "logit", "adds": "adds", "takes": "takes away", "emb": "emb", "out": "logits"},
         "ko": {"title": "기여 그래프", "layer": "층", "scores": "대체 {r:.2f}, 완전성 {c:.2f} (가지치기 후 {rp:.2f}, {cp:.2f})",
                "feature": "특징", "error": "오차 노드", "embedding": "토큰", "logit": "로짓", "adds": "더함",
                "takes": "뺌", "emb": "임베딩", "out": "로짓"}}


def chosen_nodes(data: dict, most_nodes: int) -> list[dict]:
    """Every embedding and logit node, and the MOST_NODES features and error nodes of most influence."""
    inner = [n for n in data["nodes"] if n["kind"] in ("feature", "error")]
    inner.sort(key=lambda n: -n["influence"])
    return [n for n in data["nodes"] if n["kind"] in ("embedding", "logit")] + inner[:most_nodes]


def chosen_links(data: dict, ids: set[str], most_edges: int) -> list[tuple[dict, float]]:
    """The MOST_EDGES links between IDS of largest share of their target's incoming |weight|: (link, share)."""
    total: dict[str, float] = defaultdict(float)
    for link in data["links"]:
        total[link["target"]] += abs(link["weight"])
    inside = [(link, abs(link["weight"]) / total[link["target"]]) for link in data["links"]
              if link["source"] in ids and link["target"] in ids and total[link["target"]] > 0]
    inside.sort(key=lambda ls: -ls[1])
    return inside[:most_edges]


def places(nodes: list[dict], n_layers: int) -> dict[str, tuple[float, float]]:
    """(x, y) of each node: x its position (the nodes of one cell spread across it), y its layer (embeddings −1,
    logits n_layers, which spread across the prompt's width: they all sit at the last position)."""
    cells: dict[tuple[int, int], list[dict]] = defaultdict(list)
    for n in nodes:
        if n["kind"] != "logit":
            cells[(n["layer"], n["position"])].append(n)
    at = {}
    for (layer, p), group in cells.items():
        group.sort(key=lambda n: -n["influence"])
        for k, n in enumerate(group):
            at[n["id"]] = (p + (k - (len(group) - 1) / 2) * min(0.22, 0.8 / len(group)), float(layer))
    logits = sorted((n for n in nodes if n["kind"] == "logit"), key=lambda n: -n.get("probability", 0.0))
    last = max((n["position"] for n in nodes), default=0)
    for k, n in enumerate(logits):
        at[n["id"]] = (last - k * max(0.6, last / max(1, len(logits)) / 1.5), float(n_layers) + 1)
    return at


def _label(n: dict, words: dict) -> str:
    if n["kind"] == "feature":
        return f"L{n['layer']} F{n['feature']}"
    if n["kind"] == "error":
        return f"err L{n['layer']}"
    return drawable(repr(n.get("token", "?")))


@styled
def graph_figure(data: dict, *, most_nodes: int = 40, most_edges: int = 60, labelled: int = 14,
                 lang: str = "en") -> "Figure":
    """DATA (a graph's JSON, checked) as one picture: layers up, the prompt's positions across; the LABELLED most
    influential features and error nodes named ("L12 F881"), the logits by their token and probability."""
    from matplotlib.lines import Line2D

    words = WORDS[lang]
    L, tokens = int(data["layers"]), list(data["tokens"])
    nodes = chosen_nodes(data, most_nodes)
    at = places(nodes, L)
    links = chosen_links(data, set(at), most_edges)
    fig = new_figure(min(16.0, 3.0 + 1.1 * len(tokens)), 7.5)
    ax = fig.add_subplot()
    for link, share in sorted(links, key=lambda ls: ls[1]):                 # the strongest drawn last, on top
        (x0, y0), (x1, y1) = at[link["source"]], at[link["target"]]
        ax.plot([x0, x1], [y0, y1], color=RED if link["weight"] > 0 else BLUE, lw=0.4 + 4.5 * share,
                alpha=0.25 + 0.6 * share, zorder=1, solid_capstyle="round")
    top = max((n["influence"] for n in nodes if n["kind"] in ("feature", "error")), default=1.0) or 1.0
    for n in nodes:
        x, y = at[n["id"]]
        style = KIND_STYLE[n["kind"]]
        size = 30 + 260 * n["influence"] / top if n["kind"] in ("feature", "error") else 60
        ax.scatter([x], [y], s=size, marker=style["marker"], color=style["color"], edgecolor="white", lw=0.6,
                   zorder=3)
    inner = sorted((n for n in nodes if n["kind"] in ("feature", "error")), key=lambda n: -n["influence"])
    for n in inner[:labelled]:
        x, y = at[n["id"]]
        ax.annotate(_label(n, words), (x, y), xytext=(4, 4), textcoords="offset points", fontsize=7, zorder=4)
    for n in nodes:
        if n["kind"] == "logit":
            x, y = at[n["id"]]
            ax.annotate(f"{_label(n, words)} {n.get('probability', 0):.2f}", (x, y), xytext=(0, 7),
                        textcoords="offset points", ha="center", fontsize=8, zorder=4)
    ax.set_xticks(range(len(tokens)), [drawable(repr(t)) for t in tokens], rotation=45, ha="right", fontsize=8)
    step = max(1, L // 10)
    ys = [-1, *range(0, L, step), L + 1]
    ax.set_yticks(ys, [words["emb"], *(str(y) for y in range(0, L, step)), words["out"]], fontsize=8)
    ax.set_ylabel(words["layer"])
    ax.set_xlim(-0.7, len(tokens) - 0.3)
    ax.set_ylim(-2, L + 2.2)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    handles = [Line2D([], [], ls="", marker=KIND_STYLE[k]["marker"], color=KIND_STYLE[k]["color"], label=words[k])
               for k in ("feature", "error", "embedding", "logit")]
    handles += [Line2D([], [], color=RED, lw=2, label=words["adds"]),
                Line2D([], [], color=BLUE, lw=2, label=words["takes"])]
    ax.legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)
    s = data["scores"]
    target = (data.get("target") or {}).get("token")
    title = figure_title(data.get("model"), words["title"]) + f"  ·  {drawable(repr(data.get('prompt', '')))}"
    title += f" → {drawable(repr(target))}" if target is not None else ""
    ax.set_title(title + "\n" + words["scores"].format(r=s["replacement"], c=s["completeness"],
                                                       rp=s["replacement_pruned"], cp=s["completeness_pruned"]),
                 fontsize=10)
    return fig


def save_graph_figure(data: dict, path: str | os.PathLike, *, lang: str = "en", **kw) -> Path:
    """DATA's picture written atomically to PATH, its format by the suffix (.png, .svg, .pdf)."""
    fmt = Path(path).suffix.lower().lstrip(".")
    if fmt not in FORMATS:
        raise QkvError(f"{path} is not a picture's name; end it in {', '.join('.' + f for f in FORMATS)}")
    if lang not in WORDS:
        raise QkvError(f"no words for --lang {lang}; choose one of {sorted(WORDS)}")
    fig = graph_figure(data, lang=lang, **kw)
    try:
        return write_atomic(path, lambda f: render_figure(fig, f, fmt))
    except OSError as e:
        raise QkvError(f"cannot write {path}: {e.strerror or e}; choose a writable place") from None
