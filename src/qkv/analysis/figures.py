"""Layer × head maps of a HeadReport: one per statistic, one of the roles (matplotlib, Agg).

matplotlib is imported inside the functions: importing qkv.analysis never needs it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..engine.io import FileBatch
from ..viz.palette import CMAP, ROLE_COLOURS   # the colours of every view (roles: also terminal, viewer)
from .run import HeadReport
from .stats import DESCRIPTIONS, STATS



def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _texts(report: HeadReport) -> str:
    return f"{report.texts} text" + ("" if report.texts == 1 else "s")


def _axes(plt, L: int, H: int, title: str):
    width, height = 1.6 + 0.55 * H, 1.3 + 0.5 * L                      # inches
    fig, ax = plt.subplots(figsize=(width, height), dpi=120)
    # fixed margins (in inches) instead of tight_layout, which draws the figure once more
    fig.subplots_adjust(left=0.6 / width, right=1 - 1.0 / width, bottom=0.6 / height, top=1 - 0.45 / height)
    ax.set_xticks(range(H), [str(h) for h in range(H)])
    ax.set_yticks(range(L), [str(i) for i in range(L)])
    ax.set_xlabel("head")
    ax.set_ylabel("layer")
    ax.set_title(title, fontsize=10)
    return fig, ax


def stat_figure(report: HeadReport, name: str):
    """The L × H map of one statistic, each cell labelled with its value."""
    plt = _pyplot()
    values = report.stats[name]
    L, H = report.layers, report.heads
    fig, ax = _axes(plt, L, H, f"{report.model}: {name} — {DESCRIPTIONS[name]} ({_texts(report)})")
    vmax = max(float(np.max(values)), 1e-9) if name == "entropy" else 1.0
    image = ax.imshow(values, cmap=CMAP, vmin=0.0, vmax=vmax, aspect="auto")
    fig.colorbar(image, ax=ax, fraction=0.03, pad=0.02, label="nats" if name == "entropy" else "fraction")
    for i in range(L):
        for h in range(H):
            v = float(values[i, h])
            ax.text(h, i, f"{v:.2f}", ha="center", va="center", fontsize=7,
                    color="black" if v > 0.6 * vmax else "white")
    return fig


def roles_figure(report: HeadReport):
    """The L × H map of roles: one colour per role, its name in the cell."""
    from matplotlib.colors import ListedColormap

    plt = _pyplot()
    names = list(ROLE_COLOURS)
    L, H = report.layers, report.heads
    codes = np.array([[names.index(r) for r in row] for row in report.roles])      # (L, H)
    fig, ax = _axes(plt, L, H, f"{report.model}: what each head does ({_texts(report)})")
    ax.imshow(codes, cmap=ListedColormap(list(ROLE_COLOURS.values())), vmin=-0.5, vmax=len(names) - 0.5,
              aspect="auto")
    for i in range(L):
        for h in range(H):
            ax.text(h, i, report.roles[i][h].replace("punctuation", "punct").replace("previous", "prev"),
                    ha="center", va="center", fontsize=6.5)
    return fig


def save_figures(report: HeadReport, out_dir: str | Path, formats=("png", "svg")) -> list[Path]:
    """heads-roles.* and heads-<statistic>.* for every statistic that applies; the paths written."""
    plt = _pyplot()
    figures = {"roles": roles_figure(report)}
    figures.update({name: stat_figure(report, name) for name in STATS if report.stats[name] is not None})
    try:
        with FileBatch(out_dir) as files:                      # every figure or none
            for name, fig in figures.items():
                for fmt in formats:
                    files.write(f"heads-{name}.{fmt}", lambda f: fig.savefig(f, format=fmt))
    finally:
        for fig in figures.values():
            plt.close(fig)
    return files.paths
