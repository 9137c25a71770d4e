"""The drawing kit every figure of qkv is drawn with: the attention figures (`viz.figures`), each method's
(`interpret_figures`, `causal_figures`, `image_figures`, `neuron_figures`, `feature_figures`, `head_maps`,
`distribution`, `seq2seq`, `training`) and the lessons'.

    new_figure, styled      a figure on its own Agg canvas; draw with the CJK-capable fonts
    fonts, drawable         that font list (for tick labels made before drawing); text those fonts can draw
    ticks, tick_label       token labels as ticks: all of them, or every k-th past MAX_LABELS
    figure_title            "model · part · part", empty parts left out
    panel_grid              rows × cols square panels laid out by hand, a colour-bar axis beside
    weights_image           one 0..1 map of weights (√ scale past SQRT_SCALE tokens, masked cells grey)
    cell_numbers            each weight written in its cell (figures write them up to MAX_NUMBERS tokens)
    save_figure, save_all, check_formats   PNG / SVG / PDF files, all or none

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

from ..runtime.errors import QkvError
from ..runtime.io import FileBatch
from ..core.labels import shorten
from .palette import CMAP, MASKED
from . import hangul

if TYPE_CHECKING:
    from matplotlib.figure import Figure

DPI = 110
MAX_NUMBERS = 16          # write each cell's weight up to this many tokens
MAX_LABELS = 40           # tick labels per axis before thinning them
SQRT_SCALE = 64           # past this many tokens colours follow √weight
FORMATS = ("png", "svg", "pdf")


# ── fonts ────────────────────────────────────────────────────────────────────────

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


# ── text a figure can draw ───────────────────────────────────────────────────────

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


def figure_title(model_name: str | None, *parts: str) -> str:
    """A figure's title: the model's name and the parts joined by " · ", empty ones left out, drawable."""
    return drawable(" · ".join(p for p in (model_name, *parts) if p))


# ── figures and panels ───────────────────────────────────────────────────────────

@functools.lru_cache(maxsize=1)
def _figure_class():
    """matplotlib's Figure that shows itself in Jupyter: qkv never imports pyplot, so no inline backend
    registers a display for its figures; `_repr_png_` is the one IPython asks every object for."""
    from matplotlib.figure import Figure

    class ShownFigure(Figure):
        def _repr_png_(self) -> bytes:
            out = io.BytesIO()
            render_figure(self, out, "png")
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


# ── files ────────────────────────────────────────────────────────────────────────

@styled
def render_figure(fig: "Figure", path: Path | IO[bytes], fmt: str) -> None:
    """FIG as FMT into PATH (a file or an open binary stream), the house style applied; missing-glyph warnings
    silenced (tokens in scripts the font lacks)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"Glyph .* missing")   # tokens in scripts the font lacks
        fig.savefig(path, format=fmt, dpi=DPI)


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
                paths.append(out.write(f"{name}.{fmt}", lambda f: render_figure(fig, f, fmt)))
                fig.set_layout_engine("none")                     # laid out once: the next format reuses it
        return paths
    try:
        with FileBatch(out) as files:
            save_all(files, makers, formats)
    except OSError as e:
        raise QkvError(f"cannot write figures to {out}: {e.strerror or e}; choose a writable directory") from None
    return files.paths
