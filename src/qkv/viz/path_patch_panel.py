"""The viewer's section of path patching (`qkv path-patch`, qkv.analysis.path_patch), from a PathTable's JSON
(viz comes before analysis: nothing here patches). Its panel: viewer_path_patch.js.

    path_patch_section   the "path_patch" section: each sender's effect on one receiver set as a layers × heads
                         map, a column of the layers' FFNs and the embeddings' one number
"""

from __future__ import annotations

from typing import Mapping

import numpy as np

from ..runtime.errors import QkvError
from .palette import DIVERGING_STOPS

TOP = 10                                # senders listed in the panel's header, largest |effect| first


def _sender(name: str, L: int, H: int) -> tuple[int, int | None] | None:
    """"L.H" → (L, H), "L.ffn" → (L, None), "embed" → None; one error for a name outside an L × H model."""
    if name == "embed":
        return None
    layer, _, head = name.partition(".")
    try:
        spot = int(layer), None if head == "ffn" else int(head)
    except ValueError:
        spot = (-1, None)
    if not 0 <= spot[0] < L or (spot[1] is not None and not 0 <= spot[1] < H):
        raise QkvError(f"sender {name!r} is not a head 'L.H', an FFN 'L.ffn' or 'embed' of a model of {L} layers × "
                       f"{H} heads; pass PathTable.as_json() with the model's shape")
    return spot


def _effect(x) -> float | None:
    """An effect as the page gets it: 6 decimals, None for no path (NaN or null)."""
    return None if x is None or not np.isfinite(float(x)) else round(float(x), 6)


def path_patch_section(data: Mapping, shape: tuple[int, int], column: int = 0) -> dict:
    """The "path_patch" section from `PathTable.as_json()` (a `qkv path-patch --json` file, its "set" too) of a model
    of SHAPE = (L, H), for the receiver set COLUMN: {"model", "metric", "normalised", "clean", "corrupted",
    "metric_clean", "metric_corrupted", "channel", "positions", "receivers": str ("L.H,L.H"), "labels": [str] (n),
    "heads": [[float | None]] (L × H), "ffn": [float | None] (L), "embed": float | None (None: no path, or not a
    sender), "max" (max |effect|), "top": [{"sender", "effect"}] (TOP), "set": {"senders", "effect"} | None,
    "colours" (DIVERGING_STOPS)}; effects to 6 decimals."""
    L, H = int(shape[0]), int(shape[1])
    senders, values = [str(s) for s in data["senders"]], list(data["values"])
    if len(values) != len(senders) or not 0 <= column < len(data["receivers"]):
        raise QkvError(f"a path table needs one row of values per sender ({len(senders)}) and receiver set "
                       f"{column}; got {len(values)} rows and {len(data['receivers'])} sets: pass PathTable.as_json()")
    heads: list[list[float | None]] = [[None] * H for _ in range(L)]
    ffn: list[float | None] = [None] * L
    embed = None
    for name, row in zip(senders, values):
        spot, value = _sender(name, L, H), _effect(row[column])
        if spot is None:
            embed = value
        elif spot[1] is None:
            ffn[spot[0]] = value
        else:
            heads[spot[0]][spot[1]] = value
    shown = [(name, _effect(row[column])) for name, row in zip(senders, values)]
    effects = [e for _, e in shown if e is not None]
    top = sorted((x for x in shown if x[1] is not None), key=lambda x: -abs(x[1]))[:TOP]
    one = data.get("set")
    return {"model": str(data.get("model", "")), "metric": str(data.get("metric", "")),
            "normalised": bool(data.get("normalised", True)), "clean": str(data.get("clean", "")),
            "corrupted": str(data.get("corrupted", "")), "metric_clean": float(data["metric_clean"]),
            "metric_corrupted": float(data["metric_corrupted"]), "channel": str(data["channel"]),
            "positions": None if data.get("positions") is None else [int(p) for p in data["positions"]],
            "receivers": str(data["receivers"][column]), "labels": [str(t) for t in data["labels"]],
            "heads": heads, "ffn": ffn, "embed": embed, "max": max(map(abs, effects), default=0.0),
            "top": [{"sender": s, "effect": e} for s, e in top],
            "set": None if not one else {"senders": [str(s) for s in one["senders"]], "effect": _effect(one["effect"])},
            "colours": [list(c) for c in DIVERGING_STOPS]}
