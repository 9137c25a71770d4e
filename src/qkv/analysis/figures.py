"""Layer × head maps of a HeadReport: one per statistic, one of the roles (matplotlib, Agg).

matplotlib is imported inside the functions: importing qkv.analysis never needs it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..errors import QkvError
from .run import HeadReport
from .stats import DESCRIPTIONS, STATS

# One colour per role (figures and the terminal's legend use the same hues).
ROLE_COLOURS = {
    "previous": "#1f77b4", "next": "#17becf", "self": "#9467bd", "[CLS]": "#d62728", "[SEP]": "#ff7f0e",
    "punctuation": "#8c564b", "first": "#e377c2", "induction": "#2ca02c", "broad": "#bcbd22",
    "mixed": "#c7c7c7",
}


def _pyplot():
    try:
        import matplotlib
    except ImportError:
        raise QkvError("figures need matplotlib, which is not installed; pip install matplotlib") from None
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
    image = ax.imshow(values, cmap="viridis", vmin=0.0, vmax=vmax, aspect="auto")
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
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    figures = {"roles": roles_figure(report)}
    figures.update({name: stat_figure(report, name) for name in STATS if report.stats[name] is not None})
    written = []
    for name, fig in figures.items():
        for fmt in formats:
            path = out / f"heads-{name}.{fmt}"
            tmp = path.with_name(f".{path.name}.tmp")
            fig.savefig(tmp, format=fmt)
            tmp.replace(path)                                  # never a half-written figure
            written.append(path)
        plt.close(fig)
    return written
