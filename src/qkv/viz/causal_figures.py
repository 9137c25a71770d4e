"""Causal tracing's figure (Meng et al. 2022, ROME's Figure 1), drawn from its JSON (`qkv trace-fact`'s;
viz comes before analysis, so nothing here traces anything).

    causal_trace_figure(data)   three maps side by side: the hidden state, FFN and attention outputs restored

Each map has the text's tokens as rows (top to bottom, the subject's marked "*"), layers as columns, and
colours the indirect effect p − p_corrupted of restoring that one clean state into the corrupted run, from 0
(white) to max(p_clean − p_corrupted, the map's own max) — `interpret_payload.causal_scale`, the viewer's
causal panel's scale too — on one sequential map per kind (`palette.CAUSAL_CMAPS`: purple, green, red, as
ROME draws them). Write it with `drawing.save_all(out, [("trace", lambda: causal_trace_figure(data))], formats)`.
matplotlib is imported inside the function: importing qkv.viz never needs it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Mapping

import numpy as np

from .drawing import figure_title, fonts, new_figure, styled, tick_label
from .interpret_payload import CAUSAL_KINDS, causal_scale, causal_tables
from .palette import CAUSAL_CMAPS

if TYPE_CHECKING:
    from matplotlib.figure import Figure

TITLES = {"hidden": "hidden state restored", "ffn": "FFN output restored", "attn": "attention output restored"}


def _layer_axis(window: int | None, kind: str) -> str:
    """The x label: a single layer, or the centre of the window of restored layers (ROME's words)."""
    if kind == "hidden" or window is None:
        return "restored layer l"
    return f"centre l of {window} restored layers"


@styled
def causal_trace_figure(data: Mapping) -> "Figure":
    """The causal-tracing maps of DATA (the JSON `interpret_payload.causal_section` takes: "tokens" (n),
    "subject_span" [s, e], "tables" {"hidden" | "ffn" | "attn": (L × n) P(answer)}, "p_clean", "p_corrupted",
    "answer_token", "window", "model", "text", "subject", "noise", "draws"), one per table it holds, side by
    side: rows the n tokens, columns the L layers, each with a colour bar of the indirect effect."""
    from matplotlib import colormaps
    from matplotlib.colors import Normalize

    tables, L, n = causal_tables(data)
    s, e = (int(x) for x in data["subject_span"])
    p_clean, p_corrupted = float(data["p_clean"]), float(data["p_corrupted"])
    window = data.get("window")
    labels = [tick_label(str(t), 14) + ("*" if s <= i < e else "") for i, t in enumerate(data["tokens"])]
    kinds = [k for k in CAUSAL_KINDS if k in tables]
    width = float(np.clip(1.4 + len(kinds) * (2.6 + 0.11 * L), 6.0, 20.0))
    fig = new_figure(width, float(np.clip(1.9 + 0.3 * n, 3.2, 12.0)))
    axes = fig.subplots(1, len(kinds), squeeze=False)[0]
    step = next(k for k in (1, 2, 5, 10, 20, 50) if L / k <= 12)                # a layer number every k columns
    family = fonts()
    for c, (ax, kind) in enumerate(zip(axes, kinds)):
        effect = tables[kind].T - p_corrupted                                   # (n, L) indirect effect
        top = causal_scale(tables[kind], p_clean, p_corrupted)
        im = ax.imshow(effect, cmap=colormaps[CAUSAL_CMAPS[kind]], norm=Normalize(0.0, top), aspect="auto",
                       interpolation="nearest")
        ax.set_yticks(range(n), labels if c == 0 else [], fontsize=8, family=family)
        ax.set_xticks(range(0, L, step), [str(l) for l in range(0, L, step)], fontsize=8)
        ax.set_xlabel(_layer_axis(window, kind), fontsize=9)
        ax.set_title(TITLES[kind], fontsize=10)
        bar = fig.colorbar(im, ax=ax, shrink=0.85, pad=0.03)
        bar.ax.tick_params(labelsize=7)
        bar.set_label("indirect effect p − p_corrupted", fontsize=8)
    answer = str(data.get("answer_token", ""))
    noise = "" if data.get("noise") is None else f", noise {float(data['noise']):.3g}"
    draws = "" if data.get("draws") is None else f", {int(data['draws'])} draws"
    text = str(data.get("text", ""))
    fig.suptitle(figure_title(str(data.get("model", "")), "causal tracing")
                 + f"\n“{tick_label(text, 60)}” → “{tick_label(answer, 20)}”"
                 + f"\nP {p_clean:.3f} clean, {p_corrupted:.3f} with the subject "
                 f"“{tick_label(str(data.get('subject', '')), 30)}” (* its tokens) noised{noise}{draws}", fontsize=10)
    return fig
