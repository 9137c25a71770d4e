"""The views of `qkv sae features` (an SAE's latents over a corpus, `features.pages`), drawn from its report:

    features_figure   per latent a row: its top contexts (each token's cell coloured by the latent's activation,
                      the activating token framed), its activation histogram, and the tokens its decoder
                      direction promotes / suppresses as bars
    features_page     the feature page: one self-contained HTML document with every latent's card (contexts
                      coloured the same way, the histogram, promoted / suppressed tokens) and a search box that
                      keeps the cards whose top promoted tokens or top-context tokens hold what is typed
    save_features     features.json, .png, .svg and .html written together: all or none

The cards are the neuron page's (`viz.neuron_figures`: the same CSS, context table and token lists), so the
two pages look alike. Colours: an activation on DIVERGING on each latent's own scale (latents are ≥ 0, so
red); the histogram's bars are counts of the non-zero activations in log-spaced bins. Every text from the
corpus or the vocabulary is escaped (html.escape; the search reads only data-* attributes, never HTML), and
kept from mathtext in the figure (`drawing.tick_label`). viz comes before features: the report is read
through the Protocols below.
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
from .drawing import check_formats, figure_title, new_figure, save_all, styled
from .neuron_figures import (FIGURE_CONTEXTS, FIGURE_TOKENS, PAGE_CSS, ExampleLike, colour, context_table,
                             draw_contexts, draw_vocab, vocab_lists)

if TYPE_CHECKING:
    from matplotlib.figure import Figure

FIGURE_FEATURES = 6       # latents drawn in the figure (the page and the JSON have them all)
SEARCH_TOKENS = 5         # promoted tokens, and top-context tokens, a card is found by


class FeatureLike(Protocol):
    index: int
    max: float
    mean: float
    fired: int
    frequency: float
    histogram: Sequence[int]
    examples: Sequence[ExampleLike]
    promotes: Sequence[tuple[int, str, float]]
    suppresses: Sequence[tuple[int, str, float]]


class FeatureReportLike(Protocol):
    model: str
    layer: int
    site: str
    d_sae: int
    k: int
    chosen: str
    corpus: str
    texts: int
    tokens: int
    dead: int
    vocab: str | None
    features: Sequence[FeatureLike]
    sep: str
    edges: Sequence[float]

    def as_json(self) -> dict: ...


SITE_WORDS = {"resid": "the residual stream entering block", "attn_out": "the attention output of block",
              "ffn_out": "the FFN output of block"}


def _title(r: FeatureReportLike) -> str:
    k = "" if r.k is None else f" (k {r.k})"                         # TopK only: JumpReLU and ReLU keep no k
    return f"SAE features: {r.d_sae} latents{k} of {SITE_WORDS.get(r.site, r.site)} {r.layer}"


def _stats(f: FeatureLike) -> str:
    return (f"max {f.max:.3f}, mean when firing {f.mean:.3f}, fires on {f.frequency:.3%} of tokens "
            f"({f.fired:,})")


# ── the figure ───────────────────────────────────────────────────────────────────

@styled
def features_figure(r: FeatureReportLike) -> "Figure":
    """Up to FIGURE_FEATURES latents, one row each: its FIGURE_CONTEXTS top contexts (`neuron_figures.draw_contexts`),
    its histogram of non-zero activations (log-spaced bins), its decoder direction's FIGURE_TOKENS promoted and
    suppressed tokens (`neuron_figures.draw_vocab`)."""
    shown = list(r.features[:FIGURE_FEATURES])
    if not shown:
        raise QkvError("the report has no features to draw; choose latents that exist (--feature) or a larger --top")
    rows = [max(1, min(FIGURE_CONTEXTS, len(f.examples))) for f in shown]
    bars = [min(FIGURE_TOKENS, len(f.promotes)) + min(FIGURE_TOKENS, len(f.suppresses)) for f in shown]
    heights = [max(k, 0.5 * b, 2.5) for k, b in zip(rows, bars)]
    fig = new_figure(17.0, float(np.clip(1.0 + sum(0.34 * h + 0.6 for h in heights), 3.0, 24.0)))
    axes = fig.subplots(len(shown), 3, squeeze=False,
                        gridspec_kw={"width_ratios": [3.3, 1.1, 1.0], "height_ratios": heights})
    edges = np.asarray(r.edges)
    for (ax, hist, bar), f, k in zip(axes, shown, rows):
        if f.examples:
            draw_contexts(ax, f, k, "z at the framed token")
        else:
            ax.axis("off")
            ax.text(0.0, 0.5, "never fired on this corpus", fontsize=8, va="center", transform=ax.transAxes)
        ax.set_title(f"feature {f.index}: {_stats(f)}", fontsize=9.5, loc="left")
        _histogram(hist, f, edges)
        draw_vocab(bar, f, r.vocab, "W_dec[j] · W_vocab: promotes / suppresses")
    extra = "" if len(r.features) <= len(shown) else f" (the first {len(shown)} of {len(r.features)})"
    fig.suptitle(figure_title(r.model, _title(r)) + f"\ntop contexts over {r.corpus} ({r.tokens:,} tokens); "
                 f"{r.chosen}{extra}", fontsize=10.5)
    return fig


def _histogram(ax, f: FeatureLike, edges: np.ndarray) -> None:
    """F's non-zero activations: counts per log-spaced bin, as bars on a log x axis."""
    counts = np.asarray(f.histogram)
    if counts.sum() == 0:
        ax.axis("off")
        ax.text(0.0, 0.5, "no activations", fontsize=8, va="center", transform=ax.transAxes)
        return
    used = np.nonzero(counts)[0]
    lo, hi = used[0], used[-1] + 1                                          # the bins that hold something
    red = np.array(colour(0.8, 1.0)) / 255
    ax.bar(edges[lo:hi], counts[lo:hi], width=np.diff(edges)[lo:hi], align="edge", color=red)
    from matplotlib.ticker import FuncFormatter, NullFormatter

    ax.set_xscale("log")
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))           # 1, 10, not 10⁰, 10¹
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("z", fontsize=7.5)
    ax.tick_params(labelsize=7)
    ax.set_title("activations when firing (count)", fontsize=8.5, loc="left")
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)


# ── the page ─────────────────────────────────────────────────────────────────────

_CSS = """
.qkv-features .search { margin: 8px 0; display: flex; gap: 10px; align-items: baseline; }
.qkv-features .search input { font: inherit; padding: 3px 6px; width: 24ch; }
.qkv-features .card[hidden] { display: none; }
.qkv-features .hist { display: block; margin: 4px 0; }
.qkv-features .hist rect { fill: rgb(%d,%d,%d); }
.qkv-features .hist text { font-size: 10px; fill: var(--muted); }
.qkv-features .row { display: flex; gap: 28px; flex-wrap: wrap; align-items: flex-start; }
""" % colour(0.8, 1.0)

# The search: a card stays when a line of its data-find (its top promoted tokens and its top contexts' tokens,
# lower-cased, one a line: a reader's labels hold no raw line break) holds the query, or its data-index is the
# query (with or without "#"); an empty query shows every card.
_SEARCH_JS = """
(function () {
  "use strict";
  const box = document.querySelector(".qkv-features .search input");
  const count = document.querySelector(".qkv-features .search .shown");
  const cards = Array.from(document.querySelectorAll(".qkv-features .card"));
  function filter() {
    const q = box.value.trim().toLowerCase();
    let n = 0;
    for (const card of cards) {
      const hit = !q || card.dataset.find.split("\\n").some(t => t.includes(q)) ||
                  card.dataset.index === q.replace(/^#/, "");
      card.hidden = !hit;
      if (hit) n++;
    }
    count.textContent = n + " of " + cards.length + " features";
  }
  box.addEventListener("input", filter);
  filter();
})();
"""


def _find(f: FeatureLike) -> str:
    """What the search matches: the top promoted tokens and each top context's activating token, lower-cased
    (a reader's ␣ as a space too, so "paris" finds "␣Paris")."""
    words = [t for _, t, _ in f.promotes[:SEARCH_TOKENS]] + [e.token for e in f.examples[:SEARCH_TOKENS]]
    out = []
    for w in words:
        w = w.lower()
        out += [w, w.replace("␣", " ").strip()]
    return "\n".join(dict.fromkeys(x for x in out if x))


def _hist_svg(f: FeatureLike, edges: Sequence[float], width: int = 260, height: int = 70) -> str:
    """F's histogram as an inline SVG: a bar per log-spaced bin, the first and last used edge written below."""
    counts = np.asarray(f.histogram)
    if counts.sum() == 0:
        return '<p class="qkv-note">never fired on this corpus</p>'
    used = np.nonzero(counts)[0]
    lo, hi = int(used[0]), int(used[-1]) + 1
    c = counts[lo:hi]
    w = width / len(c)
    top = c.max()
    rects = "".join(f'<rect x="{i * w:.1f}" y="{height - 14 - (height - 18) * v / top:.1f}" width="{max(w - 1, 1):.1f}" '
                    f'height="{(height - 18) * v / top:.1f}"><title>{edges[lo + i]:.3g}–{edges[lo + i + 1]:.3g}: '
                    f"{int(v)}</title></rect>" for i, v in enumerate(c))
    labels = (f'<text x="0" y="{height - 2}">{edges[lo]:.3g}</text>'
              f'<text x="{width}" y="{height - 2}" text-anchor="end">{edges[hi]:.3g}</text>')
    return (f'<div><b>activations when firing</b><svg class="hist" width="{width}" height="{height}" '
            f'role="img" aria-label="histogram of activations">{rects}{labels}</svg></div>')


def features_page(r: FeatureReportLike) -> str:
    """The feature page: a self-contained HTML document (viz.html.page) of the report, its search inline."""
    from .html import page

    parts = [f"<h1>{html.escape(figure_title(r.model, _title(r)))}</h1>",
             f'<p class="qkv-caption">{html.escape(r.chosen)}; contexts from {html.escape(r.corpus)} '
             f"({r.texts:,} texts, {r.tokens:,} tokens; {r.dead:,} of the {r.d_sae:,} latents never fired on them), "
             "each token coloured by the latent's activation z (red, on each latent's own scale; hover a token for z), "
             "the activating token framed. Promoted / suppressed: the latent's decoder direction W_dec[j] through the "
             "final norm's scale and W_vocab.</p>",
             '<div class="search"><label>search <input type="search" placeholder="a token, or #index" '
             'aria-label="search features by top token"></label><span class="shown qkv-field"></span></div>']
    if r.vocab:
        parts.append(f'<p class="qkv-note">{html.escape(r.vocab)}</p>')
    for f in r.features:
        card = [f'<h2 id="f{f.index}">feature {f.index}</h2><p class="qkv-field">{html.escape(_stats(f))}</p>']
        if f.examples:
            card.append(context_table(f, r.sep, "z"))
        card.append(f'<div class="row">{_hist_svg(f, r.edges)}{vocab_lists(f)}</div>')
        parts.append(f'<section class="card" data-index="{f.index}" data-find="{html.escape(_find(f), quote=True)}">'
                     + "".join(card) + "</section>")
    body = (f"<style>{PAGE_CSS}{_CSS}</style>\n<div class=\"qkv qkv-neurons qkv-features\">\n" + "\n".join(parts)
            + "\n</div>")
    return page(f"{r.model} · layer {r.layer} {r.site} · SAE features", body, [_SEARCH_JS])


def save_features(r: FeatureReportLike, out_dir: str | os.PathLike, formats: Sequence[str] = ("png", "svg")) -> list[Path]:
    """OUT_DIR/features.json (`r.as_json()`), features.{png,svg} (`features_figure`) and features.html
    (`features_page`): all or none (io.FileBatch)."""
    formats = check_formats(formats)
    try:
        with FileBatch(out_dir) as files:
            files.write_text("features.json", json.dumps(r.as_json(), ensure_ascii=False, indent=1))
            save_all(files, [("features", lambda: features_figure(r))], formats)
            files.write_text("features.html", features_page(r))
    except OSError as e:
        raise QkvError(f"cannot write to {out_dir}: {e.strerror or e}; choose a writable directory") from None
    return files.paths
