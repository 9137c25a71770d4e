"""Who may see whom (guide: mask), by position: the one rule every attention mask is built from.

    query at position i sees key at position j  ⇔  j ≤ i             (causal: decoders)
                                                    and i - j < w     (sliding window w: Mistral)
    an encoder's window (ModernBERT's local layers) reaches both ways:  |i - j| < w
    a chunked layer (Llama 4) sees its own chunk only:  ⌊i / C⌋ = ⌊j / C⌋, positions counted from the row's first
                                                        real token (`same_chunk`)

attention.AttentionMask makes it the mask of a pass (causal_mask and sliding_window_mask are
its (n, m) picture), kernels.py the mask of one block of tiled attention.
"""

from __future__ import annotations

import numpy as np


def visible(q_pos: np.ndarray, k_pos: np.ndarray, causal: bool, window: int | None = None) -> np.ndarray | None:
    """True where the query at q_pos[r] may see the key at k_pos[c]: (len(q_pos), len(k_pos)) bool.

    None when every pair may (neither causal nor windowed): nothing to build. A causal window
    reaches back, never forward; an encoder's (not causal) reaches both ways.
    """
    if not causal and not window:
        return None
    rel = np.asarray(q_pos)[:, None] - np.asarray(k_pos)[None, :]      # (rows, cols) how far back each key is
    if not causal:
        return np.abs(rel) < window
    allowed = rel >= 0
    if window:
        allowed &= rel < window
    return allowed


def same_chunk(q_pos: np.ndarray, k_pos: np.ndarray, chunk: int) -> np.ndarray:
    """True where the query at q_pos[…, r] and the key at k_pos[…, c] lie in one chunk of CHUNK positions,
    ⌊i / C⌋ = ⌊j / C⌋: (…, rows, cols) bool. q_pos (…, rows) and k_pos (…, cols) may carry a batch axis, each row's
    positions counted from its first real token (transformers' chunked mask, which starts a left-padded row's chunks
    at its first token); a padding key before it falls in chunk −1, which no query is in."""
    return np.floor_divide(q_pos, chunk)[..., :, None] == np.floor_divide(k_pos, chunk)[..., None, :]
