"""Mamba (Gu & Dao 2023): a stack of selective state-space blocks, and the attention each one implies (Ali et al.
2024, "The Hidden Attention of Mamba Models").

One block, as transformers' MambaBlock / MambaMixer compute it (E = d_inner = expand·d_model channels, N = d_state):

    h = RMSNorm(x)                                                  (B, n, d_model)
    [u | z] = h·W_in + b_in                                         (B, n, E) each
    x̃ = act(conv_k(u) + b_conv)      causal depthwise conv, k taps  (B, n, E)   act: hidden_act (SiLU)
    [δ | B | C] = x̃·W_x                                             (B, n, R), (B, n, N), (B, n, N)
                  (Jamba: each then RMSNormed, Mamba.inner_norms)
    Δ = softplus(δ·W_dt + b_dt)                                     (B, n, E)
    hₜ = exp(Δₜ·A) ⊙ hₜ₋₁ + (Δₜ·x̃ₜ) ⊗ Bₜ,   A = −exp(A_log)         (B, E, N) the state, per channel
    yₜ = hₜ·Cₜ + D ⊙ x̃ₜ                                             (B, n, E)
    out = (y ⊙ SiLU(z))·W_out + b_out                               (B, n, d_model)
    x + out                                                         the residual

No FFN, no positions: the scan's order is the position. A padding mask (0 = pad) zeroes h before W_in and x̃ after
the conv, as transformers' apply_mask_to_padding_states does, so a left-padded row reads as the text alone (with
use_bias, in_proj's bias still reaches the conv from the pads, in transformers as here).

**The hidden attention.** Unrolling the scan, each channel c mixes the tokens with a lower-triangular matrix:

    yₜ[c] = Σ_{s ≤ t} α[c, t, s]·x̃ₛ[c] + D[c]·x̃ₜ[c]
    α[c, t, s] = Σₙ Cₜ[n]·exp(A[c, n]·(Sₜ[c] − Sₛ[c]))·Bₛ[n]·Δₛ[c],   Sₜ = Σ_{r ≤ t} Δᵣ
               = Cₜ·(Π_{r=s+1..t} exp(Δᵣ·A[c]))·Bₛ·Δₛ[c]

(`hidden_attention`, and `blocked_attention` the same as products; D·x̃, a skip like the residual, is left out of α;
tests/test_family_mamba.py checks α·x̃ + D·x̃ is the scan's y to 1e-9 in float64). The conv
before it is a mixing of its own, the k-tap banded matrix of each channel (`conv_mixing`: conv_k(u) = K·u), kept
apart as the paper keeps it: SiLU between the two makes their product no single matrix. What the trace records as
the layer's "attentions" (B, H, n, n), the views' key, summarises α as the paper does (over channels): H = n_heads
groups of channels ("heads", one by default: every channel), each group's |α| summed over its channels, the padding's
columns zeroed, each row divided by its sum so that a row reads as attention's shares (the paper scales |α| to
0..1 for its figures). "heads" (B, H, n, E/H) are each group's channels of (y + D ⊙ x̃) ⊙ SiLU(z), what W_out reads:
ablating a head zeroes (or means) those channels, as attention's Z_h. Asked for (trace.MIXER: the pipeline page), a
layer also records its own steps, C, B, x̃, Δ, Δ·A, α and y of the first MIX_CHANNELS channels of each group
(`mix_steps`), y = α·x̃ channel by channel.

The cache of writing (`MambaState`) is transformers': per layer the conv's last k − 1 inputs and the scan's state
h, so a step's scan costs O(1) in the length; from a pass that records the attention on, it also keeps each past
token's Δ, S and B (a row a token), the keys of the attention rows a recorded generation shows (`keep_keys`;
recording over a past kept without them is refused in one line). A second pass of several tokens over a filled cache starts its scan
from the state (transformers' scan there restarts from zeros, a known TODO of its own; generation never does it).
Training (a tape) is refused in one line: the scan's backward is not in qkv.

**Among attention layers (Jamba).** A stack whose ModelConfig.layer_kinds names some layers "mamba" runs the
transformer stack (core/stack.py), each Mamba layer `mamba_layer`: the transformer block's two residual steps with
the mixer in attention's place, x + Mixer(RMSNorm(x)), then + FFN(RMSNorm(·)), dense or routed. Its "heads" are
n_heads groups of E / n_heads channels, so one trace holds the attention layers' softmax weights and the Mamba
layers' implied ones, (B, H, n, n) each; the KV cache holds K, V for the attention layers and this `MambaState`
beside them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ..runtime.errors import QkvError
from .attention import top_of
from .blocks import embed, feed_forward, linear, logits_of, norm, unembed_in
from .context import Ablation, check_finite, check_given
from .layer import after_box, norm_hooked, residual
from .ops import ACTIVATIONS, silu, softplus
from .trace import MIX_CHANNELS, MIXER, Recorder
from .weights import BlockWeights, NormWeights

if TYPE_CHECKING:
    from .cache import KVCache
    from .config import ModelConfig
    from .context import Context
    from .hooks import Hooks
    from .weights import Weights

# The points of a Mamba block a hook may read or replace (qkv.core.hooks' names); the rest are attention's or the
# FFN's, which a Mamba block has not ("attentions" is recorded, computed beside the scan: a hook would change nothing).
HOOKED = ("residual", "attn_norm_scale", "attn_in", "heads", "attn_out", "residual_mid", "ffn_out", "residual_out",
          "final_norm_scale")
# A Mamba layer of a stack of different kinds (Jamba) has its FFN's points too (a dense FFN's neurons; hooks.py refuses
# those of a routed one).
LAYER_HOOKED = (*HOOKED, "ffn_norm_scale", "ffn_in", "neurons", "ffn_pre")
NO_BACKWARD = ("gradients through a Mamba layer (training, input attribution) are not in qkv: the selective scan has "
               "no backward here; use a transformer, or transformers for Mamba")
CHUNK = 1 << 22                     # numbers of α (B·channels·n·m) computed at a time by `attention_summary`


@dataclass(frozen=True)
class Mamba:
    """The knobs of a Mamba stack (ModelConfig.mamba), as MambaConfig names them."""

    d_state: int                    # N, state_size
    d_inner: int                    # E, intermediate_size = int(expand · hidden_size)
    conv_kernel: int                # k, the conv's taps
    dt_rank: int                    # R, time_step_rank ("auto": ⌈hidden_size / 16⌉)
    conv_bias: bool = True          # use_conv_bias
    bias: bool = False              # use_bias: in_proj's and out_proj's
    inner_norms: bool = False       # Jamba: δ, B and C each RMSNormed (norm_eps) before Δ's projection and the scan
                                    # (dt_layernorm, b_layernorm, c_layernorm: MixerWeights.dt_norm, b_norm, c_norm)

    def check(self, cfg: "ModelConfig") -> str | None:
        """What is wrong with these knobs under CFG (None: nothing)."""
        sizes = (self.d_state, self.d_inner, self.conv_kernel, self.dt_rank)
        if not all(isinstance(s, int) and not isinstance(s, bool) and s > 0 for s in sizes):
            return f"Mamba's d_state, d_inner, conv_kernel, dt_rank must be positive whole numbers, got {sizes}"
        if cfg.layer_kinds is not None:            # Mamba layers among attention layers (Jamba): FFNs follow them
            if self.d_inner % cfg.n_heads:
                return (f"a Mamba layer's heads are n_heads groups of its {self.d_inner} channels: n_heads = "
                        f"{cfg.n_heads} must divide d_inner")
            if cfg.norm != "rms" or cfg.norm_place != "pre" or cfg.activation not in ACTIVATIONS:
                return ("a Mamba layer is pre-RMSNorm, its conv's activation one of " + ", ".join(ACTIVATIONS))
            return None
        if cfg.n_heads * cfg.d_head != self.d_inner:
            return (f"a Mamba model's heads are groups of its {self.d_inner} channels: n_heads · d_head = "
                    f"{cfg.n_heads} · {cfg.d_head} must equal d_inner")
        if cfg.d_ff or cfg.norm != "rms" or cfg.norm_place != "pre" or cfg.activation not in ACTIVATIONS:
            return ("a Mamba block is pre-RMSNorm, no FFN (d_ff 0), its conv's activation one of "
                    + ", ".join(ACTIVATIONS))
        return None


@dataclass
class MixerWeights:
    """One Mamba mixer (transformers' MambaMixer) under the letters of the module docstring."""

    W_in: np.ndarray                 # (d_model, 2E) [u | z], in_proj
    conv: np.ndarray                 # (E, k) each channel's taps, the last one reading the current token
    W_x: np.ndarray                  # (E, R + 2N) [δ | B | C], x_proj
    W_dt: np.ndarray                 # (R, E) dt_proj
    b_dt: np.ndarray                 # (E,)
    A_log: np.ndarray                # (E, N) A = −exp(A_log)
    D: np.ndarray                    # (E,) the skip
    W_out: np.ndarray                # (E, d_model) out_proj
    b_in: np.ndarray | None = None   # (2E,) use_bias
    b_conv: np.ndarray | None = None  # (E,) use_conv_bias
    b_out: np.ndarray | None = None  # (d_model,) use_bias
    dt_norm: NormWeights | None = None   # (R,) δ's RMSNorm (inner_norms: Jamba)
    b_norm: NormWeights | None = None    # (N,) B's
    c_norm: NormWeights | None = None    # (N,) C's


@dataclass
class MambaBlockWeights(BlockWeights):
    """A Mamba block: its RMSNorm as attn_norm (what the views call the norm before the mixing box), the mixer; no
    attention, no FFN (attn, ffn, ffn_norm None)."""

    mixer: MixerWeights | None = None


# ── the cache ────────────────────────────────────────────────────────────────────

@dataclass
class MambaState:
    """What writing keeps of the past, per layer: conv (L, B, k − 1, E) the conv's last inputs, ssm (L, B, E, N) the
    scan's state; and, for the attention rows of later tokens, each past token's Δ, S = Σ Δ (B, t, E) and B
    (B, t, N), a list of L each."""

    conv: np.ndarray
    ssm: np.ndarray
    dt: list[np.ndarray]
    S: list[np.ndarray]
    Bs: list[np.ndarray]

    @classmethod
    def empty(cls, cfg: "ModelConfig", batch: int, dtype) -> "MambaState":
        m = cfg.mamba
        L, E = cfg.n_layers, m.d_inner
        none = [np.zeros((batch, 0, E), dtype)] * L
        return cls(np.zeros((L, batch, m.conv_kernel - 1, E), dtype), np.zeros((L, batch, E, m.d_state), dtype),
                   list(none), list(none), [np.zeros((batch, 0, m.d_state), dtype)] * L)


def keep_keys(s, layer: int, dt: np.ndarray, S: np.ndarray, Bm: np.ndarray, past: int, wants: bool) -> tuple | None:
    """Keep this pass's Δ, S, B (B, n, ·) in state S (a MambaState or Mamba2State) and give every kept token's
    (Δ, S, B), the keys of a recorded row; or keep only S's last row (the scan's clock) and give None. The rows are
    kept from a pass that records the attention on (its later rows need them: O(length) memory, as a KV cache);
    an unrecorded generation keeps O(1). Recording over a past kept without them is refused in one line."""
    got = s.dt.get(layer) if isinstance(s.dt, dict) else s.dt[layer]   # Mamba-2's state: dicts by layer
    kept = past > 0 and got is not None and got.shape[1] == past
    if not (wants or kept):
        s.S[layer] = S[:, -1:]                                # (B, 1, ·) the clock, for the next pass
        return None
    if past and not kept:
        raise QkvError(f"layer {layer}'s attention over the cached past needs each past token's Δ, S and B, which only "
                       "a recorded pass keeps (the scan's state holds no rows); record the generation from its first "
                       "pass (generate(..., trace=True)), or run the whole text again")
    if past:
        dt, S, Bm = (np.concatenate([s.dt[layer], dt], 1), np.concatenate([s.S[layer], S], 1),
                     np.concatenate([s.Bs[layer], Bm], 1))
    s.dt[layer], s.S[layer], s.Bs[layer] = dt, S, Bm
    return dt, S, Bm


def state_of(cache: "KVCache", cfg: "ModelConfig", batch: int, dtype) -> MambaState:
    """The Mamba state a KV cache carries (made on its first pass): the cache counts the positions, this holds them."""
    if getattr(cache, "state", None) is None:
        cache.state = MambaState.empty(cfg, batch, dtype)
    return cache.state


# ── the boxes ────────────────────────────────────────────────────────────────────

def causal_conv(u: np.ndarray, conv: np.ndarray, b: np.ndarray | None, past: np.ndarray) -> np.ndarray:
    """conv_k(u)ₜ = Σⱼ conv[:, j]·u_{t − k + 1 + j} + b: each channel's k taps over its last k inputs (PAST (B, k − 1,
    E) before u's first; zeros at the start), as torch's depthwise Conv1d with k − 1 zeros of padding."""
    k = conv.shape[1]
    full = np.concatenate([past, u], axis=1)                  # (B, k − 1 + n, E)
    n = u.shape[1]
    out = full[:, k - 1:k - 1 + n] * conv[:, k - 1]           # (B, n, E) the current token's tap
    for j in range(k - 1):
        out += full[:, j:j + n] * conv[:, j]
    return out if b is None else out + b


def conv_mixing(conv: np.ndarray, n: int) -> np.ndarray:
    """(E, n, n) the conv as each channel's token-mixing matrix: K[c, t, s] = conv[c, k − 1 − (t − s)] for
    0 ≤ t − s < k, else 0 (banded, lower-triangular): conv_k(u)[:, c] = K[c]·u[:, c] (+ b)."""
    E, k = conv.shape
    K = np.zeros((E, n, n), conv.dtype)
    t = np.arange(n)
    for lag in range(min(k, n)):
        K[:, t[lag:], t[:n - lag]] = conv[:, k - 1 - lag][:, None]
    return K


def selective_scan(x: np.ndarray, dt: np.ndarray, A: np.ndarray, Bm: np.ndarray, Cm: np.ndarray,
                   h: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(y (B, n, E) without the D skip, the last state (B, E, N)): hₜ = exp(Δₜ·A) ⊙ hₜ₋₁ + (Δₜ·xₜ) ⊗ Bₜ, yₜ = hₜ·Cₜ,
    from state H (B, E, N), step by step in transformers' order of operations."""
    n = x.shape[1]
    y = np.empty_like(x)                                      # (B, n, E)
    for t in range(n):
        dA = np.exp(A * dt[:, t, :, None])                    # (B, E, N)
        dBx = (dt[:, t, :, None] * Bm[:, t, None, :]) * x[:, t, :, None]   # (B, E, N)
        h = dA * h + dBx
        y[:, t] = np.einsum("ben,bn->be", h, Cm[:, t])        # (B, E)
    return y, h


def hidden_attention(dt: np.ndarray, A: np.ndarray, Bm: np.ndarray, Cm: np.ndarray, S: np.ndarray | None = None,
                     channels: slice = slice(None), past: int = 0, keys: tuple | None = None) -> np.ndarray:
    """α (B, e, n, m) of the channels CHANNELS: α[c, t, s] = Σₙ Cₜ[n]·exp(A[c, n]·(Sₜ[c] − Sₛ[c]))·Bₛ[n]·Δₛ[c] for
    keys s ≤ past + t (0 after), S = the running sum of Δ (computed from dt (B, n, E) when not given).
    Plain form: Cₜ·(Π_{r=s+1..t} exp(Δᵣ·A[c]))·Bₛ·Δₛ[c]. The queries are the n rows of dt, Cm at positions
    past..past + n − 1; KEYS (Δ, S, B) of all m = past + n positions (None: the queries' own, past = 0)."""
    S = np.cumsum(dt, axis=1) if S is None else S             # (B, n, E)
    dk, Sk, Bk = (dt, S, Bm) if keys is None else keys        # (B, m, E), (B, m, E), (B, m, N)
    n, m = dt.shape[1], dk.shape[1]
    a = A[channels]                                           # (e, N)
    Sq, Sk, dk = S[:, :, channels], Sk[:, :, channels], dk[:, :, channels]
    gap = Sq.transpose(0, 2, 1)[:, :, :, None] - Sk.transpose(0, 2, 1)[:, :, None, :]   # (B, e, n, m) Sₜ − Sₛ
    later = np.arange(m)[None, :] > past + np.arange(n)[:, None]                     # (n, m) s > t: 0
    gap = np.where(later, 0, gap)                             # (exp of a future key's gap could overflow)
    alpha = np.zeros(gap.shape, dt.dtype)                     # (B, e, n, m)
    for j in range(a.shape[1]):
        cb = Cm[:, :, j, None] * Bk[:, None, :, j]            # (B, n, m) Cₜ[n]·Bₛ[n]
        alpha += np.exp(a[None, :, j, None, None] * gap) * cb[:, None]
    alpha *= dk.transpose(0, 2, 1)[:, :, None, :]             # · Δₛ[c]
    alpha[..., later] = 0
    return alpha


def blocked_attention(dt: np.ndarray, A: np.ndarray, Bm: np.ndarray, Cm: np.ndarray, S: np.ndarray | None = None,
                      channels: slice = slice(None), past: int = 0, keys: tuple | None = None) -> np.ndarray:
    """`hidden_attention` (the same α (B, e, n, m), its plain form) with most of its sum as products: the queries in
    blocks of b ≈ √m rows, and for a block starting at position r the decay from each earlier key s to each query t
    split at r − 1, exp(A·(Sₜ − Sₛ)) = exp(A·(Sₜ − S_{r−1}))·exp(A·(S_{r−1} − Sₛ)) (each factor ≤ 1: no overflow),
    so those keys are one product per channel over the N states, (Cₜ ⊙ exp(A·(Sₜ − S_{r−1})))·(exp(A·(S_{r−1} − Sₛ))
    ⊙ Bₛ·Δₛ)ᵀ; the keys inside the block (r ≤ s ≤ t) the plain form's. ~2·e·N·n·√m exponentials, not e·N·n·m."""
    S = np.cumsum(dt, axis=1) if S is None else S             # (B, n, E)
    keys = (dt, S, Bm) if keys is None else keys              # Δ, S, B of all m keys: (B, m, E), (B, m, E), (B, m, N)
    dk, Sk, Bk = keys[0][:, :, channels], keys[1][:, :, channels], keys[2]
    n, m = dt.shape[1], dk.shape[1]
    a = A[channels]                                           # (e, N)
    Sq = S[:, :, channels]                                    # (B, n, e)
    alpha = np.zeros((dt.shape[0], a.shape[0], n, m), dt.dtype)   # (B, e, n, m)
    size = max(1, int(np.sqrt(m)))
    for q0 in range(0, n, size):
        q1, r = min(q0 + size, n), past + q0                  # queries q0..q1 − 1 at positions r..past + q1 − 1
        if r:
            ref = Sk[:, r - 1:r]                              # (B, 1, e) S at key r − 1, where the decay is split
            P = np.exp(a * (Sq[:, q0:q1] - ref)[..., None])   # (B, b, e, N) exp(A·(Sₜ − S_ref))
            Q = np.exp(a * (ref - Sk[:, :r])[..., None])      # (B, r, e, N) exp(A·(S_ref − Sₛ))
            left = (Cm[:, q0:q1, None, :] * P).transpose(0, 2, 1, 3)                        # (B, e, b, N)
            right = (Q * (Bk[:, :r, None, :] * dk[:, :r, :, None])).transpose(0, 2, 3, 1)   # (B, e, N, r)
            alpha[:, :, q0:q1, :r] = left @ right             # (B, e, b, r)
        own = tuple(k[:, r:past + q1] for k in keys)          # the block's own keys, plain
        alpha[:, :, q0:q1, r:past + q1] = hidden_attention(dt[:, q0:q1], A, Bm[:, q0:q1], Cm[:, q0:q1], S[:, q0:q1],
                                                           channels, 0, own)
    return alpha


def attention_summary(dt: np.ndarray, A: np.ndarray, Bm: np.ndarray, Cm: np.ndarray, S: np.ndarray, H: int,
                      real: np.ndarray | None, past: int = 0, keys: tuple | None = None) -> np.ndarray:
    """(B, H, n, m) the layer's attention as the views read it: channels in H groups, each group's |α| summed over
    its channels, the padding's columns (REAL (B, m) 0) zeroed, each row divided by its sum (a row of zeros stays
    zeros). Computed a few channels at a time (CHUNK numbers of α)."""
    Bsz, n, E = dt.shape
    m = n if keys is None else keys[0].shape[1]
    size = E // H
    out = np.zeros((Bsz, H, n, m), dt.dtype)
    step = max(1, min(size, CHUNK // max(1, Bsz * n * m)))
    for h in range(H):
        for lo in range(h * size, (h + 1) * size, step):
            hi = min(lo + step, (h + 1) * size)
            out[:, h] += np.abs(blocked_attention(dt, A, Bm, Cm, S, slice(lo, hi), past, keys)).sum(axis=1)
    if real is not None:
        out *= real[:, None, None, :m].astype(out.dtype)
    total = out.sum(axis=-1, keepdims=True)                   # (B, H, n, 1)
    return np.divide(out, total, out=np.zeros_like(out), where=total > 0)


def mix_channels(E: int, H: int) -> np.ndarray:
    """(M,) the channels whose steps trace.MIXER keeps: the first MIX_CHANNELS of each of the H groups of E/H."""
    size = E // H
    return (np.arange(H)[:, None] * size + np.arange(min(size, MIX_CHANNELS))).ravel()


def mix_steps(f: "MixerParts", S: np.ndarray, H: int, past: int = 0, keys: tuple | None = None) -> dict:
    """The layer's own steps as trace.MIXER names them, (B, M, ·) each, for the first MIX_CHANNELS channels c of each
    of its H groups (M of E channels: each channel has its own matrix): C and B (the same for every channel), x̃[c],
    Δ[c], Δ[c]·A[c, :] (B, M, n, N), α[c] (`blocked_attention`, B, M, n, m) and y[c] without the D skip, so that
    y[c] = α[c]·x̃[c] (a pass from the text's start)."""
    E = f.x.shape[2]
    size, c = E // H, min(E // H, MIX_CHANNELS)
    chans = mix_channels(E, H)                                             # (M,) the channels kept
    M = len(chans)
    alpha = np.concatenate([blocked_attention(f.dt, f.A, f.Bm, f.Cm, S, slice(g * size, g * size + c), past, keys)
                            for g in range(H)], axis=1)                     # (B, M, n, m)

    def channels(a: np.ndarray) -> np.ndarray:                             # (B, n, E) → (B, M, n)
        return a[:, :, chans].transpose(0, 2, 1)
    return {"mix_q": np.repeat(f.Cm[:, None], M, axis=1), "mix_k": np.repeat(f.Bm[:, None], M, axis=1),   # (B, M, n, N)
            "mix_v": channels(f.x)[..., None], "mix_gate": channels(f.dt),                 # (B, M, n, 1), (B, M, n)
            "mix_decay": (f.dt[:, :, chans, None] * f.A[chans]).transpose(0, 2, 1, 3),       # (B, M, n, N)
            "mix_matrix": alpha, "mix_out": channels(f.y)[..., None]}                      # (B, M, n, m), (B, M, n, 1)


@dataclass
class Pass:
    """What one pass's blocks share: the config, the padding (real (B, m): 1 = token; None: all real), recorder,
    hooks, ablation and the state (a cache's, or None: start from zeros and keep nothing)."""

    cfg: "ModelConfig"
    real: np.ndarray | None
    rec: Recorder
    hooks: "Hooks | None"
    ablate: Ablation | None
    state: MambaState | None
    past: int = 0


def seen(p: "Pass | Context", layer: int, name: str, value: np.ndarray) -> np.ndarray:
    """VALUE at point NAME after its hooks, recorded (P's: a Mamba pass's, or a stack's Context: the same two)."""
    if p.hooks is not None:
        value = p.hooks(layer, name, value)
    p.rec.put(layer, name, value)
    return value


@dataclass
class MixerParts:
    """What a Mamba mixer computes on the way, each (B, n, ·): the conv's input u and the gate z (E each), the
    scan's input x̃ (E), its Δ (E), B and C (N each), A (E, N); the scan's output y without the skip (E) and its last
    state (B, E, N)."""

    u: np.ndarray
    z: np.ndarray
    x: np.ndarray
    dt: np.ndarray
    Bm: np.ndarray
    Cm: np.ndarray
    A: np.ndarray
    y: np.ndarray
    last: np.ndarray

    def gated(self, D: np.ndarray) -> np.ndarray:
        """(B, n, E) (y + D ⊙ x̃) ⊙ SiLU(z), what W_out reads."""
        return (self.y + self.x * D) * silu(self.z)


def mixer_parts(h: np.ndarray, w: MixerWeights, cfg: "ModelConfig", new: np.ndarray | None = None,
                conv_past: np.ndarray | None = None, h0: np.ndarray | None = None) -> MixerParts:
    """The mixer of the module docstring up to the gate, on h (B, n, d_model) what the norm gave: NEW (B, n, 1)
    this pass's padding (1 = token; None: none), CONV_PAST (B, k − 1, E) the conv's earlier inputs and H0 (B, E, N)
    the scan's state before (None: zeros, the start of a text)."""
    m = cfg.mamba
    E, N, R = m.d_inner, m.d_state, m.dt_rank
    Bsz = h.shape[0]
    if new is not None:
        h = h * new                                           # transformers' apply_mask_to_padding_states
    uz = linear(h, w.W_in, w.b_in)                            # (B, n, 2E)
    u, z = uz[..., :E], uz[..., E:]
    past = np.zeros((Bsz, m.conv_kernel - 1, E), h.dtype) if conv_past is None else conv_past
    x = ACTIVATIONS[cfg.activation](causal_conv(u, w.conv, w.b_conv, past))   # (B, n, E) x̃
    if new is not None:
        x = x * new
    proj = linear(x, w.W_x)                                   # (B, n, R + 2N)
    delta, Bm, Cm = proj[..., :R], proj[..., R:R + N], proj[..., R + N:]   # (B, n, R), (B, n, N) each
    if m.inner_norms:                                         # Jamba: each RMSNormed
        delta, Bm, Cm = norm(delta, w.dt_norm, cfg), norm(Bm, w.b_norm, cfg), norm(Cm, w.c_norm, cfg)
    dt = softplus(linear(delta, w.W_dt) + w.b_dt)             # (B, n, E) Δ
    A = -np.exp(w.A_log)                                      # (E, N)
    h0 = np.zeros((Bsz, E, N), h.dtype) if h0 is None else h0
    y, last = selective_scan(x, dt, A, Bm, Cm, h0)            # (B, n, E), (B, E, N)
    return MixerParts(u, z, x, dt, Bm, Cm, A, y, last)


def mixer(h: np.ndarray, w: MixerWeights, p: Pass, layer: int) -> np.ndarray:
    """The Mamba mixer of the module docstring: h (B, n, d_model), what the norm gave → out (B, n, d_model),
    starting from and updating the pass's state (if any); records "attentions" and "heads", hooks "heads"."""
    cfg, m, s = p.cfg, p.cfg.mamba, p.state
    E, H = m.d_inner, cfg.n_heads
    Bsz, n, _ = h.shape
    new = None if p.real is None else p.real[:, -n:, None].astype(h.dtype)   # (B, n, 1) this pass's padding
    f = mixer_parts(h, w, cfg, new, None if s is None else s.conv[layer], None if s is None else s.ssm[layer])
    keys, S = None, np.cumsum(f.dt, axis=1)                   # (B, n, E) Σ Δ
    mix = p.rec.wants_any(layer, MIXER)                       # the layer's own steps (the pipeline page)
    wants = p.rec.wants(layer, "attentions") or p.rec.wants(layer, "attention_top") or mix
    if s is not None:
        S = S + (s.S[layer][:, -1:] if p.past else 0)         # counted from the text's first token
        if m.conv_kernel > 1:
            s.conv[layer] = np.concatenate([s.conv[layer], f.u], axis=1)[:, -(m.conv_kernel - 1):]   # (B, k − 1, E)
        s.ssm[layer] = f.last
        keys = keep_keys(s, layer, f.dt, S, f.Bm, p.past, wants)
    if mix:
        for name, value in mix_steps(f, S, H, p.past, keys).items():
            p.rec.put(layer, name, value)
    if p.rec.wants(layer, "attentions") or p.rec.wants(layer, "attention_top"):
        att = attention_summary(f.dt, f.A, f.Bm, f.Cm, S, H, p.real, p.past, keys)   # (B, H, n, m)
        att = att if p.rec.heads is None else att[:, p.rec.heads]
        p.rec.put(layer, "attentions", att)
        if p.rec.wants(layer, "attention_top"):             # a long input's views: each row's largest, from it
            p.rec.put(layer, "attention_top", top_of(att, p.rec.top))
    heads = f.gated(w.D).reshape(Bsz, n, H, E // H).transpose(0, 2, 1, 3)   # (B, H, n, E/H) each group's channels
    if p.ablate is not None:
        heads = p.ablate.apply(layer, heads, None if p.real is None else p.real[:, -n:].astype(bool))
    heads = seen(p, layer, "heads", heads)
    return linear(heads.transpose(0, 2, 1, 3).reshape(Bsz, n, E), w.W_out, w.b_out)   # (B, n, d_model)


def mamba_block(x: np.ndarray, w: MambaBlockWeights, p: Pass, layer: int) -> np.ndarray:
    """x + Mixer(RMSNorm(x)) (B, n, d_model), each point hooked and recorded under its name (HOOKED). The mixer is
    the block's box in attention's place (attn_in, heads, attn_out); no FFN follows, so residual_out is residual_mid
    + ffn_out with ffn_out = 0 (the analyses that read each box's output read a Mamba block as any other; a hook's
    ffn_out is added to the stream)."""
    x = seen(p, layer, "residual", x)
    h = norm_hooked(x, w.attn_norm, p.cfg, p.hooks, p.rec, layer, "attn_norm_scale")   # (B, n, d_model)
    out = seen(p, layer, "attn_out", mixer(seen(p, layer, "attn_in", h), w.mixer, p, layer))
    x = seen(p, layer, "residual_mid", x + out)
    if p.rec.wants(layer, "ffn_out") or (p.hooks is not None and p.hooks.wants(layer, "ffn_out")):
        x = x + seen(p, layer, "ffn_out", np.zeros_like(x))   # (B, n, d_model) no FFN: 0
    return seen(p, layer, "residual_out", x)                  # (B, n, d_model)


# ── a Mamba layer among attention layers (Jamba) ────────────────────────────────

def pass_of(ctx: "Context", x: np.ndarray, layer: int) -> Pass:
    """The `Pass` a Mamba layer of a stack of different kinds reads from the stack's Context CTX: its padding (LAYER's
    mask's key_mask (B, m), None: none), recorder, hooks, ablation, and the Mamba state the KV cache carries beside
    the attention layers' K, V (None without a cache), its past the positions the cache holds."""
    cache = ctx.cache
    state = None if cache is None else state_of(cache, ctx.cfg, x.shape[0], x.dtype)
    return Pass(ctx.cfg, ctx.mask_of(layer).key_mask, ctx.rec, ctx.hooks, ctx.ablate, state,
                0 if cache is None else cache.length)


def mamba_layer(x: np.ndarray, w: MambaBlockWeights, ctx: "Context", layer: int) -> np.ndarray:
    """A Mamba layer of a stack of layers of different kinds (cfg.layer_kinds: Jamba): the transformer block's two
    residual steps (core/layer.py's `residual`) with the mixer in attention's place,

        x + Mixer(RMSNorm(x)),  then  + FFN(RMSNorm(·))        (B, n, d_model), the FFN dense or routed

    each point hooked and recorded under its name as `layer.block` records an attention layer's (the mixer's
    "attentions" and "heads" as `mixer` records them). Training refused in one line (NO_BACKWARD)."""
    cfg, hooks = ctx.cfg, ctx.hooks
    if ctx.tape is not None:
        raise QkvError(NO_BACKWARD)
    x = seen(ctx, layer, "residual", x)
    p = pass_of(ctx, x, layer)
    x, a = residual(x, w.attn_norm, ctx, layer, mixer, w.mixer, p, layer,
                    after=after_box(w.attn_out_norm, hooks, layer, "attn_out", cfg, None, ctx.rec))
    x = seen(ctx, layer, "residual_mid", x)
    x, f = residual(x, w.ffn_norm, ctx, layer, feed_forward, w.ffn, cfg, None, layer, ctx.rec, hooks,
                    after=after_box(w.ffn_out_norm, hooks, layer, "ffn_out", cfg, None, ctx.rec),
                    names=("ffn_norm_scale", "ffn_in"))
    ctx.rec.put(layer, "attn_out", a)
    ctx.rec.put(layer, "ffn_out", f)
    return seen(ctx, layer, "residual_out", x)                # (B, n, d_model)


def check_layer_hooks(hooks: "Hooks | None", cfg: "ModelConfig") -> None:
    """One error for a hook on a point a Mamba layer of a stack of different kinds has not (q, k, v, scores; its
    "attentions" are implied by the scan): the attention layers have them."""
    for layer, name in (hooks.points if hooks is not None else ()):
        if cfg.layer_kind(layer) == "mamba" and name not in LAYER_HOOKED:
            others = [i for i in range(cfg.n_layers) if cfg.layer_kind(i) == "attention"]
            raise QkvError(f"hook name {name!r} on layer {layer}: a Mamba layer has no attention q, k, v or scores "
                           "(its attention is implied by its scan: read it from the trace); hook it on an attention "
                           f"layer ({', '.join(map(str, others)) or 'none'}), or one of {', '.join(LAYER_HOOKED)}")


# ── the pass ─────────────────────────────────────────────────────────────────────

def check_hooks(hooks: "Hooks | None") -> None:
    """One error for a hook on a point a Mamba block has not (attention's q, k, v, scores; the FFN's)."""
    for _, name in (hooks.points if hooks is not None else ()):
        if name == "attentions":
            raise QkvError("hook name 'attentions': a Mamba layer's attention is implied by its scan and computed "
                           "beside it (read it from the trace); hook 'heads' or 'attn_out' to change what it adds")
        if name not in HOOKED:
            raise QkvError(f"hook name {name!r}: a Mamba block has no such point (it has no attention scores, no "
                           f"FFN); hook one of {', '.join(HOOKED)}")


def mamba_pass(weights: "Weights", cfg: "ModelConfig", ids: np.ndarray | None, attention_mask: np.ndarray, *,
               cache: "KVCache | None" = None, tape=None, token_type_ids=None, **kw) -> tuple[np.ndarray, np.ndarray | None]:
    """`qkv.core.stack.transformer` for a Mamba model: ids (B, n) → (final hidden states (B, n, d_model), logits
    (B, n, V) | (B, 1, V) with logits="last" | None with STOP), the same arguments. With a KV cache, ids are the
    new tokens after its past and attention_mask (B, past + n); its Mamba state (`MambaState`) carries the conv's
    inputs and the scan's state across passes."""
    if tape is not None:
        raise QkvError(NO_BACKWARD)
    state = None if cache is None else state_of(cache, cfg, attention_mask.shape[0], weights.tok_embed.dtype)
    return scan_stack(weights, cfg, ids, attention_mask, mamba_block, state, cache=cache, **kw)


def scan_stack(weights: "Weights", cfg: "ModelConfig", ids: np.ndarray | None, attention_mask: np.ndarray,
               block, state, *, rec: Recorder | None = None, cache: "KVCache | None" = None, logits: str = "all",
               ablate: Ablation | None = None, hooks: "Hooks | None" = None, start: int = 0,
               stream: np.ndarray | None = None, tokens: np.ndarray | None = None,
               stop: int | None = None) -> tuple[np.ndarray, np.ndarray | None]:
    """The pass of a stack of scan blocks (Mamba's `mamba_block`, Mamba-2's): embeddings, BLOCK(x, w, p, layer) for
    each layer from START (to STOP), the final norm and the logits, STATE the cache's (None without one), as
    `qkv.core.stack.transformer` runs a transformer's."""
    if stop is not None and cache is not None:
        raise QkvError("a pass that stops early would leave the later layers' state unfilled; run it without a cache")
    if ablate is not None and ablate.how == "mean" and cache is not None:
        raise QkvError("mean-ablation needs the whole input in one pass; run it without a KV cache")
    check_hooks(hooks)
    check_given(stream, "the residual stream given to the pass (from_layer's x)")
    check_given(tokens, "the token embeddings given to the pass")
    rec = rec or Recorder(keep=())
    n = (ids if stream is None else stream).shape[1]
    real = None if attention_mask.all() else attention_mask
    p = Pass(cfg, real, rec, hooks, ablate, state, 0 if cache is None else cache.length)
    if stream is None:
        x = embed(weights, cfg, ids, np.zeros_like(ids) if ids is not None else None, None, None, tokens)
        check_finite(x, "the embeddings")
    else:
        x = stream                                            # (B, n, d_model) entering block START
    depth = len(weights.blocks)
    for layer in range(start, depth if stop is None else stop):
        x = block(x, weights.blocks[layer], p, layer)         # (B, n, d_model)
        check_finite(x, f"layer {layer}'s output", hooks)
    if stop is not None and stop < depth:
        return x, None
    if cache is not None:
        cache.advance(n, ids)
    x = norm_hooked(x, weights.final_norm, cfg, hooks, rec, depth - 1, "final_norm_scale")
    x = unembed_in(x, weights, None)
    if logits is None:
        return x, None
    out = logits_of(x[:, -1:] if logits == "last" else x, weights, cfg)   # (B, n | 1, V)
    check_finite(out, "the logits", hooks)
    return x, out
