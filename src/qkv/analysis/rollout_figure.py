"""Raw attention beside attention rollout and attention flow, one figure (`qkv rollout`).

    raw      the last layer's attention weights, mean over its H heads      (n, n)
    rollout  R_L: each input token's share in each position after L layers   (n, n)
    flow     the maximum flow from each position down to each input token   (n, n), optional

Rows are positions (queries), columns input tokens, all on one 0..1 colour scale, so the three
read as answers to the same question: where does position i draw from? A decoder's cells above
the diagonal (a later token) are grey, as in every attention figure of qkv.

matplotlib is imported inside viz.figures' helpers: importing qkv.analysis never needs it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

import numpy as np

from ..viz.figures import MAX_NUMBERS, SQRT_SCALE, fonts, weights_image, cell_numbers, panel_grid, ticks, figure_title

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def rollout_figure(raw: np.ndarray, rollout: np.ndarray, flow: np.ndarray | None, labels: Sequence[str], *,
                   mask: np.ndarray | None = None, layer: int = 0, heads: int = 1,
                   model_name: str = "") -> "Figure":
    """Two or three n × n panels side by side: RAW (layer LAYER, mean of HEADS heads), ROLLOUT
    (after every layer) and, when given, FLOW. MASK (n, n) bool: cells the causal mask removed."""
    panels = [(raw, f"raw attention\nlayer {layer}, mean of {heads} heads"),
              (rollout, f"attention rollout\nafter {layer + 1} layers")]
    if flow is not None:
        panels.append((flow, f"attention flow\nmax-flow after {layer + 1} layers"))
    n = len(labels)
    size = float(np.clip(0.28 * n, 3.0, 6.0))                                  # inches a panel
    fig, axes, cax = panel_grid(1, len(panels), size, left=1.3, bottom=1.2, top=1.1, wgap=0.35, hgap=0.0,
                                title=figure_title(model_name, "where each position draws from"))
    family = fonts()
    at, names = ticks(list(labels))
    for c, (ax, (a, title)) in enumerate(zip(axes[0], panels)):
        im = weights_image(ax, np.asarray(a, dtype=np.float64), mask)                  # (n, n)
        if n <= MAX_NUMBERS:
            cell_numbers(ax, a, mask)
        ax.set_title(title, fontsize=10)
        ax.set_xticks(at, names, rotation=60, ha="right", rotation_mode="anchor", fontsize=8, family=family)
        ax.set_yticks(at, names if c == 0 else [], fontsize=8, family=family)
        ax.set_xlabel("input token")
    axes[0, 0].set_ylabel("position")
    scale = " (√ scale)" if n > SQRT_SCALE else ""
    grey = "   grey: masked" if mask is not None else ""
    fig.colorbar(im, cax=cax).set_label(f"share (flow: each entry ≤ 1){scale}{grey}")
    return fig
