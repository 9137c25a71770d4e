"""Every box of every architecture, once (guide: block): the functions that compute one box of the
forward pass (core/layer.py composes them into a block, recording and hooking each point of it).

    X ─▶ Norm ─▶ Q, K, V = X·W_Q, X·W_K, X·W_V ─▶ softmax(Q·Kᵀ/√d_k + M)·V = Z ─▶ Concat(Z)·W_O ─▶ + X
      (─▶ Norm ─▶ cross-attention: Q from X, K, V from the encoder's output ─▶ + X)
      ─▶ Norm ─▶ FFN ─▶ + X                        (pre-norm; post-norm puts Norm after each +)

A family is knob values read by these boxes, each in one place: post- or pre-norm, no norm before a
box and one after it (OLMo 2), a parallel residual (GPT-NeoX, Phi, GPT-J, Cohere), partial RoPE and RoPE
by interleaved pairs (GPT-J, Cohere), q/k norms (Qwen3, Phi, OLMo 2; StableLM's and Cohere's one per head),
an embedding narrower than the stream mapped in and out (OPT-350m: embed_in in `embed`, `unembed_in` after
the final norm), T5's position bias and unscaled scores, ALiBi's bias (BLOOM, Falcon, MPT), Granite's
multipliers (embeddings, each box's output before the stream, scores, logits; Cohere's logit scale), the
encoder–decoder's cross-attention, norms before and after each box (Gemma 2/3), layers of different kinds
(each its own window's mask and its own rotation: Context.mask_of, rope_of), soft-capped scores and logits
(Gemma 2), a routed FFN among experts (Mixtral, Qwen2-MoE; DeepSeek-V3's σ router with its choice bias and groups:
`route`, `routed_feed_forward`, read through `feed_forward`), DeBERTa's disentangled attention (its c2p and p2c
score tables added to S as the mask's position bias: core/disentangled.py). Each box
is called as box(x, w, …) with `w` the weights of that box; `Context` (core/context.py) carries the config, the mask,
the rotation of positions, the recorder, the KV cache, the ablation, the hooks, and for training the
tape that blocks_backward.py (each box's backward, under the same name) reads. `logits_of` is the last
box, H·W_vocab (H: the final norm of the stream). core/stack.py composes the blocks into whole passes.

Shapes: B rows of n tokens (with a KV cache, the n new ones after the past; m keys in all),
d_model wide. x (B, n, d_model); Q (B, H, n, d_k); K, V (B, Hkv, m, d_k) (Hkv < H: grouped
queries share them); S, A (B, H, n, m); Z (B, H, n, d_k); FFN hidden (B, n, d_ff);
logits (B, n, V).
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Callable

import numpy as np

from .attention import (AttentionMask, attention_output, attention_top, attention_weights, merge_heads, top_of,
                        scaled_dot_product_attention, soft_cap_, split_heads)
from .blocks_backward import (AttentionTape, EmbedTape, FFNTape, HeadTape, MoETape, Tape, mask_dropout_scale,
                              top_k_denominator)
from .config import ModelConfig
from .context import Context
from .disentangled import disentangled_mask
from ..runtime import llama_arith
from ..runtime.errors import QkvError
from .hooks import Hooks
from .ops import ACTIVATIONS, clamped_glu, layer_norm, rms_norm, sigmoid, softmax, xielu
from .positions import alibi_bias, alibi_slopes, apply_rope
from .sparse_layers import SparseMask, global_rows, sparse_layer_attention, sparse_mask
from .trace import Recorder
from .weights import AttentionWeights, BlockWeights, ConvWeights, FFNWeights, MoEWeights, NormWeights, Weights


# ── the boxes ────────────────────────────────────────────────────────────────────

def linear(x: np.ndarray, W: np.ndarray, b: np.ndarray | None = None) -> np.ndarray:
    """x·W + b over the last axis, as one GEMM over all B·n rows."""
    y = x.reshape(math.prod(x.shape[:-1]), x.shape[-1]) @ W   # (B·n, out); not -1: `in` may be 0 (d_ff = 0)
    if b is not None:
        y += b
    return y.reshape(*x.shape[:-1], W.shape[1])          # (B, n, out)


def norm(x: np.ndarray, w: NormWeights, cfg: ModelConfig) -> np.ndarray:
    """LayerNorm or RMSNorm, as the config says. γ, β of shape (H, d_k) (StableLM's q/k norms, one LayerNorm
    per head) normalise x (B, H, n, d_k) head by head: head h's d_k numbers by γ[h], β[h]. With llama.cpp's
    arithmetic (cfg.arith) RMSNorm is ggml's: x·(1/√(mean + eps))·γ, Σx² in float64 (llama_arith.rms_norm)."""
    g, b = w.weight, w.bias
    if g.ndim == 2:
        g, b = g[:, None], None if b is None else b[:, None]     # (H, 1, d_k): broadcast over the n positions
    if cfg.norm == "rms":
        if cfg.arith == "llama.cpp":
            return llama_arith.rms_norm(x, g, cfg.norm_eps)
        return rms_norm(x, g, cfg.norm_eps)
    return layer_norm(x, g, b, cfg.norm_eps)


def norm_scale(x: np.ndarray, cfg: ModelConfig) -> np.ndarray:
    """s (…,) of x (…, d): what `norm` divides each row by, √(mean(x²) + eps) (RMSNorm) or √(var(x) + eps)
    (LayerNorm), with the very float operations of qkv.core.ops.rms_norm and layer_norm (so `norm_by(x, s)` is
    `norm(x)` to the bit): what a pass records as attn_norm_scale, ffn_norm_scale and final_norm_scale."""
    if cfg.norm == "rms":
        ms = np.add.reduce(x * x, axis=-1, keepdims=True)     # (…, 1) Σ x²
        ms /= x.shape[-1]                                     # mean(x²)
        ms += float(cfg.norm_eps)
        return np.sqrt(ms, out=ms)[..., 0]                    # (…,)
    xc = x - x.mean(axis=-1, keepdims=True)                   # (…, d)
    return np.sqrt(np.mean(xc * xc, axis=-1, keepdims=True) + float(cfg.norm_eps))[..., 0]   # (…,)


def norm_by(x: np.ndarray, s: np.ndarray, w: NormWeights, cfg: ModelConfig) -> np.ndarray:
    """`norm` of x (…, d) dividing by a given s (…,) (a hooked norm_scale): x / s · γ (RMSNorm), (x − mean) / s
    · γ + β (LayerNorm); with s = norm_scale(x) the same numbers as norm(x)."""
    y = (x if cfg.norm == "rms" else x - x.mean(axis=-1, keepdims=True)) / s[..., None]   # (…, d)
    y *= w.weight
    if cfg.norm != "rms" and w.bias is not None:
        y += w.bias
    return y


def embed(weights: Weights, cfg: ModelConfig, ids: np.ndarray, positions: np.ndarray,
          token_type_ids: np.ndarray | None = None, tape: Tape | None = None,
          tokens: np.ndarray | None = None) -> np.ndarray:
    """X = E[ids]·s + P[positions + offset] (+ T[types]), then LayerNorm (BERT, BART), then ·W_embed + b_embed
    where the tables are E wide (ELECTRA) (guide: embeddings), with s = cfg.embed_scale (√d_model: Marian, Gemma;
    Granite's embedding_multiplier; none: 1). positions (B, n) or (n,); T5 has no table: its positions enter
    the scores. A table narrower than d_model (OPT-350m) is mapped to it first: X = E[ids]·s·embed_in + P[…].
    tape: where to keep what the backward reads (blocks_backward.embed); None: nothing kept.
    tokens: the token embeddings E[ids]·s to use instead (B, n, d_embed), as input attribution scales them.
    An image model (ViT, weights.W_patch) reads TOKENS as its image's patches, flattened (B, n − 1, C·p_h·p_w):
    X = [E[0]; patches·W_patch + b_patch] + P, [CLS] first (the patch convolution as one product)."""
    if weights.front is not None:                        # Whisper: log-mel frames (B, T, mels) through the convolutions
        if tape is not None:
            raise QkvError("backpropagation through an audio encoder's convolutions is not in qkv; "
                           "train or attribute a text model")
        x = np.asarray(tokens, dtype=weights.tok_embed.dtype)
        for conv in weights.front:
            x = ACTIVATIONS["gelu"](convolve(x, conv))   # (B, T / stride, C_out): transformers' F.gelu, the erf one
        return x + weights.pos_embed[positions]          # a fixed sinusoidal table, stored (Whisper's encoder)
    if weights.W_patch is not None:
        tokens = np.asarray(tokens, dtype=weights.tok_embed.dtype)                   # (B, P, C·p·p), as the tape keeps it
        x = linear(tokens, weights.W_patch, weights.b_patch)                          # (B, P, d_model)
        if cfg.class_token:                                                           # SigLIP: none
            cls = np.broadcast_to(weights.tok_embed[0], (len(tokens), 1, weights.tok_embed.shape[1]))   # (B, 1, d)
            x = np.concatenate([cls, x], axis=1)                                      # (B, 1 + P, d_model)
    elif tokens is None:
        x = weights.tok_embed[ids]                       # (B, n, d_model) a copy; (B, n, d_embed) with embed_in, (B, n, E) with W_embed
        if cfg.embed_scale is not None:
            x *= cfg.embed_scale                         # Marian: E·√d, Granite: E·m
    else:
        x = np.array(tokens, dtype=weights.tok_embed.dtype)      # (B, n, d_embed) E[ids]·s given
    if cfg.mask_dropout_id is not None and ids is not None:
        x = mask_dropout(x, ids, cfg)                    # ESM: <mask> rows zeroed, rows rescaled
    if weights.embed_in is not None:
        x = linear(x, weights.embed_in)                  # (B, n, d_model) OPT's project_in
    if weights.pos_embed is not None:                    # learned or sinusoidal table
        x += weights.pos_embed[positions + cfg.position_offset if cfg.position_offset else positions]  # BART: row p + 2
    if weights.type_embed is not None:
        types = np.zeros_like(ids) if token_type_ids is None else token_type_ids
        x += weights.type_embed[types]
    if tape is not None:                                 # the table rows looked up, as (B, n)
        rows = np.broadcast_to(positions + cfg.position_offset if cfg.position_offset else positions, ids.shape)
        record = EmbedTape(ids, rows, token_type_ids, None if weights.embed_norm is None else x, tokens=tokens)
        tape.put(None, "embed", record)
    if weights.embed_norm is not None:
        x = norm(x, weights.embed_norm, cfg)
    if weights.W_embed is not None:                      # ELECTRA: E-wide tables, projected after their norm
        if tape is not None:
            record.proj_in = x                           # what the projection read, for its backward
        x = linear(x, weights.W_embed, weights.b_embed)  # (B, n, E) → (B, n, d_model)
    return x


def mask_dropout(x: np.ndarray, ids: np.ndarray, cfg: ModelConfig) -> np.ndarray:
    """ESM's token_dropout at inference: X = E[ids]·s with the rows of <mask> (cfg.mask_dropout_id) zeroed, each
    row ÷ (1 − r), r = its <mask> ids / its real ids (those not pad_token_id: the attention mask transformers
    counts). With s = 1 − 0.15·0.8 (cfg.embedding_multiplier) the model sees, without masks, the scale training's
    masking gave it on average (transformers' EsmEmbeddings). x (B, n, d), ids (B, n) → (B, n, d); the factor
    per row is blocks_backward.mask_dropout_scale, which the backward multiplies by too."""
    if not (ids == cfg.mask_dropout_id).any():
        return x
    return x * mask_dropout_scale(ids, cfg)[..., None].astype(x.dtype)   # (B, n, d)


def convolve(x: np.ndarray, w: ConvWeights) -> np.ndarray:
    """A 1-D convolution over time, x (B, T, C_in) → (B, T_out, C_out), T_out = (T + 2·padding − kernel) // stride + 1:
    each output step's KERNEL input frames side by side (B, T_out, kernel·C_in), times W, + b."""
    B, T, C = x.shape
    padded = np.pad(x, ((0, 0), (w.padding, w.padding), (0, 0)))              # zeros outside the input
    T_out = (T + 2 * w.padding - w.kernel) // w.stride + 1
    windows = np.concatenate([padded[:, j:j + w.stride * (T_out - 1) + 1:w.stride] for j in range(w.kernel)],
                             axis=-1)                                        # (B, T_out, kernel·C_in)
    return linear(windows, w.W, w.b)                                         # (B, T_out, C_out)


def conv_activation(name: str) -> Callable[[np.ndarray], np.ndarray]:
    """act of DeBERTa-v2's first-layer convolution (cfg.first_conv[1], transformers' conv_act): an FFN activation,
    or tanh (its default)."""
    return np.tanh if name == "tanh" else ACTIVATIONS[name]


def conv_beside(x: np.ndarray, y: np.ndarray, w: BlockWeights, cfg: ModelConfig, real: np.ndarray | None,
                tape: Tape | None = None, layer: int = 0) -> np.ndarray:
    """DeBERTa-v2's convolution beside its first layer: out = Norm(y + act(conv(x ⊙ m) ⊙ m)) ⊙ m, x the block's input
    and y its output (B, n, d_model), conv a 1-D convolution over the positions (kernel k, padding (k − 1)/2, as one
    product: `convolve`), m the real tokens (REAL (B, n), None: all), as transformers' ConvLayer zeroes the padding.
    tape: keeps (x ⊙ m, conv's output, the norm's input, m) as (layer, "conv") for the backward."""
    m = None if real is None else real[..., None].astype(x.dtype)              # (B, n, 1)
    xm = x if m is None else x * m                                              # (B, n, d_model)
    c = convolve(xm, w.conv)                                                    # (B, n, d_model)
    if m is not None:
        c *= m
    z = y + conv_activation(cfg.first_conv[1])(c)                               # (B, n, d_model)
    if tape is not None:
        tape.put(layer, "conv", (xm, c, z, m))
    out = norm(z, w.conv_norm, cfg)
    return out if m is None else out * m


def projections(x: np.ndarray, w: AttentionWeights) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Q = X·W_Q + b_Q, K = X·W_K + b_K, V = X·W_V + b_V (guide: qkv).

    Plain form: linear(x, w.W_Q, w.b_Q), linear(x, w.W_K, w.b_K), linear(x, w.W_V, w.b_V).
    With the weights laid out by qkv.core.layout it is one product, X·[W_Q | W_K | W_V], whose
    column blocks are Q, K and V: one pass over the weights instead of three (decoding is
    bound by how fast they stream).
    """
    if w.W_QKV is None:
        return linear(x, w.W_Q, w.b_Q), linear(x, w.W_K, w.b_K), linear(x, w.W_V, w.b_V)
    qkv = linear(x, w.W_QKV)                                  # (B, n, (H + 2·Hkv)·d_k)
    hq, hkv = w.W_Q.shape[1], w.W_K.shape[1]
    q, k, v = qkv[..., :hq], qkv[..., hq:hq + hkv], qkv[..., hq + hkv:]    # views
    for y, b in ((q, w.b_Q), (k, w.b_K), (v, w.b_V)):
        if b is not None:
            y += b
    return q, k, v


def attention(x: np.ndarray, w: AttentionWeights, ctx: Context, layer: int) -> np.ndarray:
    """MultiHead(X) = Concat_h softmax(Q_h·K_hᵀ/√d_k + M)·V_h · W_O (guide: qkv to heads).

    Self-attention: Q, K, V all from X. With a KV cache, X holds only the new tokens; their K, V
    join the cached past. Cross-attention (ctx.memory, an encoder–decoder's decoder): Q = X·W_Q
    from the decoder's n_tgt rows, K and V the encoder output's (computed once, `cross_memory`),
    so A is (B, H, n_tgt, n_src): row i says which source tokens target token i reads.
    The weights A are only materialised when the recorder keeps them (for the heads it
    asks for); otherwise long inputs take the tiled path, which never holds n × n scores.
    """
    cfg, rec, scale = ctx.cfg, ctx.rec, ctx.scale
    mask, rope = (ctx.mask, None) if ctx.memory is not None else (ctx.mask_of(layer), ctx.rope_of(layer))
    cap = cfg.attn_softcap                                    # Gemma 2, T5Gemma (its cross-attention's too):
                                                              # S = c·tanh(S/c) before the mask
    sink = w.sinks if cfg.attn_sinks else None                # gpt-oss: (H,) sink logits in the softmax; None: none
    if w.rel_bias is not None:                                # UMT5: this layer's own table, B[h, i, j] = T[bucket, h]
        mask = replace(mask, position_bias=w.rel_bias[ctx.rel_buckets].transpose(2, 0, 1)[None], _bias={})
    pre = None                                                # q, k before their norms, for a tape
    if ctx.memory is None:
        q, k, v = projections(x, w)                           # (B, n, H·d_k), (B, n, Hkv·d_k) × 2
        if cfg.qk_norm == "all":                              # OLMo 2: over the whole projection, before the heads
            pre = (q, k)
            q, k = norm(q, w.q_norm, cfg), norm(k, w.k_norm, cfg)
        k = split_heads(k, cfg.n_kv_heads)                    # (B, Hkv, n, d_k)
        v = split_heads(v, cfg.n_kv_heads)                    # (B, Hkv, n, d_k)
    else:
        q = linear(x, w.W_Q, w.b_Q)                           # (B, n_tgt, H·d_k)
        k, v = ctx.memory[layer]                              # (B, Hkv, n_src, d_k) each
    q = split_heads(q, cfg.n_heads)                           # (B, H, n, d_k)
    if cfg.qk_norm == "head" and not cfg.qk_norm_after_rope:   # Qwen3, Phi: each head's q and k normalised
        pre = (q, k)
        q, k = norm(q, w.q_norm, cfg), norm(k, w.k_norm, cfg)   # over d_k, before RoPE
    hooks = ctx.hooks                                         # None: no hook anywhere (the fast path)
    if hooks is not None:
        q, k = hooks(layer, "q_pre_rope", q), hooks(layer, "k_pre_rope", k)
    rec.put(layer, "q_pre_rope", q)
    rec.put(layer, "k_pre_rope", k)
    if rope is not None:
        q, k = apply_rope(q, *rope, cfg.rope_interleaved), apply_rope(k, *rope, cfg.rope_interleaved)   # by position
    if cfg.qk_norm_after_rope:                                # Hunyuan: each head's q and k normalised once turned
        pre = (q, k)
        q, k = norm(q, w.q_norm, cfg), norm(k, w.k_norm, cfg)   # (B, H, n, d_k), (B, Hkv, n, d_k)
    q, k, pre = llama4_qk(q, k, pre, rope is not None, ctx)    # Llama 4: L2 norms (RoPE layers), temperature (NoPE)
    if hooks is not None:
        q, k, v = hooks.qkv(layer, q, k, v)                   # the new positions', before the cache
    if ctx.cache is not None:
        k, v = ctx.cache.append(layer, k, v)                  # (B, Hkv, m, d_k) past + new
    if cfg.disentangled is not None and ctx.memory is None:   # DeBERTa: S = Q·Kᵀ·s + (c2p + p2c), the terms
        mask = disentangled_mask(q, k, w, ctx, layer, mask)   # as the mask's position bias
    want = rec.wants(layer, "attentions") or rec.wants(layer, "scores")
    top = None                                                # each row's largest weights, where a kernel gives them
    if hooks is not None and hooks.on_weights(layer):         # S or A hooked: step by step, plain
        z, a, s = hooks.attention(layer, q, k, v, mask, rec, scale, cap, sink)
    elif want and rec.heads is None and not rec.beside or ctx.tape is not None:   # every head's weights (a tape
        z, a, s = scaled_dot_product_attention(q, k, v, mask.bias(q.dtype),         # keeps A): the plain path
                                               keep_scores=rec.wants(layer, "scores"), scale=scale, cap=cap, sink=sink)
    elif isinstance(mask, SparseMask):                        # Longformer's global tokens, BigBird's blocks: each
        z, a, s, top = sparse_layer_attention(                # block of queries with only the keys it reads
            q, k, v, mask, scale=scale, cap=cap, sink=sink, scores=rec.wants(layer, "scores"),
            heads=(rec.heads if rec.heads is not None else range(cfg.n_heads)) if want else None,
            top=rec.top if rec.wants(layer, "attention_top") else None)
    else:
        z = attention_output(q, k, v, mask, scale, cap, sink=sink)   # (B, H, n, d_k) plain or tiled
        heads = rec.heads if rec.heads is not None else range(cfg.n_heads)
        a, s = attention_weights(q, k, mask, heads, scale=scale, cap=cap, sink=sink) if want else (None, None)
    if cfg.global_tokens and ctx.memory is None:              # Longformer: the global rows, their own Q, K, V
        if ctx.tape is not None:
            raise QkvError("gradients through Longformer's global tokens (training, gradient attributions) are not in "
                           "qkv (the global projections have no backward here): run without global tokens, or "
                           "attribute by occlusion")
        if hooks is not None and hooks.on_weights(layer):
            raise QkvError("a hook on Longformer's scores or weights would miss the global tokens' rows (computed "
                           "apart, from their own Q, K, V): hook the heads' output, or run without global tokens")
        z, a, s = global_rows(x, w, cfg, mask, z, a, s, rec.heads, top)   # (top: G's rows in place)
    if w.W_G is not None:                                     # Qwen3-Next: each head's Z gated, Z_h ⊙ σ(X·W_G + b_G)_h
        if ctx.tape is not None:
            raise QkvError("training through an attention output gate (Qwen3-Next) is not in qkv; use transformers")
        z = z * split_heads(sigmoid(linear(x, w.W_G, w.b_G)), cfg.n_heads)   # (B, H, n, d_k), what W_O reads
    if ctx.ablate is not None:                                # (B, H, n, d_k) ablated heads replaced
        z = ctx.ablate.apply(layer, z, ctx.query_mask if ctx.memory is not None
                             else None if mask.key_mask is None else mask.key_mask[:, -z.shape[2]:])
    if hooks is not None:
        z = hooks(layer, "heads", z)
    for name, value in (("q", q), ("k", k), ("v", v), ("scores", s), ("attentions", a), ("heads", z)):
        rec.put(layer, name, value)
    if rec.wants(layer, "attention_top"):                     # each row's largest weights: from A if it is there
        rec.put(layer, "attention_top", top if top is not None else top_of(a, rec.top)
                if a is not None and a.shape[1] == cfg.n_heads else attention_top(q, k, mask, rec.top, scale=scale,
                                                                                  cap=cap, sink=sink))
    z = merge_heads(z)                                        # (B, n, H·d_k) Concat(Z)
    if ctx.tape is not None:                                  # a learned bias (T5's, UMT5's, MPNet's), not ALiBi's
        learned = (mask.position_bias is not None and cfg.position != "alibi" and cfg.disentangled is None
                   and cfg.block_sparse is None)              # BigBird's blocks: a constant bias (sparse_mask)
        ctx.tape.put(layer, "attn", AttentionTape(x, q, k, v, a, z, rope, pre, learned,
                                                  relative=ctx.relative,    # DeBERTa: its terms' own backward
                                                  q_scale=None if rope is not None else ctx.temperature))
    return linear(z, w.W_O, w.b_O)                            # (B, n, d_model); its hook: the block's (`after`)


def llama4_qk(q: np.ndarray, k: np.ndarray, pre, turned: bool, ctx: Context):
    """Llama 4's q and k once RoPE turned them (or not): (q, k, pre), pre the tape's q, k before the norms.

        a layer RoPE turns (TURNED), with cfg.qk_l2_norm:   q, k = x / √(mean(x²) + eps) over each head's d_k, no γ
        a NoPE layer, with cfg.temperature_floor:           q = q · (1 + τ·log(1 + ⌊(p + 1)/F⌋)), ctx.temperature
                                                            (B, 1, n, 1) the factor of each query's position p
    Elsewhere q, k and pre come back as they came."""
    cfg = ctx.cfg
    if cfg.qk_l2_norm and turned:
        pre = (q, k)
        q, k = rms_norm(q, 1.0, cfg.norm_eps), rms_norm(k, 1.0, cfg.norm_eps)   # (B, H, n, d_k), (B, Hkv, n, d_k)
    elif ctx.temperature is not None and not turned:
        q = q * ctx.temperature                                  # (B, H, n, d_k)
    return q, k, pre


def cross_memory(encoded: np.ndarray, blocks: list[BlockWeights], cfg: ModelConfig) -> list[tuple[np.ndarray, np.ndarray]]:
    """Each decoder layer's cross-attention K = M·W_K + b_K and V = M·W_V + b_V of the encoder's output
    M (B, n_src, d_model): (B, Hkv, n_src, d_k) each, computed once per source and read by every step."""
    return [(split_heads(linear(encoded, b.cross_attn.W_K, b.cross_attn.b_K), cfg.n_kv_heads),
             split_heads(linear(encoded, b.cross_attn.W_V, b.cross_attn.b_V), cfg.n_kv_heads)) for b in blocks]


def activation_of(w: FFNWeights, cfg: ModelConfig) -> Callable[[np.ndarray], np.ndarray]:
    """act of the FFN W: the config's activation (ops.ACTIVATIONS), or xIELU with W's own learned scalars
    (cfg.activation "xielu": Apertus, ops.xielu), so every reader of a neuron's act(u) calls this one. In llama.cpp's
    arithmetic (cfg.arith) SiLU is ggml's (llama_arith.silu: its own e^x)."""
    if cfg.activation == "silu" and cfg.arith == "llama.cpp":
        return llama_arith.silu
    if cfg.activation != "xielu":
        return ACTIVATIONS[cfg.activation]
    p = w.xielu
    return lambda u: xielu(u, p.alpha_p, p.alpha_n, p.beta, p.eps)


def feed_forward(x: np.ndarray, w: FFNWeights | MoEWeights, cfg: ModelConfig, tape: Tape | None = None,
                 layer: int = 0, rec: Recorder | None = None, hooks: Hooks | None = None) -> np.ndarray:
    """FFN(x) = act(x·W_in + b)·W_out + b, or gated (SwiGLU): (act(x·W_gate + b_gate) ⊙ (x·W_in + b_in))·W_out + b_out
    (the biases where the model has them: Llama's mlp_bias); a MoE layer's
    (w a MoEWeights) is `routed_feed_forward`. The hidden h = act(x·W_in + b) (B, n, d_ff) is "neurons": h_i is
    neuron i's coefficient on its output vector W_out[i] (a key–value memory, Geva et al. 2021), hooked
    (`hooks`; a replacement is what W_out reads: neuron ablation) and then recorded (`rec`); what the activation
    reads, x·W_in + b (gated: x·W_gate + b_gate), is "ffn_pre", hooked and recorded before it. A MoE layer has
    no single d_ff hidden (each token's k experts have their own): it records none, and qkv.core.hooks
    refuses a hook on it. tape: where to keep what the backward reads, as (layer, "ffn"); None: nothing
    kept. rec: where the hidden, or a routed FFN's router choice, is recorded; None: nowhere."""
    if isinstance(w, MoEWeights):
        return routed_feed_forward(x, w, cfg, tape, layer, rec)
    act = activation_of(w, cfg)                              # the config's, or xIELU with w's scalars (Apertus)
    if w.W_gate_in is not None:                              # laid out by qkv.core.layout: one product,
        gate_in = linear(x, w.W_gate_in)                     # (B, n, 2·d_ff) = [x·W_gate | x·W_in]
        d_ff = w.W_in.shape[1]
        u, g = gate_in[..., d_ff:], gate_in[..., :d_ff]     # x·W_in, x·W_gate
        if w.b_in is not None:
            u += w.b_in
        if w.b_gate is not None:                             # Llama's mlp_bias: x·W_gate + b_gate
            g += w.b_gate
    else:
        u = linear(x, w.W_in, w.b_in)                        # (B, n, d_ff)
        g = None if w.W_gate is None else linear(x, w.W_gate, w.b_gate)
    if g is not None and cfg.ffn_gate_scale != 1:            # Falcon-H1: act((x·W_gate + b_gate)·m)
        g = g * cfg.ffn_gate_scale
    if hooks is not None and hooks.wants(layer, "ffn_pre"):  # what the activation reads, e.g. a neuron's input
        if g is None:
            u = hooks(layer, "ffn_pre", u)
        else:
            g = hooks(layer, "ffn_pre", g)
    if rec is not None:
        rec.put(layer, "ffn_pre", u if g is None else g)     # kept only when asked for (trace.OPT_IN)
    if g is None:
        h = act(u)
    elif cfg.glu_limit is not None:                          # gpt-oss: min(g, c)·σ(α·min(g, c)) ⊙ (clip(u, ±c) + 1)
        h = clamped_glu(g, u, cfg.glu_alpha, cfg.glu_limit)
    else:
        h = act(g)                                           # act(x·W_gate)
        h *= u                                               # ⊙ (x·W_in + b_in)
    if hooks is not None and hooks.wants(layer, "neurons"):
        h = hooks(layer, "neurons", h)                       # (B, n, d_ff) e.g. a neuron set to 0
    if tape is not None:
        tape.put(layer, "ffn", FFNTape(x, u, g, h))
    if rec is not None:
        rec.put(layer, "neurons", h)                         # kept only when asked for (trace.OPT_IN)
    del u, g                                                 # freed before the last product, unless kept
    return linear(h, w.W_out, w.b_out)                       # (B, n, d_model)


def route(x: np.ndarray, w: MoEWeights, cfg: ModelConfig) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The router of a MoE layer: x (N, d_model) → (s (N, E), chosen (N, k), weights (N, k)).

        s = softmax(x·W_router)         each token's probability of each expert (Mixtral, Qwen, Ernie 4.5; gpt-oss:
                                        x·W_router + b_router, the weights then = softmax of the top-k logits), or
            σ(x·W_router)               each expert's own score (cfg.router_score "sigmoid": DeepSeek-V3, dots1)
        r = s + b_choice                what the choice ranks (cfg.expert_choice_bias; else r = s)
            r of the experts outside the best expert_groups_kept groups = −∞, a group ranked by the sum of
            its two highest r (cfg.expert_groups > 1: DeepSeek-V3's group-limited choice, `kept_groups`)
        chosen = the k largest of r     highest first; among exactly equal ranks the lower expert first
                                        (torch.topk's order there is its sort's own; only a degenerate router,
                                        e.g. all zero, ties)
        weights = s[chosen] / D · c     D = max(Σ s[chosen], norm_top_k_min) (+ 1e-20 for sigmoid scores) where
                                        cfg.norm_top_k (Mixtral always), else D = 1; c = cfg.routed_scaling
    The bias and the groups steer which experts run, never how much each one's output weighs.
    """
    logits = x @ w.W_router                                      # (N, E)
    if w.b_router is not None:                                   # gpt-oss: x·W_router + b_router
        logits += w.b_router
    s = sigmoid(logits) if cfg.router_score == "sigmoid" else softmax(logits)   # (N, E)
    r = s if w.b_choice is None else s + w.b_choice              # (N, E) what the choice ranks
    if cfg.expert_groups > 1:
        r = np.where(kept_groups(r, cfg), r, -np.inf)            # (N, E) the experts of the other groups out
    chosen = np.argsort(-r, axis=-1, kind="stable")[:, :cfg.experts_per_token]   # (N, k)
    weights = np.take_along_axis(s, chosen, axis=-1)             # (N, k)
    if cfg.norm_top_k:
        weights = weights / top_k_denominator(weights, cfg)[0]
    if cfg.routed_scaling != 1:
        weights = weights * cfg.routed_scaling
    return s, chosen, weights


def kept_groups(r: np.ndarray, cfg: ModelConfig) -> np.ndarray:
    """Which experts (N, E) lie in the expert_groups_kept groups of highest score: the E experts in
    cfg.expert_groups groups of E/G in order, a group's score the sum of its two highest ranks r (N, E) (its highest:
    cfg.expert_group_score "max", DeepSeek-V2); among equal group scores the lower group first."""
    N, E = r.shape
    G = cfg.expert_groups
    groups = r.reshape(N, G, E // G)                             # (N, G, E/G)
    if cfg.expert_group_score == "max":
        score = groups.max(axis=-1)                              # (N, G)
    else:
        top2 = -np.partition(-groups, 1, axis=-1)[..., :2]       # (N, G, 2) each group's two highest
        score = top2.sum(axis=-1)                                # (N, G)
    best = np.argsort(-score, axis=-1, kind="stable")[:, :cfg.expert_groups_kept]   # (N, kept)
    keep = np.zeros((N, G), dtype=bool)
    np.put_along_axis(keep, best, True, axis=-1)
    return np.repeat(keep, E // G, axis=-1)                      # (N, E)


def routed_feed_forward(x: np.ndarray, w: MoEWeights, cfg: ModelConfig, tape: Tape | None = None, layer: int = 0,
                        rec: Recorder | None = None) -> np.ndarray:
    """MoE(x) = Σ_j w_j·FFN_{e_j}(x) over the k experts the router chose for each token (`route`) (Llama 4:
    Σ_j FFN_{e_j}(w_j·x), cfg.expert_input_scaled),
    + σ(x·W_shared_gate)·FFN_shared(x) with a shared expert (Qwen2-MoE; without its gate, cfg.shared_expert_gate
    false: + FFN_shared(x), DeepSeek, dots1, Ernie 4.5). Each expert is the gated FFN
    (`feed_forward`) run on the rows sent to it only, so a one-token step reads only its k experts'
    weights; the sum goes expert by expert, as transformers adds them. rec: records "router",
    "experts", "expert_weights"; tape: keeps (layer, "ffn") a MoETape for the backward."""
    shape = x.shape
    x2 = x.reshape(-1, shape[-1])                                # (N, d_model), N = B·n
    p, chosen, gate = route(x2, w, cfg)                          # (N, E), (N, k), (N, k)
    out = np.zeros_like(x2)                                      # (N, d_model)
    kept = []
    for e in np.unique(chosen):                                  # the experts some token went to, in order
        rows, slot = np.nonzero(chosen == e)                     # (r,) its tokens, and e's place in their k
        t = None if tape is None else Tape()
        g = gate[rows, slot][:, None]                            # (r, 1) its weight for each of its tokens
        if cfg.expert_input_scaled:                              # Llama 4: FFN_e(w·x), the input weighed
            y = feed_forward(x2[rows] * g, w.experts[e], cfg, t, layer)   # (r, d_model)
            out[rows] += y
        else:
            y = feed_forward(x2[rows], w.experts[e], cfg, t, layer)  # (r, d_model) FFN_e of its tokens
            out[rows] += y * g
        if t is not None:
            kept.append((int(e), rows, slot, t.pop(layer, "ffn"), y))
    shared = None
    if w.shared is not None:
        t = None if tape is None else Tape()
        s = feed_forward(x2, w.shared, cfg, t, layer)            # (N, d_model)
        sg = sigmoid(x2 @ w.W_shared_gate) if cfg.shared_expert_gate else None   # (N, 1) its gate σ(x·w)
        out += s if sg is None else sg * s
        shared = None if t is None else (t.pop(layer, "ffn"), s, sg)
    if tape is not None:
        tape.put(layer, "ffn", MoETape(x2, p, chosen, gate, kept, shared))
    if rec is not None:
        for name, value in (("router", p), ("experts", chosen), ("expert_weights", gate)):
            rec.put(layer, name, value.reshape(*shape[:-1], value.shape[-1]))   # (B, n, E or k)
    return out.reshape(shape)                                    # (B, n, d_model)


def attention_mask_of(cfg: ModelConfig, attention_mask: np.ndarray, n: int, layer: int = 0) -> AttentionMask:
    """Who may see whom (guide: mask): causal for decoders, within LAYER's sliding window if it has one
    (an encoder's reaches both ways: ModernBERT's local layers), within its chunk if it has one (Llama 4), never a
    padding key; with ALiBi (BLOOM,
    Falcon, MPT) each head's slope times the key's position, added to S for every query (the one-token
    step's row too). attention_mask (B, m) covers every key; the n queries are the last n of them."""
    alibi = None
    if cfg.position == "alibi":
        scale = None if not cfg.alibi_scaled else cfg.score_scale or 1.0 / math.sqrt(cfg.d_head)
        alibi = alibi_bias(attention_mask, alibi_slopes(cfg.n_heads), scale, cfg.alibi_bfloat16)   # (B, H, 1, m)
    return sparse_mask(cfg, layer, AttentionMask(   # Longformer's global tokens, BigBird's blocks (sparse_layers)
        n=n, m=attention_mask.shape[1], causal=cfg.causal, window=cfg.window(layer),
                         key_mask=None if attention_mask.all() else attention_mask.astype(bool), position_bias=alibi,
                         chunk=cfg.chunk(layer)))


def unembed_in(x: np.ndarray, weights: Weights, tape: Tape | None = None) -> np.ndarray:
    """Z·unembed_in: the stream after the final norm mapped back to the embedding table's width before
    W_vocab (OPT-350m's project_out), x (…, d_model) → (…, d_embed); x itself when there is no such map.
    tape: keeps x as (None, "unembed_in") for the backward."""
    if weights.unembed_in is None:
        return x
    if tape is not None:
        tape.put(None, "unembed_in", x)
    return linear(x, weights.unembed_in)                 # (B, n, d_embed)


def logits_of(hidden: np.ndarray, weights: Weights, cfg: ModelConfig, tape: Tape | None = None) -> np.ndarray | None:
    """logits = H·W_vocab (+ b), × logit_scale (Cohere, Granite): one score per vocabulary entry (guide: logits);
    T5 with a tied head scales Z by d_model^-0.5 first (scale_decoder_output); a masked-LM head (RoBERTa,
    DistilBERT, ELECTRA's generator) reads Norm(act(H·W_head + b_head)) instead of Z; Gemma 2 soft-caps the
    logits, logits = c·tanh(logits/c) (final_softcap). None without an LM head.
    tape: keeps the head's HeadTape as (None, "head") for its backward."""
    if weights.W_vocab is None:
        return None
    if cfg.scale_decoder_output:
        hidden = hidden * (cfg.d_model ** -0.5)
    if weights.W_head is not None:
        z, u = hidden, linear(hidden, weights.W_head, weights.b_head)                        # (B, n, E)
        hidden = norm(ACTIVATIONS[cfg.head_activation](u), weights.head_norm, cfg)
        if tape is not None:
            tape.put(None, "head", HeadTape(z, u, hidden))
    logits = linear(hidden, weights.W_vocab, weights.b_vocab)  # (B, n, V)
    if cfg.logit_scale != 1:
        logits *= cfg.logit_scale                            # Cohere: × logit_scale, Granite: ÷ logits_scaling
    return logits if cfg.final_softcap is None else soft_cap_(logits, cfg.final_softcap)
