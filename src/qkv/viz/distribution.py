"""The next-token distribution as a bar chart (guide: temperature: logits → softmax(logits / T)).

    next_token_figure   one panel per temperature: the top k tokens and their probabilities

Every panel lists the same tokens in the same order (dividing by T > 0 never reorders
them), so the eye compares one token's bar across temperatures.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Sequence

import numpy as np

from ..writing.nexttoken import distribution, entropy, top_tokens
from .drawing import figure_title, fonts, new_figure, styled

if TYPE_CHECKING:
    from matplotlib.figure import Figure

BAR = "#2c7fb8"
TOP = "#d95f0e"            # the most probable token: what greedy decoding (T = 0) picks


@styled
def next_token_figure(logits: np.ndarray, temperatures: Sequence[float], label: Callable[[int], str], *,
                      k: int = 10, model_name: str = "", text: str = "") -> "Figure":
    """Bars of P = softmax(logits / T) for the top k tokens, one panel per temperature.

    logits: (V,) the scores of the next token; label: token id → the text to show.
    Each panel's title gives T and the entropy H = −Σ P·log₂ P (bits) of the whole
    distribution; the mass of the tokens not drawn is written under the bars.
    """
    z = np.asarray(logits)                                                   # (V,)
    ids, _ = top_tokens(distribution(z, 1.0), k)                             # (k,) the order of every panel
    labels = [label(int(i)) for i in ids]
    cols = len(temperatures)
    fig = new_figure(1.2 + 3.1 * cols, 1.3 + 0.3 * len(ids))
    axes = fig.subplots(1, cols, sharey=True, squeeze=False)[0]
    y = np.arange(len(ids))
    for ax, T in zip(axes, temperatures):
        P = distribution(z, T)                                               # (V,)
        p = P[ids]                                                           # (k,)
        colours = [TOP if r == 0 else BAR for r in range(len(ids))]
        ax.barh(y, p, color=colours, height=0.7)
        for yi, pi in zip(y, p):
            ax.text(min(pi, 1.0) + 0.02, yi, f"{pi:.3f}", va="center", fontsize=8)
        ax.set_xlim(0, 1.25)
        ax.set_xticks([0, 0.5, 1])
        ax.set_title(f"T = {T:g}" + ("  (greedy)" if T == 0 else "") + f"\nH = {float(entropy(P)):.2f} bits",
                     fontsize=10)
        ax.set_xlabel(f"probability · other tokens {max(0.0, 1 - p.sum()):.3f}", fontsize=8)
        ax.spines[["top", "right"]].set_visible(False)
    axes[0].set_yticks(y, [s.replace("$", r"\$") for s in labels], fontsize=9, family=fonts())
    axes[0].invert_yaxis()
    fig.suptitle(figure_title(model_name, f"next token after “{_short(text)}”" if text else "next token",
                              "softmax(logits / T)"), fontsize=11)
    return fig


def _short(text: str, width: int = 50) -> str:
    text = " ".join(text.split()).replace("$", r"\$")
    return text if len(text) <= width else "…" + text[-(width - 1):]

