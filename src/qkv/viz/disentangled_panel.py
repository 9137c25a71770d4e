"""The viewer's section of DeBERTa's disentangled attention (core/disentangled.py), from a trace that kept its three
score tables (core.trace.DISENTANGLED). Its panel: viewer_disentangled.js, four maps of one layer and head side by
side, c2c, c2p, p2c and their sum S = c2c + c2p + p2c, on one diverging colour scale.

    disentangled_section   the "disentangled" section, or None (a model without the terms, or a trace without them)
"""

from __future__ import annotations

import numpy as np

from ..core.trace import Trace
from .wire import encode

TERMS = ("c2c", "c2p", "p2c")
F16 = 65504.0                            # float16's largest: a score past it is drawn at it
MAX_VALUES = 24_000_000                  # numbers the section carries at most (f16: ~48 MB before compression)


def disentangled_section(trace: Trace) -> dict | None:
    """{"layers": [int] (the kept layers with the tables), "positions": n, "heads": H, "terms": [str] (those the
    model has, of c2c, c2p, p2c: c2c always), "tables": {term: f16 (Lt, H, n, n)} (each term's scores, S's parts,
    rows queries and columns keys, ≈ 3 significant digits)}; None when no kept layer holds them, or when they
    would pass MAX_VALUES (a long input: the attention views stay)."""
    kept = [i for i in trace.layer_ids if trace.layers[i].scores_c2c is not None]
    if not kept:
        return None
    first = trace.layers[kept[0]]
    terms = [t for t in TERMS if getattr(first, f"scores_{t}") is not None]
    H, n, m = first.scores_c2c.shape
    if len(kept) * len(terms) * H * n * m > MAX_VALUES:
        return None
    tables = {t: encode(np.clip(np.stack([getattr(trace.layers[i], f"scores_{t}") for i in kept]), -F16, F16), "f16")
              for t in terms}                                                   # (Lt, H, n, n) each
    return {"layers": [int(i) for i in kept], "positions": int(n), "heads": int(H), "terms": terms, "tables": tables}
