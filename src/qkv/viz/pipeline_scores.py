"""The pipeline page's one byte a score: S (L, H, n, n), and a mixer's implied matrices (`pipeline_mixer`), travel as

    code 0 = masked (−∞), else S = lo + (code − 1)·step with step = (hi − lo)/254 per (layer, head),

so within step/2 of the engine's float32 score (lo and step to float32's precision, as short decimals, and the codes
made with exactly those). `pipeline_payload`'s module doc: where they sit in the payload."""

from __future__ import annotations

import numpy as np

from .wire import decode, encode

SCORE_CODES = 254           # codes 1..255 for finite scores, 0 = masked


def encode_scores(scores: np.ndarray) -> dict:
    """(L, H, n, n) masked scores (−inf) → one byte each, affine per (layer, head) (module doc)."""
    s = np.asarray(scores, dtype=np.float64)                                  # (L, H, n, n)
    finite = np.isfinite(s)
    lo = np.where(finite, s, np.inf).min(axis=(-1, -2))                       # (L, H)
    hi = np.where(finite, s, -np.inf).max(axis=(-1, -2))                      # (L, H)
    lo = _float32_decimals(np.where(np.isfinite(lo), lo, 0.0))
    step = _float32_decimals(np.where(hi > lo, (hi - lo) / SCORE_CODES, 1.0))   # (L, H)
    code = 1 + np.round((np.where(finite, s, lo[..., None, None]) - lo[..., None, None]) / step[..., None, None])
    code = np.where(finite, np.clip(code, 1, SCORE_CODES + 1), 0)             # (L, H, n, n)
    return {"shape": list(s.shape), "lo": lo.tolist(), "step": step.tolist(), "data": encode(code, "u8")}


def _float32_decimals(a: np.ndarray) -> np.ndarray:
    """A's numbers to float32's precision, each the shortest decimal that reads back as that float32
    (so that the JSON holds about 9 digits a number, not float64's 17)."""
    return np.array([float(str(v)) for v in np.asarray(a, dtype=np.float32).ravel()]).reshape(np.shape(a))


def decode_scores(encoded: dict) -> np.ndarray:
    """The inverse of `encode_scores`: (L, H, n, n) float64, −inf where masked, within step/2."""
    code = decode(encoded["data"]).astype(np.float64)
    lo, step = np.asarray(encoded["lo"])[..., None, None], np.asarray(encoded["step"])[..., None, None]
    return np.where(code == 0, -np.inf, lo + (code - 1) * step)
