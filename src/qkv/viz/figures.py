"""Attention as pictures, as the guide's steps draw them (guide: softmax, heads).

    head_heatmap    one head's A = softmax(Q·Kᵀ/√d_k): rows = queries i, columns = keys j
    layer_grid      the H heads of one layer side by side ("compare their patterns")
    model_overview  every layer × head as small multiples
    save_figures    all of them as PNG and SVG files, written atomically
    masked_cells, focused_head   what they hatch, and the head a heatmap shows by default
    (an encoder–decoder's set, cross-attention included: `viz.seq2seq.save_seq2seq_figures`)

Brighter = more attention (the usual convention; `viz.palette` holds the colours every view
shares). Cells a decoder's causal mask removes (key after query, guide: mask) are hatched grey,
so they never read as a weight of 0. Rows are the queries (`trace.labels`), columns the keys
(`trace.key_labels`: the same tokens in self-attention; n_q × n_k in general). Titles name
`trace.model` unless given `model_name`.
The pieces they are drawn with (new_figure, styled, panel_grid, weights_image, save_all, …) are
`viz.drawing`'s, shared by every figure of qkv; matplotlib is imported inside them (`import qkv` stays light).
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Sequence

import numpy as np

from ..core.attention import causal_mask
from ..runtime.errors import QkvError, check_index
from ..core.ops import entropy
from ..runtime.io import FileBatch
from .drawing import (MAX_LABELS, MAX_NUMBERS, SQRT_SCALE, cell_numbers, check_formats, figure_title, fonts,
                      new_figure, panel_grid, save_all, styled, tick_label, ticks, weights_image)
from .palette import HATCH

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from ..core.trace import Trace

GRID_LABELS = 16          # token labels on the panels of a layer grid up to this many tokens


# ── what to draw ─────────────────────────────────────────────────────────────────

def _attentions(trace: "Trace", layer: int) -> np.ndarray:
    """The kept layer's weights A (H, n_q, n_k), or a clear error."""
    lt = trace.layer(layer)
    if not lt.kept("attentions"):
        raise QkvError(f"the trace holds no attention weights for layer {layer}; "
                       "run the model with keep=('attentions',)")
    return lt.attentions


def _check_head(head: int, H: int) -> int:
    return check_index("head", head, H, "the trace")


def masked_cells(trace: "Trace", layer: int, causal: bool | None = None) -> np.ndarray | None:
    """The (query, key) cells the mask removed, (n_q, n_k) bool, or None when nothing was masked.

    From the kept scores (-∞ = masked) when there are any; otherwise the causal triangle
    (key j > query i) when the trace's attention is causal (`trace.causal`, or `causal`
    when given). A trace that does not say (None) has nothing hatched: no guessing from zeros.
    """
    lt = trace.layer(layer)
    if lt.kept("scores"):
        mask = np.isneginf(lt.scores).all(axis=0)                 # (n_q, n_k)
        return mask if mask.any() else None
    causal = trace.causal if causal is None else causal
    n_q, n_k = _attentions(trace, layer).shape[-2:]
    if not causal or n_k < 2:
        return None
    return ~causal_mask(n_q, n_k)                                 # key after query (the engine's own mask)


def focused_head(trace: "Trace", layer: int) -> int:
    """The head of a layer whose rows are most focused: lowest mean entropy −Σ_j A[i,j]·log A[i,j]."""
    a = _attentions(trace, layer).astype(np.float64)               # (H, n, n)
    return int(np.argmin(entropy(a).mean(-1)))                     # entropy: (H, n)


# ── the figures ──────────────────────────────────────────────────────────────────

def _bar_label(n: int, masked: bool = False) -> str:
    return ("attention weight" + (" (√ scale)" if n > SQRT_SCALE else "")
            + ("   grey: masked" if masked else ""))


def _hatch(ax, mask: np.ndarray) -> None:
    """Hatch the masked cells: one rectangle per run of masked keys in a row."""
    from matplotlib.collections import PatchCollection
    from matplotlib.patches import Rectangle

    rects = []
    for i, row in enumerate(mask):
        edges = np.flatnonzero(np.diff(np.concatenate([[0], row.astype(np.int8), [0]])))
        for start, stop in zip(edges[::2], edges[1::2]):                # masked keys start..stop-1
            rects.append(Rectangle((start - 0.5, i - 0.5), stop - start, 1.0))
    ax.add_collection(PatchCollection(rects, facecolor="none", edgecolor=HATCH, linewidth=0, hatch="///"))


def _name(trace: "Trace", model_name: str | None) -> str:
    """The model named in titles: the trace's own unless the caller gives one."""
    return trace.model if model_name is None else model_name


@styled
def head_heatmap(trace: "Trace", layer: int, head: int, *, model_name: str | None = None,
                 causal: bool | None = None, what: str | None = None,
                 axes: tuple[str, str] | None = None) -> "Figure":
    """One head's attention weights A (n_q × n_k): tokens on both axes, rows = queries.

    Up to 16 tokens each cell shows its weight; past 40 tokens the tick labels thin out
    to every k-th token (with its index). Decoders: the masked triangle is hatched grey. A model with attention
    sinks (gpt-oss): a last column "sink", each row's share its sink took (1 − Σ_j A_ij).
    what: the title's name of the head (default "head {head}"); axes: the (x, y) axis labels
    (default key j / query i; cross-attention says target and source).
    """
    layer = trace.layer(layer).layer
    att = _attentions(trace, layer)                               # (H, n_q, n_k)
    head = _check_head(head, att.shape[0])
    a = att[head]                                                 # (n_q, n_k)
    mask = masked_cells(trace, layer, causal)
    keys = trace.key_labels
    if trace.sinks:                                               # gpt-oss: each row's sink share, a last column
        a = np.concatenate([a, np.maximum(1 - a.sum(axis=-1, keepdims=True), 0)], axis=1)   # (n_q, n_k + 1)
        keys = list(keys) + ["sink"]
        mask = None if mask is None else np.concatenate([mask, np.zeros((len(mask), 1), bool)], axis=1)
    n = max(a.shape)
    side = float(np.clip(1.6 + 0.42 * n, 4.2, 10.0))
    fig = new_figure(side + 1.3, side + 0.5)
    ax = fig.add_subplot()
    im = weights_image(ax, a, mask)
    if mask is not None:
        _hatch(ax, mask)
    if n <= MAX_NUMBERS:
        cell_numbers(ax, a, mask)
    fontsize = 10 if n <= MAX_NUMBERS else 8 if n <= MAX_LABELS else 7
    family = fonts()
    ax.set_xticks(*ticks(keys), rotation=60, ha="right", rotation_mode="anchor", fontsize=fontsize,
                  family=family)
    ax.set_yticks(*ticks(trace.labels), fontsize=fontsize, family=family)
    xlabel, ylabel = axes or ("key j (attended to)", "query i (looking)")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(figure_title(_name(trace, model_name), f"layer {layer}", what or f"head {head}"), fontsize=11,
                 wrap=True)                                       # a long model name: two lines, not cut off
    bar = fig.colorbar(im, ax=ax, shrink=0.8, pad=0.02)
    bar.set_label(_bar_label(n, mask is not None))
    return fig


def _panel(ax, a: np.ndarray, mask: np.ndarray | None):
    im = weights_image(ax, a, mask)
    ax.set_xticks([])
    ax.set_yticks([])
    return im


@styled
def layer_grid(trace: "Trace", layer: int, *, model_name: str | None = None,
               causal: bool | None = None, axes: str = "rows = queries, columns = keys") -> "Figure":
    """All H heads of one layer side by side (up to 6 per row), titled h0, h1, …

    Short inputs (≤ 16 tokens) carry token labels on the outer panels; axes: what rows and
    columns are, for the title.
    """
    layer = trace.layer(layer).layer
    att = _attentions(trace, layer)                               # (H, n_q, n_k)
    H, n_q, n_k = att.shape
    mask = masked_cells(trace, layer, causal)
    rows = math.ceil(H / 6)
    cols = math.ceil(H / rows)
    labelled = max(n_q, n_k) <= GRID_LABELS
    title = figure_title(_name(trace, model_name), f"layer {layer}", f"all {H} heads ({axes})")
    fig, axes, cax = panel_grid(rows, cols, 2.0, left=0.8 if labelled else 0.2, bottom=0.75 if labelled else 0.2,
                             top=0.75, wgap=0.15, hgap=0.35, title=title)
    for h, ax in enumerate(axes.flat):
        if h >= H:
            ax.set_axis_off()
            continue
        im = _panel(ax, att[h], mask)
        ax.set_title(f"h{h}", fontsize=10)
        if labelled and h % cols == 0:
            ax.set_yticks(range(n_q), [tick_label(t, 8) for t in trace.labels], fontsize=7, family=fonts())
        if labelled and h + cols >= H:                            # the lowest panel of its column
            ax.set_xticks(range(n_k), [tick_label(t, 8) for t in trace.key_labels], fontsize=7, rotation=90,
                          family=fonts())
    fig.colorbar(im, cax=cax, label=_bar_label(n_k))
    return fig


@styled
def model_overview(trace: "Trace", *, model_name: str | None = None, causal: bool | None = None) -> "Figure":
    """Every kept layer × head as small multiples: one row per layer, one column per head."""
    layers = trace.layer_ids
    H = _attentions(trace, layers[0]).shape[0]
    panel = float(np.clip(14.0 / H, 0.45, 1.0))
    fig, axes, cax = panel_grid(len(layers), H, panel, left=0.45, bottom=0.15, top=0.75, wgap=0.08, hgap=0.08,
                             title=figure_title(_name(trace, model_name), f"{len(layers)} layers × {H} heads",
                                          f"{len(trace.tokens)} tokens"))
    for r, layer in enumerate(layers):
        att = _attentions(trace, layer)                           # (H, n_q, n_k)
        mask = masked_cells(trace, layer, causal)
        for h in range(H):
            ax = axes[r, h]
            im = _panel(ax, att[h], mask)
            if r == 0:
                ax.set_title(f"h{h}", fontsize=8)
            if h == 0:
                ax.set_ylabel(f"layer {layer}", fontsize=8)
    fig.colorbar(im, cax=cax, label=_bar_label(len(trace.key_labels)))
    return fig


# ── files ────────────────────────────────────────────────────────────────────────

def save_figures(trace: "Trace", out_dir: str | os.PathLike | FileBatch, *, model_name: str | None = None,
                 layer: int = 0, head: int | None = None, formats: Sequence[str] = ("png", "svg"),
                 causal: bool | None = None) -> list[Path]:
    """Write the figures of a trace into OUT_DIR and return their paths.

    heatmap_layer{L}_head{h}  `head` of `layer` (default: its most focused head, `focused_head`)
    grid_layer{L}             the heads of `layer` side by side
    overview                  every kept layer × head
    each in every format of `formats`. All files are rendered to temporary names first
    and renamed into place at the end: on any error none of them is left behind.
    OUT_DIR may also be an `io.FileBatch`: the figures then join its other files.
    """
    formats = check_formats(formats)
    layer = trace.layer(layer).layer
    H = _attentions(trace, layer).shape[0]
    head = focused_head(trace, layer) if head is None else _check_head(head, H)
    style = dict(model_name=model_name, causal=causal)
    makers: list[tuple[str, Callable[[], "Figure"]]] = [
        (f"heatmap_layer{layer}_head{head}", lambda: head_heatmap(trace, layer, head, **style)),
        (f"grid_layer{layer}", lambda: layer_grid(trace, layer, **style)),
        ("overview", lambda: model_overview(trace, **style)),
    ]
    return save_all(out_dir, makers, formats)
