"""What one forward pass shares besides its input and its weights (guide: block): the `Context` every box of
the pass reads (config, mask, rotation of positions, recorder, KV cache, hooks, ablation, tape), the heads an
`Ablation` knocks out, and the pass's checks that its numbers stay finite (`check_finite`, `check_given`).
The boxes that read a Context are core/blocks.py's; the stack runner that makes one, core/stack.py's.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..runtime.errors import QkvError
from .attention import AttentionMask
from .blocks_backward import Tape
from .cache import KVCache
from .config import ModelConfig
from .disentangled import RelativeTable
from .hooks import Hooks
from .trace import Recorder


ABLATIONS = ("zero", "mean")


@dataclass(frozen=True)
class Ablation:
    """Heads knocked out of a pass: their Z = A·V replaced before Concat·W_O.

    how="zero": Z_h = 0, so the head adds nothing (the same as zeroing rows h·d_k..(h+1)·d_k
    of W_O). how="mean": Z_h = its mean over the positions of the same input (real tokens
    only, every position, future ones included even in a decoder), so the head adds a
    constant instead of what it read at each position. `Model.ablation` builds and checks one.
    """

    heads: dict[int, tuple[int, ...]]              # layer → its ablated query heads (0..H-1)
    how: str = "zero"

    def apply(self, layer: int, z: np.ndarray, real: np.ndarray | None) -> np.ndarray:
        """z (B, H, n, d_k) → a copy with this layer's ablated heads replaced (z itself if none);
        real (B, n): which of the n positions are real tokens (None: all), for the mean."""
        heads = self.heads.get(layer)
        if not heads:
            return z
        z = z.copy()
        h = list(heads)
        if self.how == "zero":
            z[:, h] = 0
            return z                                               # (B, H, n, d_k)
        n = z.shape[2]
        real = np.ones((z.shape[0], n), bool) if real is None else real   # (B, n) the real tokens
        w = (real / np.maximum(real.sum(axis=1, keepdims=True), 1)).astype(z.dtype)   # (B, n)
        mean = np.einsum("bn,bhnd->bhd", w, z[:, h])               # (B, h, d_k)
        z[:, h] = mean[:, :, None, :]
        return z                                                   # (B, H, n, d_k)

    def join(self, other: "Ablation") -> "Ablation":
        """Both ablations' heads (an ablated view of a model ablated again)."""
        if other.how != self.how:
            raise QkvError(f"this model already {self.how}-ablates heads; ablate more with how={self.how!r}")
        layers = self.heads.keys() | other.heads.keys()
        return Ablation({l: tuple(sorted({*self.heads.get(l, ()), *other.heads.get(l, ())})) for l in layers},
                        self.how)


@dataclass
class Context:
    """What every box of one forward pass shares, besides its input and its weights.

    An encoder–decoder's decoder pass has a second Context, `cross`, for its cross-attention:
    the source's mask, the encoder's K, V (`memory`), and its own recorder, hooks and ablation.
    """

    cfg: ModelConfig
    mask: AttentionMask                              # who may see whom (guide: mask), + T5's position bias
    rope: tuple[np.ndarray, np.ndarray] | None       # cos, sin (B, 1, n, d_k) of the positions; None without RoPE
    rec: Recorder                                    # which intermediates to keep, and where
    cache: KVCache | None = None                     # the past's K, V when decoding; None: no past
    ablate: Ablation | None = None                   # heads whose Z is replaced; None: none (the fast path)
    hooks: Hooks | None = None                       # functions reading or replacing values (qkv.core.hooks); None: none
    step_bias: np.ndarray | None = None              # a one-token step's mask M, None if it hides nothing
    one_step: bool = False                           # a plain one-token step: blocks take `step_block`
    compiled_step: bool = False                      # … or, where they can, step_compiled's (nothing recorded)
    scale: float | None = None                       # what Q·Kᵀ is multiplied by; None: 1/√d_k (ModelConfig.score_scale)
    memory: list[tuple[np.ndarray, np.ndarray]] | None = None   # cross-attention: each layer's K, V (B, H, n_src, d_k)
    cross: "Context | None" = None                   # a decoder's cross-attention (encoder–decoders); None: none
    query_mask: np.ndarray | None = None             # cross-attention: (B, n) the real target tokens; None: all
    rel_buckets: np.ndarray | None = None            # (n, m) T5 buckets of the pass's query–key pairs, for layers
                                                     # with a position bias of their own (UMT5); None: none
    tape: Tape | None = None                         # what each box's backward reads (blocks_backward); None: nothing
    relative: RelativeTable | None = None            # DeBERTa: the relative positions' table and the rows each pair
                                                     # reads, made once a pass (core/disentangled.py); None: none
    # Layers of different kinds (ModelConfig.layer_windows, local_rope_theta, no_rope_layers, chunked_layers): one
    # mask per kind of mask (window, chunk: ModelConfig.mask_kind), one rotation per kind, each made once per pass;
    # None: every layer takes `mask`, `rope`, `step_bias`.
    masks: dict[tuple[int | None, int | None], AttentionMask] | None = None
    ropes: dict[str | None, tuple[np.ndarray, np.ndarray] | None] | None = None
    step_biases: dict[tuple[int | None, int | None], np.ndarray | None] | None = None
    temperature: np.ndarray | None = None            # Llama 4's NoPE layers: each query's factor (B, 1, n, 1) by its
                                                     # position (positions.temperature_scales); None: none

    def mask_of(self, layer: int) -> AttentionMask:
        """LAYER's mask: its window's and chunk's (a full layer's: neither)."""
        return self.mask if self.masks is None else self.masks[self.cfg.mask_kind(layer)]

    def rope_of(self, layer: int) -> tuple[np.ndarray, np.ndarray] | None:
        """LAYER's cos, sin: global, local (its own base, Gemma 3) or None (no RoPE, SmolLM3's no_rope_layers)."""
        return self.rope if self.ropes is None else self.ropes[self.cfg.rope_kind(layer)]

    def step_bias_of(self, layer: int) -> np.ndarray | None:
        """LAYER's mask M of a one-token step (None if it hides nothing)."""
        return self.step_bias if self.step_biases is None else self.step_biases[self.cfg.mask_kind(layer)]


# What a pass does where float32 overflows (weights near 3e38, a q·k of 1e40): NumPy's warnings are silenced
# inside the pass and the first non-finite stream stops it, naming where (`check_finite`), instead of tables of nan.
QUIET = dict(over="ignore", invalid="ignore", divide="ignore")


class NotFinite(QkvError):
    """A pass's stream held inf or NaN (`check_finite`): callers with their own words for it (training) catch this."""


def check_finite(x: np.ndarray, where: str, hooks: Hooks | None = None) -> None:
    """One NotFinite when X holds inf or NaN: WHERE (e.g. "layer 3's output") is where the pass first overflowed.
    What it blames: the weights, or with HOOKS in the pass (core.hooks; their values are finite, `_replacement`)
    those values or the weights; an input the caller gave (a stream, embeddings) is checked before the pass."""
    if not np.isfinite(x).all():
        if hooks is not None:
            raise NotFinite(f"{where} is not finite (inf or NaN): the values of the hooks in the pass "
                            f"({', '.join(hooks.keys)}) or the model's weights overflow float32 there; make the "
                            "hooks' values smaller, or run without them to see which")
        raise NotFinite(f"{where} is not finite (inf or NaN): the model's weights or config overflow float32 there; "
                       "check the checkpoint (its values, its rope and eps settings)")


def check_given(x: np.ndarray | None, what: str) -> None:
    """An array the caller hands a pass instead of ids (a stream to continue, token embeddings) holding inf or
    NaN is the caller's mistake: said here, before the pass would blame the weights (`check_finite`)."""
    if x is not None and not np.isfinite(x).all():
        raise QkvError(f"{what} holds inf or NaN; give finite numbers")
