"""One layer of the pass (guide: block): the boxes of core/blocks.py composed into a block, each point of it
recorded and hooked under its name (qkv.core.trace.INTERMEDIATES), so that analyses and views read what the
pass computed instead of applying the config's knobs again:

    residual ─▶ [Norm: attn_norm_scale] ─▶ attn_in ─▶ attention ─▶ attn_out ─▶ + ─▶ residual_mid
             ─▶ [Norm: ffn_norm_scale] ─▶ ffn_in ─▶ FFN ─▶ ffn_out ─▶ + ─▶ residual_out      (pre-norm)

post-norm puts each Norm after its +; a parallel residual (GPT-NeoX, Phi) adds attention's and the FFN's
outputs, both read from the block's input, at once (`parallel_block`); an encoder–decoder's decoder has its
cross-attention step between them. `step_block` is the one-token fast path of `block` (the same numbers,
nothing recorded or hooked); `final_norm` the norm after the last block; `joined` and `norm_in_front` say, for
the analyses, what a box's output adds to the stream and which norm a box reads through.
"""

from __future__ import annotations

import math

import numpy as np

from . import step_compiled
from .attention import scaled_dot_product_attention
from .blocks import attention, conv_beside, feed_forward, linear, norm, norm_by, norm_scale
from .config import ModelConfig
from .context import Context
from .blocks_backward import Tape
from .hooks import Hooks
from .latent import latent_attention
from .ops import rms_norm
from .positions import apply_rope
from .trace import Recorder
from .weights import BlockWeights, NormWeights


def normalise(x: np.ndarray, w: NormWeights, ctx: Context, layer: int, name: str) -> np.ndarray:
    """Norm(x) inside a pass, its scale s recorded as NAME (attn_norm_scale, ffn_norm_scale, final_norm_scale)
    and hooked there: a hook's s (B, n) is what the norm divides by. Neither: `norm` itself (the fast path)."""
    return norm_hooked(x, w, ctx.cfg, ctx.hooks, ctx.rec, layer, name)


def norm_hooked(x: np.ndarray, w: NormWeights, cfg: ModelConfig, hooks: Hooks | None, rec: Recorder | None,
                layer: int, name: str) -> np.ndarray:
    """`normalise` given the hooks and the recorder (None: none) instead of a pass's Context."""
    hooked = hooks is not None and hooks.wants(layer, name)
    if not hooked and (rec is None or not rec.wants(layer, name)):
        return norm(x, w, cfg)
    s = norm_scale(x, cfg)                                    # (B, n)
    if hooked:
        s = hooks(layer, name, s)
    if rec is not None:
        rec.put(layer, name, s)
    return norm_by(x, s, w, cfg) if hooked else norm(x, w, cfg)


def final_norm(x: np.ndarray, w: NormWeights | None, ctx: Context, last: int) -> np.ndarray:
    """The final norm of the stream leaving the last block (index LAST), its scale recorded and hooked as that
    layer's final_norm_scale (qkv.core.trace.FINAL); x itself where the stack has none (BERT)."""
    return x if w is None else normalise(x, w, ctx, last, "final_norm_scale")


def joined(out: np.ndarray | float, cfg: ModelConfig) -> np.ndarray | float:
    """What a box's output OUT adds to the residual stream once past its output norm (if any): OUT × m, Granite's
    residual_multiplier (1 elsewhere). Linear, so it applies to any linear reading of OUT alike (a head's part of
    it, its dot product with a direction): what analyses call instead of reading the multiplier."""
    m = cfg.residual_multiplier
    return out if m == 1 else out * m


def norm_in_front(w: BlockWeights, box: str, cfg: ModelConfig) -> NormWeights | None:
    """The norm BOX ("attn" or "ffn") reads the stream through: pre-norm's attn_norm or ffn_norm (a parallel
    block's FFN without one of its own: the attention's, Phi); None where the box reads the stream itself
    (post-norm, whose norms come after each box; no norm there: OLMo 2)."""
    if cfg.norm_place == "post":
        return None
    if box == "ffn":
        return w.attn_norm if cfg.parallel_residual and w.ffn_norm is None else w.ffn_norm
    return w.attn_norm


def row_norm(x: np.ndarray, w: NormWeights, cfg: ModelConfig) -> np.ndarray:
    """`norm` of one row (1, 1, d): RMSNorm's three steps on its one number (mean, + eps, √) done as
    scalars instead of (1, 1, 1) arrays (each NumPy call on an array costs ~2–4 µs; a SmolLM2 step
    makes 61 norms). The same float32 numbers: each scalar step is computed in float64 and rounded
    to float32, which for ÷, + and √ equals the float32 operation (float64 has more than 2·24 + 2 bits).
    Plain form: rms_norm(x, w.weight, cfg.norm_eps). llama.cpp's arithmetic: `norm` (ggml's RMSNorm)."""
    if cfg.norm != "rms" or x.size != x.shape[-1] or cfg.arith != "exact":
        return norm(x, w, cfg)
    ms = np.float32(float(np.add.reduce(x * x, axis=-1)[0, 0]) / x.shape[-1])     # mean(x²), float32
    r = np.float32(math.sqrt(np.float32(ms + np.float32(cfg.norm_eps))))           # √(mean(x²) + eps)
    y = x / r                                                                       # (1, 1, d)
    y *= w.weight
    return y


def step_block(x: np.ndarray, w: BlockWeights, ctx: Context, layer: int) -> np.ndarray:
    """`block` for one new token after a KV cache's past, pre- or post-norm, with nothing recorded, hooked or
    ablated: what `generate` runs once per layer per token. The same numbers as `block` (each value
    goes through the same operations; tests/test_decode_fast.py), with less work around them:

      - Q, K, V are one product (three, joined, where a file stores them in different kinds: Q4_K_M's Q6_K W_V)
        and stay one buffer: its heads are (B, H + 2·Hkv, 1, d_k), and
        RoPE turns the Q and K heads in one call (plain form: apply_rope(q), apply_rope(k));
      - K and V of the new position go straight into the cache (plain form: cache.append);
      - a mask that hides nothing is not added (plain form: S + 0); a recorder may keep only the weights A;
      - RMSNorm of the one row with scalars (`row_norm`).
    Layers of different kinds take their own window's mask and their own rotation (ctx.step_bias_of, rope_of).
    """
    cfg, cache, a = ctx.cfg, ctx.cache, w.attn
    if cfg.latent:                                              # MLA (DeepSeek): its box fills the latent cache
        return latent_step_block(x, w, ctx, layer)
    B = x.shape[0]
    H, Hkv, dk = cfg.n_heads, cfg.n_kv_heads, cfg.d_head
    hq, hk = H * dk, Hkv * dk
    post = cfg.norm_place == "post"                             # OPT-350m: Norm(x + Box(x)) after each box
    h_attn = x if w.attn_norm is None or post else row_norm(x, w.attn_norm, cfg)   # (B, 1, d_model)
    if a.W_QKV is not None:
        qkv = linear(h_attn, a.W_QKV)                           # (B, 1, (H + 2·Hkv)·d_k) = X·[W_Q | W_K | W_V]
    else:                                                       # stored of different kinds (Q4_K_M): three
        qkv = np.concatenate([linear(h_attn, W) for W in (a.W_Q, a.W_K, a.W_V)], axis=-1)
    for lo, hi, b in ((0, hq, a.b_Q), (hq, hq + hk, a.b_K), (hq + hk, hq + 2 * hk, a.b_V)):
        if b is not None:
            qkv[..., lo:hi] += b
    if cfg.qk_norm == "all":                                    # OLMo 2: q and k normalised over the projection
        qkv[..., :hq], qkv[..., hq:hq + hk] = norm(qkv[..., :hq], a.q_norm, cfg), norm(qkv[..., hq:hq + hk], a.k_norm, cfg)
    heads = qkv.reshape(B, H + 2 * Hkv, 1, dk)                  # (B, H + 2·Hkv, 1, d_k): Q, K, V heads
    qk = heads[:, :H + Hkv]
    if cfg.qk_norm == "head" and not cfg.qk_norm_after_rope:   # Qwen3, Phi: each head's q and k normalised first
        qk = np.concatenate([norm(qk[:, :H], a.q_norm, cfg), norm(qk[:, H:], a.k_norm, cfg)], axis=1)
    rope = ctx.rope_of(layer)
    if rope is not None:
        qk = apply_rope(qk, *rope, cfg.rope_interleaved)        # (B, H + Hkv, 1, d_k) rotated by position
    if cfg.qk_norm_after_rope:                                  # Hunyuan: normalised once turned
        qk = np.concatenate([norm(qk[:, :H], a.q_norm, cfg), norm(qk[:, H:], a.k_norm, cfg)], axis=1)
    if cfg.qk_l2_norm and rope is not None:                     # Llama 4: RMS without γ (blocks.llama4_qk)
        qk = rms_norm(qk, 1.0, cfg.norm_eps)
    elif ctx.temperature is not None and rope is None:          # Llama 4's NoPE layers: q × its position's factor
        qk = np.concatenate([qk[:, :H] * ctx.temperature, qk[:, H:]], axis=1)
    t, r = cache.length, cache.row(layer)                       # r: the layer's row among the attention layers'
    cache.k[r, :, :, t] = qk[:, H:, 0]                          # the new position's K and V, in place
    cache.v[r, :, :, t] = heads[:, H + Hkv:, 0]
    k, v = cache.k[r, :, :, :t + 1], cache.v[r, :, :, :t + 1]   # (B, Hkv, t + 1, d_k) views
    z, att, _ = scaled_dot_product_attention(qk[:, :H], k, v, ctx.step_bias_of(layer), scale=ctx.scale,
                                             cap=cfg.attn_softcap, sink=a.sinks if cfg.attn_sinks else None)   # (B, H, 1, d_k), A (B, H, 1, t + 1)
    if ctx.rec.keep:                                            # a recorded generation: A is there anyway
        ctx.rec.put(layer, "attentions", att if ctx.rec.heads is None else att[:, ctx.rec.heads])
    out = linear(z.reshape(B, 1, hq), a.W_O, a.b_O)            # Concat(Z)·W_O; n = 1: a reshape
    if w.attn_out_norm is not None:                             # OLMo 2: the output normalised before the stream
        out = row_norm(out, w.attn_out_norm, cfg)
    m = cfg.residual_multiplier                                 # Granite: each output × m before the stream
    if m != 1:
        out *= m
    if post:
        x = norm(x + out, w.attn_norm, cfg)
        f = feed_forward(x, w.ffn, cfg)
        return norm(x + (f if m == 1 else f * m), w.ffn_norm, cfg)   # (B, 1, d_model)
    if cfg.parallel_residual:                                   # GPT-NeoX: the FFN reads the block's input too
        h = row_norm(x, w.ffn_norm, cfg) if w.ffn_norm is not None else h_attn   # Phi: the attention's Norm(x)
        f = feed_forward(h, w.ffn, cfg)
        return ((f if m == 1 else f * m) + out) + x
    x = x + out
    f = feed_forward(x if w.ffn_norm is None else row_norm(x, w.ffn_norm, cfg), w.ffn, cfg)
    f = f if w.ffn_out_norm is None else row_norm(f, w.ffn_out_norm, cfg)
    return x + (f if m == 1 else f * m)                         # (B, 1, d_model)


def latent_step_block(x: np.ndarray, w: BlockWeights, ctx: Context, layer: int) -> np.ndarray:
    """`step_block` of a pre-norm block with multi-head latent attention (DeepSeek): x + MLA(Norm(x)), then + FFN(Norm(·)),
    the boxes themselves (latent.latent_attention appends the new latent to the cache), the norms of the one row
    by `row_norm`: the numbers of `block`."""
    cfg = ctx.cfg
    x = x + latent_attention(row_norm(x, w.attn_norm, cfg), w.attn, ctx, layer)     # (B, 1, d_model)
    return x + feed_forward(row_norm(x, w.ffn_norm, cfg), w.ffn, cfg)               # (B, 1, d_model)


def residual(x: np.ndarray, w: NormWeights | None, ctx: Context, layer: int, box, *args, after=None, keep=None,
             names: tuple[str, str] = ("attn_norm_scale", "attn_in")) -> tuple[np.ndarray, np.ndarray]:
    """One residual step of a block: (the stream after it, what joined it).

        pre-norm (GPT-2, Llama, T5)    x + After(Box(Norm(x)))     no Norm (OLMo 2): x + After(Box(x))
        post-norm (BERT, Marian, BART) Norm(x + After(Box(x)))
    ctx: the Context whose recorder and hooks see the step (a decoder's cross-attention: its own, `cross`);
    NAMES: the points the norm's scale and what the box reads are recorded and hooked as.
    After: what the box's output goes through before it joins the stream — its own norm (OLMo 2), the
    multiplier and the hooks on it (`after_box`); None: nothing. keep: (tape, layer, name) to keep the norm's
    input for its backward (training); None: nothing kept."""
    scale, reads = names
    post = ctx.cfg.norm_place == "post"
    if keep is not None and not post:
        keep[0].put(keep[1], keep[2], x)
    h = x if post or w is None else normalise(x, w, ctx, layer, scale)       # (B, n, d_model) what the box reads
    out = box(seen(ctx, layer, reads, h), *args)
    out = out if after is None else after(out)
    if not post:
        return x + out, out                                  # (B, n, d_model) each
    r = x + out                                              # (B, n, d_model) what the norm reads
    if keep is not None:
        keep[0].put(keep[1], keep[2], r)
    return normalise(r, w, ctx, layer, scale), out


def seen(ctx: Context, layer: int, name: str, value: np.ndarray) -> np.ndarray:
    """VALUE at the point NAME of the pass (qkv.core.trace.INTERMEDIATES): after the hooks on it, recorded."""
    if ctx.hooks is not None:
        value = ctx.hooks(layer, name, value)
    ctx.rec.put(layer, name, value)
    return value


def after_box(out_norm: NormWeights | None, hooks: Hooks | None, layer: int, name: str, cfg: ModelConfig,
              tape: Tape | None = None, rec: Recorder | None = None):
    """The output norm (OLMo 2), the residual multiplier (Granite: × m) and then the hooks on NAME, as one
    function of a box's output; None when there are none of them (the fast path). What it returns is what
    joins the stream and what the trace records as NAME. tape: keeps the output norm's input as
    (layer, NAME + "_norm") for its backward. The output norm's scale is recorded (REC) and hooked as
    NAME + "_norm_scale" (qkv.core.trace.OUT_NORMS), as `normalise` does the other norms'."""
    hooked = hooks is not None and hooks.wants(layer, name)
    if out_norm is None and not hooked and cfg.residual_multiplier == 1:
        return None
    scale = name + "_norm_scale"

    def after(out: np.ndarray) -> np.ndarray:
        if tape is not None and out_norm is not None:
            tape.put(layer, name + "_norm", out)
        out = joined(out if out_norm is None else norm_hooked(out, out_norm, cfg, hooks, rec, layer, scale), cfg)
        return hooks(layer, name, out) if hooked else out
    return after


def block(x: np.ndarray, w: BlockWeights, ctx: Context, layer: int) -> np.ndarray:
    """One transformer block (guide: block): attention, then (an encoder–decoder's decoder) cross-attention
    reading the encoder's output, then the FFN, each a residual step with its norm. Each point of it is hooked
    and recorded under its name (qkv.core.trace.INTERMEDIATES: residual, attn_in, residual_mid, ffn_in,
    residual_out, the norms' scales, and inside the boxes q, k, v, …). DeBERTa-v2's first block (w.conv) adds a
    convolution of its input to its output and normalises the sum (blocks.conv_beside): residual_out is after it."""
    cfg, hooks = ctx.cfg, ctx.hooks
    if ctx.one_step:
        if x.dtype == np.float32 and step_compiled.takes(w, ctx):
            return step_compiled.step(x, w, ctx, layer)
        return step_block(x, w, ctx, layer)
    x = x_in = seen(ctx, layer, "residual", x)
    tape = ctx.tape
    after_attn = after_box(w.attn_out_norm, hooks, layer, "attn_out", cfg, tape, ctx.rec)
    after_ffn = after_box(w.ffn_out_norm, hooks, layer, "ffn_out", cfg, tape, ctx.rec)
    if cfg.parallel_residual:
        return parallel_block(x, w, ctx, layer, after_attn, after_ffn)
    box = latent_attention if cfg.latent else attention      # DeepSeek's MLA: its own box (core/latent.py)
    x, a = residual(x, w.attn_norm, ctx, layer, box, w.attn, ctx, layer, after=after_attn,
                    keep=None if tape is None else (tape, layer, "attn_norm"))
    if w.cross_attn is not None:                             # the cross-attention's own trace keeps its step:
        cross = ctx.cross                                    # the stream it starts from ("residual"), what it reads
        x, c = residual(seen(cross, layer, "residual", x), w.cross_norm, cross, layer, attention, w.cross_attn,
                        cross, layer, after=after_box(w.cross_out_norm, cross.hooks, layer, "attn_out", cfg,
                                                      cross.tape, cross.rec),   # T5Gemma: its output norm
                        keep=None if tape is None else (tape, layer, "cross_norm"))
        cross.rec.put(layer, "attn_out", c)
    x = seen(ctx, layer, "residual_mid", x)
    x, f = residual(x, w.ffn_norm, ctx, layer, feed_forward, w.ffn, cfg, tape, layer, ctx.rec, hooks, after=after_ffn,
                    keep=None if tape is None else (tape, layer, "ffn_norm"), names=("ffn_norm_scale", "ffn_in"))
    ctx.rec.put(layer, "attn_out", a)
    ctx.rec.put(layer, "ffn_out", f)
    if w.conv is not None:                                   # DeBERTa-v2: Norm(x + act(conv(block input))), layer 0
        x = conv_beside(x_in, x, w, cfg, None if ctx.mask.key_mask is None else ctx.mask.key_mask[:, -x.shape[1]:],
                        tape, layer)
    return seen(ctx, layer, "residual_out", x)               # (B, n, d_model)


def parallel_block(x: np.ndarray, w: BlockWeights, ctx: Context, layer: int, after_attn, after_ffn) -> np.ndarray:
    """A parallel residual (GPT-NeoX, Phi, GPT-J, Cohere): x + Attn(Norm₁(x)) + FFN(Norm₂(x)), both branches
    reading the block's input (Phi: one norm read by both). No stream lies between them: residual_mid is
    recorded as x + attn_out for reading (qkv.core.hooks refuses a hook on it)."""
    cfg, tape, rec = ctx.cfg, ctx.tape, ctx.rec
    if tape is not None:
        tape.put(layer, "attn_norm", x)                      # both norms read x (their backward's input)
    h = normalise(x, w.attn_norm, ctx, layer, "attn_norm_scale")   # (B, n, d_model)
    a = (latent_attention if cfg.latent else attention)(seen(ctx, layer, "attn_in", h), w.attn, ctx, layer)
    a = a if after_attn is None else after_attn(a)
    if rec.wants(layer, "residual_mid"):
        rec.put(layer, "residual_mid", x + a)                # (B, n, d_model) read only: no box reads it
    h = h if w.ffn_norm is None else normalise(x, w.ffn_norm, ctx, layer, "ffn_norm_scale")
    f = feed_forward(seen(ctx, layer, "ffn_in", h), w.ffn, cfg, tape, layer, rec, ctx.hooks)
    f = f if after_ffn is None else after_ffn(f)
    rec.put(layer, "attn_out", a)
    rec.put(layer, "ffn_out", f)
    return seen(ctx, layer, "residual_out", (f + a) + x)     # (B, n, d_model), transformers' order of the sum
