"""The viewer's panels beyond attention weights: the optional "lens", "rollout" and "patch"
sections of the payload (`payload` documents them), built from plain arrays that
qkv.analysis computes (viz comes before analysis, so nothing here computes a lens or a patch).

Big arrays travel as attention does, as `wire` arrays: probabilities u16 with scale 65535
(±0.5/65535 ≈ 7.6e-6, PROB_PRECISION), rollout and flow u8 with scale 255 (±0.002, as attention:
`payload.PRECISION`), ranks and token ids i32 as they are.
"""

from __future__ import annotations

from typing import Callable, Mapping, Sequence

import numpy as np

from ..engine.errors import QkvError
from .payload import SCALE
from .wire import encode

LENS_K = 5                              # top tokens kept per (layer, position) cell of the lens
PROB_SCALE = 65535                      # probabilities as u16: q = round(p · 65535)
PROB_PRECISION = 0.5 / PROB_SCALE       # largest |decoded - original| of a probability
PATCH_DECIMALS = 5                      # patching effects, rounded in the JSON
PATCH_TABLES = ("heads", "residual", "attn_out", "ffn_out", "cross")   # cross: encoder–decoders


def lens_section(probs: np.ndarray, ranks: np.ndarray, predicted: np.ndarray, top_ids: np.ndarray,
                 top_probs: np.ndarray, spell: Callable[[int], str], vocab: int) -> dict:
    """The "lens" section: rows 0..L (row 0: the embeddings) × n positions.

    probs (L+1, n): P(final prediction) read at each layer; ranks (L+1, n): its rank there (1 = top);
    predicted (n,): each position's final prediction (its top token at row L); top_ids, top_probs
    (L+1, n, k): each cell's k most likely tokens and their probabilities; spell(id) → the token
    as a reader sees it; vocab: V."""
    probs, ranks = np.asarray(probs), np.asarray(ranks)                         # (L+1, n)
    top_ids, top_probs = np.asarray(top_ids), np.asarray(top_probs)             # (L+1, n, k)
    rows, n = probs.shape
    if ranks.shape != (rows, n) or top_ids.shape[:2] != (rows, n) or top_probs.shape != top_ids.shape \
            or len(predicted) != n:
        raise QkvError(f"lens arrays disagree: probs {probs.shape}, ranks {ranks.shape}, top {top_ids.shape}, "
                       f"{len(predicted)} predictions; compute them together (analysis.lens.lens_top)")
    ids = sorted({int(i) for i in top_ids.ravel()} | {int(i) for i in predicted})
    return {"rows": int(rows), "positions": int(n), "k": int(top_ids.shape[2]), "vocab": int(vocab),
            "predicted": [int(i) for i in predicted],
            "prob": encode(probs, "u16", PROB_SCALE),
            "rank": encode(ranks, "i32"),
            "top_ids": encode(top_ids, "i32"),
            "top_prob": encode(top_probs, "u16", PROB_SCALE),
            "spelling": {"ids": ids, "tokens": [spell(i) for i in ids]}}


def rollout_section(rollout: np.ndarray, flow: np.ndarray | None = None, flow_note: str | None = None) -> dict:
    """The "rollout" section: rollout (L, n, n), R_l after layers 1..l (row = position, column =
    input token), and attention flow (n, n) after all L layers, or None with FLOW_NOTE saying why."""
    R = np.asarray(rollout)
    if R.ndim != 3 or R.shape[1] != R.shape[2]:
        raise QkvError(f"rollout must be (L, n, n), got {R.shape}; pass analysis.attention_rollout(trace)")
    if flow is not None and np.shape(flow) != R.shape[1:]:
        raise QkvError(f"flow must be (n, n) = {R.shape[1:]}, got {np.shape(flow)}; pass analysis.attention_flow(trace)")
    return {"rollout": encode(R, "u8", SCALE),
            "flow": None if flow is None else encode(flow, "u8", SCALE),
            "flow_note": None if flow is not None else flow_note}


def patch_section(tables: Mapping) -> dict:
    """The "patch" section from `Patching.as_json()` (or any mapping with its keys): the metric,
    the two texts, m(clean), m(corrupted), labels (n) and the tables heads (L, H), residual,
    attn_out, ffn_out (L, n), each rounded to PATCH_DECIMALS (null: not computed)."""
    out = {}
    for name in PATCH_TABLES:
        t = tables.get(name)
        out[name] = None if t is None else np.round(np.asarray(t, dtype=np.float64), PATCH_DECIMALS).tolist()
    labels: Sequence[str] = tables["labels"]
    return {"metric": str(tables["metric"]), "normalised": bool(tables.get("normalised", True)),
            "clean": str(tables.get("clean", "")), "corrupted": str(tables.get("corrupted", "")),
            "metric_clean": float(tables["metric_clean"]), "metric_corrupted": float(tables["metric_corrupted"]),
            "labels": [str(x) for x in labels], "tables": out}
