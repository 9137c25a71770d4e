"""The viewer's section of a protein's contact map (ESM-2's contact head, Rao et al. 2020), from a ContactMap of
qkv.analysis.contacts (viz comes before analysis: nothing here computes a contact). Its panel: viewer_contacts.js,
the predicted map P beside the chosen head's own map (symmetrised, APC-corrected: what the contact head reads) and
its raw attention over the residues, the heads whose map best matches P listed.

    contact_section   the "contacts" section: P (m × m), every head's Pearson r with it, the best heads, and the
                      heads' maps (all of them, or the best MAX_MAPS past MAX_VALUES)
"""

from __future__ import annotations

import numpy as np

from ..runtime.errors import QkvError
from .wire import encode

TOP = 10                        # heads listed (best r first) and residue pairs named (surest first)
MAX_VALUES = 12_000_000         # head-map numbers the section carries at most (f16: 24 MB before compression)
MAX_MAPS = 32                   # heads whose map the section carries past MAX_VALUES: the best-matching
DIGITS = 6                      # decimals of r and of the named pairs' P


def shipped_heads(scores: np.ndarray, m: int) -> list[tuple[int, int]]:
    """The (layer, head) whose maps the section carries: every head in layer order when L·H·m² ≤ MAX_VALUES, else
    the MAX_MAPS best by r (SCORES (L, H)), best first."""
    L, H = scores.shape
    if L * H * m * m <= MAX_VALUES:
        return [(l, h) for l in range(L) for h in range(H)]
    order = np.argsort(-scores, axis=None, kind="stable")[:MAX_MAPS]
    return [(int(c // H), int(c % H)) for c in order]


def contact_section(cm, *, positions: int) -> dict:
    """The "contacts" section of CM (a `qkv.analysis.contacts.ContactMap` of one sequence of POSITIONS tokens,
    <cls>, its m residues, <eos>: what the viewer's trace holds): {"positions": n, "first": 1 (the token of
    residue 0), "residues": [str] (m), "layers": L, "heads": H, "separation": int (the pairs r is taken over:
    |i − j| ≥ it), "predicted": f32 (m, m) (P, the contact head's probability), "scores": [[float]] (L × H, each
    head's r with P), "best": [{"layer", "head", "r"}] (TOP, best first), "top": [{"i", "j", "p"}] (the TOP pairs
    the model is surest of), "maps": {"heads": [[layer, head]] (k), "values": f16 (k, m, m)} (each head's
    symmetrised, APC-corrected map, ≈ 3 significant digits: every head, or the best MAX_MAPS of a long one)}."""
    residues = [str(r) for r in cm.residues]
    m = len(residues)
    L, H = cm.scores.shape
    if positions != m + 2 or cm.predicted.shape != (m, m) or cm.features.shape != (L, H, m, m):
        raise QkvError(f"a contact map of {m} residues ({cm.predicted.shape} predicted, {cm.features.shape} head "
                       f"maps) does not fit a trace of {positions} tokens (<cls>, the residues, <eos>): compute it "
                       "from the same sequence")
    heads = shipped_heads(cm.scores, m)
    maps = np.stack([cm.features[l, h] for l, h in heads])                       # (k, m, m)
    return {"positions": int(positions), "first": 1, "residues": residues, "layers": int(L), "heads": int(H),
            "separation": int(cm.separation), "predicted": encode(cm.predicted, "f32"),
            "scores": [[round(float(r), DIGITS) for r in row] for row in cm.scores],
            "best": [{"layer": l, "head": h, "r": round(r, DIGITS)} for l, h, r in cm.best_heads(TOP)],
            "top": [{"i": i, "j": j, "p": round(p, DIGITS)} for i, j, p in cm.top_contacts(TOP)],
            "maps": {"heads": [[l, h] for l, h in heads], "values": encode(maps, "f16")}}
