"""The viewer's section of a probe sweep (`qkv probe`, qkv.analysis.probes), from a ProbeReport's JSON (viz comes
before analysis: nothing here fits a probe). Its panel: viewer_probe.js.

    probe_section   the "probe" section: per layer, the probe's held-out accuracy, the control task's and their
                    difference, the selectivity (Hewitt & Liang 2019)
"""

from __future__ import annotations

from typing import Mapping

from ..runtime.errors import QkvError

DIGITS = 6                              # decimals the page receives (accuracies are shares of a few texts)


def probe_section(data: Mapping, *, text: str, positions: int) -> dict:
    """The "probe" section from `ProbeReport.as_json()` (a `qkv probe --json` file): {"model", "labels": [str],
    "n_train", "n_test", "position", "point", "majority", "control" (the control task, in words), "layers": [int]
    (the probed layers, in order), "accuracy", "control_accuracy", "selectivity", "train_accuracy": [float] (one
    per layer, DIGITS decimals), "text", "positions"}. A probe reads many texts; the page's other tabs show the
    attention of one, TEXT, of POSITIONS tokens (what the viewer checks the section against)."""
    rows = sorted(data["layers"], key=lambda r: int(r["layer"]))
    if not rows:
        raise QkvError("a probe report with no layer has nothing to show; probe at least one layer (--layer all)")
    column = lambda key: [round(float(r[key]), DIGITS) for r in rows]
    return {"model": str(data.get("model", "")), "labels": [str(x) for x in data["labels"]],
            "n_train": int(data["n_train"]), "n_test": int(data["n_test"]), "position": str(data["position"]),
            "point": str(data.get("point", "residual_out")), "majority": round(float(data["majority"]), DIGITS),
            "control": str(data.get("control", "")), "layers": [int(r["layer"]) for r in rows],
            "accuracy": column("accuracy"), "control_accuracy": column("control_accuracy"),
            "selectivity": column("selectivity"), "train_accuracy": column("train_accuracy"),
            "text": str(text), "positions": int(positions)}
