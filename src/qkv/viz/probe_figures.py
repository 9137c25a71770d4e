"""The figure of a probe sweep (`qkv probe --out`, qkv.analysis.probes): per layer, the probe's held-out accuracy,
the control task's and their difference, the selectivity (Hewitt & Liang 2019), over the majority baseline."""

from __future__ import annotations

from typing import TYPE_CHECKING, Mapping

from .drawing import figure_title, new_figure, styled

if TYPE_CHECKING:
    from matplotlib.figure import Figure


@styled
def probe_figure(data: Mapping) -> "Figure":
    """DATA as `ProbeReport.as_json` makes it: "layers" [{"layer", "accuracy", "control_accuracy",
    "selectivity"}…], "majority", "labels", "model", "n_train", "n_test", "position"."""
    rows = list(data["layers"])
    layers = [int(r["layer"]) for r in rows]
    fig = new_figure(9.0, 3.6)
    ax = fig.subplots()
    ax.plot(layers, [r["accuracy"] for r in rows], marker="o", ms=3, label="probe accuracy (held out)")
    ax.plot(layers, [r["control_accuracy"] for r in rows], marker="s", ms=3, label="control task accuracy")
    ax.plot(layers, [r["selectivity"] for r in rows], marker="^", ms=3, label="selectivity = accuracy − control")
    ax.axhline(float(data["majority"]), color="grey", lw=0.8, ls="--", label="majority label")
    ax.set_xlabel("layer L (the stream leaving block L)", fontsize=9)
    ax.set_ylabel("held-out accuracy", fontsize=9)
    ax.set_ylim(min(0.0, min((r["selectivity"] for r in rows), default=0.0)) - 0.02, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))    # beside, not over, the lines
    labels = " / ".join(str(x) for x in data["labels"])
    fig.suptitle(figure_title(str(data.get("model", "")), "linear probes")
                 + f"\n{labels}: {data['n_train']} texts to train, {data['n_test']} held out; "
                 f"{data['position']} token", fontsize=10)
    return fig
