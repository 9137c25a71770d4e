"""Attention rollout (Abnar & Zuidema 2020): how much each input token reaches each position,
following attention through every layer and the residual connections around it.

    Â_l = ½·mean_h A_l + ½·I, rows renormalised        (the residual as attention to oneself)
    R_1 = Â_1,   R_l = Â_l · R_{l−1}                     (R_l[i, j]: token j's share in position i after l layers)

Encoders and decoders alike; a decoder's R_l stays lower-triangular (causal Â, causal products).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ..errors import QkvError

if TYPE_CHECKING:
    from ..trace import Trace


def rollout_of(attentions: np.ndarray) -> np.ndarray:
    """(L, H, n, n) attention weights → (L, n, n) rollout R_1..R_L (float64)."""
    A = np.asarray(attentions, dtype=np.float64)                      # (L, H, n, n)
    if A.ndim != 4 or A.shape[-1] != A.shape[-2]:
        raise QkvError(f"attention rollout needs self-attention weights (L, H, n, n), not {A.shape}")
    n = A.shape[-1]
    Ahat = 0.5 * A.mean(axis=1) + 0.5 * np.eye(n)                     # (L, n, n)
    Ahat /= Ahat.sum(axis=-1, keepdims=True)                          # rows sum to 1 (a padding query too)
    R = np.empty_like(Ahat)                                           # (L, n, n)
    R[0] = Ahat[0]
    for l in range(1, len(Ahat)):
        R[l] = Ahat[l] @ R[l - 1]
    return R


def attention_rollout(trace: "Trace") -> np.ndarray:
    """(L, n, n): row i of R_l is how much each token j reaches position i after layers 1..l.

    The trace must keep every head's attention weights of every layer from 0
    (`model.run(text, keep=("attentions",))`); rows sum to 1.
    """
    if trace.source_tokens is not None:
        raise QkvError("attention rollout follows self-attention; this trace holds cross-attention")
    if not trace.layers or trace.layer_ids != list(range(len(trace.layers))):
        raise QkvError(f"attention rollout needs every layer from 0, not layers {trace.layer_ids}; "
                       "run the model without layers=")
    if trace.head_ids is not None:
        raise QkvError("attention rollout averages every head; run the model without heads=")
    A = trace.attentions
    if A is None:
        raise QkvError('attention rollout needs the attention weights; run with keep=("attentions",)')
    return rollout_of(A)
