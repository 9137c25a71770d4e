"""The figures of the commands beyond attention weights (`qkv lens`, `rollout`, `dla`, `patch`,
`circuits`), drawn from what qkv.analysis computes, passed as arrays or as any object with the
fields below (viz comes before analysis, so nothing here computes or imports an analysis).

    lens_figure          layers × positions: P(final prediction) after each layer
    rollout_figure       raw attention, attention rollout and attention flow side by side
    attribution_figure   layers × heads: each head's direct part of one logit
    token_scores_figure  the input tokens coloured by their attribution to one output (qkv attribute)
    patch_figure         activation patching's effect tables (heads; residual, attn, FFN by position)
    save_patching        patch.png, .svg, patch.json and any pages beside them, all or none
    circuits_figure      one head's OV circuit on a token set, and its QK pattern by distance

Signed maps (attribution, patching, OV) are diverging at 0 (`palette.DIVERGING`), each on its own
symmetric scale; weights and shares on the attention figures' 0..1 viridis scale.
matplotlib is imported inside the functions: importing qkv.viz never needs it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Mapping, Protocol, Sequence

import numpy as np

from ..runtime.errors import QkvError
from ..runtime.io import FileBatch
from .drawing import (MAX_NUMBERS, SQRT_SCALE, cell_numbers, check_formats, figure_title, fonts, new_figure, panel_grid,
                      save_all, styled, ticks, weights_image)
from .palette import CMAP, DIVERGING

if TYPE_CHECKING:
    from matplotlib.figure import Figure


class PatchTables(Protocol):
    """What `patch_figure` and `save_patching` read (`analysis.patch.Patching` has it)."""

    heads: np.ndarray | None         # (L, H)
    residual: np.ndarray | None      # (L, n)
    attn_out: np.ndarray | None      # (L, n)
    ffn_out: np.ndarray | None       # (L, n)
    cross: np.ndarray | None         # (L, H) an encoder–decoder's cross-attention heads; None: a decoder
    labels: list[str]                # (n,)
    metric: str
    normalised: bool
    model: str

    def as_json(self) -> dict: ...


class OVTable(Protocol):
    """What `circuits_figure` reads of a head's OV circuit (`analysis.circuits.OVCircuit`)."""

    layer: int
    head: int
    labels: list[str]                # (k,)
    matrix: np.ndarray               # (k, k)
    copying_score: float


class QKByDistance(Protocol):
    """What `circuits_figure` reads of a head's QK pattern (`analysis.circuits.PositionQK`)."""

    deltas: np.ndarray               # (D,)
    score: np.ndarray                # (D,)
    attention: np.ndarray            # (D,)
    table_by_delta: np.ndarray | None    # (D',)
    deltas_table: np.ndarray | None      # (D',)


def _signed(ax, values: np.ndarray, **imshow):
    """imshow of signed VALUES on DIVERGING, symmetric about 0 (white)."""
    from matplotlib import colormaps
    from matplotlib.colors import Normalize

    m = float(np.abs(values).max()) or 1.0
    return ax.imshow(values, cmap=colormaps[DIVERGING], norm=Normalize(-m, m), interpolation="nearest", **imshow)


# ── the logit lens ───────────────────────────────────────────────────────────────

@styled
def lens_figure(probs: np.ndarray, labels: Sequence[str], predicted: Sequence[str], *,
                model_name: str = "", kind: str = "logit lens") -> "Figure":
    """Layers (rows, embeddings at the bottom) × positions (columns): the probability that
    the lens at layer l gives the token the model finally predicts at that position.

    probs: (L+1, n) (`analysis.lens.final_prediction`); labels: the n input tokens (bottom axis);
    predicted: the n final predictions (top axis); kind: the lens's name in the title ("tuned lens").
    """
    from matplotlib import colormaps
    from matplotlib.colors import Normalize

    rows, n = probs.shape
    fig = new_figure(float(np.clip(2.2 + 0.45 * n, 6.5, 16.0)), float(np.clip(1.8 + 0.22 * rows, 4.0, 11.0)))
    ax = fig.add_subplot()
    im = ax.imshow(probs, cmap=colormaps[CMAP], norm=Normalize(0.0, 1.0), aspect="auto", origin="lower",
                   interpolation="nearest")
    family = fonts()
    ax.set_xticks(*ticks(list(labels)), rotation=60, ha="right", rotation_mode="anchor", fontsize=8, family=family)
    step = max(1, rows // 16)
    ax.set_yticks(range(0, rows, step), ["emb" if l == 0 else str(l) for l in range(0, rows, step)], fontsize=8)
    ax.set_xlabel("position (input token)")
    ax.set_ylabel("layer (residual stream after l blocks)")
    top = ax.secondary_xaxis("top")
    top.set_xticks(*ticks(list(predicted)), rotation=60, ha="left", rotation_mode="anchor", fontsize=8,
                   family=family)
    top.set_xlabel("final prediction")
    ax.set_title(figure_title(model_name, kind) + "\nP(final prediction) after each layer", fontsize=11)
    fig.colorbar(im, ax=ax, shrink=0.8, pad=0.02).set_label("probability")
    return fig


# ── rollout and flow ─────────────────────────────────────────────────────────────

def rollout_figure(raw: np.ndarray, rollout: np.ndarray, flow: np.ndarray | None, labels: Sequence[str], *,
                   mask: np.ndarray | None = None, layer: int = 0, heads: int = 1,
                   model_name: str = "") -> "Figure":
    """Two or three n × n panels side by side: RAW (layer LAYER, mean of HEADS heads), ROLLOUT
    (after every layer) and, when given, FLOW. MASK (n, n) bool: cells the causal mask removed.

    Rows are positions (queries), columns input tokens, all on one 0..1 colour scale, so the three
    read as answers to the same question: where does position i draw from?"""
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
        im = weights_image(ax, np.asarray(a, dtype=np.float64), mask)           # (n, n)
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


# ── direct logit attribution ─────────────────────────────────────────────────────

@styled
def attribution_figure(heads: np.ndarray, *, model_name: str = "", what: str = "") -> "Figure":
    """Layers (rows, layer 0 at the bottom) × heads (columns): each head's direct part of the
    logit, HEADS (L, H), red adding to it and blue taking away, white at 0 (the scale symmetric)."""
    L, H = heads.shape
    fig = new_figure(float(np.clip(2.5 + 0.5 * H, 5.0, 14.0)), float(np.clip(1.8 + 0.22 * L, 4.0, 11.0)))
    ax = fig.add_subplot()
    im = _signed(ax, heads, aspect="auto", origin="lower")
    ax.set_xticks(range(H), [str(h) for h in range(H)], fontsize=8)
    step = max(1, L // 16)
    ax.set_yticks(range(0, L, step), [str(l) for l in range(0, L, step)], fontsize=8)
    ax.set_xlabel("head")
    ax.set_ylabel("layer")
    ax.set_title(figure_title(model_name, "direct logit attribution") + (f"\n{what}" if what else ""), fontsize=11)
    fig.colorbar(im, ax=ax, shrink=0.8, pad=0.02).set_label("direct contribution to the logit")
    return fig


TOKENS_PER_LINE = 12


@styled
def token_scores_figure(labels: Sequence[str], scores: np.ndarray, *, model_name: str = "", what: str = "") -> "Figure":
    """The input tokens as a text, TOKENS_PER_LINE to a line, each cell coloured by its score (red: adds to
    the output, blue: takes away, white: 0, one symmetric scale) with the score written under the token."""
    from .drawing import tick_label

    n = len(labels)
    cols = min(n, TOKENS_PER_LINE)
    lines = -(-n // cols)
    grid = np.full((lines, cols), np.nan)
    grid.flat[:n] = scores
    fig = new_figure(float(np.clip(1.2 + 0.95 * cols, 4.0, 13.0)), float(np.clip(1.3 + 0.75 * lines, 2.2, 12.0)))
    ax = fig.add_subplot()
    m = float(np.nanmax(np.abs(grid))) if n else 1.0
    im = _signed(ax, np.where(np.isnan(grid), 0.0, grid) if m == 0 else grid, aspect="auto")
    for i in range(n):
        r, c = divmod(i, cols)
        strong = m > 0 and abs(scores[i]) > 0.6 * m
        ax.text(c, r - 0.12, tick_label(labels[i], 10), ha="center", va="center", fontsize=8,
                color="white" if strong else "black")
        ax.text(c, r + 0.25, f"{scores[i]:+.2f}", ha="center", va="center", fontsize=6.5,
                color="white" if strong else "#333333")
    ax.set_xticks([])
    ax.set_yticks([])
    ax.set_title(figure_title(model_name, "input attribution") + (f"\n{what}" if what else ""), fontsize=10)
    fig.colorbar(im, ax=ax, shrink=0.8, pad=0.02).set_label("attribution")
    return fig


# ── activation patching ──────────────────────────────────────────────────────────

@styled
def patch_figure(p: PatchTables) -> "Figure":
    """Four heatmaps, layer 0 at the bottom: heads (L × H), an encoder–decoder's cross-attention heads
    (L × H), and, for each position (its token below), the residual stream, attention output and FFN
    output (L × n). Red restores the clean answer,
    blue pushes further away, white is no effect; each panel has its own symmetric scale."""
    panels = [(w, t) for w, t in (("heads", p.heads), ("cross-attention heads", p.cross), ("residual stream", p.residual),
                                  ("attention output", p.attn_out), ("FFN output", p.ffn_out)) if t is not None]
    L = panels[0][1].shape[0]
    n = len(p.labels)
    fig = new_figure(float(np.clip(3.0 + 0.3 * (n * (len(panels) - 1) + 9), 8.0, 20.0)),
                     float(np.clip(2.4 + 0.2 * L, 4.5, 10.0)))
    ratios = [max(t.shape[1], 4) for _, t in panels]
    axes = fig.subplots(1, len(panels), gridspec_kw={"width_ratios": ratios}, squeeze=False)[0]
    step = max(1, L // 16)
    for ax, (what, t) in zip(axes, panels):
        im = _signed(ax, t, aspect="auto", origin="lower")
        if what in ("heads", "cross-attention heads"):
            ax.set_xticks(range(t.shape[1]), [str(h) for h in range(t.shape[1])], fontsize=7)
            ax.set_xlabel("head")
        else:
            ax.set_xticks(*ticks(p.labels), rotation=70, ha="right", rotation_mode="anchor", fontsize=7,
                          family=fonts())
            ax.set_xlabel("position")
        ax.set_yticks(range(0, L, step), [str(l) for l in range(0, L, step)], fontsize=7)
        ax.set_title(what, fontsize=10)
        fig.colorbar(im, ax=ax, shrink=0.7, pad=0.02, location="top")
    axes[0].set_ylabel("layer")
    effect = "effect (0 = corrupted, 1 = clean)" if p.normalised else "m(patched) − m(corrupted)"
    method = getattr(p, "method", "activation patching")                   # an estimate's: attribution patching
    fig.suptitle(figure_title(p.model, method) + f"\n{p.metric}: {effect}", fontsize=11)
    return fig


def save_patching(p: PatchTables, out_dir: str | os.PathLike, formats: Sequence[str] = ("png", "svg"),
                  pages: Mapping[str, str] | None = None) -> list[Path]:
    """OUT_DIR/patch.{png,svg} (patch_figure), OUT_DIR/patch.json (`p.as_json()`) and PAGES
    ({file name: text}, e.g. {"patch.html": the viewer}): all or none."""
    formats = check_formats(formats)
    try:
        with FileBatch(out_dir) as files:
            save_all(files, [("patch", lambda: patch_figure(p))], formats)
            files.write_text("patch.json", json.dumps(p.as_json(), ensure_ascii=False, indent=1))
            for name, text in (pages or {}).items():
                files.write_text(name, text)
    except OSError as e:
        raise QkvError(f"cannot write to {out_dir}: {e.strerror or e}; choose a writable directory") from None
    return files.paths


# ── QK and OV circuits ───────────────────────────────────────────────────────────

@styled
def circuits_figure(ov: OVTable, qk: QKByDistance, *, model_name: str = "") -> "Figure":
    """Left: the OV circuit on the token set (rows: the token attended to, columns: the logit raised;
    red raises, blue lowers). Right: the QK pattern by relative distance (mean score, mean attention;
    for a position table, the weights' own mean score too)."""
    k = len(ov.labels)
    side = float(np.clip(2.0 + 0.28 * k, 4.5, 10.0))
    fig = new_figure(side + 6.0, side)
    ax, line = fig.subplots(1, 2, gridspec_kw={"width_ratios": [side, 5.0]})
    im = _signed(ax, ov.matrix)
    family = fonts()
    ax.set_xticks(*ticks(ov.labels), rotation=70, ha="right", rotation_mode="anchor", fontsize=7, family=family)
    ax.set_yticks(*ticks(ov.labels), fontsize=7, family=family)
    ax.set_xlabel("output token (logit raised)")
    ax.set_ylabel("token attended to")
    ax.set_title(f"OV: W_E·W_V·W_O·W_U (copying score {ov.copying_score:+.2f})", fontsize=10)
    fig.colorbar(im, ax=ax, shrink=0.7, pad=0.02)
    line.plot(qk.deltas, qk.score, marker="o", ms=3, color="#b2182b", label="mean q·k/√d_k (text)")
    if qk.table_by_delta is not None:
        keep = np.abs(qk.deltas_table) <= np.abs(qk.deltas).max()
        line.plot(qk.deltas_table[keep], qk.table_by_delta[keep], color="#2166ac", ls="--",
                  label="W_pos·W_Q·(W_pos·W_K)ᵀ/√d_k")
    line.set_xlabel("relative distance Δ = query − key")
    line.set_ylabel("score")
    twin = line.twinx()
    twin.bar(qk.deltas, qk.attention, color="#999999", alpha=0.35, label="mean attention")
    twin.set_ylabel("mean attention weight")
    line.set_zorder(twin.get_zorder() + 1)
    line.patch.set_visible(False)
    handles = line.get_legend_handles_labels()[0] + twin.get_legend_handles_labels()[0]
    line.legend(handles=handles, fontsize=8, loc="best")
    line.set_title("QK by relative position", fontsize=10)
    fig.suptitle(figure_title(model_name, f"layer {ov.layer}, head {ov.head}: circuits"), fontsize=11)
    return fig
