"""The gated delta rule (Yang, Kautz & Hatamizadeh 2024; Qwen3-Next's linear attention): a layer that keeps a
state matrix per head instead of a KV cache, and the attention it implies.

One linear-attention layer, as transformers' Qwen3NextGatedDeltaNet computes it (its torch fallbacks
torch_chunk_gated_delta_rule / torch_recurrent_gated_delta_rule: the same numbers as the recurrence below),
on h = Norm(x) (B, n, d_model), Hk key heads of d_k, Hv value heads of d_v (each key head serves r = Hv/Hk
value heads, as GQA's K/V heads serve query heads), C = 2·Hk·d_k + Hv·d_v conv channels:

    [q | k | v] = act(conv_k(h·[W_q | W_k | W_v]))   causal depthwise conv, k taps, no bias  (B, n, C)
    z = h·W_z,  β = σ(h·W_b),  g = −exp(A_log)·softplus(h·W_a + b_dt)         (B, n, Hv·d_v), (B, n, Hv) ×2
    q̂ = q/‖q‖·d_k^−½,  k̂ = k/‖k‖      (‖x‖ = √(Σx² + 1e-6), per head; value head j reads key head j // r)
    Sₜ = exp(gₜ)·Sₜ₋₁ + k̂ₜ·(βₜ·(vₜ − (exp(gₜ)·Sₜ₋₁)ᵀ·k̂ₜ))ᵀ      the state (B, Hv, d_k, d_v), per value head
       = (I − βₜ·k̂ₜk̂ₜᵀ)·exp(gₜ)·Sₜ₋₁ + βₜ·k̂ₜ·vₜᵀ        (the delta rule: write vₜ over what Sₜ₋₁ read at k̂ₜ)
    oₜ = Sₜᵀ·q̂ₜ                                                  (B, n, Hv, d_v)  the core output
    y = RMSNorm_{d_v}(o)·w ⊙ SiLU(z)                             the gated norm, per value head
    out = y·W_out                                                (B, n, d_model)

The padding's rows of h are zeroed first (transformers' apply_mask_to_padding_states): a left pad then writes
nothing (k̂ = v = 0), so a padded row reads as the text alone.

**The attention it implies.** Sₜ is linear in the values: Sₜ = Σ_{s≤t} Uₜ[:, s]·vₛᵀ with

    Uₜ = [exp(gₜ)·(I − βₜ·k̂ₜk̂ₜᵀ)·Uₜ₋₁ | βₜ·k̂ₜ]                   (d_k, t) per value head, one column a key
    oₜ = Σ_{s≤t} A[t, s]·vₛ,   A[t, s] = q̂ₜᵀ·Uₜ[:, s] = βₛ·q̂ₜᵀ·(Π_{r=s+1..t} exp(g_r)(I − β_r k̂_r k̂_rᵀ))·k̂ₛ

exactly (`implied_attention`; tests/test_family_qwen3_next.py checks A·V is the core output to 1e-9 in
float64). The conv before it is a mixing of its own (core/mamba.py's conv_mixing), kept apart: SiLU between
them makes their product no single matrix. What the trace records as the layer's "attentions" (B, H, n, m),
the views' key, is A as shares, as a Mamba layer's: the C_v = Hv·d_v value channels in H = n_heads groups (the
model's full-attention heads; a group may hold several value heads or part of one), each group's Σ|A| over its
channels, the padding's columns zeroed, each row divided by its sum. "heads" (B, H, n, C_v/H) are each group's
channels of y, what W_out reads: ablating a head zeroes (or means) them, as attention's Z_h.

The cache of writing (`DeltaState`, in KVCache.state) is transformers': per linear layer the conv's last k − 1
inputs and the state S, so a step costs O(1) in the length; and, from a pass that records the attention on, U,
the keys of the rows a recorded generation shows (Hv·d_k numbers a past token, as a KV cache's keys; a pass that
records over a past kept without them is refused in one line). Training (a tape) is refused in one line:
the delta rule's backward is not in qkv. `delta_layer` is the block around the box (a transformer block's residual
steps, its FFN dense or routed), what core/stack.py runs for a layer of kind "delta" (ModelConfig.layer_kind).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ..runtime.errors import QkvError
from .attention import top_of
from .blocks import feed_forward, linear
from .layer import after_box, residual, seen
from .mamba import causal_conv
from .ops import ACTIVATIONS, sigmoid, silu, softplus
from .trace import MIXER
from .weights import BlockWeights, NormWeights

if TYPE_CHECKING:
    from .config import ModelConfig
    from .context import Context

L2_EPS = 1e-6                       # ‖x‖ = √(Σx² + ε) of q and k (transformers' l2norm, FLA's)
# The points of softmax attention a linear-attention layer has not, refused to a hook there (its "attentions" are
# implied by the rule and computed beside it: a hook on them would change nothing).
NOT_HERE = ("q", "k", "v", "scores", "attentions", "q_pre_rope", "k_pre_rope")
NO_BACKWARD = ("gradients through Qwen3-Next's linear-attention layers (training, input attribution) are not in qkv: "
               "the gated delta rule has no backward here; use transformers for them")


@dataclass(frozen=True)
class GatedDelta:
    """The knobs of the gated delta rule's layers (ModelConfig.delta), as Qwen3NextConfig names them."""

    layers: tuple[int, ...]          # the linear-attention layers (layer_types "linear_attention"); the rest attend
    n_k_heads: int                   # Hk, linear_num_key_heads
    n_v_heads: int                   # Hv, linear_num_value_heads (a multiple of Hk)
    d_k: int                         # linear_key_head_dim
    d_v: int                         # linear_value_head_dim
    conv_kernel: int                 # k, linear_conv_kernel_dim

    @property
    def channels(self) -> int:
        """C, the conv's channels: [q | k | v]."""
        return 2 * self.n_k_heads * self.d_k + self.n_v_heads * self.d_v

    def check(self, cfg: "ModelConfig") -> str | None:
        """What is wrong with these knobs under CFG (None: nothing)."""
        sizes = (self.n_k_heads, self.n_v_heads, self.d_k, self.d_v, self.conv_kernel)
        if not all(isinstance(s, int) and not isinstance(s, bool) and s > 0 for s in sizes):
            return f"the linear layers' heads, head sizes and conv_kernel must be positive whole numbers, got {sizes}"
        if self.n_v_heads % self.n_k_heads:
            return (f"linear_num_value_heads={self.n_v_heads} must be a multiple of linear_num_key_heads="
                    f"{self.n_k_heads} (each key head serves a group of value heads)")
        if (self.n_v_heads * self.d_v) % cfg.n_heads:
            return (f"the views show a linear layer's {self.n_v_heads}·{self.d_v} value channels as n_heads="
                    f"{cfg.n_heads} groups: they must divide evenly")
        if any(not 0 <= i < cfg.n_layers for i in self.layers) or len(set(self.layers)) != len(self.layers):
            return f"the linear layers {list(self.layers)} must be distinct layers 0..{cfg.n_layers - 1}"
        if cfg.norm != "rms" or cfg.norm_place != "pre" or cfg.parallel_residual or cfg.activation not in ACTIVATIONS:
            return "a gated delta layer sits in a pre-RMSNorm block, its conv's activation one of " + \
                ", ".join(ACTIVATIONS)
        return None


@dataclass
class DeltaWeights:
    """One gated delta layer (transformers' Qwen3NextGatedDeltaNet) under the letters of the module docstring;
    the heads' columns in order (key head g's q, k: columns g·d_k…; value head j's v, z: j·d_v…)."""

    W_q: np.ndarray                  # (d_model, Hk·d_k)
    W_k: np.ndarray                  # (d_model, Hk·d_k)
    W_v: np.ndarray                  # (d_model, Hv·d_v)
    W_z: np.ndarray                  # (d_model, Hv·d_v) the output gate's
    W_b: np.ndarray                  # (d_model, Hv) β = σ(h·W_b)
    W_a: np.ndarray                  # (d_model, Hv) the decay's input
    conv: np.ndarray                 # (C, k) each channel's taps, the last one reading the current token
    A_log: np.ndarray                # (Hv,)
    b_dt: np.ndarray                 # (Hv,) dt_bias
    norm: NormWeights                # (d_v,) the gated RMSNorm's γ
    W_out: np.ndarray                # (Hv·d_v, d_model)


@dataclass
class DeltaBlockWeights(BlockWeights):
    """A block whose mixing box is a gated delta layer (attn None); its norms and FFN are any block's."""

    delta: DeltaWeights | None = None


# ── the cache ────────────────────────────────────────────────────────────────────

@dataclass
class DeltaState:
    """What writing keeps of the past, per layer (None for a full-attention layer, whose K, V the KV cache
    holds): conv (B, k − 1, C) the conv's last inputs, S (B, Hv, d_k, d_v) the state, U (B, Hv, d_k, t) the
    implied attention's keys, one column a past token (None until a pass records the attention)."""

    conv: list[np.ndarray | None]
    S: list[np.ndarray | None]
    U: list[np.ndarray | None]

    @classmethod
    def empty(cls, n_layers: int) -> "DeltaState":
        return cls([None] * n_layers, [None] * n_layers, [None] * n_layers)


def state_of(ctx: "Context", layer: int) -> DeltaState | None:
    """The delta state the pass's KV cache carries (made on its first pass); None without a cache. A text's
    first pass (and a cache emptied to read its text again, KVCache.reread) starts each layer from zeros."""
    cache = ctx.cache
    if cache is None:
        return None
    if not isinstance(cache.state, DeltaState):
        cache.state = DeltaState.empty(ctx.cfg.n_layers)
    if cache.length == 0:
        cache.state.conv[layer] = cache.state.S[layer] = cache.state.U[layer] = None
    return cache.state


# ── the boxes ────────────────────────────────────────────────────────────────────

def l2_normalise(x: np.ndarray) -> np.ndarray:
    """x / √(Σx² + 1e-6) over the last axis (transformers' l2norm)."""
    return x / np.sqrt(np.sum(x * x, axis=-1, keepdims=True) + L2_EPS)


@dataclass
class DeltaParts:
    """What a gated delta layer computes on the way: mixed (B, n, C) the conv's input; q̂, k̂ (B, Hv, n, d_k)
    normalised (q̂ scaled by d_k^−½) and repeated for each value head; v (B, Hv, n, d_v); β, g (B, Hv, n);
    z (B, n, Hv, d_v); o (B, Hv, n, d_v) the core output; S (B, Hv, d_k, d_v) the last state."""

    mixed: np.ndarray
    q: np.ndarray
    k: np.ndarray
    v: np.ndarray
    beta: np.ndarray
    g: np.ndarray
    z: np.ndarray
    o: np.ndarray
    S: np.ndarray


def delta_rule(q: np.ndarray, k: np.ndarray, v: np.ndarray, beta: np.ndarray, g: np.ndarray,
               S: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(o (B, Hv, n, d_v), the last state (B, Hv, d_k, d_v)) of the recurrence of the module docstring from
    state S, step by step in transformers' order of operations (torch_recurrent_gated_delta_rule)."""
    n = q.shape[2]
    o = np.empty(v.shape, np.result_type(q, v))               # (B, Hv, n, d_v)
    for t in range(n):
        S = S * np.exp(g[:, :, t])[..., None, None]           # (B, Hv, d_k, d_v) decayed
        read = np.einsum("bhkv,bhk->bhv", S, k[:, :, t])      # (B, Hv, d_v) what S holds at k̂ₜ
        delta = (v[:, :, t] - read) * beta[:, :, t, None]     # (B, Hv, d_v)
        S = S + k[:, :, t, :, None] * delta[:, :, None, :]    # (B, Hv, d_k, d_v)
        o[:, :, t] = np.einsum("bhkv,bhk->bhv", S, q[:, :, t])
    return o, S


def delta_parts(h: np.ndarray, w: DeltaWeights, cfg: "ModelConfig", new: np.ndarray | None = None,
                conv_past: np.ndarray | None = None, S0: np.ndarray | None = None) -> DeltaParts:
    """The layer of the module docstring up to the core output, on h (B, n, d_model) what the norm gave: NEW
    (B, n, 1) this pass's padding (1 = token; None: none), CONV_PAST (B, k − 1, C) the conv's earlier inputs
    and S0 (B, Hv, d_k, d_v) the state before (None: zeros, the start of a text)."""
    m = cfg.delta
    Hk, Hv, dk, dv = m.n_k_heads, m.n_v_heads, m.d_k, m.d_v
    B, n, _ = h.shape
    if new is not None:
        h = h * new                                           # transformers' apply_mask_to_padding_states
    mixed = np.concatenate([linear(h, w.W_q), linear(h, w.W_k), linear(h, w.W_v)], axis=-1)   # (B, n, C)
    past = np.zeros((B, m.conv_kernel - 1, m.channels), h.dtype) if conv_past is None else conv_past
    qkv = ACTIVATIONS[cfg.activation](causal_conv(mixed, w.conv, None, past))               # (B, n, C)
    r = Hv // Hk

    def heads(x: np.ndarray, count: int, size: int, repeat: int = 1) -> np.ndarray:
        x = x.reshape(B, n, count, size).transpose(0, 2, 1, 3)                               # (B, count, n, size)
        return np.repeat(x, repeat, axis=1) if repeat > 1 else x                              # value head j: j // r
    q = heads(l2_normalise(qkv[..., :Hk * dk].reshape(B, n, Hk, dk)), Hk, dk, r) * dk ** -0.5   # (B, Hv, n, d_k)
    k = heads(l2_normalise(qkv[..., Hk * dk:2 * Hk * dk].reshape(B, n, Hk, dk)), Hk, dk, r)     # (B, Hv, n, d_k)
    v = heads(qkv[..., 2 * Hk * dk:], Hv, dv)                                                   # (B, Hv, n, d_v)
    beta = sigmoid(linear(h, w.W_b)).transpose(0, 2, 1)                                         # (B, Hv, n)
    g = (-np.exp(w.A_log) * softplus(linear(h, w.W_a) + w.b_dt)).transpose(0, 2, 1)             # (B, Hv, n)
    S0 = np.zeros((B, Hv, dk, dv), h.dtype) if S0 is None else S0
    o, S = delta_rule(q, k, v, beta, g, S0)
    return DeltaParts(mixed, q, k, v, beta, g, linear(h, w.W_z).reshape(B, n, Hv, dv), o, S)


def gated_norm(o: np.ndarray, z: np.ndarray, w: NormWeights, eps: float) -> np.ndarray:
    """y = RMSNorm(o)·γ ⊙ SiLU(z) per value head, o (B, Hv, n, d_v), z (B, n, Hv, d_v) → (B, n, Hv·d_v)."""
    o = o.transpose(0, 2, 1, 3)                               # (B, n, Hv, d_v)
    y = o / np.sqrt(np.mean(o * o, axis=-1, keepdims=True) + eps) * w.weight
    return (y * silu(z)).reshape(*o.shape[:2], -1)            # (B, n, Hv·d_v)


def implied_attention(q: np.ndarray | None, k: np.ndarray, beta: np.ndarray, g: np.ndarray,
                      U: np.ndarray | None = None) -> tuple[np.ndarray | None, np.ndarray]:
    """(A (B, Hv, n, m), U after the last token (B, Hv, d_k, m)): the keys of the module docstring, Uₜ =
    [exp(gₜ)·(I − βₜ·k̂ₜk̂ₜᵀ)·Uₜ₋₁ | βₜ·k̂ₜ] from U (B, Hv, d_k, past) the past's (None: none), and
    A[t, s] = q̂ₜᵀ·Uₜ[:, s] for the keys s ≤ past + t (0 after), so that oₜ = Σₛ A[t, s]·vₛ exactly (the past's
    values included: the state S0 is U·V of the past). q̂, k̂ (B, Hv, n, d_k), β, g (B, Hv, n); q None: U alone
    (what a cache keeps when no attention is recorded), A None."""
    B, Hv, n, dk = k.shape
    U = np.zeros((B, Hv, dk, 0), k.dtype) if U is None else U
    past = U.shape[-1]
    A = None if q is None else np.zeros((B, Hv, n, past + n), q.dtype)    # (B, Hv, n, m)
    for t in range(n):
        kt, bt = k[:, :, t], beta[:, :, t, None]                            # (B, Hv, d_k), (B, Hv, 1)
        U = U - (bt * kt)[..., None] * np.einsum("bhk,bhks->bhs", kt, U)[:, :, None, :]   # (I − β·k̂k̂ᵀ)·U
        U = np.concatenate([U * np.exp(g[:, :, t])[..., None, None], (bt * kt)[..., None]], axis=-1)
        if A is not None:                                                   # U: (B, Hv, d_k, past + t + 1)
            A[:, :, t, :past + t + 1] = np.einsum("bhk,bhks->bhs", q[:, :, t], U)
    return A, U


def channel_groups(Hv: int, dv: int, H: int) -> np.ndarray:
    """(H, Hv) how many of value head j's d_v channels shown head h holds: the Hv·d_v channels cut in H equal
    groups, in order."""
    size = Hv * dv // H
    channel = np.arange(Hv * dv)
    G = np.zeros((H, Hv))
    np.add.at(G, (channel // size, channel // dv), 1)
    return G


def attention_summary(A: np.ndarray, H: int, dv: int, real: np.ndarray | None) -> np.ndarray:
    """(B, H, n, m) the layer's attention as the views read it (module docstring): Σ over each group's value
    channels of |A|, the padding's columns (REAL (B, m) 0) zeroed, each row divided by its sum."""
    G = channel_groups(A.shape[1], dv, H).astype(A.dtype)     # (H, Hv)
    out = np.einsum("gj,bjts->bgts", G, np.abs(A))            # (B, H, n, m)
    if real is not None:
        out *= real[:, None, None, :].astype(out.dtype)
    total = out.sum(axis=-1, keepdims=True)                   # (B, H, n, 1)
    return np.divide(out, total, out=np.zeros_like(out), where=total > 0)


def check_hooks(ctx: "Context", layer: int) -> None:
    """One error for a hook on a point a linear-attention layer has not (attention's q, k, v, scores)."""
    for name in NOT_HERE:
        if ctx.hooks.wants(layer, name):
            raise QkvError(f"hook name {layer}.{name}: layer {layer} is a linear-attention layer (the gated delta "
                           "rule) with no such point; hook its 'heads', 'attn_in' or 'attn_out', or a full-attention "
                           f"layer ({', '.join(str(i) for i in full_layers(ctx.cfg))})")


def full_layers(cfg: "ModelConfig") -> list[int]:
    """The layers that attend with softmax (not the delta rule's)."""
    return [i for i in range(cfg.n_layers) if i not in cfg.delta.layers]


def delta_attention(h: np.ndarray, w: DeltaWeights, ctx: "Context", layer: int) -> np.ndarray:
    """The gated delta layer of the module docstring, in attention's place in the block: h (B, n, d_model) what
    the norm gave → out (B, n, d_model), starting from and updating the cache's state (if any); records
    "attentions" (the implied attention's shares) and "heads", hooks and ablates "heads"."""
    cfg, rec, m = ctx.cfg, ctx.rec, ctx.cfg.delta
    if ctx.tape is not None:
        raise QkvError(NO_BACKWARD)
    if ctx.hooks is not None:
        check_hooks(ctx, layer)
    B, n, _ = h.shape
    key_mask = ctx.mask.key_mask                              # (B, m) bool or None
    new = None if key_mask is None else key_mask[:, -n:, None].astype(h.dtype)   # (B, n, 1) this pass's padding
    state = state_of(ctx, layer)
    f = delta_parts(h, w, cfg, new, None if state is None else state.conv[layer],
                    None if state is None else state.S[layer])
    U = None if state is None else state.U[layer]
    if state is not None:
        k1 = m.conv_kernel - 1
        past = state.conv[layer] if state.conv[layer] is not None else np.zeros((B, k1, m.channels), h.dtype)
        state.conv[layer] = np.concatenate([past, f.mixed], axis=1)[:, past.shape[1] + n - k1:]   # (B, k − 1, C)
        state.S[layer] = f.S
    top = rec.wants(layer, "attention_top")                   # a long input's views: each row's largest weights
    mix = rec.wants_any(layer, MIXER)                         # the layer's own steps (the pipeline page)
    wants = rec.wants(layer, "attentions") or top
    if (wants or mix) and state is not None and ctx.cache.length and U is None:
        raise QkvError(f"layer {layer}'s attention over the cached past needs the keys a recorded pass keeps (the "
                       "gated delta rule's state holds no rows); record the generation from its first pass "
                       "(generate(..., trace=True)), or run the whole text again")
    if wants or mix or U is not None:
        A, last = implied_attention(f.q if wants or mix else None, f.k, f.beta, f.g, U)   # (B, Hv, n, m)
        if state is not None:                                 # kept once a pass has recorded: a recorded
            state.U[layer] = last                             # generation's later rows need them
        if wants:
            att = attention_summary(A, cfg.n_heads, m.d_v, key_mask)        # (B, H, n, m)
            att = att if rec.heads is None else att[:, rec.heads]
            rec.put(layer, "attentions", att)
            if top:
                rec.put(layer, "attention_top", top_of(att, rec.top))
    if mix:                                                   # trace.MIXER, one per value head: o = A·v
        for name, value in (("mix_q", f.q), ("mix_k", f.k), ("mix_v", f.v), ("mix_gate", f.beta), ("mix_decay", f.g),
                            ("mix_matrix", A), ("mix_out", f.o)):
            rec.put(layer, name, value)
    y = gated_norm(f.o, f.z, w.norm, cfg.norm_eps)            # (B, n, Hv·d_v)
    H = cfg.n_heads
    heads = y.reshape(B, n, H, -1).transpose(0, 2, 1, 3)      # (B, H, n, Hv·d_v / H) each group's channels
    if ctx.ablate is not None:
        heads = ctx.ablate.apply(layer, heads, None if key_mask is None else key_mask[:, -n:])
    if ctx.hooks is not None:
        heads = ctx.hooks(layer, "heads", heads)
    rec.put(layer, "heads", heads)
    return linear(heads.transpose(0, 2, 1, 3).reshape(B, n, -1), w.W_out)   # (B, n, d_model)


def delta_layer(x: np.ndarray, w: DeltaBlockWeights, ctx: "Context", layer: int) -> np.ndarray:
    """A linear-attention layer (cfg.layer_kind "delta": Qwen3-Next's): the transformer block's two residual steps
    (core/layer.py's `residual`) with the gated delta layer in attention's place,

        x + Delta(RMSNorm(x)),  then  + FFN(RMSNorm(·))        (B, n, d_model), the FFN dense or routed

    each point hooked and recorded under its name as `layer.block` records an attention layer's (the box's
    "attentions" and "heads" as `delta_attention` records them). Training refused in one line."""
    cfg, hooks = ctx.cfg, ctx.hooks
    if ctx.tape is not None:
        raise QkvError(NO_BACKWARD)
    x = seen(ctx, layer, "residual", x)
    x, a = residual(x, w.attn_norm, ctx, layer, delta_attention, w.delta, ctx, layer,
                    after=after_box(w.attn_out_norm, hooks, layer, "attn_out", cfg, None, ctx.rec))
    x = seen(ctx, layer, "residual_mid", x)
    x, f = residual(x, w.ffn_norm, ctx, layer, feed_forward, w.ffn, cfg, None, layer, ctx.rec, hooks,
                    after=after_box(w.ffn_out_norm, hooks, layer, "ffn_out", cfg, None, ctx.rec),
                    names=("ffn_norm_scale", "ffn_in"))
    ctx.rec.put(layer, "attn_out", a)
    ctx.rec.put(layer, "ffn_out", f)
    return seen(ctx, layer, "residual_out", x)                # (B, n, d_model)
