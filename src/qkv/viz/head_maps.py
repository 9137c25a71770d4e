"""Layer × head maps of a head report (`qkv heads --out`): one per statistic, one of the roles.

    stat_figure      the L × H map of one statistic, each cell labelled with its value
    roles_figure     the L × H map of roles, one colour each (`palette.ROLE_COLOURS`)
    save_head_maps   heads-roles.* and heads-<statistic>.* for every statistic that applies

They read any object with the fields of `HeadMaps` (`analysis.run.HeadReport` has them); the
statistics' descriptions come from the caller (`analysis.stats.DESCRIPTIONS`), since viz comes
before analysis. matplotlib is imported inside the functions, each figure on its own Agg canvas.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Mapping, Protocol, Sequence

import numpy as np

from ..runtime.io import FileBatch
from .drawing import new_figure
from .palette import CMAP, ROLE_COLOURS

if TYPE_CHECKING:
    from matplotlib.figure import Figure

DPI = 120


class HeadMaps(Protocol):
    """What the maps read of a head report."""

    model: str
    layers: int                                  # L
    heads: int                                   # H
    texts: int                                   # how many texts the means are over
    stats: Mapping[str, np.ndarray | None]       # name → (L, H), None = not applicable
    roles: Sequence[Sequence[str]]               # (L, H) role names of ROLE_COLOURS


def _texts(report: HeadMaps) -> str:
    return f"{report.texts} text" + ("" if report.texts == 1 else "s")


def _axes(L: int, H: int, title: str):
    width, height = 1.6 + 0.55 * H, 1.3 + 0.5 * L                      # inches
    fig = new_figure(width, height, layout=None, dpi=DPI)
    ax = fig.subplots()
    # fixed margins (in inches) instead of tight_layout, which draws the figure once more
    fig.subplots_adjust(left=0.6 / width, right=1 - 1.0 / width, bottom=0.6 / height, top=1 - 0.45 / height)
    ax.set_xticks(range(H), [str(h) for h in range(H)])
    ax.set_yticks(range(L), [str(i) for i in range(L)])
    ax.set_xlabel("head")
    ax.set_ylabel("layer")
    ax.set_title(title, fontsize=10)
    return fig, ax


def stat_figure(report: HeadMaps, name: str, description: str) -> "Figure":
    """The L × H map of statistic NAME (DESCRIPTION: what it measures), each cell labelled with its value."""
    values = report.stats[name]
    L, H = report.layers, report.heads
    fig, ax = _axes(L, H, f"{report.model}: {name} — {description} ({_texts(report)})")
    vmax = max(float(np.max(values)), 1e-9) if name == "entropy" else 1.0
    image = ax.imshow(values, cmap=CMAP, vmin=0.0, vmax=vmax, aspect="auto")
    fig.colorbar(image, ax=ax, fraction=0.03, pad=0.02, label="nats" if name == "entropy" else "fraction")
    for i in range(L):
        for h in range(H):
            v = float(values[i, h])
            ax.text(h, i, f"{v:.2f}", ha="center", va="center", fontsize=7,
                    color="black" if v > 0.6 * vmax else "white")
    return fig


def roles_figure(report: HeadMaps) -> "Figure":
    """The L × H map of roles: one colour per role, its name in the cell."""
    from matplotlib.colors import ListedColormap

    names = list(ROLE_COLOURS)
    L, H = report.layers, report.heads
    codes = np.array([[names.index(r) for r in row] for row in report.roles])      # (L, H)
    fig, ax = _axes(L, H, f"{report.model}: what each head does ({_texts(report)})")
    ax.imshow(codes, cmap=ListedColormap(list(ROLE_COLOURS.values())), vmin=-0.5, vmax=len(names) - 0.5,
              aspect="auto")
    for i in range(L):
        for h in range(H):
            ax.text(h, i, report.roles[i][h].replace("punctuation", "punct").replace("previous", "prev"),
                    ha="center", va="center", fontsize=6.5)
    return fig


def save_head_maps(report: HeadMaps, out_dir: str | os.PathLike, descriptions: Mapping[str, str],
                   formats: Sequence[str] = ("png", "svg")) -> list[Path]:
    """OUT_DIR/heads-roles.* and heads-<statistic>.* for every statistic that applies (in the order of
    `report.stats`), DESCRIPTIONS naming what each measures; all or none. The paths written."""
    figures = {"roles": roles_figure(report)}
    figures.update({name: stat_figure(report, name, descriptions[name])
                    for name, values in report.stats.items() if values is not None})
    with FileBatch(out_dir) as files:                          # every figure or none
        for name, fig in figures.items():
            for fmt in formats:
                files.write(f"heads-{name}.{fmt}", lambda f: fig.savefig(f, format=fmt))
    return files.paths
