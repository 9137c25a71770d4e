"""Mamba-2 (Dao & Gu 2024, "Transformers are SSMs": state-space duality, SSD): blocks of a multi-head selective scan
whose decay is one number per head, and the attention each head implies, exactly.

One block, as transformers' Mamba2Block / Mamba2Mixer compute it (H heads of P channels, E = H·P = d_inner; G groups
of B and C, each read by H/G heads; N = d_state; the conv runs over the E + 2·G·N channels of [x | B | C]):

    h = RMSNorm(x)                                                  (B, n, d_model)
    [z | u | δ] = h·W_in + b_in                                     (B, n, E), (B, n, E + 2GN), (B, n, H)
    [x̃ | B | C] = act(conv_k(u) + b_conv)   causal depthwise conv   (B, n, H, P), (B, n, G, N), (B, n, G, N)
    Δ = clamp(softplus(δ + b_dt), time_step_limit)                  (B, n, H)
    hₜ = exp(Δₜ·A) · hₜ₋₁ + Δₜ·x̃ₜ ⊗ B_{g(h)ₜ},   A = −exp(A_log)     (B, H, P, N) the state, a scalar A per head
    yₜ = hₜ·C_{g(h)ₜ} + D ⊙ x̃ₜ                                       (B, n, H, P)
    out = GroupRMSNorm(y ⊙ SiLU(z))·W_out + b_out                   (B, n, d_model)   G groups of E/G channels
    x + out                                                         the residual

No FFN, no positions. A padding mask (0 = pad) zeroes h before W_in and [x̃ | B | C] after the conv, as transformers'
apply_mask_to_padding_states, so a left-padded row reads as the text alone. transformers computes the scan in chunks
of chunk_size tokens (the quadratic form inside a chunk, the state between chunks): the same numbers, to rounding, as
the recurrence here (tests/live/test_live_mamba2.py runs chunk sizes below and above the length).

**The implied attention.** Since A is one number per head, unrolling the scan gives each head one lower-triangular
matrix, the same for its P channels (SSD's quadratic form, the paper's "masked attention"):

    yₜ[h] = Σ_{s ≤ t} α[h, t, s]·x̃ₛ[h] + D[h]·x̃ₜ[h]
    α[h, t, s] = (Cₜ·Bₛ)·exp(A_h·(Sₜ[h] − Sₛ[h]))·Δₛ[h],   Sₜ = Σ_{r ≤ t} Δᵣ       (B and C of head h's group)

(`implied_attention`; tests/test_family_mamba2.py checks α·x̃ + D·x̃ is the scan's y to 1e-9 in float64). What the trace
records as each layer's "attentions" (B, H, n, n) is |α| with the padding's columns zeroed and each row divided by its
sum, as core/mamba.py's (a row then reads as attention's shares; α itself may be negative, C·B having any sign).
"heads" (B, H, n, P) are each head's channels of GroupRMSNorm(y ⊙ SiLU(z)), what W_out reads: ablating a head zeroes
(or means) those channels, as attention's Z_h. (The gated norm mixes the heads of one group through its scale, so a
head's part of out is read after it, where W_out's rows split by head.) Asked for (trace.MIXER: the pipeline page), a
mixer also records its own steps, one per head: C, B, x̃, Δ, Δ·A_h, α and y (`mix_steps`), y = α·x̃.

The cache of writing (`Mamba2State`) is transformers': per layer the conv's last k − 1 inputs and the state h, and, for
the attention rows a recorded generation shows, each past token's Δ, S and B (from a pass that records on:
core.mamba.keep_keys). Training is refused in one line: the
scan's backward is not in qkv.

The same mixer runs in stacks of layers of different kinds (core/mamba2_layers.py): Granite 4's Mamba-2 layers among
attention layers, each followed by an FFN (there the views' H heads are the attention layers', each a group of H_m/H
Mamba heads, their |α| summed), and Falcon-H1's, beside attention in every layer, whose knobs are here too: µP
multipliers on the mixer's input and on in_proj's five parts (in_scale, mup), an out_proj bias of its own, the output
norm before the gate or none (`NORMS`), and the layer's own multipliers (`Beside`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from ..runtime.errors import QkvError
from .blocks import linear
from .layer import norm_hooked
from .mamba import Pass, causal_conv, keep_keys, scan_stack, seen
from .ops import ACTIVATIONS, silu, softplus
from .trace import MIXER
from .weights import BlockWeights

if TYPE_CHECKING:
    from .cache import KVCache
    from .config import ModelConfig
    from .weights import Weights

CHUNK = 1 << 22                     # numbers of α (B·heads·n·m) computed at a time by `attention_summary`


NORMS = ("gated", "then_gate", "none")   # the mixer's output norm: GroupRMSNorm(y ⊙ SiLU(z)), GroupRMSNorm(y) ⊙ SiLU(z),
                                        # y ⊙ SiLU(z) (Falcon-H1's mamba_norm_before_gate, mamba_rms_norm false)


@dataclass(frozen=True)
class Beside:
    """Falcon-H1's layer: attention and the Mamba-2 mixer side by side on one norm's output, and its multipliers,

        x + Attn(h·attn_in)·attn_out + Mixer(h)·ssm_out,  h = RMSNorm(x);  then + FFN(RMSNorm(·))·ffn_out"""

    attn_in: float = 1.0            # attention_in_multiplier
    attn_out: float = 1.0           # attention_out_multiplier
    ssm_out: float = 1.0            # ssm_out_multiplier
    ffn_out: float = 1.0            # mlp_multipliers[1] (the gate's, [0]: ModelConfig.ffn_gate_scale)


@dataclass(frozen=True)
class Mamba2:
    """The knobs of a Mamba-2 mixer (ModelConfig.mamba holds it for a Mamba-2 stack), as Mamba2Config names them."""

    n_heads: int                    # H, num_heads
    head_dim: int                   # P, head_dim: E = H·P channels
    d_state: int                    # N, state_size
    n_groups: int                   # G, n_groups: B and C each G·N wide, head h reads group h // (H/G)
    conv_kernel: int                # k, the conv's taps
    conv_bias: bool = True          # use_conv_bias
    bias: bool = False              # use_bias: in_proj's and out_proj's
    dt_min: float = 0.0             # time_step_limit: Δ clamped to [dt_min, dt_max]
    dt_max: float = float("inf")
    chunk_size: int = 256           # transformers' chunks (the same numbers; kept to write config.json back)
    out_bias: bool | None = None    # out_proj's bias when it is not in_proj's (Falcon-H1's projectors_bias); None: bias
    in_scale: float = 1.0           # the mixer's input × this before in_proj (Falcon-H1's ssm_in_multiplier)
    mup: tuple[float, ...] = (1.0, 1.0, 1.0, 1.0, 1.0)   # in_proj's [z | x | B | C | δ] × these (Falcon-H1's
                                    # ssm_multipliers, its µP vector)
    norm: str = "gated"             # the output norm (NORMS): Falcon-H1's may come before the gate, or be none
    beside: Beside | None = None    # Falcon-H1: the mixer beside attention in every layer (`parallel_layer`)

    @property
    def d_inner(self) -> int:
        """E = H·P, the scan's channels."""
        return self.n_heads * self.head_dim

    @property
    def conv_dim(self) -> int:
        """E + 2·G·N, the conv's channels [x | B | C]."""
        return self.d_inner + 2 * self.n_groups * self.d_state

    def check(self, cfg: "ModelConfig") -> str | None:
        """What is wrong with these knobs under CFG (None: nothing)."""
        sizes = (self.n_heads, self.head_dim, self.d_state, self.n_groups, self.conv_kernel, self.chunk_size)
        if not all(isinstance(s, int) and not isinstance(s, bool) and s > 0 for s in sizes):
            return ("Mamba-2's num_heads, head_dim, state_size, n_groups, conv_kernel, chunk_size must be positive "
                    f"whole numbers, got {sizes}")
        if self.n_heads % self.n_groups:
            return f"Mamba-2's {self.n_heads} heads must split evenly into its n_groups={self.n_groups} groups"
        if not 0 <= self.dt_min <= self.dt_max:
            return f"Mamba-2's time_step_limit ({self.dt_min}, {self.dt_max}) must be 0 ≤ low ≤ high"
        if self.norm not in NORMS or len(self.mup) != 5 or not all(0 < v < float("inf") for v in
                                                                   (*self.mup, self.in_scale)):
            return (f"Mamba-2's output norm {self.norm!r} must be one of {', '.join(NORMS)}, and its five µP "
                    f"multipliers {self.mup} and input multiplier {self.in_scale} positive finite numbers")
        if self.beside is not None:                # Falcon-H1: every layer attention and a mixer side by side
            if cfg.layer_kinds != ("attention",) * cfg.n_layers or not all(
                    0 < v < float("inf") for v in vars(self.beside).values()) or cfg.activation not in ACTIVATIONS:
                return ("a Mamba-2 mixer beside attention (Falcon-H1) is in every layer (layer_kinds all "
                        "'attention'), its multipliers positive finite numbers, its conv's activation one of "
                        + ", ".join(ACTIVATIONS))
            return None
        if cfg.layer_kinds is not None:            # Mamba-2 layers among attention layers (Granite 4): FFNs follow them
            if self.n_heads % cfg.n_heads:
                return (f"a Mamba-2 layer's {self.n_heads} heads are shown as the attention layers' {cfg.n_heads}, "
                        "a group of its heads each: the attention heads must divide the Mamba heads")
            if cfg.norm != "rms" or cfg.norm_place != "pre" or cfg.activation not in ACTIVATIONS:
                return "a Mamba-2 layer is pre-RMSNorm, its conv's activation one of " + ", ".join(ACTIVATIONS)
            return None
        if (cfg.n_heads, cfg.d_head) != (self.n_heads, self.head_dim):
            return (f"a Mamba-2 model's heads are its scan's: n_heads, d_head must be {self.n_heads}, {self.head_dim} "
                    f"(got {cfg.n_heads}, {cfg.d_head})")
        if cfg.d_ff or cfg.norm != "rms" or cfg.norm_place != "pre" or cfg.activation not in ACTIVATIONS:
            return ("a Mamba-2 block is pre-RMSNorm, no FFN (d_ff 0), its conv's activation one of "
                    + ", ".join(ACTIVATIONS))
        return None


@dataclass
class Mixer2Weights:
    """One Mamba-2 mixer (transformers' Mamba2Mixer) under the letters of the module docstring."""

    W_in: np.ndarray                 # (d_model, E + (E + 2GN) + H) [z | u | δ], in_proj
    conv: np.ndarray                 # (E + 2GN, k) each channel's taps, the last one reading the current token
    b_dt: np.ndarray                 # (H,) dt_bias
    A_log: np.ndarray                # (H,) A = −exp(A_log), one per head
    D: np.ndarray                    # (H,) the skip
    norm: np.ndarray | None          # (E,) the GroupRMSNorm's weight; None: no norm (Mamba2.norm "none")
    W_out: np.ndarray                # (E, d_model) out_proj
    b_in: np.ndarray | None = None   # (E + (E + 2GN) + H,) use_bias
    b_conv: np.ndarray | None = None  # (E + 2GN,) use_conv_bias
    b_out: np.ndarray | None = None  # (d_model,) use_bias


@dataclass
class Mamba2BlockWeights(BlockWeights):
    """A Mamba-2 block: its RMSNorm as attn_norm (the norm before the mixing box), the mixer; no attention, no FFN."""

    mixer: Mixer2Weights | None = None


# ── the cache ────────────────────────────────────────────────────────────────────

@dataclass
class Mamba2State:
    """What writing keeps of the past, per layer (dicts by layer, filled by its first pass): conv (B, k − 1, E + 2GN)
    the conv's last inputs, ssm (B, H, P, N) the scan's state; and, for the attention rows of later tokens, each past
    token's Δ and S = Σ Δ (B, t, H) and B (B, t, G, N)."""

    conv: dict[int, np.ndarray] = field(default_factory=dict)
    ssm: dict[int, np.ndarray] = field(default_factory=dict)
    dt: dict[int, np.ndarray] = field(default_factory=dict)
    S: dict[int, np.ndarray] = field(default_factory=dict)
    Bs: dict[int, np.ndarray] = field(default_factory=dict)


def state_of(cache: "KVCache") -> Mamba2State:
    """The Mamba-2 state a KV cache carries (made on its first pass): the cache counts the positions, this holds
    them."""
    if getattr(cache, "state", None) is None:
        cache.state = Mamba2State()
    return cache.state


# ── the boxes ────────────────────────────────────────────────────────────────────

def per_head(v: np.ndarray, H: int) -> np.ndarray:
    """(B, n, G, N) → (B, n, H, N): each head's group's B or C (head h reads group h // (H/G))."""
    return np.repeat(v, H // v.shape[2], axis=2)


def ssd_scan(x: np.ndarray, dt: np.ndarray, A: np.ndarray, Bm: np.ndarray, Cm: np.ndarray,
             h: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(y (B, n, H, P) without the D skip, the last state (B, H, P, N)): hₜ = exp(Δₜ·A)·hₜ₋₁ + Δₜ·x̃ₜ ⊗ Bₜ, yₜ = hₜ·Cₜ,
    from state H (B, H, P, N), step by step (transformers' one-token step, mamba2_selective_state_update, each step)."""
    H = x.shape[2]
    Bh, Ch = per_head(Bm, H), per_head(Cm, H)                 # (B, n, H, N) each
    y = np.empty_like(x)                                      # (B, n, H, P)
    for t in range(x.shape[1]):
        dA = np.exp(dt[:, t] * A)                             # (B, H)
        dBx = (dt[:, t, :, None] * Bh[:, t])[:, :, None, :] * x[:, t, :, :, None]   # (B, H, P, N)
        h = dA[:, :, None, None] * h + dBx
        y[:, t] = np.einsum("bhpn,bhn->bhp", h, Ch[:, t])     # (B, H, P)
    return y, h


def implied_attention(dt: np.ndarray, A: np.ndarray, Bm: np.ndarray, Cm: np.ndarray, S: np.ndarray | None = None,
                      heads: slice = slice(None), past: int = 0, keys: tuple | None = None) -> np.ndarray:
    """α (B, h, n, m) of the heads HEADS: α[h, t, s] = (Cₜ·Bₛ)·exp(A_h·(Sₜ[h] − Sₛ[h]))·Δₛ[h] for keys s ≤ past + t
    (0 after), B and C those of head h's group, S the running sum of Δ (computed from dt (B, n, H) when not given).
    The queries are the n rows of dt, Cm at positions past..past + n − 1; KEYS (Δ (B, m, H), S (B, m, H),
    B (B, m, G, N)) of all m = past + n positions (None: the queries' own, past = 0). Each factor exp(A_h·gap) ≤ 1 (A < 0, gap ≥ 0)."""
    S = np.cumsum(dt, axis=1) if S is None else S             # (B, n, H)
    dk, Sk, Bk = (dt, S, Bm) if keys is None else keys        # (B, m, H), (B, m, H), (B, m, G, N)
    H = dt.shape[2]
    n, m = dt.shape[1], dk.shape[1]
    CB = np.einsum("btgn,bsgn->btsg", Cm, Bk)                 # (B, n, m, G) Cₜ·Bₛ of each group
    CB = np.repeat(CB, H // CB.shape[3], axis=3)[..., heads]  # (B, n, m, h) each head's group's
    gap = S[:, :, None, heads] - Sk[:, None, :, heads]        # (B, n, m, h) Sₜ − Sₛ
    later = np.arange(m)[None, :] > past + np.arange(n)[:, None]   # (n, m) s > t: 0
    gap = np.where(later[None, :, :, None], 0, gap)           # (exp of a future key's gap could overflow)
    alpha = CB * np.exp(A[heads] * gap) * dk[:, None, :, heads]   # (B, n, m, h)
    alpha[:, later] = 0
    return alpha.transpose(0, 3, 1, 2)                        # (B, h, n, m)


def attention_summary(dt: np.ndarray, A: np.ndarray, Bm: np.ndarray, Cm: np.ndarray, S: np.ndarray,
                      real: np.ndarray | None, past: int = 0, keys: tuple | None = None,
                      shown: int | None = None) -> np.ndarray:
    """(B, V, n, m) the layer's attention as the views read it: each head's |α| (summed over each of SHOWN = V groups
    of H/V heads in a stack of layers of different kinds, whose views show the attention layers' V heads; None: every
    head), the padding's columns (REAL (B, m) 0) zeroed, each row divided by its sum (a row of zeros stays zeros). A
    few heads at a time (CHUNK numbers of α)."""
    Bsz, n, H = dt.shape
    m = n if keys is None else keys[0].shape[1]
    V = shown or H
    out = np.zeros((Bsz, V, n, m), dt.dtype)
    step = max(1, min(H // V, CHUNK // max(1, Bsz * n * m)))
    while (H // V) % step:                                    # a chunk of heads never spans two groups
        step -= 1
    for lo in range(0, H, step):
        out[:, lo // (H // V)] += np.abs(implied_attention(dt, A, Bm, Cm, S, slice(lo, lo + step), past, keys)).sum(1)
    if real is not None:
        out *= real[:, None, None, :m].astype(out.dtype)
    total = out.sum(axis=-1, keepdims=True)                   # (B, H, n, 1)
    return np.divide(out, total, out=np.zeros_like(out), where=total > 0)


def group_rms_norm(g: np.ndarray, weight: np.ndarray, groups: int, eps: float) -> np.ndarray:
    """GroupRMSNorm(g) (B, n, E): G groups of E/G channels, each divided by its own √(mean(g²) + eps), times the
    weight."""
    Bsz, n, E = g.shape
    parts = g.reshape(Bsz, n, groups, E // groups)            # (B, n, G, E/G)
    parts = parts / np.sqrt(np.mean(parts * parts, axis=-1, keepdims=True) + eps)
    return parts.reshape(Bsz, n, E) * weight                  # (B, n, E)


def gated_norm(y: np.ndarray, z: np.ndarray, weight: np.ndarray | None, groups: int, eps: float,
               kind: str = "gated") -> np.ndarray:
    """The mixer's output (B, n, E) from the scan's y (with its skip) and the gate z, as KIND (NORMS) says:
    GroupRMSNorm(y ⊙ SiLU(z)) (transformers' Mamba2RMSNormGated: the gate before the norm), GroupRMSNorm(y) ⊙ SiLU(z)
    (Falcon-H1's norm_before_gate), or y ⊙ SiLU(z) (no norm)."""
    if kind == "then_gate":
        return group_rms_norm(y, weight, groups, eps) * silu(z)
    g = y * silu(z)                                           # (B, n, E)
    return g if kind == "none" else group_rms_norm(g, weight, groups, eps)


@dataclass
class Mixer2Parts:
    """What a Mamba-2 mixer computes on the way: the gate z (B, n, E), the conv's input u (B, n, E + 2GN), the scan's
    input x̃ (B, n, H, P), B and C (B, n, G, N), Δ (B, n, H), A (H,); the scan's output y without the skip
    (B, n, H, P) and its last state (B, H, P, N)."""

    z: np.ndarray
    u: np.ndarray
    x: np.ndarray
    Bm: np.ndarray
    Cm: np.ndarray
    dt: np.ndarray
    A: np.ndarray
    y: np.ndarray
    last: np.ndarray

    def skipped(self, D: np.ndarray) -> np.ndarray:
        """(B, n, E) y + D ⊙ x̃, the scan's output with its skip, before the gated norm."""
        Bsz, n, H, P = self.y.shape
        return (self.y + self.x * D[:, None]).reshape(Bsz, n, H * P)


def mixer_parts(h: np.ndarray, w: Mixer2Weights, m: Mamba2, activation: str, new: np.ndarray | None = None,
                conv_past: np.ndarray | None = None, h0: np.ndarray | None = None) -> Mixer2Parts:
    """The mixer of the module docstring up to the gated norm, on h (B, n, d_model) what the norm gave: NEW (B, n, 1)
    this pass's padding (1 = token; None: none), CONV_PAST (B, k − 1, E + 2GN) the conv's earlier inputs and H0
    (B, H, P, N) the scan's state before (None: zeros, the start of a text)."""
    E, H, P, G, N = m.d_inner, m.n_heads, m.head_dim, m.n_groups, m.d_state
    Bsz, n, _ = h.shape
    if new is not None:
        h = h * new                                           # transformers' apply_mask_to_padding_states
    if m.in_scale != 1:
        h = h * m.in_scale                                    # Falcon-H1's ssm_in_multiplier
    proj = linear(h, w.W_in, w.b_in)                          # (B, n, E + conv_dim + H)
    if m.mup != (1.0,) * 5:                                   # Falcon-H1's µP: [z | x | B | C | δ] each × its own
        proj = proj * np.repeat(np.array(m.mup, proj.dtype), (E, E, G * N, G * N, H))
    z, u, delta = proj[..., :E], proj[..., E:E + m.conv_dim], proj[..., E + m.conv_dim:]
    past = np.zeros((Bsz, m.conv_kernel - 1, m.conv_dim), h.dtype) if conv_past is None else conv_past
    xbc = ACTIVATIONS[activation](causal_conv(u, w.conv, w.b_conv, past))   # (B, n, E + 2GN)
    if new is not None:
        xbc = xbc * new
    x = xbc[..., :E].reshape(Bsz, n, H, P)                    # (B, n, H, P) x̃
    Bm = xbc[..., E:E + G * N].reshape(Bsz, n, G, N)          # (B, n, G, N)
    Cm = xbc[..., E + G * N:].reshape(Bsz, n, G, N)           # (B, n, G, N)
    dt = np.clip(softplus(delta + w.b_dt), m.dt_min, m.dt_max)   # (B, n, H) Δ
    A = -np.exp(w.A_log)                                      # (H,)
    h0 = np.zeros((Bsz, H, P, N), h.dtype) if h0 is None else h0
    y, last = ssd_scan(x, dt, A, Bm, Cm, h0)                  # (B, n, H, P), (B, H, P, N)
    return Mixer2Parts(z, u, x, Bm, Cm, dt, A, y, last)


def mix_steps(f: Mixer2Parts, S: np.ndarray, past: int = 0, keys: tuple | None = None) -> dict:
    """The mixer's own steps as trace.MIXER names them, (B, H, ·) each, one per head: C and B of the head's group
    (B, H, n, N), x̃ (B, H, n, P), Δ and Δ·A_h (B, H, n), α (`implied_attention`, B, H, n, m) and y without the D skip
    (B, H, n, P), so that y = α·x̃ head by head (a pass from the text's start)."""
    H = f.dt.shape[2]

    def heads(a: np.ndarray) -> np.ndarray:                   # (B, n, H, ·) → (B, H, n, ·)
        return a.transpose(0, 2, 1, 3)
    return {"mix_q": heads(per_head(f.Cm, H)), "mix_k": heads(per_head(f.Bm, H)), "mix_v": heads(f.x),
            "mix_gate": f.dt.transpose(0, 2, 1), "mix_decay": (f.dt * f.A).transpose(0, 2, 1),
            "mix_matrix": implied_attention(f.dt, f.A, f.Bm, f.Cm, S, slice(None), past, keys), "mix_out": heads(f.y)}


def keep_state(s: Mamba2State, layer: int, f: Mixer2Parts, m: Mamba2, past: int, wants: bool = False) -> tuple:
    """Update layer LAYER's state with this pass's parts (the conv's last inputs, the scan's state, and each token's
    Δ, S, B when WANTS, this pass recording, or an earlier one did: core.mamba.keep_keys); give (S (B, n, H) of this
    pass's tokens counted from the text's first, the keys (Δ, S, B) of all tokens or None)."""
    S = np.cumsum(f.dt, axis=1) + (s.S[layer][:, -1:] if past else 0)   # (B, n, H)
    if m.conv_kernel > 1:
        before = s.conv.get(layer, np.zeros((f.u.shape[0], m.conv_kernel - 1, m.conv_dim), f.u.dtype))
        s.conv[layer] = np.concatenate([before, f.u], axis=1)[:, -(m.conv_kernel - 1):]   # (B, k − 1, E + 2GN)
    s.ssm[layer] = f.last
    return S, keep_keys(s, layer, f.dt, S, f.Bm, past, wants)


def mixer(h: np.ndarray, w: Mixer2Weights, p: Pass, layer: int, m: Mamba2) -> np.ndarray:
    """The Mamba-2 mixer of the module docstring: h (B, n, d_model), what the norm gave → out (B, n, d_model),
    starting from and updating the pass's state (if any); records "attentions" and "heads", hooks "heads"."""
    s = p.state
    Bsz, n, _ = h.shape
    new = None if p.real is None else p.real[:, -n:, None].astype(h.dtype)   # (B, n, 1) this pass's padding
    first = s is None or layer not in s.ssm
    f = mixer_parts(h, w, m, p.cfg.activation, new, None if first else s.conv[layer], None if first else s.ssm[layer])
    keys, S = None, np.cumsum(f.dt, axis=1)                   # (B, n, H) Σ Δ
    mix = p.rec.wants_any(layer, MIXER)                       # the mixer's own steps (the pipeline page)
    wants = p.rec.wants(layer, "attentions")
    if s is not None:
        S, keys = keep_state(s, layer, f, m, p.past, wants or mix)
    V = m.n_heads if m.beside is not None else p.cfg.n_heads   # the heads shown: H, or groups of H/V heads
    if mix:
        for name, value in mix_steps(f, S, p.past, keys).items():
            p.rec.put(layer, name, value)
    if wants:
        att = attention_summary(f.dt, f.A, f.Bm, f.Cm, S, p.real, p.past, keys, V)   # (B, V, n, m)
        p.rec.put(layer, "attentions", att if p.rec.heads is None else att[:, p.rec.heads])
    normed = gated_norm(f.skipped(w.D), f.z, w.norm, m.n_groups, p.cfg.norm_eps, m.norm)   # (B, n, E)
    heads = normed.reshape(Bsz, n, V, m.d_inner // V).transpose(0, 2, 1, 3)   # (B, V, n, E/V)
    if p.ablate is not None:
        heads = p.ablate.apply(layer, heads, None if p.real is None else p.real[:, -n:].astype(bool))
    heads = seen(p, layer, "heads", heads)
    return linear(heads.transpose(0, 2, 1, 3).reshape(Bsz, n, m.d_inner), w.W_out, w.b_out)   # (B, n, d_model)


def mamba2_block(x: np.ndarray, w: Mamba2BlockWeights, p: Pass, layer: int) -> np.ndarray:
    """x + Mixer(RMSNorm(x)) (B, n, d_model), each point hooked and recorded under its name (core.mamba.HOOKED): the
    mixer in attention's place (attn_in, heads, attn_out), no FFN (residual_out = residual_mid + ffn_out, ffn_out 0)."""
    x = seen(p, layer, "residual", x)
    h = norm_hooked(x, w.attn_norm, p.cfg, p.hooks, p.rec, layer, "attn_norm_scale")   # (B, n, d_model)
    out = seen(p, layer, "attn_out", mixer(seen(p, layer, "attn_in", h), w.mixer, p, layer, p.cfg.mamba))
    x = seen(p, layer, "residual_mid", x + out)
    if p.rec.wants(layer, "ffn_out") or (p.hooks is not None and p.hooks.wants(layer, "ffn_out")):
        x = x + seen(p, layer, "ffn_out", np.zeros_like(x))   # (B, n, d_model) no FFN: 0
    return seen(p, layer, "residual_out", x)                  # (B, n, d_model)


# ── the pass ─────────────────────────────────────────────────────────────────────

def mamba2_pass(weights: "Weights", cfg: "ModelConfig", ids: np.ndarray | None, attention_mask: np.ndarray, *,
                cache: "KVCache | None" = None, tape=None, token_type_ids=None, **kw
                ) -> tuple[np.ndarray, np.ndarray | None]:
    """`qkv.core.stack.transformer` for a Mamba-2 model (cfg.mamba a Mamba2): ids (B, n) → (final hidden states
    (B, n, d_model), logits (B, n, V) | (B, 1, V) with logits="last" | None with STOP), the same arguments. With a KV
    cache, ids are the new tokens after its past and attention_mask (B, past + n); its state (`Mamba2State`) carries
    the conv's inputs and the scan's state across passes (core.mamba.scan_stack runs it)."""
    if tape is not None:
        raise QkvError("gradients through a Mamba-2 model (training, input attribution) are not in qkv: the SSD scan "
                       "has no backward here; use a transformer, or transformers for Mamba-2")
    return scan_stack(weights, cfg, ids, attention_mask, mamba2_block, None if cache is None else state_of(cache),
                      cache=cache, **kw)
