"""MiniMax's blocks (MiniMax-Text-01, Li et al. 2025): lightning attention — a causal linear attention with a
per-head exponential decay — in most layers, softmax attention in the others, each box's residual step scaled.

One lightning-attention box, as transformers' MiniMaxLightningAttention computes it (H heads of d_k, no RoPE, no
1/√d_k, no softmax):

    [q | k | v]ₕ = act(h·W_QKV)                   each head's three, side by side   (B, n, H, 3·d_k)
    oₜ = Σ_{s ≤ t} (qₜ·kₛ)·λ^(t−s)·vₛ            λₕ = exp(−rₕ), rₕ the head's slope   (B, H, n, d_k)
    out = (RMSNorm(Concat(o)) ⊙ σ(h·W_gate))·W_O                                     (B, n, d_model)

The slopes: rₕ = 2^(−8(h+1)/H)·(1 − l/(L − 1 + 1e-5) + 1e-5) in layer l of L (ALiBi's slopes, fading with depth):
fixed, not learned (`slopes`; a checkpoint's slope_rate buffer holds the same). The sum is computed as transformers
sums it, in blocks of b = block_size tokens (`lightning_core`): within a block the plain sum, (Q·Kᵀ ⊙ D)·V with
D[t, s] = λ^(t−s) below the diagonal; across blocks a state S = Σₛ λ^(T−1−s)·kₛᵀ·vₛ (B, H, d_k, d_k), the past's
keys and values folded into one d_k × d_k matrix per head, read by each query as (qₜ·λ^(i+1))·S — the n × n matrix
is never built (4,096 tokens, 8 heads of 64, one thread: 0.21 s; `implied_attention`'s A, then A·V: 56 s). The
state is what a KV cache holds for such a layer (`LightningState`): each new token costs S ← λ·S + kₜᵀ·vₜ,
oₜ = qₜ·S, O(1) in the length.

**The implied attention.** The sum is a matrix: A[h, t, s] = (qₜ·kₛ)·λₕ^(t−s) for s ≤ t, 0 after, and o = A·V
exactly (`implied_attention`; tests/test_family_minimax.py checks A·V against the blocked sum to 1e-9 in float64).
A itself — signed (act may be SiLU, which dips below 0), rows not summing to 1 — is recorded as the layer's
"scores" (B, H, n, m), what it mixes V with: a hook there replaces A and the layer computes A·V from it. Its
"attentions", what the views, rollout and a saved trace read as weights, are A as shares, as a Mamba layer's:
each head's |A| with every row divided by its sum (`shares`; the padding's columns are 0 in A already).
"heads" (B, H, n, d_k) are each head's o, before the norm over all heads.

The block, both kinds (MiniMaxDecoderLayer): the stream that goes on is the *normalised* one, scaled:

    h = RMSNorm(x);   x' = α_attn·h + β_attn·Attn(h)        (lightning or softmax: their own α, β)
    g = RMSNorm(x');  out = α_ffn·g + β_ffn·MoE(g)

recorded as residual, attn_in (h), attn_out (β·Attn(h)), residual_mid (x'), ffn_in (g), ffn_out (β·MoE(g)),
residual_out. With every α, β 1 it is still not x + …: the residual stream is h, not x, which is why direct logit
attribution (a sum of boxes' outputs from the embeddings on) is refused. Training is refused: lightning attention's
backward is not in qkv.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from ..runtime.errors import QkvError
from .attention import top_of
from .blocks import attention, feed_forward, linear
from .layer import normalise, seen
from .ops import ACTIVATIONS, rms_norm, sigmoid
from .trace import MIXER
from .weights import BlockWeights, NormWeights

if TYPE_CHECKING:
    from .cache import KVCache
    from .config import ModelConfig
    from .context import Context

OUT_NORM_EPS = 1e-6            # the norm over Concat(o): transformers builds it with MiniMaxRMSNorm's default ε
HOOKED = ("q", "k", "v", "scores", "heads")       # the points inside a lightning box a hook may read or replace


@dataclass(frozen=True)
class Lightning:
    """MiniMax's knobs (ModelConfig.lightning), as MiniMaxConfig names them."""

    linear_layers: tuple[int, ...]          # the layers of lightning attention (layer_types "linear_attention")
    block_size: int = 256                   # b, the tokens of one block of the blocked sum
    full_alpha: float = 1.0                 # full_attn_alpha_factor: the softmax layers' α (on h)
    full_beta: float = 1.0                  # full_attn_beta_factor: their β (on Attn(h))
    linear_alpha: float = 1.0               # linear_attn_alpha_factor
    linear_beta: float = 1.0                # linear_attn_beta_factor
    ffn_alpha: float = 1.0                  # mlp_alpha_factor
    ffn_beta: float = 1.0                   # mlp_beta_factor

    def check(self, cfg: "ModelConfig") -> str | None:
        """What is wrong with these knobs under CFG (None: nothing)."""
        if not isinstance(self.block_size, int) or isinstance(self.block_size, bool) or self.block_size <= 0:
            return f"lightning attention's block_size must be a positive whole number, got {self.block_size!r:.20}"
        if any(not 0 <= i < cfg.n_layers for i in self.linear_layers):
            return f"lightning attention's layers {list(self.linear_layers)} must be layers 0..{cfg.n_layers - 1}"
        factors = (self.full_alpha, self.full_beta, self.linear_alpha, self.linear_beta, self.ffn_alpha, self.ffn_beta)
        if not all(isinstance(f, (int, float)) and not isinstance(f, bool) and math.isfinite(f) for f in factors):
            return f"MiniMax's α, β factors must be finite numbers, got {factors}"
        if cfg.norm != "rms" or cfg.norm_place != "pre" or cfg.parallel_residual or cfg.d_ff <= 0:
            return "a MiniMax block is RMSNorm before each box, sequential, with an FFN"
        if cfg.activation not in ACTIVATIONS:
            return f"lightning attention's activation must be one of {', '.join(ACTIVATIONS)}"
        return None

    def linear(self, layer: int) -> bool:
        """Whether LAYER is lightning (linear) attention, not softmax attention."""
        return layer in self.linear_layers

    def attn_factors(self, layer: int) -> tuple[float, float]:
        """(α, β) of LAYER's attention step."""
        return (self.linear_alpha, self.linear_beta) if self.linear(layer) else (self.full_alpha, self.full_beta)


@dataclass
class LightningWeights:
    """One lightning-attention box (MiniMaxLightningAttention) under the letters of the module docstring."""

    W_Q: np.ndarray                  # (d_model, H·d_k) the q columns of qkv_proj, head by head
    W_K: np.ndarray                  # (d_model, H·d_k)
    W_V: np.ndarray                  # (d_model, H·d_k)
    W_gate: np.ndarray               # (d_model, H·d_k) output_gate
    out_norm: NormWeights            # (H·d_k,) the RMSNorm over Concat(o)
    W_O: np.ndarray                  # (H·d_k, d_model) out_proj
    slopes: np.ndarray               # (H,) r, λ = exp(−r): slope_rate


@dataclass
class LightningBlockWeights(BlockWeights):
    """A MiniMax block whose attention is lightning attention: attn None, the box in `lightning`; its norms and
    FFN as every block's."""

    lightning: LightningWeights | None = None


def slopes(n_heads: int, layer: int, n_layers: int) -> np.ndarray:
    """(H,) float64 rₕ = 2^(−8(h+1)/H)·(1 − l/(L − 1 + 1e-5) + 1e-5): transformers' get_slope_rate, what a
    checkpoint without slope_rate (a fresh model) uses."""
    base = 1 / (2 ** (8 / n_heads))
    factor = 1 - layer / (n_layers - 1 + 1e-5) + 1e-5
    return base ** np.arange(1, n_heads + 1, dtype=np.float64) * factor


# ── the sum ──────────────────────────────────────────────────────────────────────

def implied_attention(q: np.ndarray, k: np.ndarray, rate: np.ndarray, past: int = 0) -> np.ndarray:
    """A (B, H, n, m): A[h, t, s] = (qₜ·kₛ)·exp(−rₕ·(t − s)) for keys s ≤ t, 0 after; q (B, H, n, d_k) the queries at
    positions past..past + n − 1, k (B, H, m, d_k) every key from position 0 (m = past + n), rate (H,)."""
    n, m = q.shape[2], k.shape[2]
    gap = (past + np.arange(n))[:, None] - np.arange(m)[None, :]          # (n, m) t − s
    decay = np.exp(-rate[:, None, None] * np.maximum(gap, 0)) * (gap >= 0)   # (H, n, m) λ^(t−s), 0 for s > t
    return (q @ k.swapaxes(-1, -2)) * decay.astype(q.dtype)              # (B, H, n, m)


def lightning_core(q: np.ndarray, k: np.ndarray, v: np.ndarray, rate: np.ndarray, block: int,
                   state: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(o (B, H, n, d_k), the state after the last token (B, H, d_k, d_k)): oₜ = Σ_{s ≤ t} (qₜ·kₛ)·λ^(t−s)·vₛ + the
    past's λ^(t+1−p)·qₜ·S (STATE S over the tokens before, None: none), in blocks of BLOCK tokens as transformers
    sums it: within a block (Q·Kᵀ ⊙ D)·V, across blocks (Q ⊙ λ^(i+1))·S, then S ← λ^c·S + (K ⊙ λ^(c−1−i))ᵀ·V.
    Plain form: implied_attention(q, k, rate) @ v (with no state); tests/test_family_minimax.py checks they agree."""
    Bsz, H, n, dk = q.shape
    dtype = q.dtype
    S = np.zeros((Bsz, H, dk, v.shape[-1]), dtype) if state is None else state
    r = rate.astype(dtype)[:, None, None]                                 # (H, 1, 1)
    o = np.empty_like(v)                                                  # (B, H, n, d_k)
    for start in range(0, n, block):
        c = min(block, n - start)
        i = np.arange(1, c + 1, dtype=dtype)                              # 1..c, each query's place in the block
        qb, kb, vb = q[:, :, start:start + c], k[:, :, start:start + c], v[:, :, start:start + c]
        gap = i[:, None] - i[None, :]                                     # (c, c)
        D = np.exp(np.where(gap >= 0, -r * gap, -np.inf))                 # (H, c, c) λ^(t−s) below the diagonal
        intra = ((qb @ kb.swapaxes(-1, -2)) * D) @ vb                     # (B, H, c, d_k)
        inter = (qb * np.exp(-r * i[:, None])) @ S                        # (B, H, c, d_k) the blocks before
        o[:, :, start:start + c] = inter + intra
        S = S * np.exp(-r * c) + (kb * np.exp(-r * (c - i)[:, None])).swapaxes(-1, -2) @ vb   # (B, H, d_k, d_k)
    return o, S


def shares(A: np.ndarray) -> np.ndarray:
    """(…, n, m) |A| with each row divided by its sum (a row of zeros stays zeros): the implied matrix as the views
    read attention weights, ≥ 0, rows summing to 1 (core/mamba.py's attention_summary, per head)."""
    W = np.abs(A)
    total = W.sum(axis=-1, keepdims=True)                                 # (…, n, 1)
    return np.divide(W, total, out=np.zeros_like(W), where=total > 0)


# ── the cache ────────────────────────────────────────────────────────────────────

@dataclass
class LightningState:
    """What writing keeps of a lightning layer's past: its state S (B, H, d_k, d_k) and, for the attention rows of
    later tokens, every past key (B, H, t, d_k) — only when the first pass recorded the attentions (a recorded
    generation), as writing alone needs S alone; by layer."""

    S: dict[int, np.ndarray] = field(default_factory=dict)
    keys: dict[int, np.ndarray] = field(default_factory=dict)


def state_of(cache: "KVCache") -> LightningState:
    """The lightning state a KV cache carries (made on its first pass); the cache counts the positions."""
    if getattr(cache, "state", None) is None:
        cache.state = LightningState()
    return cache.state


# ── the boxes ────────────────────────────────────────────────────────────────────

def _heads(x: np.ndarray, H: int) -> np.ndarray:
    """(B, n, H·d_k) → (B, H, n, d_k)."""
    B, n, _ = x.shape
    return x.reshape(B, n, H, -1).transpose(0, 2, 1, 3)


def lightning_attention(h: np.ndarray, w: LightningWeights, ctx: "Context", layer: int) -> np.ndarray:
    """The lightning box of the module docstring: h (B, n, d_model) → out (B, n, d_model), from and into the
    cache's state (if any). q, k, v, "scores" (the implied A) and "heads" (o) hooked and recorded by name,
    "attentions" (A as shares) recorded."""
    cfg, rec, hooks, cache = ctx.cfg, ctx.rec, ctx.hooks, ctx.cache
    H, n = cfg.n_heads, h.shape[1]
    act = ACTIVATIONS[cfg.activation]
    q, k, v = (act(linear(h, W)) for W in (w.W_Q, w.W_K, w.W_V))        # (B, n, H·d_k) each
    real = ctx.mask.key_mask                                              # (B, m) or None: no padding
    if real is not None and n > 1:                                        # transformers' apply_mask_to_padding_states
        new = real[:, -n:, None].astype(h.dtype)                          # (B, n, 1); a one-token step is never a pad
        q, k, v = q * new, k * new, v * new
    q, k, v = _heads(q, H), _heads(k, H), _heads(v, H)                    # (B, H, n, d_k) each
    if hooks is not None:
        q, k, v = hooks.qkv(layer, q, k, v)
    for name, value in (("q", q), ("k", k), ("v", v)):
        rec.put(layer, name, value)
    state = None if cache is None else state_of(cache)
    past = 0 if cache is None else cache.length
    S0 = None if state is None or not past else state.S[layer]
    hooked = hooks is not None and hooks.wants(layer, "scores")
    if hooked and past:
        raise QkvError("a hook on a lightning layer's scores needs the whole text in one pass (its past is a "
                       "state, not a matrix); run it without a KV cache")
    mix = rec.wants_any(layer, MIXER)                                     # its own steps (the pipeline page)
    shown = hooked or mix or any(rec.wants(layer, name) for name in ("scores", "attentions", "attention_top"))
    keys = k                                                              # (B, H, m, d_k) every key A's rows read
    if past and (shown or layer in state.keys):
        if layer not in state.keys:
            raise QkvError(f"layer {layer}'s attention rows over the cached past need its keys, which are kept only "
                           "when the first pass records the attentions; record them from the first pass (a recorded "
                           "generation), or run the whole text without a cache")
        keys = np.concatenate([state.keys[layer], k], axis=2)
    if shown:
        A = implied_attention(q, keys, w.slopes, past)                    # (B, H, n, m) (a long text: n·m per head)
        if hooked:
            A = hooks(layer, "scores", A)
        rec.put(layer, "scores", A if rec.heads is None else A[:, rec.heads])
        if rec.wants(layer, "attentions") or rec.wants(layer, "attention_top"):
            W = shares(A if rec.heads is None else A[:, rec.heads])      # (B, H, n, m) what the views read
            rec.put(layer, "attentions", W)
        if rec.wants(layer, "attention_top"):                             # each row's largest weights
            rec.put(layer, "attention_top", top_of(W, rec.top))
    o, S = lightning_core(q, k, v, w.slopes, cfg.lightning.block_size, S0)   # (B, H, n, d_k), (B, H, d_k, d_k)
    if hooked:                                                            # the hooked matrix is what mixes
        o = A @ v                                                         # (B, H, n, d_k)
    if mix:                                                               # trace.MIXER, one per head: o = A·v
        decay = np.broadcast_to(-w.slopes.astype(q.dtype)[:, None], q.shape[:3])   # (B, H, n) log λ = −r
        for name, value in (("mix_q", q), ("mix_k", k), ("mix_v", v), ("mix_decay", decay.copy()), ("mix_matrix", A),
                            ("mix_out", o)):
            rec.put(layer, name, value)
    if state is not None:
        state.S[layer] = S
        if shown and not past or layer in state.keys:                     # (a recorded generation: every key)
            state.keys[layer] = keys
    if ctx.ablate is not None:
        o = ctx.ablate.apply(layer, o, None if real is None else real[:, -n:])
    if hooks is not None:
        o = hooks(layer, "heads", o)
    rec.put(layer, "heads", o)
    Bsz = h.shape[0]
    z = o.transpose(0, 2, 1, 3).reshape(Bsz, n, -1)                      # (B, n, H·d_k) Concat(o)
    z = rms_norm(z, w.out_norm.weight, OUT_NORM_EPS) * sigmoid(linear(h, w.W_gate))
    return linear(z, w.W_O)                                               # (B, n, d_model)


def check_pass(ctx: "Context") -> None:
    """One error for what a MiniMax pass cannot do: a tape (training: lightning's backward is not in qkv), a hook on
    a lightning layer's attentions (shares, read beside it) or RoPE points (it has none)."""
    if ctx.tape is not None:
        raise QkvError("gradients through a MiniMax model (training, input attribution) are not in qkv: lightning "
                       "attention has no backward here; use a transformer, or transformers for MiniMax")
    lightning = ctx.cfg.lightning
    for layer, name in (ctx.hooks.points if ctx.hooks is not None else ()):
        if lightning.linear(layer) and name == "attentions":
            raise QkvError(f"hook {layer}.attentions: layer {layer} is lightning attention, whose attentions are shares "
                           "of its implied matrix read beside it; hook 'scores' (the matrix A it mixes V with) or "
                           "'heads' there")
        if lightning.linear(layer) and name in ("q_pre_rope", "k_pre_rope"):
            raise QkvError(f"hook {layer}.{name}: layer {layer} is lightning attention, which has no RoPE; hook one "
                           f"of {', '.join(HOOKED)} there")


def minimax_block(x: np.ndarray, w: BlockWeights, ctx: "Context", layer: int) -> np.ndarray:
    """One MiniMax block (module docstring): h = Norm(x), x' = α·h + β·Attn(h), g = Norm(x'), α_f·g + β_f·MoE(g),
    Attn lightning or softmax attention by the layer's kind; each point hooked and recorded under its name."""
    cfg, lightning = ctx.cfg, ctx.cfg.lightning
    check_pass(ctx)
    x = seen(ctx, layer, "residual", x)
    h = seen(ctx, layer, "attn_in", normalise(x, w.attn_norm, ctx, layer, "attn_norm_scale"))   # (B, n, d_model)
    alpha, beta = lightning.attn_factors(layer)
    if lightning.linear(layer):
        a = lightning_attention(h, w.lightning, ctx, layer)
    else:
        a = attention(h, w.attn, ctx, layer)
    a = seen(ctx, layer, "attn_out", a * beta)                           # (B, n, d_model) β·Attn(h)
    x = seen(ctx, layer, "residual_mid", h * alpha + a)
    g = seen(ctx, layer, "ffn_in", normalise(x, w.ffn_norm, ctx, layer, "ffn_norm_scale"))
    f = seen(ctx, layer, "ffn_out", feed_forward(g, w.ffn, cfg, None, layer, ctx.rec, ctx.hooks) * lightning.ffn_beta)
    return seen(ctx, layer, "residual_out", g * lightning.ffn_alpha + f)   # (B, n, d_model)
