"""Multi-head latent attention (MLA: DeepSeek-V2, DeepSeek-AI 2024, §2.1; V3), the attention box of a config with
cfg.latent (core/layer.py takes it in place of blocks.attention; its backward is blocks_backward.latent_attention):

    X ─▶ x·W_Q (─▶ Norm ─▶ ·W_Q_b)                       ─▶ Q = [q_nope | RoPE(q_rot)]  per head
      ─▶ x·W_V ─▶ Norm = c ──(KV cache)──▶ c·W_KV_b = [K_nope | V]  per head
      ─▶ x·W_K ─▶ RoPE = k_R ──(KV cache)──▶ K = [K_nope | k_R], k_R shared by the heads
    softmax(Q·Kᵀ·scale + M)·V ─▶ Concat(Z)·W_O

Each head's K and V come from one latent c per token (kv_lora_rank numbers) and one turned key part, which is all a
KV cache keeps (core/cache.py); every pass expands them again, as transformers' DeepSeek does.
"""

from __future__ import annotations

import numpy as np

from .attention import attention_output, attention_top, attention_weights, merge_heads, scaled_dot_product_attention, \
    split_heads, top_of
from .blocks import linear, projections
from .blocks_backward import AttentionTape
from .config import ModelConfig
from .context import Context
from .ops import rms_norm
from .positions import apply_rope
from .weights import AttentionWeights
from ..runtime.errors import QkvError


def latent_attention(x: np.ndarray, w: AttentionWeights, ctx: Context, layer: int) -> np.ndarray:
    """Multi-head latent attention (MLA: DeepSeek-V2, DeepSeek-AI 2024, §2.1): every head's K and V come from one
    latent per token, so a KV cache keeps r_kv + d_rot numbers a token and layer instead of H·(d_k + d_v):

        c = Norm(x·W_V + b_V)                  the K/V latent (B, n, r_kv): what the cache keeps
        k_R = RoPE(x·W_K + b_K)                one turned key part shared by every head (B, n, d_rot)
        [K_nope,h | V_h] = c·W_KV_b            each head's unturned key part and its value
        K_h = [K_nope,h | k_R],   Q_h = [q_nope,h | RoPE(q_rot,h)],   q = x·W_Q, or Norm(x·W_Q + b_Q)·W_Q_b
        Z_h = softmax(Q_h·K_hᵀ·scale + M)·V_h,   out = Concat(Z)·W_O + b_O

    RoPE turns each head's last rotary_dim numbers (pairs laid out as cfg.rope_interleaved / rope_deinterleave
    say); scale is cfg.attn_scale (YaRN's mscale² folded in by the family). A is an ordinary (B, H, n, m) softmax,
    recorded and hooked as attention's; q, k, v are the expanded heads (k (B, H, m, d_k), v (B, H, m, d_v)),
    k_pre_rope the new keys before RoPE (recorded when asked for). A hook on k_pre_rope, or on k or v with a KV
    cache (which keeps the latent, not K and V), is refused. tape: keeps an AttentionTape with the latents before
    their norms for the backward (blocks_backward.latent_attention)."""
    cfg, rec, scale, hooks = ctx.cfg, ctx.rec, ctx.scale, ctx.hooks
    mask, rope = ctx.mask_of(layer), ctx.rope_of(layer)
    d_nope = cfg.d_head - cfg.rotary_dim
    if hooks is not None and (hooks.wants(layer, "k_pre_rope") or ctx.cache is not None and (
            hooks.wants(layer, "k") or hooks.wants(layer, "v"))):
        raise QkvError(f"layer {layer} is multi-head latent attention: its keys and values are made from a latent "
                       "after the KV cache (there is no k before RoPE to replace); hook q, scores, attentions or "
                       "heads, or k and v in a pass without a cache")
    q, k_rot, c = projections(x, w)                           # (B, n, H·d_k or r_q), (B, n, d_rot), (B, n, r_kv)
    latent = (None if w.W_Q_b is None else q, c[:, None])     # before their norms: what a tape keeps
    if w.W_Q_b is not None:                                   # q through a latent of its own
        q = linear(rms_norm(q, w.q_latent_norm.weight, cfg.latent_norm_eps), w.W_Q_b)   # (B, n, H·d_k)
    c = rms_norm(c, w.kv_latent_norm.weight, cfg.latent_norm_eps)[:, None]   # (B, 1, n, r_kv)
    k_rot = k_rot[:, None]                                    # (B, 1, n, d_rot) one "head" for all
    q = split_heads(q, cfg.n_heads)                           # (B, H, n, d_k)
    if hooks is not None:
        q = hooks(layer, "q_pre_rope", q)
    rec.put(layer, "q_pre_rope", q)
    if rec.wants(layer, "k_pre_rope"):
        rec.put(layer, "k_pre_rope", latent_keys(c, k_rot, w, cfg)[0])   # (B, H, n, d_k) before RoPE
    if rope is not None:
        q = np.concatenate([q[..., :d_nope], latent_rope(q[..., d_nope:], rope, cfg)], axis=-1)   # (B, H, n, d_k)
        k_rot = latent_rope(k_rot, rope, cfg)                 # (B, 1, n, d_rot)
    if ctx.cache is not None:
        c, k_rot = ctx.cache.append(layer, c, k_rot)          # (B, 1, m, r_kv), (B, 1, m, d_rot) past + new
    k, v = latent_keys(c, k_rot, w, cfg)                      # (B, H, m, d_k), (B, H, m, d_v)
    if hooks is not None:
        q, k, v = hooks.qkv(layer, q, k, v)
    want = rec.wants(layer, "attentions") or rec.wants(layer, "scores")
    if hooks is not None and hooks.on_weights(layer):         # S or A hooked: step by step, plain
        z, a, s = hooks.attention(layer, q, k, v, mask, rec, scale)
    elif want and rec.heads is None and not rec.beside or ctx.tape is not None:   # every head's weights (a tape
        z, a, s = scaled_dot_product_attention(q, k, v, mask.bias(q.dtype),           # keeps A): the plain path
                                               keep_scores=rec.wants(layer, "scores"), scale=scale)
    else:
        z = attention_output(q, k, v, mask, scale)            # (B, H, n, d_v) plain or tiled
        heads = rec.heads if rec.heads is not None else range(cfg.n_heads)
        a, s = attention_weights(q, k, mask, heads, scale=scale) if want else (None, None)
    if ctx.ablate is not None:                                # (B, H, n, d_v) ablated heads replaced
        z = ctx.ablate.apply(layer, z, None if mask.key_mask is None else mask.key_mask[:, -z.shape[2]:])
    if hooks is not None:
        z = hooks(layer, "heads", z)
    for name, value in (("q", q), ("k", k), ("v", v), ("scores", s), ("attentions", a), ("heads", z)):
        rec.put(layer, name, value)
    if rec.wants(layer, "attention_top"):
        rec.put(layer, "attention_top", top_of(a, rec.top) if a is not None and rec.heads is None
                else attention_top(q, k, mask, rec.top, scale=scale))
    z = merge_heads(z)                                        # (B, n, H·d_v) Concat(Z)
    if ctx.tape is not None:                                  # what the backward reads (blocks_backward)
        ctx.tape.put(layer, "attn", AttentionTape(x, q, k, v, a, z, rope, latent=latent))
    return linear(z, w.W_O, w.b_O)                            # (B, n, d_model) Concat(Z)·W_O + b_O


def latent_keys(c: np.ndarray, k_rot: np.ndarray, w: AttentionWeights, cfg: ModelConfig) -> tuple[np.ndarray, np.ndarray]:
    """Every head's K and V from MLA's latent c (B, 1, m, r_kv) and shared key part k_rot (B, 1, m, d_rot):
    [K_nope,h | V_h] = c·W_KV_b, K_h = [K_nope,h | k_rot] → K (B, H, m, d_k), V (B, H, m, d_v)."""
    d_nope = cfg.d_head - cfg.rotary_dim
    kv = split_heads(linear(c[:, 0], w.W_KV_b), cfg.n_heads)   # (B, H, m, d_nope + d_v)
    k = np.empty(kv.shape[:3] + (cfg.d_head,), kv.dtype)       # (B, H, m, d_k)
    k[..., :d_nope] = kv[..., :d_nope]
    k[..., d_nope:] = k_rot                                    # the same for every head
    return k, kv[..., d_nope:]


def latent_rope(x: np.ndarray, rope: tuple[np.ndarray, np.ndarray], cfg: ModelConfig) -> np.ndarray:
    """RoPE of MLA's turned part x (…, d_rot): pairs (2i, 2i+1) in place (cfg.rope_interleaved: DeepSeek V2), pairs
    (i, i + d/2) (V3 without rope_interleave), or pairs (2i, 2i+1) laid out as halves first (rope_deinterleave: V3's
    rope_interleave, [x_0, x_2, …, x_1, x_3, …], so the turned numbers come out as halves, as transformers'
    apply_rotary_pos_emb_interleave writes them)."""
    if cfg.rope_deinterleave:
        x = np.concatenate([x[..., 0::2], x[..., 1::2]], axis=-1)   # (…, d_rot)
    return apply_rope(x, *rope, cfg.rope_interleaved)
