"""The KV cache (guide: kv-cache): keep every past token's K and V so each new token costs O(n).

Without it, generating token t recomputes Q, K, V for all t tokens; with it, a step
computes them for one token and reads the past K, V from here. Keys are stored after
RoPE (their rotation depends only on their own position); GQA/MQA models store only
their Hkv heads, which is their memory saving.
"""

from __future__ import annotations

import numpy as np

from .config import ModelConfig
from .errors import QkvError


class KVCache:
    """Preallocated K and V for every layer: (L, B, Hkv, max_len, d_k) each."""

    def __init__(self, cfg: ModelConfig, batch: int, max_len: int, dtype=np.float32):
        shape = (cfg.n_layers, batch, cfg.n_kv_heads, max_len, cfg.d_head)
        self.k = np.zeros(shape, dtype=dtype)
        self.v = np.zeros(shape, dtype=dtype)
        self.max_len = max_len
        self.length = 0                                  # positions filled in every layer

    def append(self, layer: int, k: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Store this step's k, v (B, Hkv, n, d_k) for `layer`; return all keys and values so far.

        The returned arrays are views (B, Hkv, length + n, d_k): no copy of the past.
        """
        start, n = self.length, k.shape[2]
        if start + n > self.max_len:
            raise QkvError(f"the KV cache holds {self.max_len} positions and is full; "
                           "generate fewer tokens or use a longer context")
        self.k[layer, :, :, start:start + n] = k
        self.v[layer, :, :, start:start + n] = v
        return self.k[layer, :, :, :start + n], self.v[layer, :, :, :start + n]

    def advance(self, n: int) -> None:
        """Mark n more positions as filled (after every layer has appended them)."""
        self.length += n

    @staticmethod
    def bytes_per_token(cfg: ModelConfig, dtype=np.float32) -> int:
        """Cache bytes one token costs: K and V, every layer, Hkv heads of d_k numbers."""
        return 2 * cfg.n_layers * cfg.n_kv_heads * cfg.d_head * np.dtype(dtype).itemsize

    @property
    def nbytes(self) -> int:
        return self.k.nbytes + self.v.nbytes
