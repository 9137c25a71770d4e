"""The views of `qkv neurons` (FFN neurons as key–value memories, `analysis.neurons`), drawn from its report:

    neurons_figure   per neuron a row: its top contexts, each token's cell coloured by the neuron's activation
                     there (the activating token framed), and the tokens its value promotes / suppresses as bars
    neurons_page     the neuron page: one self-contained HTML document (no script, nothing from the network)
                     with every neuron's contexts coloured the same way and its promoted / suppressed tokens
    save_neurons     neurons.json, .png, .svg and .html written together: all or none

Their pieces (draw_contexts, draw_vocab; context_table, vocab_lists, PAGE_CSS) also draw the SAE feature
pages (`viz.feature_figures`), so the two look alike.

Colours: an activation on DIVERGING (red above 0, blue below, white at 0), on each neuron's own scale
symmetric about 0 (its largest |h| among the contexts shown); promoted tokens red, suppressed blue, as every
signed view of qkv (`viz.palette`). viz comes before analysis: the report is read through the Protocols below.
Every text from the corpus or the vocabulary is escaped in the page (html.escape) and kept from mathtext in
the figure (`drawing.tick_label`).
"""

from __future__ import annotations

import html
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, Sequence

import numpy as np

from ..runtime.errors import QkvError
from ..runtime.io import FileBatch
from .drawing import check_formats, figure_title, new_figure, save_all, styled, tick_label
from .palette import DIVERGING, DIVERGING_STOPS

if TYPE_CHECKING:
    from matplotlib.figure import Figure

FIGURE_NEURONS = 6        # neurons drawn in the figure (the page and the JSON have them all)
FIGURE_CONTEXTS = 5       # contexts a neuron in the figure
FIGURE_SIDE = 5           # tokens of context drawn on each side of the activating one
FIGURE_TOKENS = 8         # promoted and suppressed tokens a neuron in the figure


class ExampleLike(Protocol):
    text: int
    line: int | None
    position: int
    activation: float
    tokens: list[str]
    at: int
    activations: list[float]


class NeuronLike(Protocol):
    index: int
    max: float
    min: float
    mean: float
    positive: float
    on_text: float | None
    examples: Sequence[ExampleLike]
    promotes: Sequence[tuple[int, str, float]]
    suppresses: Sequence[tuple[int, str, float]]


class ReportLike(Protocol):
    model: str
    layer: int
    d_ff: int
    activation: str
    chosen: str
    corpus: str
    texts: int
    tokens: int
    vocab: str | None
    neurons: Sequence[NeuronLike]
    sep: str                         # what goes between tokens in a line of text (" " for WordPiece)

    def as_json(self) -> dict: ...


def _scale(n: NeuronLike, contexts: int) -> float:
    """The neuron's colour scale: its largest |h| over the contexts shown (1 if all are 0)."""
    values = [abs(a) for e in n.examples[:contexts] for a in e.activations]
    return max(values, default=0.0) or 1.0


def colour(value: float, scale: float) -> tuple[int, int, int]:
    """VALUE on DIVERGING, symmetric about 0 at ±SCALE: linear between the palette's 11 stops, as matplotlib's map."""
    x = (min(max(value / scale, -1.0), 1.0) + 1.0) * 5.0                       # 0..10
    lo = min(int(x), 9)
    t = x - lo
    a, b = DIVERGING_STOPS[lo], DIVERGING_STOPS[lo + 1]
    return tuple(int(round(a[k] + t * (b[k] - a[k]))) for k in range(3))


def _title(r: ReportLike) -> str:
    return f"layer {r.layer}: FFN neurons as key–value memories"


# ── the figure ───────────────────────────────────────────────────────────────────

@styled
def neurons_figure(r: ReportLike) -> "Figure":
    """Up to FIGURE_NEURONS neurons, one row each: left, its FIGURE_CONTEXTS top contexts over the corpus
    (FIGURE_SIDE tokens either side of the activating one, framed; each cell coloured by h there and the value
    written in the activating cell); right, its value's FIGURE_TOKENS promoted (red) and suppressed (blue)
    tokens by logit. Without value logits (no LM head) the right column says why."""
    shown = list(r.neurons[:FIGURE_NEURONS])
    rows = [max(1, min(FIGURE_CONTEXTS, len(n.examples))) for n in shown]
    bars = [min(FIGURE_TOKENS, len(n.promotes)) + min(FIGURE_TOKENS, len(n.suppresses)) for n in shown]
    heights = [max(k, 0.5 * b, 2.5) for k, b in zip(rows, bars)]
    fig = new_figure(15.0, float(np.clip(1.0 + sum(0.34 * h + 0.55 for h in heights), 3.0, 24.0)))
    axes = fig.subplots(len(shown), 2, squeeze=False, gridspec_kw={"width_ratios": [3.3, 1.0], "height_ratios": heights})
    for (ax, bar), n, k in zip(axes, shown, rows):
        draw_contexts(ax, n, k, "h at the framed token")
        ax.set_title(f"neuron {n.index}: max {n.max:.2f}, mean {n.mean:.3f}, active on {n.positive:.0%} of "
                     f"tokens" + ("" if n.on_text is None else f", max on TEXT {n.on_text:.2f}"), fontsize=9.5, loc="left")
        draw_vocab(bar, n, r.vocab)
    extra = "" if len(r.neurons) <= len(shown) else f" (the first {len(shown)} of {len(r.neurons)})"
    values = "" if r.vocab else " and the tokens its value W_out[i] promotes / suppresses"
    fig.suptitle(figure_title(r.model, _title(r)) + f"\ntop contexts over {r.corpus} ({r.tokens:,} tokens; red: the "
                 f"neuron fires){values}{extra}", fontsize=10.5)
    return fig


def draw_contexts(ax, n: NeuronLike, k: int, ylabel: str) -> None:
    """N's first K contexts on AX, one row each: FIGURE_SIDE tokens either side of the activating one (framed),
    each cell coloured by the activation there on DIVERGING (N's own scale), the value written in the row's label."""
    from matplotlib import colormaps
    from matplotlib.colors import Normalize
    from matplotlib.patches import Rectangle

    cols = 2 * FIGURE_SIDE + 1
    m = _scale(n, FIGURE_CONTEXTS)
    grid = np.full((k, cols), np.nan)                                        # (k, 2·side+1)
    for row, e in enumerate(n.examples[:k]):
        for c in range(cols):
            t = e.at + c - FIGURE_SIDE
            if 0 <= t < len(e.tokens):
                grid[row, c] = e.activations[t]
    ax.imshow(grid, cmap=colormaps[DIVERGING], norm=Normalize(-m, m), aspect="auto", interpolation="nearest")
    for row, e in enumerate(n.examples[:k]):
        for c in range(cols):
            t = e.at + c - FIGURE_SIDE
            if not 0 <= t < len(e.tokens):
                continue
            strong = abs(e.activations[t]) > 0.6 * m
            ax.text(c, row, tick_label(e.tokens[t], 9), ha="center", va="center", fontsize=7.5,
                    color="white" if strong else "black")
        ax.add_patch(Rectangle((FIGURE_SIDE - 0.5, row - 0.5), 1, 1, fill=False, lw=1.6, ec="#111111"))
    ax.set_xticks([])
    ax.set_yticks(range(k), [f"{e.activation:.2f}" for e in n.examples[:k]], fontsize=7.5)
    ax.set_ylabel(ylabel, fontsize=7.5)
    for side in ax.spines.values():
        side.set_visible(False)


def draw_vocab(ax, n: NeuronLike, vocab: str | None, title: str = "value · W_vocab: promotes / suppresses") -> None:
    """N's promoted tokens (red, top) and suppressed ones (blue, below) as horizontal bars of their logits."""
    up, down = list(n.promotes[:FIGURE_TOKENS]), list(n.suppresses[:FIGURE_TOKENS])
    if not up and not down:
        ax.axis("off")
        ax.text(0.0, 0.5, "no value logits:\n" + (vocab or "none computed"), fontsize=7.5, va="center", wrap=True,
                transform=ax.transAxes)
        return
    items = up + down[::-1]                                                  # top: most promoted; bottom: most suppressed
    values = np.array([v for _, _, v in items])
    red, blue = (np.array(colour(s, 1.0)) / 255 for s in (0.8, -0.8))
    ax.barh(range(len(items))[::-1], values, color=[red if v > 0 else blue for v in values], height=0.75)
    ax.set_yticks(range(len(items))[::-1], [tick_label(t, 12) for _, t, _ in items], fontsize=7.5)
    ax.axvline(0, color="#555555", lw=0.6)
    ax.tick_params(axis="x", labelsize=7)
    ax.set_title(title, fontsize=8.5, loc="left")
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)


# ── the page ─────────────────────────────────────────────────────────────────────

_CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:; font-src data:"     # no script at all
# The neuron page's CSS, and the SAE feature page's (viz.feature_figures draws its cards with these pieces too).
PAGE_CSS = """
.qkv-neurons h1 { font-size: 18px; margin: 4px 0 6px; }
.qkv-neurons h2 { font-size: 15px; margin: 18px 0 4px; border-top: 1px solid var(--line); padding-top: 10px; }
.qkv-neurons .ctx { white-space: pre-wrap; line-height: 1.9; }
.qkv-neurons .t { padding: 1px 1px; border-radius: 2px; }
.qkv-neurons .hit { outline: 2px solid #111; font-weight: 600; }
.qkv-neurons table { border-collapse: collapse; margin: 4px 0; }
.qkv-neurons td { padding: 2px 8px 2px 0; vertical-align: top; }
.qkv-neurons td.num { text-align: right; font-variant-numeric: tabular-nums; color: var(--muted); }
.qkv-neurons .vocab { display: flex; gap: 28px; flex-wrap: wrap; }
.qkv-neurons .bar { display: inline-block; height: 10px; vertical-align: middle; margin-right: 6px; }
"""


def _span(token: str, value: float, scale: float, hit: bool, what: str = "h") -> str:
    r, g, b = colour(value, scale)
    ink = "#fff" if abs(value) > 0.6 * scale else "#111"
    cls = "t hit" if hit else "t"
    return (f'<span class="{cls}" style="background: rgb({r},{g},{b}); color: {ink}" '
            f'title="{html.escape(what)} = {value:.3f}">{html.escape(token)}</span>')


def _vocab_table(items: Sequence[tuple[int, str, float]], sign: float) -> str:
    if not items:
        return ""
    top = max(abs(v) for _, _, v in items) or 1.0
    r, g, b = colour(0.8 * sign, 1.0)
    rows = "".join(f'<tr><td class="num">{v:+.3f}</td><td><span class="bar" style="width: {int(80 * abs(v) / top)}px; '
                   f'background: rgb({r},{g},{b})"></span>{html.escape(t)}</td></tr>' for _, t, v in items)
    return f"<div><b>{'promotes' if sign > 0 else 'suppresses'}</b><table>{rows}</table></div>"


def context_table(n: NeuronLike, sep: str, what: str = "h") -> str:
    """N's contexts as a table: the activation, where, and the tokens coloured by WHAT on N's own scale."""
    scale = _scale(n, len(n.examples))
    rows = []
    for e in n.examples:
        spans = html.escape(sep).join(_span(t, a, scale, i == e.at, what)
                                      for i, (t, a) in enumerate(zip(e.tokens, e.activations)))
        where = f"text {e.text}" + ("" if e.line is None else f", line {e.line}")
        rows.append(f'<tr><td class="num">{e.activation:.3f}</td><td class="num">{html.escape(where)}</td>'
                    f'<td class="ctx">{spans}</td></tr>')
    return f"<table>{''.join(rows)}</table>"


def vocab_lists(n: NeuronLike) -> str:
    """N's promoted and suppressed tokens side by side, each with a bar of its logit ("" if none)."""
    vocab = _vocab_table(n.promotes, 1.0) + _vocab_table(n.suppresses, -1.0)
    return f'<div class="vocab">{vocab}</div>' if vocab else ""


def neurons_page(r: ReportLike) -> str:
    """The neuron page: a self-contained HTML document (viz.html.page; no script) of the report."""
    from .html import page

    parts = [f"<h1>{html.escape(figure_title(r.model, _title(r)))}</h1>",
             f'<p class="qkv-caption">{html.escape(r.chosen)}; contexts from {html.escape(r.corpus)} '
             f"({r.texts:,} texts, {r.tokens:,} tokens), each token coloured by the neuron's activation h "
             f"({html.escape(r.activation)}; red above 0, blue below, on each neuron's own scale; hover a token for h), "
             "the activating token framed. Promoted / suppressed: the neuron's value W_out[i] through the final norm's "
             "scale and W_vocab.</p>"]
    if r.vocab:
        parts.append(f'<p class="qkv-note">{html.escape(r.vocab)}</p>')
    for n in r.neurons:
        on_text = "" if n.on_text is None else f", max on TEXT {n.on_text:.3f}"
        parts.append(f'<h2 id="n{n.index}">neuron {n.index}</h2><p class="qkv-field">max {n.max:.3f}, min {n.min:.3f}, '
                     f"mean {n.mean:.4f}, h &gt; 0 on {n.positive:.1%} of tokens{on_text}</p>")
        parts.append(context_table(n, r.sep))
        vocab = vocab_lists(n)
        if vocab:
            parts.append(vocab)
    body = f'<style>{PAGE_CSS}</style>\n<div class="qkv qkv-neurons">\n' + "\n".join(parts) + "\n</div>"
    return page(f"{r.model} · layer {r.layer} · neurons", body, [], csp=_CSP)


def save_neurons(r: ReportLike, out_dir: str | os.PathLike, formats: Sequence[str] = ("png", "svg")) -> list[Path]:
    """OUT_DIR/neurons.json (`r.as_json()`), neurons.{png,svg} (`neurons_figure`) and neurons.html
    (`neurons_page`): all or none (io.FileBatch)."""
    formats = check_formats(formats)
    try:
        with FileBatch(out_dir) as files:
            files.write_text("neurons.json", json.dumps(r.as_json(), ensure_ascii=False, indent=1))
            save_all(files, [("neurons", lambda: neurons_figure(r))], formats)
            files.write_text("neurons.html", neurons_page(r))
    except OSError as e:
        raise QkvError(f"cannot write to {out_dir}: {e.strerror or e}; choose a writable directory") from None
    return files.paths
