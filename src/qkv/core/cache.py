"""The KV cache (guide: kv-cache): keep every past token's K and V so each new token costs O(n).

Without it, generating token t recomputes Q, K, V for all t tokens; with it, a step
computes them for one token and reads the past K, V from here. Keys are stored after
RoPE (their rotation depends only on their own position); GQA/MQA models store only
their Hkv heads, which is their memory saving.

A key's turn depends on its position and on the RoPE speeds ω of the pass that made it, and a
table that changes with the sequence's length (LongRoPE: short factors up to its original length,
long ones past it) turns the same position another way once the sequence grows. So the cache keeps
the speeds its keys were turned with, and the ids it read: a pass with other speeds reads the whole
sequence again (`reread`), as transformers' Phi-3 drops its cache when it crosses that length.

Multi-head latent attention (MLA, DeepSeek V2/V3: cfg.latent) caches what transformers' does, the latent: per
token and layer its c (kv_lora_rank numbers, after its norm) in `k` and its turned RoPE key (rotary_dim) in `v`,
one "head" shared by all H (each step expands them to every head's K and V again, c·W_KV_b), instead of
H·(d_k + d_v) numbers.
"""

from __future__ import annotations

import numpy as np

from .config import ModelConfig
from ..runtime.errors import QkvError


class KVCache:
    """Preallocated K and V for every layer: (L, B, Hkv, max_len, d_k) each (MLA: the latent c (L, B, 1, max_len,
    r_kv) and the RoPE key (L, B, 1, max_len, d_rot))."""

    def __init__(self, cfg: ModelConfig, batch: int, max_len: int, dtype=np.float32):
        heads, k_width, v_width = self.widths(cfg)
        self.k = np.zeros((cfg.n_layers, batch, heads, max_len, k_width), dtype=dtype)
        self.v = np.zeros((cfg.n_layers, batch, heads, max_len, v_width), dtype=dtype)
        self.ids = np.zeros((batch, max_len), dtype=np.int64)   # (B, max_len) the tokens read, to read again
        self.max_len = max_len
        self.length = 0                                  # positions filled in every layer
        self.speeds: dict[str, np.ndarray] = {}          # the RoPE speeds ω the cached keys were turned with
        self.rereads = 0                                 # how many times a change of speeds emptied the cache
        self.state = None                                # a Mamba model's conv and scan states (core.mamba.MambaState)

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

    def advance(self, n: int, ids: np.ndarray | None = None, speeds: dict[str, np.ndarray] | None = None) -> None:
        """Mark n more positions as filled (after every layer has appended them); ids (B, n): the tokens they
        hold, speeds: the RoPE speeds of each kind of layer ({"global": ω (d_rot/2,), …}) their keys were
        turned with (kept to see when a pass turns by others: `fits`)."""
        if ids is not None:
            self.ids[:, self.length:self.length + n] = ids
        if speeds is not None:
            self.speeds = speeds
        self.length += n

    def fits(self, speeds: dict[str, np.ndarray]) -> bool:
        """Whether keys turned with SPEEDS may join the cached ones: the cache is empty, or its keys were turned
        with the same speeds (False once LongRoPE's table switches from short to long with the length)."""
        return self.length == 0 or (self.speeds.keys() == speeds.keys() and
                                    all(np.array_equal(self.speeds[k], w) for k, w in speeds.items()))

    def reread(self, ids: np.ndarray) -> np.ndarray:
        """Empty the cache and give back the whole sequence to read again: the past ids, then IDS (B, n) →
        (B, length + n). What a change of RoPE speeds needs: every cached key turns by the new ones."""
        everything = np.concatenate([self.ids[:, :self.length], ids], axis=1)   # (B, length + n)
        self.length, self.speeds = 0, {}
        self.rereads += 1
        return everything

    @staticmethod
    def widths(cfg: ModelConfig) -> tuple[int, int, int]:
        """(heads, k's width, v's width) of one token's entry in one layer: (Hkv, d_k, d_k), or MLA's latent
        (1, kv_lora_rank, rotary_dim)."""
        if cfg.latent:
            return 1, cfg.kv_lora_rank, cfg.rotary_dim
        if cfg.mamba is not None:                        # no K, V: its state (core.mamba.MambaState) is `state`
            return 0, 0, 0
        return cfg.n_kv_heads, cfg.d_head, cfg.d_head

    @staticmethod
    def bytes_per_token(cfg: ModelConfig, dtype=np.float32) -> int:
        """Cache bytes one token costs: K and V, every layer, Hkv heads of d_k numbers (MLA: its latent and RoPE
        key, kv_lora_rank + rotary_dim numbers a layer)."""
        heads, k_width, v_width = KVCache.widths(cfg)
        return cfg.n_layers * heads * (k_width + v_width) * np.dtype(dtype).itemsize

    @property
    def nbytes(self) -> int:
        return self.k.nbytes + self.v.nbytes
