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

A stack of layers of different kinds holds K and V for its attention layers alone (`layers`: those whose
ModelConfig.layer_kind is "attention"; `row` gives a layer's row of k and v), as transformers' hybrid caches do: a
Mamba or Mamba-2 layer (Jamba, Granite 4's hybrid, a Mamba stack), a gated delta layer (Qwen3-Next) or a lightning
layer (MiniMax) keeps a state of its own instead, whatever the length (`state`: core.mamba.MambaState,
core.mamba2.Mamba2State, core.delta.DeltaState or core.lightning.LightningState), counted by `state_bytes`. Falcon-H1
attends in every layer (its Mamba-2 mixer runs beside attention): K and V everywhere, and a state everywhere too. So
a real Jamba (4 attention layers of 32) caches K and V in an eighth of its layers. What qkv keeps beyond the maths:
a Mamba or Mamba-2 layer's state holds each past token's Δ, S = ΣΔ and B, the keys of the attention rows a
recorded generation shows ((2·E + N) numbers a token for Mamba, (2·H + G·N) for Mamba-2), not counted here, only
from a pass that records the attention on (core.mamba.keep_keys; a real Jamba in bfloat16 would keep 918,400 bytes a
token so in its 28 Mamba layers, against 16,384 of K and V); an unrecorded generation keeps its fixed size.

Llama 4's chunked layers (cfg.chunked_layers) keep every position's K and V here, as its other layers do, while
transformers' keeps at most the last attention_chunk − 1 of such a layer (DynamicSlidingWindowLayer: a query never
sees further back): the same numbers, more memory for a text longer than a chunk; `bytes_per_token` counts what qkv
holds (transformers' sliding-window layers alike)."""

from __future__ import annotations

import numpy as np

from .config import ModelConfig
from ..runtime.errors import QkvError


class KVCache:
    """Preallocated K and V for every attention layer: (L_attn, B, Hkv, max_len, d_k) each, row `row(layer)` for
    layer LAYER (MLA: the latent c (L, B, 1, max_len, r_kv) and the RoPE key (L, B, 1, max_len, d_rot)); the other
    layers' states in `state`."""

    def __init__(self, cfg: ModelConfig, batch: int, max_len: int, dtype=np.float32):
        heads, k_width, v_width = self.widths(cfg)
        self.layers = self.kv_layers(cfg)                # the layers that keep K, V: row r of k, v is layers[r]
        self.rows = {layer: r for r, layer in enumerate(self.layers)}
        L = len(self.layers)
        self.k = np.zeros((L, batch, heads, max_len, k_width), dtype=dtype)   # (L_attn, B, Hkv, max_len, d_k)
        self.v = np.zeros((L, batch, heads, max_len, v_width), dtype=dtype)   # (L_attn, B, Hkv, max_len, d_v)
        self.ids = np.zeros((batch, max_len), dtype=np.int64)   # (B, max_len) the tokens read, to read again
        self.max_len = max_len
        self.length = 0                                  # positions filled in every layer
        self.speeds: dict[str, np.ndarray] = {}          # the RoPE speeds ω the cached keys were turned with
        self.rereads = 0                                 # how many times a change of speeds emptied the cache
        self.state = None                                # the other layers' fixed states, made by their first pass:
                                                         # Mamba's (core.mamba.MambaState), Mamba-2's (core.mamba2.
                                                         # Mamba2State), MiniMax's lightning layers' (core.lightning.
                                                         # LightningState), Qwen3-Next's delta layers' (core.delta.
                                                         # DeltaState)

    def row(self, layer: int) -> int:
        """LAYER's row of k and v; a layer without K, V (a Mamba, delta or lightning layer) has none: a bug to ask."""
        if layer not in self.rows:
            raise ValueError(f"layer {layer} keeps no K, V in the cache (its attention layers: {list(self.layers)})")
        return self.rows[layer]

    def append(self, layer: int, k: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Store this step's k, v (B, Hkv, n, d_k) for `layer`; return all keys and values so far.

        The returned arrays are views (B, Hkv, length + n, d_k): no copy of the past.
        """
        start, n = self.length, k.shape[2]
        if start + n > self.max_len:
            raise QkvError(f"the KV cache holds {self.max_len} positions and is full; "
                           "generate fewer tokens or use a longer context")
        r = self.row(layer)
        self.k[r, :, :, start:start + n] = k
        self.v[r, :, :, start:start + n] = v
        return self.k[r, :, :, :start + n], self.v[r, :, :, :start + n]

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
        return cfg.n_kv_heads, cfg.d_head, cfg.d_head

    @staticmethod
    def kv_layers(cfg: ModelConfig) -> tuple[int, ...]:
        """The layers that keep K and V: every layer of a transformer, the "attention" layers of a stack of kinds
        (ModelConfig.layer_kind), none of a Mamba stack."""
        return tuple(i for i in range(cfg.n_layers) if cfg.layer_kind(i) == "attention")

    @staticmethod
    def bytes_per_token(cfg: ModelConfig, dtype=np.float32) -> int:
        """Cache bytes one token costs: K and V, every attention layer, Hkv heads of d_k numbers (MLA: its latent and
        RoPE key, kv_lora_rank + rotary_dim numbers a layer). The other layers' states do not grow with the length:
        `state_bytes`."""
        heads, k_width, v_width = KVCache.widths(cfg)
        return len(KVCache.kv_layers(cfg)) * heads * (k_width + v_width) * np.dtype(dtype).itemsize

    @staticmethod
    def state_numbers(cfg: ModelConfig, layer: int) -> int:
        """Numbers LAYER's fixed state holds for one sequence, whatever its length (0 for a plain attention layer):
            Mamba      conv (k − 1)·E + scan E·N                 core.mamba.MambaState
            Mamba-2    conv (k − 1)·(E + 2·G·N) + scan H_m·P·N   core.mamba2.Mamba2State (Falcon-H1: all layers)
            delta      conv (k − 1)·C + state Hv·d_k·d_v         core.delta.DeltaState (Qwen3-Next)
            lightning  state H·d_k·d_k                           core.lightning.LightningState (MiniMax)"""
        kind, m = cfg.layer_kind(layer), cfg.mamba
        if m is not None and (kind == "mamba" or getattr(m, "beside", None) is not None):
            if hasattr(m, "conv_dim"):                   # Mamba-2 (core.mamba2.Mamba2; not imported: it reads this)
                return (m.conv_kernel - 1) * m.conv_dim + m.n_heads * m.head_dim * m.d_state
            return (m.conv_kernel - 1) * m.d_inner + m.d_inner * m.d_state
        if kind == "delta":
            d = cfg.delta
            return (d.conv_kernel - 1) * d.channels + d.n_v_heads * d.d_k * d.d_v
        if kind == "lightning":
            return cfg.n_heads * cfg.d_head * cfg.d_head
        return 0

    @staticmethod
    def state_bytes(cfg: ModelConfig, dtype=np.float32) -> int:
        """Bytes one sequence's fixed states cost, every layer that keeps one (`state_numbers`): the same after 10
        tokens or 100,000 — what a Mamba, delta or lightning layer keeps in K and V's place."""
        numbers = sum(KVCache.state_numbers(cfg, i) for i in range(cfg.n_layers))
        return numbers * np.dtype(dtype).itemsize

    @property
    def nbytes(self) -> int:
        """Bytes of the K and V arrays (all max_len positions, the attention layers alone)."""
        return self.k.nbytes + self.v.nbytes
