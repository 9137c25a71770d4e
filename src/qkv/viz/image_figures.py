"""An image model's attention drawn over its image (ViT: the tokens after [CLS] are the image's patches).

    image_heads     one layer: each head's attention from [CLS] laid over the image, one panel per head
    image_layers    every layer × head, the same overlay, as small multiples
    image_rollout   the image alone, and attention rollout from [CLS] laid over it, with the predicted label

Pure drawing: every function takes arrays — the image (H, W, C) uint8 (C = 1 grey or 3), the weights one
query gives each patch as a grid (rows, cols), and the patch size (p_h, p_w) — and computes nothing of the
model (`cli.show_image` takes them from the trace). Patch (r, c) covers pixels [r·p_h, (r+1)·p_h) ×
[c·p_w, (c+1)·p_w): the grid is drawn with that extent, nearest-neighbour, so each patch is one flat
square of colour over exactly the pixels it read, and an 8 × 8 image stays crisp.
Colours: `palette.CMAP` (brighter = more attention), on one 0..max scale per figure, its colour bar beside.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Sequence

import numpy as np

from .drawing import figure_title, new_figure, styled, tick_label
from .palette import CMAP

if TYPE_CHECKING:
    from matplotlib.figure import Figure

ALPHA = 0.6               # the overlay's opacity: the image shows through


def overlay(ax, image: np.ndarray, cells: np.ndarray, patch: Sequence[int], vmax: float):
    """Draw IMAGE (H, W, C) uint8 and over it CELLS (rows, cols), patch (r, c) over the pixels it covers
    (p_h × p_w each), semi-transparent; returns the overlay's image (for a colour bar)."""
    ph, pw = patch
    rows, cols = cells.shape
    H, W = image.shape[:2]
    if image.shape[2] == 1:
        ax.imshow(image[:, :, 0], cmap="gray", vmin=0, vmax=255, interpolation="nearest", extent=(0, W, H, 0))
    else:
        ax.imshow(image, interpolation="nearest", extent=(0, W, H, 0))
    im = ax.imshow(cells, cmap=CMAP, vmin=0.0, vmax=vmax, alpha=ALPHA, interpolation="nearest",
                   extent=(0, cols * pw, rows * ph, 0))                 # pixels past the last patch: not read
    ax.set_xlim(0, W)
    ax.set_ylim(H, 0)
    ax.set_xticks([])
    ax.set_yticks([])
    return im


def _scale(cells: np.ndarray) -> float:
    """The top of a figure's colour scale: its largest weight (never 0)."""
    return max(float(np.max(cells)), 1e-6)


@styled
def image_heads(image: np.ndarray, cells: np.ndarray, patch: Sequence[int], layer: int, *,
                self_weights: Sequence[float] | None = None, model_name: str | None = None) -> "Figure":
    """Each head's attention from [CLS] at LAYER over the image: cells (H, rows, cols), one panel per head
    (up to 6 a row) titled "layer L head h"; self_weights (H,): what [CLS] keeps for itself, under each panel."""
    H = cells.shape[0]
    per_row = min(H, 6)
    n_rows = math.ceil(H / per_row)
    aspect = image.shape[0] / image.shape[1]
    fig = new_figure(2.2 * per_row + 0.8, (2.2 * aspect + 0.45) * n_rows + 0.5)
    axes = fig.subplots(n_rows, per_row, squeeze=False)
    vmax = _scale(cells)
    for h, ax in enumerate(axes.flat):
        if h >= H:
            ax.set_axis_off()
            continue
        im = overlay(ax, image, cells[h], patch, vmax)
        ax.set_title(f"layer {layer} head {h}", fontsize=9)
        if self_weights is not None:
            ax.set_xlabel(f"[CLS] → itself {self_weights[h]:.2f}", fontsize=8)
    fig.colorbar(im, ax=axes, shrink=0.8, label="attention from [CLS]")
    fig.suptitle(figure_title(model_name, f"layer {layer}: where [CLS] looks, each head"))
    return fig


@styled
def image_layers(image: np.ndarray, cells: np.ndarray, patch: Sequence[int], layers: Sequence[int], *,
                 model_name: str | None = None) -> "Figure":
    """Every layer × head: cells (L, H, rows, cols), one row of panels per layer, the same overlay."""
    L, H = cells.shape[:2]
    size = float(np.clip(12.0 / H, 0.9, 1.8))
    aspect = image.shape[0] / image.shape[1]
    fig = new_figure(size * H + 1.2, size * aspect * L + 0.9)
    axes = fig.subplots(L, H, squeeze=False)
    vmax = _scale(cells)
    for r, layer in enumerate(layers):
        for h in range(H):
            ax = axes[r, h]
            im = overlay(ax, image, cells[r, h], patch, vmax)
            if r == 0:
                ax.set_title(f"head {h}", fontsize=8)
            if h == 0:
                ax.set_ylabel(f"layer {layer}", fontsize=8)
    fig.colorbar(im, ax=axes, shrink=0.8, label="attention from [CLS]")
    fig.suptitle(figure_title(model_name, f"{L} layers × {H} heads: where [CLS] looks"))
    return fig


@styled
def image_rollout(image: np.ndarray, cells: np.ndarray, patch: Sequence[int], label: str, prob: float, *,
                  model_name: str | None = None) -> "Figure":
    """The image alone, beside attention rollout from [CLS] after every layer over it (cells (rows, cols)),
    titled with the predicted LABEL and its probability."""
    aspect = image.shape[0] / image.shape[1]
    fig = new_figure(6.4, 3.0 * aspect + 0.9)
    left, right = fig.subplots(1, 2)
    overlay(left, image, np.zeros_like(cells), patch, 1.0).set_alpha(0.0)   # the image alone, same frame
    left.set_title("the image the model read", fontsize=9)
    im = overlay(right, image, cells, patch, _scale(cells))
    right.set_title("attention rollout from [CLS]", fontsize=9)
    fig.colorbar(im, ax=right, shrink=0.8, label="share of [CLS] after every layer")
    fig.suptitle(figure_title(model_name, f"predicted: {tick_label(label, 24)} ({prob:.2f})"))   # never mathtext
    return fig
