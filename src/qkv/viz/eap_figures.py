"""The figure and the page of `qkv eap` (edge attribution patching: qkv.analysis.eap), drawn from plain data
(viz comes before analysis: nothing here computes or imports an analysis).

    faithfulness_figure   the faithfulness curve: the metric recovered as the top k edges are kept (every other
                          edge patched from the corrupt run), k on a symmetric-log axis, beside the senders ×
                          receivers map of the edges' scores
    circuit_page          one self-contained HTML page: the components laid by layer (the embedding at the bottom,
                          the logits at the top, a layer's heads then its FFN across), the top edges as curves
                          coloured by sign (red raises the metric's move, blue lowers it), width ∝ |score|, a
                          slider for how many, hover for the numbers (viz/assets/eap.js)

The page's data (`circuit_data` of qkv.analysis.eap): {"model", "metric", "method", "steps", "clean", "corrupted",
"metric_clean", "metric_corrupted", "n_layers", "n_heads", "parallel", "qkv", "n_edges", "edges": [[sender,
receiver, score], …] largest |score| first (names as "embed", "L3.H5", "L3.H5.q", "L3.FFN", "logits"), "curve":
[[k, faithfulness, metric], …]}. Every text in it (the prompts, the metric's tokens) is set as textContent by the
script, never as markup.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

import numpy as np

from .drawing import figure_title, new_figure, styled
from .html import asset, page
from .palette import DIVERGING
from .payload import script_json

if TYPE_CHECKING:
    from matplotlib.figure import Figure

CLIP = 0.995                 # the score map's colour scale ends at this quantile of the edges' |score|


@styled
def faithfulness_figure(ks: Sequence[int], faithfulness: Sequence[float], scores: np.ndarray | None = None, *,
                        senders: Sequence[str] = (), receivers: Sequence[str] = (), model_name: str = "",
                        what: str = "") -> "Figure":
    """Right: faithfulness (1 = the clean metric, 0 = the corrupt one) against the edges kept, KS (k on a
    symmetric-log axis: 0 and every edge both shown). Left (SCORES (S, R) given): each edge's score, senders
    (rows) × receivers (columns), red > 0 > blue, on a symmetric scale ending at the CLIP quantile of |score| (the
    largest few saturate); the cells that are no edge at 0."""
    two = scores is not None
    fig = new_figure(12.5 if two else 6.5, 5.2)
    axes = fig.subplots(1, 2, width_ratios=[1, 1.1]) if two else [None, fig.add_subplot()]
    if two:
        ax = axes[0]
        size = np.abs(scores[scores != 0])
        top = float(np.quantile(size, CLIP)) if size.size else 1.0       # a few huge edges would blank the rest
        im = ax.imshow(scores, cmap=DIVERGING, vmin=-top, vmax=top, aspect="auto", interpolation="nearest")
        for axis, names, setter in ((0, senders, ax.set_yticks), (1, receivers, ax.set_xticks)):
            step = max(1, len(names) // 12)
            setter(range(0, len(names), step), [names[i] for i in range(0, len(names), step)], fontsize=7)
        ax.tick_params(axis="x", rotation=90)
        ax.set_xlabel("receiver (reads the stream)")
        ax.set_ylabel("sender (writes it)")
        ax.set_title(f"edge scores (colours end at the {100 * CLIP:g}th percentile of |score|)", fontsize=10)
        fig.colorbar(im, ax=ax, shrink=0.8, pad=0.02).set_label("score")
    ax = axes[1]
    ax.plot(list(ks), list(faithfulness), marker="o", color="#b2182b")
    ax.axhline(1.0, color="#888888", lw=0.8, ls="--")
    ax.axhline(0.0, color="#888888", lw=0.8, ls=":")
    ax.set_xscale("symlog", linthresh=1)
    ax.set_xlim(-0.3, max(2, max(ks, default=1)) * 1.5)
    ax.set_xlabel("edges kept (top by |score|; the rest from the corrupt run)")
    ax.set_ylabel("faithfulness (m − m corrupt) / (m clean − m corrupt)")
    ax.set_title("faithfulness by edge patching", fontsize=10)
    fig.suptitle(figure_title(model_name, "edge attribution") + (f"\n{what}" if what else ""), fontsize=11)
    return fig


def circuit_page(data: dict) -> str:
    """The circuit page of DATA (module doc): one complete, self-contained HTML document (no network)."""
    title = f"qkv · edge attribution · {data.get('model') or '?'}"
    body = ("<div class=\"qkv qkv-eap\" data-qkv-eap></div>\n"
            f"<script type=\"application/json\" class=\"qkv-eap-data\">{script_json(data)}</script>")
    return page(title, body, [asset("eap.js"), "QKV_EAP.boot();"])
