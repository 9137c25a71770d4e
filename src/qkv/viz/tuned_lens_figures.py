"""The tuned lens's figure: KL(final ‖ lens) per layer, the logit lens's line beside the tuned lens's
(`qkv tuned-lens eval --out DIR`; the numbers come from qkv.features.tuned_lens_train.held_out_kl).

matplotlib is imported inside the function: importing qkv.viz never needs it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

import numpy as np

from .drawing import figure_title, new_figure

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def tuned_lens_kl_figure(logit: Sequence[float], tuned: Sequence[float], model_name: str = "") -> "Figure":
    """Layers 0..L−1 (x; 0: the embeddings) × mean KL in nats (y, log scale): the logit lens and the tuned lens."""
    logit, tuned = np.asarray(logit, float), np.asarray(tuned, float)          # (L,), (L,)
    fig = new_figure(7.0, 4.2)
    ax = fig.add_subplot()
    layers = np.arange(len(logit))
    ax.plot(layers, logit, marker="o", markersize=3, label="logit lens")
    ax.plot(layers, tuned, marker="o", markersize=3, label="tuned lens")
    if (np.concatenate([logit, tuned]) > 0).all():
        ax.set_yscale("log")
    ax.set_xlabel("layer (residual stream after l blocks; 0: the embeddings)")
    ax.set_ylabel("KL(final ‖ lens), nats")
    ax.set_title(figure_title(model_name, "tuned lens") + "\nKL to the final distribution on held-out text",
                 fontsize=11)
    ax.legend()
    ax.grid(alpha=0.3)
    return fig
