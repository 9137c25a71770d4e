"""Pictures of a model learning (`qkv train`): the loss curve, and induction heads forming.

    loss_figure       training loss against the step (log scale when it spans a decade), lr beside it
    induction_figure  two panels sharing the step axis: above, the loss on the repeated half of
                      random sequences repeated twice (and on the first half, which no model can
                      predict); below, every head's induction score. The loss drop and an
                      induction head's rise happen together: the "phase change" (Olsson et al. 2022).

Both take plain arrays (the training log's columns), so they draw a run in progress, a
finished one, or one read back from DIR/log.jsonl. Drawn on an Agg canvas (no pyplot).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

import numpy as np

from .drawing import new_figure, styled

if TYPE_CHECKING:
    from matplotlib.figure import Figure

LOSS = "#2c7fb8"
FIRST = "#8c8c8c"          # the first half: random tokens, nothing to learn (loss stays near ln V)
LR = "#d95f0e"
THRESHOLD = 0.5            # an induction head: score ≥ 0.5 on the repeated half


def _smooth(y: np.ndarray, window: int) -> np.ndarray:
    """A trailing moving average over `window` points (the first points average what exists)."""
    if window <= 1 or len(y) < 2:
        return y
    c = np.cumsum(np.insert(y, 0, 0.0))                        # (T + 1,)
    k = np.minimum(np.arange(1, len(y) + 1), window)           # (T,) points in each window
    return (c[1:] - c[np.arange(1, len(y) + 1) - k]) / k


@styled
def loss_figure(steps: Sequence[int], loss: Sequence[float], lr: Sequence[float] | None = None, *,
                title: str = "", val: tuple[Sequence[int], Sequence[float]] | None = None) -> "Figure":
    """The training loss (mean next-token cross-entropy, nats) against the step.

    steps, loss, lr: (T,) one per step; the raw loss is drawn faint, its moving average over
    ~1/50 of the run solid. val: (steps, losses) of a held-out split, drawn as points.
    """
    s = np.asarray(steps)                                      # (T,)
    y = np.asarray(loss, dtype=np.float64)                     # (T,)
    fig = new_figure(7.5, 3.8)
    ax = fig.subplots()
    ax.plot(s, y, color=LOSS, alpha=0.25, linewidth=0.8)
    ax.plot(s, _smooth(y, max(1, len(y) // 50)), color=LOSS, linewidth=1.6, label="training loss")
    if val is not None and len(val[0]):
        ax.plot(val[0], val[1], "o-", color="#31a354", markersize=3, linewidth=1, label="validation loss")
    if len(y) and np.all(y > 0) and y.max() / max(y.min(), 1e-12) > 10:
        ax.set_yscale("log")
    ax.set_xlabel("step")
    ax.set_ylabel("loss (nats)")
    ax.spines[["top"]].set_visible(False)
    if lr is not None and len(lr):
        twin = ax.twinx()
        twin.plot(s, lr, color=LR, linewidth=0.9, alpha=0.7)
        twin.set_ylabel("learning rate", color=LR)
        twin.tick_params(axis="y", colors=LR)
        twin.set_ylim(0, max(lr) * 1.1)
        twin.spines[["top"]].set_visible(False)
    ax.legend(loc="upper right", fontsize=8, frameon=False)
    ax.set_title("training loss: mean cross-entropy of the next token", fontsize=9)
    if title:
        fig.suptitle(title, fontsize=11)
    return fig


@styled
def induction_figure(steps: Sequence[int], loss_repeated: Sequence[float], loss_first: Sequence[float],
                     scores: np.ndarray, *, title: str = "", vocab: int | None = None) -> "Figure":
    """Loss on the repeated half (above) and each head's induction score (below), against the step.

    steps (T,), loss_repeated (T,), loss_first (T,): mean losses of the recorded steps;
    scores (T, L, H): each head's induction score at those steps. A line per head, coloured
    by layer; the best head is drawn bold and named, the threshold 0.5 dashed.
    """
    from matplotlib import colormaps

    s = np.asarray(steps)                                      # (T,)
    A = np.asarray(scores, dtype=np.float64)                   # (T, L, H)
    T, L, H = A.shape
    fig = new_figure(7.5, 5.6)
    top, bottom = fig.subplots(2, 1, sharex=True, gridspec_kw=dict(height_ratios=[1, 1.2]))
    top.plot(s, loss_repeated, color=LOSS, linewidth=1.8, label="repeated half (predictable by induction)")
    top.plot(s, loss_first, color=FIRST, linewidth=1.2, linestyle="--", label="first half (random)")
    if vocab:
        top.axhline(np.log(vocab), color=FIRST, linewidth=0.6, linestyle=":")
        top.annotate(f"ln V = {np.log(vocab):.2f}: a uniform guess", (1, np.log(vocab)), xycoords=("axes fraction", "data"),
                     xytext=(0, 3), textcoords="offset points", ha="right", va="bottom", fontsize=7, color=FIRST)
    top.set_ylabel("loss (nats)")
    top.legend(loc="center right", fontsize=8, frameon=False)
    top.set_ylim(0, max(np.max(loss_first, initial=0), np.log(vocab or 1)) * 1.12)
    top.spines[["top", "right"]].set_visible(False)
    cmap = colormaps["tab10"]
    best = np.unravel_index(np.argmax(A[-1]), (L, H)) if T else (0, 0)
    for layer in range(L):
        for head in range(H):
            bold = (layer, head) == tuple(best)
            bottom.plot(s, A[:, layer, head], color=cmap(layer % 10), linewidth=2.2 if bold else 0.9,
                        alpha=1.0 if bold else 0.55, label=f"layer {layer}" if head == 0 else None)
    if T:
        crossed = np.flatnonzero(A.reshape(T, -1).max(axis=1) >= THRESHOLD)
        if len(crossed):
            at = s[crossed[0]]
            for ax in (top, bottom):
                ax.axvline(at, color="#555555", linewidth=0.7, linestyle=":")
            bottom.text(at, 1.02, f" step {at}: a head passes {THRESHOLD}", fontsize=7, va="bottom")
        bottom.annotate(f"L{best[0]} h{best[1]}", (s[-1], A[-1][best]), xytext=(-4, 4),
                        textcoords="offset points", ha="right", fontsize=8)
    bottom.axhline(THRESHOLD, color="#555555", linewidth=0.8, linestyle="--")
    bottom.set_ylim(0, 1.1)
    bottom.set_ylabel("induction score Σ(A⊙P)/ΣA")
    bottom.set_xlabel("step")
    bottom.legend(loc="upper left", fontsize=8, frameon=False)
    bottom.spines[["top", "right"]].set_visible(False)
    top.set_title("induction heads forming: the loss on held-out repeated sequences, and each head's score",
                  fontsize=9)
    fig.suptitle(title or "induction heads forming", fontsize=11)
    return fig
