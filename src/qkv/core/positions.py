"""Where each token is (guide: positions): learned tables, sinusoids, RoPE, T5's relative buckets and ALiBi.

Attention itself is blind to order, so position enters either added to the token
embeddings (learned, sinusoidal), as a rotation of Q and K (RoPE), as a learned bias
on the scores that depends only on how far the key is from the query (relative, T5),
or as a fixed bias growing linearly with the key's position, one slope per head (ALiBi: BLOOM, Falcon).
"""

from __future__ import annotations

import math

import numpy as np

from ..runtime.errors import QkvError


def positions_from_mask(attention_mask: np.ndarray) -> np.ndarray:
    """Position of each token counting only real tokens: cumsum(mask) - 1 (padding → 0).

    A left-padded row then gets the same positions as the row without padding, as
    transformers' `generate` does.
    """
    pos = np.cumsum(attention_mask, axis=-1) - 1         # (B, n)
    return np.maximum(pos, 0)


def temperature_scales(positions: np.ndarray, floor: int, scale: float, dtype=np.float32) -> np.ndarray:
    """Llama 4's attention temperature of a NoPE layer's queries: s_p = 1 + τ·log(1 + ⌊(p + 1)/F⌋) (F floor_scale,
    τ attn_scale; Nakanishi 2025, "Scalable-Softmax"), 1 up to position F − 2, then growing with log p so that a
    query far into a long input still picks out its keys. positions (B, n) or (n,) → (B, 1, n, 1), a factor of q.

    transformers counts p over the row's cache index, padding included; here p is the token's position among the
    row's real tokens, as RoPE's: the same numbers but for a left-padded row (whose padding moves no position)."""
    p = np.asarray(positions, dtype=np.float64)
    s = 1.0 + scale * np.log1p(np.floor((p + 1.0) / floor))            # (B, n)
    return s.reshape(-1, 1, s.shape[-1], 1).astype(dtype)              # (B, 1, n, 1)


def positions_from_ids(ids: np.ndarray, pad_token_id: int) -> np.ndarray:
    """Position of each token counting the ids that are not PAD_TOKEN_ID: cumsum(ids ≠ pad) − 1, and −1 for a
    pad (RoBERTa; transformers' create_position_ids_from_input_ids gives these + pad + 1, the rows it reads).
    The ids decide, not the attention mask: a pad id the mask keeps is still a pad to the positions."""
    real = ids != pad_token_id                                      # (B, n)
    return np.where(real, np.cumsum(real, axis=-1) - 1, -1)         # (B, n)


def sinusoidal_table(n_positions: int, d_model: int) -> np.ndarray:
    """PE[p, 2i] = sin(p / 10000^(2i/d)), PE[p, 2i+1] = cos(p / 10000^(2i/d))."""
    pos = np.arange(n_positions, dtype=np.float64)[:, None]               # (P, 1)
    inv = np.exp(-math.log(10000.0) * np.arange(0, d_model, 2) / d_model)  # (d/2,)
    table = np.zeros((n_positions, d_model))                             # (P, d)
    table[:, 0::2] = np.sin(pos * inv)
    table[:, 1::2] = np.cos(pos * inv[: d_model // 2])
    return table.astype(np.float32)


def sinusoidal_halves(n_positions: int, d_model: int) -> np.ndarray:
    """The same sinusoids with the sines first and the cosines after (Marian's table):

        PE[p, i] = sin(p / 10000^(2i/d)),   PE[p, ⌈d/2⌉ + i] = cos(p / 10000^(2i/d))

    As transformers' MarianSinusoidalPositionalEmbedding: the angles in float64, then float32.
    It holds the numbers of `sinusoidal_table` with its columns reordered (not interleaved).
    """
    pos = np.arange(n_positions, dtype=np.float64)[:, None]                          # (P, 1)
    j = np.arange(d_model)
    angles = pos / np.power(10000.0, 2 * (j // 2) / d_model)                          # (P, d)
    return np.concatenate([np.sin(angles[:, 0::2]), np.cos(angles[:, 1::2])], axis=1).astype(np.float32)


def relative_buckets(q_pos: np.ndarray, k_pos: np.ndarray, bidirectional: bool, n_buckets: int,
                     max_distance: int) -> np.ndarray:
    """T5's bucket of each (query, key) pair: (len(q_pos), len(k_pos)) ints in [0, n_buckets).

    The distance r = key − query. Bidirectional (the encoder): half the buckets for keys
    after the query, half for keys before; causal (the decoder): only r ≤ 0 counts. Of a
    half's b buckets, distances 0..b/2−1 get one each, and larger ones share logarithmically
    wider buckets up to max_distance, beyond which all share the last. As transformers'
    T5Attention._relative_position_bucket, the logarithm in float32.
    """
    rel = np.asarray(k_pos)[None, :] - np.asarray(q_pos)[:, None]                   # (n_q, n_k) r = key − query
    buckets = np.zeros(rel.shape, dtype=np.int64)
    if bidirectional:
        n_buckets //= 2
        buckets += (rel > 0) * n_buckets
        rel = np.abs(rel)
    else:
        rel = -np.minimum(rel, 0)
    exact = n_buckets // 2
    far = np.maximum(rel, exact).astype(np.float32)                                  # the log's input where it counts
    log = np.log(far / np.float32(exact)) / np.float32(math.log(max_distance / exact))
    large = exact + (log * np.float32(n_buckets - exact)).astype(np.int64)
    large = np.minimum(large, n_buckets - 1)
    return buckets + np.where(rel < exact, rel, large)                               # (n_q, n_k)


def relative_bias(table: np.ndarray, q_pos: np.ndarray, k_pos: np.ndarray, bidirectional: bool,
                  max_distance: int) -> np.ndarray:
    """B[h, i, j] = table[bucket(k_pos[j] − q_pos[i]), h]: T5's learned bias added to the
    scores S = Q·Kᵀ + B, one number per head and distance bucket. table (n_buckets, H) →
    (1, H, n_q, n_k), computed once per pass and shared by every layer of the stack."""
    b = relative_buckets(q_pos, k_pos, bidirectional, table.shape[0], max_distance)   # (n_q, n_k)
    return table[b].transpose(2, 0, 1)[None]                                           # (1, H, n_q, n_k)


ROPE_FACTOR = (1e-3, 1e6)        # a rope_scaling factor outside this makes float32 angles of 0 or ∞
SUPPORTED = "default, linear, dynamic, yarn, llama3, longrope"      # the rope_scaling kinds qkv computes


def rope_kind(scaling: dict | None) -> str:
    """The kind of a Hugging Face `rope_scaling` (its rope_type, or the older key type): "default" when none."""
    return (scaling or {}).get("rope_type", (scaling or {}).get("type", "default"))


def resolve_rope(scaling: dict | None, max_positions: int) -> dict | None:
    """SCALING with every number `rope_inv_freq` reads written in, as transformers fills them in (the one place
    they are read): YaRN's original_max_position_embeddings (else MAX_POSITIONS), factor (else MAX_POSITIONS /
    original), beta_fast 32 and beta_slow 1 (a 0 or none too, as transformers' `or`), truncate (true) and its
    attention factor (else mscale(factor, mscale) / mscale(factor, mscale_all_dim) when both are given and
    non-zero, else 0.1·ln(factor) + 1, 1 when factor ≤ 1); dynamic NTK's max_position_embeddings (MAX_POSITIONS:
    the length past which its base grows). Every other kind is returned as it is. Idempotent."""
    kind = rope_kind(scaling)
    if kind == "dynamic" and "max_position_embeddings" not in scaling:
        return {**scaling, "max_position_embeddings": max_positions}
    if kind != "yarn":
        return scaling
    out = dict(scaling)
    original = out.get("original_max_position_embeddings") or max_positions
    factor = out.get("factor") or (max_positions / original if _is_num(original) and original > 0 else None)
    out.update(original_max_position_embeddings=original, factor=factor, beta_fast=out.get("beta_fast") or 32,
               beta_slow=out.get("beta_slow") or 1, truncate=out.get("truncate", True))
    if out.get("attention_factor") is None and _is_num(factor) and factor > 0:
        mscale, mscale_all = out.get("mscale"), out.get("mscale_all_dim")
        if _is_num(mscale) and _is_num(mscale_all) and mscale and mscale_all:
            out["attention_factor"] = yarn_mscale(factor, mscale) / yarn_mscale(factor, mscale_all)
        else:
            out["attention_factor"] = yarn_mscale(factor)
    return out


def yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    """YaRN's magnitude correction (Peng et al. 2023, eq. 21): 0.1·mscale·ln(factor) + 1, and 1 for factor ≤ 1."""
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def _is_num(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def check_rope(theta: float, scaling: dict | None, what: str = "rope", resolved: bool = False) -> None:
    """RoPE's numbers as `rope_inv_freq` will use them, checked once at load: θ a finite number above 1 (else
    1/θ^(2i/d) is ∞ or flat), a scaling kind qkv computes with every number it reads present, finite and in
    range (llama3: high_freq_factor > low_freq_factor; yarn: beta_fast ≥ beta_slow, mscale and mscale_all_dim
    finite, truncate true or false) once RESOLVED (`resolve_rope` filled in what the config left out; before,
    only yarn's and dynamic's kind is checked). One QkvError naming the knob."""
    fix = "fix the model's config"
    if not (isinstance(theta, (int, float)) and math.isfinite(theta) and theta > 1):
        raise QkvError(f"{what}_theta={theta!r} must be a finite number above 1 (the rotation speeds are "
                       f"1/θ^(2i/d)); {fix}")
    if not scaling:
        return
    kind = rope_kind(scaling)
    need = {"default": (), "linear": ("factor",), "llama3": ("factor", "low_freq_factor", "high_freq_factor",
                                                             "original_max_position_embeddings"),
            "longrope": ("original_max_position_embeddings",),
            "dynamic": ("factor", "max_position_embeddings"),
            "yarn": ("factor", "original_max_position_embeddings", "beta_fast", "beta_slow", "attention_factor")}
    if kind not in need:
        raise QkvError(f"rope_scaling type {kind!r} is not supported; supported: {SUPPORTED}")
    if kind in ("yarn", "dynamic") and not resolved:      # a reader's early look: checked whole by ModelConfig
        return
    for key in need[kind]:
        v = scaling.get(key)
        if not (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0):
            raise QkvError(f"rope_scaling {kind} needs {key}, a positive finite number, not {v!r}; {fix}")
    if "factor" in need[kind] and not ROPE_FACTOR[0] <= scaling["factor"] <= ROPE_FACTOR[1]:
        raise QkvError(f"rope_scaling factor={scaling['factor']!r} must be from {ROPE_FACTOR[0]:g} to "
                       f"{ROPE_FACTOR[1]:g}; {fix}")
    if kind == "llama3" and not scaling["high_freq_factor"] > scaling["low_freq_factor"]:
        raise QkvError(f"rope_scaling llama3 needs high_freq_factor > low_freq_factor, not "
                       f"{scaling['high_freq_factor']!r} ≤ {scaling['low_freq_factor']!r}; {fix}")
    if kind == "yarn":
        _check_yarn(scaling, fix)
    if kind == "longrope":
        if "attention_factor" not in scaling:            # a reader that left it unresolved: refused, not guessed
            raise QkvError("rope_scaling longrope is read for phi3, stablelm and starcoder2 checkpoints; "
                           "use one of those families (or a checkpoint without longrope)")
        for key in ("short_factor", "long_factor", "attention_factor"):
            v = scaling.get(key)
            values = v if isinstance(v, list) else [v]
            if v is not None and not all(isinstance(x, (int, float)) and math.isfinite(x) and
                                         ROPE_FACTOR[0] <= x <= ROPE_FACTOR[1] for x in values):
                raise QkvError(f"rope_scaling longrope {key} must hold numbers from {ROPE_FACTOR[0]:g} to "
                               f"{ROPE_FACTOR[1]:g}; {fix}")


def _check_yarn(scaling: dict, fix: str) -> None:
    """YaRN's knobs beyond the positive numbers `check_rope` asks of every kind: the ramp's ends in order (beta_fast
    rotations ≥ beta_slow), mscale and mscale_all_dim finite numbers when given, truncate a bool."""
    if scaling["beta_fast"] < scaling["beta_slow"]:
        raise QkvError(f"rope_scaling yarn needs beta_fast ≥ beta_slow, not {scaling['beta_fast']!r} < "
                       f"{scaling['beta_slow']!r}; {fix}")
    for key in ("mscale", "mscale_all_dim"):
        if scaling.get(key) is not None and not _is_num(scaling[key]):
            raise QkvError(f"rope_scaling yarn {key} must be a finite number, not {scaling[key]!r}; {fix}")
    if not isinstance(scaling["truncate"], bool):
        raise QkvError(f"rope_scaling yarn truncate must be true or false, not {scaling['truncate']!r}; {fix}")


def rope_inv_freq(d_rot: int, theta: float, scaling: dict | None = None, dtype=np.float32,
                  length: int | None = None) -> np.ndarray:
    """RoPE's rotation speeds: ω_i = 1 / θ^(2i/d) for i < d/2, optionally rescaled.

    Computed in `dtype` as the reference does (float32 by default), so that angles
    p·ω_i round the same way at large positions. `scaling` follows Hugging Face's
    `rope_scaling` (resolved by `resolve_rope`): None/"default", "linear" (positions divided by a factor),
    "llama3" (low frequencies slowed, high ones kept), "yarn" (`yarn_inv_freq`), "dynamic" (`dynamic_base`: θ
    grown with the pass's LENGTH) and "longrope" (Phi-3: ω_i / s_i, s the short_factor table, or long_factor
    once the pass reaches past original_max_position_embeddings). LENGTH = the pass's last position + 1, as
    transformers chooses per pass; None: the table at load (dynamic: plain θ; longrope: the short table).
    """
    dtype = np.dtype(dtype).type
    exps = np.arange(0, d_rot, 2).astype(dtype) / dtype(d_rot)                   # (d/2,)
    kind = rope_kind(scaling)
    if kind in ("yarn", "dynamic") and resolve_rope(scaling, 1) != scaling:   # a dict ModelConfig did not resolve
        raise QkvError(f"rope_scaling {kind} needs its numbers filled in first: resolve_rope(scaling, "
                       "max_positions), as ModelConfig does")
    if kind == "dynamic":
        theta = dynamic_base(d_rot, theta, scaling, dtype, length)
    if kind == "yarn":
        return yarn_inv_freq(d_rot, theta, scaling, dtype)
    if kind == "longrope":
        if "attention_factor" not in scaling:            # a reader that left it unresolved: refused, not guessed
            raise QkvError("rope_scaling longrope is read for phi3, stablelm and starcoder2 checkpoints; "
                           "use one of those families (or a checkpoint without longrope)")
        long = length is not None and length > scaling["original_max_position_embeddings"]
        s = np.asarray(scaling["long_factor" if long else "short_factor"], dtype=dtype)       # (d/2,)
        return (dtype(1.0) / (s * np.power(dtype(theta), exps))).astype(dtype)             # (d/2,)
    inv = (dtype(1.0) / np.power(dtype(theta), exps)).astype(dtype)             # (d/2,)
    if kind in ("default", "dynamic"):
        return inv
    if kind == "linear":
        return (inv / dtype(scaling["factor"])).astype(dtype)
    if kind == "llama3":
        factor = float(scaling["factor"])
        low, high = float(scaling["low_freq_factor"]), float(scaling["high_freq_factor"])
        old_len = float(scaling["original_max_position_embeddings"])
        wavelen = 2 * math.pi / inv
        smooth = (old_len / wavelen - low) / (high - low)
        scaled = np.where(wavelen > old_len / low, inv / factor, inv)
        mid = (wavelen <= old_len / low) & (wavelen >= old_len / high)
        return np.where(mid, (1 - smooth) * inv / factor + smooth * inv, scaled).astype(dtype)
    raise QkvError(f"rope_scaling type {kind!r} is not supported; supported: {SUPPORTED}")


def dynamic_base(d_rot: int, theta: float, scaling: dict, dtype, length: int | None):
    """Dynamic NTK's base for a pass over LENGTH positions: θ' = θ·(f·n/N − (f − 1))^(d/(d−2)), n = LENGTH,
    N = max_position_embeddings, f = factor; θ itself up to N (and with no LENGTH), as transformers'
    _compute_dynamic_ntk_parameters grows it per pass, in float32 there (DTYPE here) since n is a tensor."""
    n_max = scaling["max_position_embeddings"]
    if length is None or length <= n_max:
        return theta
    f = dtype(scaling["factor"])
    grown = f * dtype(length) / dtype(n_max) - (f - dtype(1.0))
    return dtype(theta) * np.power(grown, dtype(d_rot / (d_rot - 2)))


def yarn_inv_freq(d_rot: int, theta: float, scaling: dict, dtype) -> np.ndarray:
    """YaRN's speeds (Peng et al. 2023, "YaRN: Efficient Context Window Extension"): each ω_i between the plain
    speed (extrapolation, the fast pairs that turn more than beta_fast times over the original length L) and
    ω_i / factor (interpolation, the slow pairs that turn fewer than beta_slow times), on a linear ramp between:

        ω_i = ω_i/s · r_i + ω_i · (1 − r_i),   r_i = clamp((i − lo) / (hi − lo), 0, 1)
        lo, hi = d·ln(L / (2π·β)) / (2·ln θ) for β = beta_fast, beta_slow (floored / ceiled with truncate),
                 clipped to [0, d − 1]

    As transformers' _compute_yarn_parameters, in DTYPE (float32 there); cos and sin are then multiplied by its
    attention factor (`rope_attention_factor`)."""
    factor, original = float(scaling["factor"]), float(scaling["original_max_position_embeddings"])

    def dim_of(rotations: float) -> float:               # the pair index that turns ROTATIONS times over L
        return d_rot * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    lo, hi = dim_of(scaling["beta_fast"]), dim_of(scaling["beta_slow"])
    if scaling["truncate"]:
        lo, hi = math.floor(lo), math.ceil(hi)
    lo, hi = max(lo, 0), min(hi, d_rot - 1)
    if lo == hi:
        hi += 0.001                                       # as transformers: no division by zero
    exps = np.arange(0, d_rot, 2).astype(dtype) / dtype(d_rot)                     # (d/2,)
    power = np.power(dtype(theta), exps)                                            # (d/2,) θ^(2i/d)
    extrapolated = dtype(1.0) / power                                               # (d/2,)
    interpolated = dtype(1.0) / (dtype(factor) * power)                             # (d/2,)
    ramp = np.clip((np.arange(d_rot // 2, dtype=dtype) - dtype(lo)) / dtype(hi - lo), 0, 1).astype(dtype)
    keep = dtype(1.0) - ramp                                                        # (d/2,) share extrapolated
    return (interpolated * (dtype(1.0) - keep) + extrapolated * keep).astype(dtype)


def rope_attention_factor(scaling: dict | None) -> float:
    """What cos and sin are multiplied by (LongRoPE's and YaRN's attention factor, which sharpens the scores by
    its square; `resolve_rope` or the family's reader resolves it from the config as transformers does); 1 for
    every other kind."""
    return float(scaling.get("attention_factor", 1.0)) if rope_kind(scaling) in ("longrope", "yarn") else 1.0


def rope_keeps_turned_keys(scaling: dict | None) -> bool:
    """Whether a KV cache keeps the keys turned with an older table when a longer pass changes it: dynamic NTK
    (transformers turns only each step's new query and key with the grown base, never the cached keys again);
    LongRoPE rereads the whole sequence instead (transformers' Phi-3 drops its cache)."""
    return rope_kind(scaling) == "dynamic"


def rope_cos_sin(positions: np.ndarray, inv_freq: np.ndarray, factor: float = 1.0, interleaved: bool = False
                 ) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin of the angles p·ω_i, laid out for the pairs RoPE turns: (B, 1, n, d_rot), each times FACTOR
    (LongRoPE's attention factor; 1: plain RoPE).

    Hugging Face's Llama pairs dimension i with i + d/2 (rotate-half), so the d/2 angles are repeated
    twice along the head dimension: [θ_0 … θ_{d/2−1}, θ_0 … θ_{d/2−1}]. Interleaved (GPT-J, Cohere) pairs
    2i with 2i + 1, so each angle is repeated in place: [θ_0, θ_0, θ_1, θ_1, …] (torch's repeat_interleave).
    """
    angles = positions[..., None].astype(inv_freq.dtype) * inv_freq  # (B, n, d/2)
    if interleaved:
        angles = np.repeat(angles, 2, axis=-1)                       # (B, n, d) θ_0, θ_0, θ_1, θ_1, …
    else:
        angles = np.concatenate([angles, angles], axis=-1)           # (B, n, d)
    cos, sin = np.cos(angles)[:, None], np.sin(angles)[:, None]      # (B, 1, n, d)
    if factor != 1.0:
        cos, sin = cos * inv_freq.dtype.type(factor), sin * inv_freq.dtype.type(factor)
    return cos, sin


def rotate_half(x: np.ndarray) -> np.ndarray:
    """[x1, x2] → [-x2, x1] over the last axis (the 90° turn of each pair (i, i+d/2))."""
    half = x.shape[-1] // 2
    return np.concatenate([-x[..., half:], x[..., :half]], axis=-1)


def rotate_every_two(x: np.ndarray) -> np.ndarray:
    """(x_0, x_1, x_2, x_3, …) → (−x_1, x_0, −x_3, x_2, …): the 90° turn of each pair (2i, 2i+1) (GPT-J)."""
    y = np.empty_like(x)                                            # (..., d)
    y[..., 0::2] = -x[..., 1::2]
    y[..., 1::2] = x[..., 0::2]
    return y


def apply_rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray, interleaved: bool = False) -> np.ndarray:
    """RoPE(x) = x·cos + turn(x)·sin: rotates each pair of Q or K by p·ω_i; turn is rotate_half, or
    rotate_every_two when the pairs are interleaved (GPT-J, Cohere; cos, sin laid out to match).

    cos, sin narrower than x (d_rot < d_k, GPT-NeoX's and GPT-J's partial rotary): the first d_rot numbers
    of each head turn, the rest pass unchanged."""
    turn = rotate_every_two if interleaved else rotate_half
    r = cos.shape[-1]
    if r == x.shape[-1]:
        return x * cos + turn(x) * sin                             # (B, H, n, d_k)
    turned = x[..., :r] * cos + turn(x[..., :r]) * sin             # (B, H, n, d_rot)
    return np.concatenate([turned, x[..., r:]], axis=-1)           # (B, H, n, d_k)


def apply_rope_backward(dy: np.ndarray, cos: np.ndarray, sin: np.ndarray, interleaved: bool = False) -> np.ndarray:
    """dx of y = x·cos + turn(x)·sin: dx = dy·cos − turn(dy·sin) (on the first d_rot numbers; the rest
    pass dy unchanged).

    turn (rotate_half or rotate_every_two) is a 90° turn R of each pair, and Rᵀ = −R: the backward
    turns the other way.
    """
    turn = rotate_every_two if interleaved else rotate_half
    r = cos.shape[-1]
    if r == dy.shape[-1]:
        return dy * cos - turn(dy * sin)                           # (B, H, n, d_k)
    turned = dy[..., :r] * cos - turn(dy[..., :r] * sin)           # (B, H, n, d_rot)
    return np.concatenate([turned, dy[..., r:]], axis=-1)          # (B, H, n, d_k)


def alibi_slopes(n_heads: int) -> np.ndarray:
    """ALiBi's slope of each head (Press et al. 2022): m_h = b^(h+1), b = 2^(-8/2^⌊log₂H⌋), a geometric series
    from b down to 2^-8 over the largest power of two P ≤ H heads; the H − P others take every other power
    of the series for 2P heads, b' = 2^(-4/P): b'^1, b'^3, …. (H,) float32, as transformers'
    build_alibi_tensor computes them (base in float32, raised to integer powers)."""
    p2 = 2 ** math.floor(math.log2(n_heads))
    base = np.float32(2 ** (-(2 ** -(math.log2(p2) - 3))))
    slopes = np.power(base, np.arange(1, 1 + p2, dtype=np.float32))                     # (P,)
    if p2 != n_heads:
        extra = np.float32(2 ** (-(2 ** -(math.log2(2 * p2) - 3))))
        rest = min(p2, n_heads - p2)
        slopes = np.concatenate([slopes, np.power(extra, np.arange(1, 1 + 2 * rest, 2, dtype=np.float32))])
    return slopes.astype(np.float32)                                                     # (H,)


def to_bfloat16(x: np.ndarray) -> np.ndarray:
    """float32 values rounded to bfloat16's 8-bit mantissa (to nearest, ties to even), kept as float32."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    u = (u + (((u >> 16) & 1) + np.uint32(0x7FFF))) & np.uint32(0xFFFF0000)
    return u.view(np.float32)


def alibi_bias(attention_mask: np.ndarray, slopes: np.ndarray, scale: float | None = None,
               bfloat16: bool = False) -> np.ndarray:
    """ALiBi's bias on the scores, B[b, h, ·, j] = m_h·p_j: head h's slope times key j's position, counted over
    real tokens (p = (cumsum(mask) − 1)·mask, so left padding shifts nothing; padding keys 0). One row for every
    query: a query i adds m_h·(p_j − p_i) in the paper's form, the same softmax (a constant per row).
    attention_mask (B, m) → (B, H, 1, m) float32. scale: the bias is multiplied with the scores (Falcon's
    (Q·Kᵀ + m·p)/√d_k); None: added as it is (BLOOM's Q·Kᵀ/√d_k + m·p). bfloat16: m and m·p rounded to
    bfloat16 as Falcon computes them."""
    pos = ((np.cumsum(attention_mask, axis=-1) - 1) * attention_mask).astype(np.float32)     # (B, m)
    m = to_bfloat16(slopes) if bfloat16 else slopes                                          # (H,)
    bias = m[None, :, None, None] * pos[:, None, None, :]                                    # (B, H, 1, m)
    if bfloat16:
        bias = to_bfloat16(bias)
    if scale is not None:
        bias = bias * np.float32(scale)
    return bias.astype(np.float32, copy=False)                                               # (B, H, 1, m)
