"""Attention as pictures, as the guide's steps draw them (guide: softmax, heads).

    head_heatmap    one head's A = softmax(Q·Kᵀ/√d_k): rows = queries i, columns = keys j
    layer_grid      the H heads of one layer side by side ("compare their patterns")
    model_overview  every layer × head as small multiples
    save_figures    all of them as PNG and SVG files, written atomically
    (an encoder–decoder's set, cross-attention included: `viz.seq2seq.save_seq2seq_figures`)

and the pieces every figure of qkv is drawn with (`interpret_figures`, `causal_figures`, `head_maps`,
`distribution`, `seq2seq`, `training`, the lessons):

    new_figure, styled      a figure on its own Agg canvas; draw with the CJK-capable fonts
    fonts                   that font list, for tick labels made before drawing
    ticks, tick_label       token labels as ticks: all of them, or every k-th past MAX_LABELS
    figure_title            "model · part · part", empty parts left out
    panel_grid              rows × cols square panels laid out by hand, a colour-bar axis beside
    weights_image           one 0..1 map of weights (√ scale past SQRT_SCALE tokens, masked cells grey)
    cell_numbers            each weight written in its cell
    save_figure, save_all, check_formats   PNG / SVG / PDF files, all or none

Brighter = more attention (the usual convention; `viz.palette` holds the colours every view
shares). Cells a decoder's causal mask removes (key after query, guide: mask) are hatched grey,
so they never read as a weight of 0. Rows are the queries (`trace.labels`), columns the keys
(`trace.key_labels`: the same tokens in self-attention; n_q × n_k in general). Titles name
`trace.model` unless given `model_name`.
matplotlib is imported inside the functions (`import qkv` stays light) and every figure
draws on its own Agg canvas: no display, no pyplot state.
"""

from __future__ import annotations

import functools
import io
import math
import os
import warnings
from pathlib import Path
from typing import IO, TYPE_CHECKING, Callable, Sequence

import numpy as np

from ..core.attention import causal_mask
from ..runtime.errors import QkvError, check_index
from ..core.ops import entropy
from ..runtime.io import FileBatch
from ..core.labels import shorten
from .palette import CMAP, HATCH, MASKED
from . import hangul

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from ..core.trace import Trace

DPI = 110
MAX_NUMBERS = 16          # write each cell's weight up to this many tokens
MAX_LABELS = 40           # tick labels per axis before thinning them
SQRT_SCALE = 64           # past this many tokens colours follow √weight
GRID_LABELS = 16          # token labels on the panels of a layer grid up to this many tokens
FORMATS = ("png", "svg", "pdf")


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


def tick_label(label: str, width: int = 12) -> str:
    """A token's label as a tick label: short, drawable, and never read as mathtext."""
    return drawable(shorten(label, width)).replace("$", r"\$")


@functools.lru_cache(maxsize=1)
def _drawable_chars() -> frozenset[int]:
    """The code points some font of `fonts()` has a glyph for (read once from their character maps)."""
    from matplotlib import font_manager
    from matplotlib.ft2font import FT2Font

    chars: set[int] = set()
    for name in fonts():
        try:
            chars.update(FT2Font(font_manager.findfont(name, fallback_to_default=False)).get_charmap())
        except (ValueError, RuntimeError, OSError):
            pass
    return frozenset(chars)


def drawable(text: str) -> str:
    """TEXT with each character no figure font can draw (an emoji, a rare script) written as its code point,
    "⟨U+1F642⟩", instead of the empty box matplotlib would draw."""
    have = _drawable_chars()
    if not have or all(ord(ch) in have for ch in text):
        return text
    return "".join(ch if ord(ch) in have or ch in "\n\t" else f"⟨U+{ord(ch):04X}⟩" for ch in text)


def ticks(labels: Sequence[str]) -> tuple[list[int], list[str]]:
    """Tick positions and labels: every token, or every k-th with its index when there are many."""
    n = len(labels)
    if n <= MAX_LABELS:
        return list(range(n)), [tick_label(t) for t in labels]
    step = math.ceil(n / MAX_LABELS)
    at = list(range(0, n, step))
    return at, [f"{i} {tick_label(labels[i], 8)}" for i in at]


# ── drawing ──────────────────────────────────────────────────────────────────────

# Tokens of Korean, Japanese or Chinese text need a font with those glyphs; DejaVu Sans (matplotlib's
# own) has none. The first of these that is installed backs it up; NanumGothic always is (viz/hangul.py
# registers the file a dependency ships, so Korean shows on a machine without a Korean font).
CJK_FONTS = ("Noto Sans CJK KR", "Noto Sans KR", "NanumGothic", "NanumBarunGothic", "Malgun Gothic",
             "Apple SD Gothic Neo", "AppleGothic", "Noto Sans CJK JP", "Noto Sans CJK SC", "Source Han Sans KR")


@functools.lru_cache(maxsize=1)
def fonts() -> tuple[str, ...]:
    """DejaVu Sans, then the installed CJK fonts of `CJK_FONTS` (the bundled NanumGothic among them),
    as a fallback list."""
    from matplotlib import font_manager

    hangul.register_matplotlib()
    installed = {f.name for f in font_manager.fontManager.ttflist}
    return ("DejaVu Sans", *(f for f in CJK_FONTS if f in installed))


def styled(draw):
    """Draw with the fallback fonts (every text, including tick labels made at render time)."""
    @functools.wraps(draw)
    def wrapper(*args, **kwargs):
        import matplotlib

        with matplotlib.rc_context({"font.family": list(fonts())}):
            return draw(*args, **kwargs)
    return wrapper


@functools.lru_cache(maxsize=1)
def _figure_class():
    """matplotlib's Figure that shows itself in Jupyter: qkv never imports pyplot, so no inline backend
    registers a display for its figures; `_repr_png_` is the one IPython asks every object for."""
    from matplotlib.figure import Figure

    class ShownFigure(Figure):
        def _repr_png_(self) -> bytes:
            out = io.BytesIO()
            _render(self, out, "png")
            return out.getvalue()

    return ShownFigure


def new_figure(width: float, height: float, layout: str | None = "constrained", dpi: int = DPI) -> "Figure":
    """A figure on its own Agg canvas (no pyplot, no display; a notebook shows it as a PNG); width and
    height in inches."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    fig = _figure_class()(figsize=(width, height), dpi=dpi, layout=layout)
    FigureCanvasAgg(fig)
    return fig


def panel_grid(rows: int, cols: int, panel: float, *, left: float, bottom: float, top: float, wgap: float,
               hgap: float, title: str):
    """A rows × cols grid of square panels laid out by hand (sizes in inches), a colour-bar axis on
    the right. Many panels make matplotlib's automatic layout slow; fixed margins are instant."""
    right = 1.0
    width = left + cols * panel + (cols - 1) * wgap + right
    height = top + rows * panel + (rows - 1) * hgap + bottom
    fig = new_figure(width, height, layout=None)
    axes = fig.subplots(rows, cols, squeeze=False, gridspec_kw=dict(
        left=left / width, right=(width - right) / width, bottom=bottom / height, top=(height - top) / height,
        wspace=wgap / panel, hspace=hgap / panel))
    span = min(height - top - bottom, 4.0)
    cax = fig.add_axes([(width - right + 0.15) / width, (height - top - span) / height, 0.15 / width, span / height])
    fig.suptitle(title, y=1 - 0.12 / height, va="top")
    return fig, axes, cax


def weights_image(ax, a: np.ndarray, mask: np.ndarray | None):
    """imshow of one head's weights on a fixed 0..1 scale, masked cells grey.

    Past 64 tokens most weights are near 1/n, so the scale turns to √ (PowerNorm 0.5)
    to keep the faint patterns visible; the colour bar shows it.
    """
    from matplotlib import colormaps
    from matplotlib.colors import Normalize, PowerNorm

    cmap = colormaps[CMAP].with_extremes(bad=MASKED)
    data = a if mask is None else np.ma.masked_array(a, mask)
    n = a.shape[-1]                                               # keys
    norm = Normalize(0.0, 1.0) if n <= SQRT_SCALE else PowerNorm(0.5, 0.0, 1.0)
    return ax.imshow(data, cmap=cmap, norm=norm, aspect="equal",
                     interpolation="nearest" if n <= 128 else "antialiased")


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


def cell_numbers(ax, a: np.ndarray, mask: np.ndarray | None) -> None:
    """Write each weight of A (n_q, n_k) in its cell (2 decimals; dark text on bright cells), none on masked ones."""
    n_q, n_k = a.shape
    size = 9 if max(n_q, n_k) <= 10 else 7
    for i in range(n_q):
        for j in range(n_k):
            if mask is not None and mask[i, j]:
                continue
            weight = float(a[i, j])
            if weight < 0.005:                                         # a quiet 0, so the weights stand out
                ax.text(j, i, "0", ha="center", va="center", fontsize=size, color="white", alpha=0.45)
            else:
                ax.text(j, i, f"{weight:.2f}".lstrip("0"), ha="center", va="center", fontsize=size,
                        color="black" if weight > 0.6 else "white")


def figure_title(model_name: str | None, *parts: str) -> str:
    """A figure's title: the model's name and the parts joined by " · ", empty ones left out, drawable."""
    return drawable(" · ".join(p for p in (model_name, *parts) if p))


def _name(trace: "Trace", model_name: str | None) -> str:
    """The model named in titles: the trace's own unless the caller gives one."""
    return trace.model if model_name is None else model_name


@styled
def head_heatmap(trace: "Trace", layer: int, head: int, *, model_name: str | None = None,
                 causal: bool | None = None, what: str | None = None,
                 axes: tuple[str, str] | None = None) -> "Figure":
    """One head's attention weights A (n_q × n_k): tokens on both axes, rows = queries.

    Up to 16 tokens each cell shows its weight; past 40 tokens the tick labels thin out
    to every k-th token (with its index). Decoders: the masked triangle is hatched grey.
    what: the title's name of the head (default "head {head}"); axes: the (x, y) axis labels
    (default key j / query i; cross-attention says target and source).
    """
    layer = trace.layer(layer).layer
    att = _attentions(trace, layer)                               # (H, n_q, n_k)
    head = _check_head(head, att.shape[0])
    a = att[head]                                                 # (n_q, n_k)
    n = max(a.shape)
    mask = masked_cells(trace, layer, causal)
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
    ax.set_xticks(*ticks(trace.key_labels), rotation=60, ha="right", rotation_mode="anchor", fontsize=fontsize,
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

@styled
def _render(fig: "Figure", path: Path | IO[bytes], fmt: str) -> None:
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"Glyph .* missing")   # tokens in scripts the font lacks
        fig.savefig(path, format=fmt, dpi=DPI)


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


def check_formats(formats: Sequence[str]) -> list[str]:
    """File formats ("png", ".SVG", …) as save_all takes them, or one clear error."""
    formats = [f.lower().lstrip(".") for f in formats]
    bad = [f for f in formats if f not in FORMATS]
    if bad or not formats:
        raise QkvError(f"cannot write figures as {bad or 'nothing'}; choose formats from {list(FORMATS)}")
    return formats


def save_figure(fig: "Figure", out_dir: str | os.PathLike, name: str,
                formats: Sequence[str] = ("png", "svg")) -> list[Path]:
    """One figure as OUT_DIR/NAME.{png,svg}: all files or none (temporary names, renamed at the end)."""
    return save_all(out_dir, [(name, lambda: fig)], check_formats(formats))


def save_all(out: str | os.PathLike | FileBatch, makers: Sequence[tuple[str, Callable[[], "Figure"]]],
             formats: Sequence[str]) -> list[Path]:
    """The figure of each (name, make) as name.fmt in every format, into OUT: a directory
    (all files or none: rendered to temporary names, renamed into place at the end) or an
    `io.FileBatch` already being written."""
    if isinstance(out, FileBatch):
        paths = []
        for name, make in makers:
            fig = make()
            for fmt in formats:
                paths.append(out.write(f"{name}.{fmt}", lambda f: _render(fig, f, fmt)))
                fig.set_layout_engine("none")                     # laid out once: the next format reuses it
        return paths
    try:
        with FileBatch(out) as files:
            save_all(files, makers, formats)
    except OSError as e:
        raise QkvError(f"cannot write figures to {out}: {e.strerror or e}; choose a writable directory") from None
    return files.paths
