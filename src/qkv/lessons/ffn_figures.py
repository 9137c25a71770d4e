"""The figures of `qkv explain ffn` (qkv.lessons.ffn.figures writes them): drawn from a built Lesson and one
language's sentences (viz.words, FFN)."""

from __future__ import annotations

import numpy as np


def neurons_figure(le, t: dict):
    """Left: a_i over the d_ff neurons (stems), the top neurons marked, ±10 % of the largest |a_i| dotted.
    Right: the cosine of the top-k partial sum to FFN(h) for every k (log k), the table's k marked."""
    from ..viz.drawing import new_figure, styled, tick_label

    @styled
    def draw():
        fig = new_figure(12, 4.4)
        a, b = fig.subplots(1, 2, gridspec_kw={"width_ratios": [1.6, 1]})
        i = np.arange(le.d_ff)
        a.vlines(i, 0, le.a, color="C0", lw=0.6)
        amax = float(np.abs(le.a).max())
        for s in (1, -1):
            a.axhline(s * 0.1 * amax, color="#999999", lw=0.8, ls=":", label=t["fig_tenth"] if s == 1 else None)
        for r, nr in enumerate(le.top):
            a.plot([nr.index], [nr.a], "o", color="C3", ms=4,
                   label=t["fig_top"].format(k=len(le.top)) if r == 0 else None)
            a.annotate(f"#{nr.index}", (nr.index, nr.a), textcoords="offset points",
                       xytext=(4, 4 if nr.a > 0 else -10), fontsize=8, color="C3")
        a.axhline(0, color="black", lw=0.6)
        a.set(xlim=(-1, le.d_ff), xlabel=t["fig_neuron"], ylabel="a_i",
              title=t["fig_a"].format(model=le.model, layer=le.layer, token=tick_label(le.labels[le.pos]),
                                      d_ff=le.d_ff))
        a.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=2, frameon=False)
        k = np.arange(1, le.d_ff + 1)
        b.plot(k, le.curve, color="C0", lw=1.8, label=t["fig_cos"])
        for pt in le.partials:
            if pt.k:
                b.plot([pt.k], [pt.cos], "o", color="C3", ms=4)
                b.annotate(f"{pt.cos:.2f}", (pt.k, pt.cos), textcoords="offset points", xytext=(4, -12), fontsize=8)
        b.set(xscale="log", xlim=(1, le.d_ff), ylim=(min(0.0, float(le.curve.min())), 1.05), xlabel=t["fig_k"],
              title=t["fig_partial"])
        b.legend(fontsize=8, loc="upper left")
        return fig
    return draw()


def promoted_figure(le, t: dict):
    """One panel per top neuron, and one for the whole output: the tokens its vector promotes (green) and
    suppresses (red), with their logits."""
    from ..viz.drawing import new_figure, styled, tick_label

    panels = [(t["fig_one"].format(i=nr.index, a=nr.a), nr.promoted, nr.suppressed) for nr in le.top]
    panels.append((t["fig_whole"], le.out_promoted, le.out_suppressed))

    @styled
    def draw():
        cols = 3
        rows = -(-len(panels) // cols)
        fig = new_figure(4.2 * cols, 3.0 * rows)
        axes = np.atleast_1d(fig.subplots(rows, cols)).ravel()
        for ax, (title, up, down) in zip(axes, panels):
            items = up + down[::-1]                                 # largest at the top, smallest at the bottom
            y = np.arange(len(items))[::-1]
            ax.barh(y, [v for _, v in items], color=["C2"] * len(up) + ["C3"] * len(down))
            ax.set_yticks(y, [tick_label(s, 14) for s, _ in items], fontsize=8)
            ax.axvline(0, color="black", lw=0.6)
            ax.set_title(title, fontsize=9)
            ax.tick_params(axis="x", labelsize=7)
        for ax in axes[len(panels):]:
            ax.set_visible(False)
        token = tick_label(le.labels[le.pos])
        fig.suptitle(t["fig_promoted"].format(model=le.model, layer=le.layer, token=token), fontsize=11)
        return fig
    return draw()
