"""Every box of every architecture, once (guide: block): the functions that compute one box of the
forward pass, and the `Context` that every box of one pass shares.

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
(Gemma 2), a routed FFN among experts (Mixtral, Qwen2-MoE: `route`, `routed_feed_forward`, read through
`feed_forward`). Each box
is called as box(x, w, …) with `w` the weights of that box; `Context` carries the config, the mask,
the rotation of positions, the recorder, the KV cache, the ablation, the hooks, and for training the
tape that blocks_backward.py (each box's backward, under the same name) reads. `step_block` is the
one-token fast path of `block` (the same numbers), `logits_of` the last box, H·W_vocab (H: the final norm of the stream).
qkv.models.model and qkv.models.seq2seq compose the boxes into whole passes.

Shapes: B rows of n tokens (with a KV cache, the n new ones after the past; m keys in all),
d_model wide. x (B, n, d_model); Q (B, H, n, d_k); K, V (B, Hkv, m, d_k) (Hkv < H: grouped
queries share them); S, A (B, H, n, m); Z (B, H, n, d_k); FFN hidden (B, n, d_ff);
logits (B, n, V).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from .attention import (AttentionMask, attention_output, attention_top, attention_weights, merge_heads, top_of,
                        scaled_dot_product_attention, soft_cap_, split_heads)
from .blocks_backward import AttentionTape, EmbedTape, FFNTape, HeadTape, MoETape, Tape
from .cache import KVCache
from .config import ModelConfig
from ..runtime.errors import QkvError
from .hooks import Hooks
from .ops import ACTIVATIONS, layer_norm, rms_norm, sigmoid, softmax
from .positions import alibi_bias, alibi_slopes, apply_rope
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
    per head) normalise x (B, H, n, d_k) head by head: head h's d_k numbers by γ[h], β[h]."""
    g, b = w.weight, w.bias
    if g.ndim == 2:
        g, b = g[:, None], None if b is None else b[:, None]     # (H, 1, d_k): broadcast over the n positions
    if cfg.norm == "rms":
        return rms_norm(x, g, cfg.norm_eps)
    return layer_norm(x, g, b, cfg.norm_eps)


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
        cls = np.broadcast_to(weights.tok_embed[0], (len(tokens), 1, weights.tok_embed.shape[1]))   # (B, 1, d)
        x = np.concatenate([cls, linear(tokens, weights.W_patch, weights.b_patch)], axis=1)   # (B, 1 + P, d_model)
    elif tokens is None:
        x = weights.tok_embed[ids]                       # (B, n, d_model) a copy; (B, n, d_embed) with embed_in, (B, n, E) with W_embed
        if cfg.embed_scale is not None:
            x *= cfg.embed_scale                         # Marian: E·√d, Granite: E·m
    else:
        x = np.array(tokens, dtype=weights.tok_embed.dtype)      # (B, n, d_embed) E[ids]·s given
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


def convolve(x: np.ndarray, w: ConvWeights) -> np.ndarray:
    """A 1-D convolution over time, x (B, T, C_in) → (B, T_out, C_out), T_out = (T + 2·padding − kernel) // stride + 1:
    each output step's KERNEL input frames side by side (B, T_out, kernel·C_in), times W, + b."""
    B, T, C = x.shape
    padded = np.pad(x, ((0, 0), (w.padding, w.padding), (0, 0)))              # zeros outside the input
    T_out = (T + 2 * w.padding - w.kernel) // w.stride + 1
    windows = np.concatenate([padded[:, j:j + w.stride * (T_out - 1) + 1:w.stride] for j in range(w.kernel)],
                             axis=-1)                                        # (B, T_out, kernel·C_in)
    return linear(windows, w.W, w.b)                                         # (B, T_out, C_out)


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
    scale: float | None = None                       # what Q·Kᵀ is multiplied by; None: 1/√d_k (ModelConfig.score_scale)
    memory: list[tuple[np.ndarray, np.ndarray]] | None = None   # cross-attention: each layer's K, V (B, H, n_src, d_k)
    cross: "Context | None" = None                   # a decoder's cross-attention (encoder–decoders); None: none
    query_mask: np.ndarray | None = None             # cross-attention: (B, n) the real target tokens; None: all
    rel_buckets: np.ndarray | None = None            # (n, m) T5 buckets of the pass's query–key pairs, for layers
                                                     # with a position bias of their own (UMT5); None: none
    tape: Tape | None = None                         # what each box's backward reads (blocks_backward); None: nothing
    # Layers of different kinds (ModelConfig.layer_windows, local_rope_theta, no_rope_layers): one mask per
    # window, one rotation per kind, each made once per pass; None: every layer takes `mask`, `rope`, `step_bias`.
    masks: dict[int | None, AttentionMask] | None = None
    ropes: dict[str | None, tuple[np.ndarray, np.ndarray] | None] | None = None
    step_biases: dict[int | None, np.ndarray | None] | None = None

    def mask_of(self, layer: int) -> AttentionMask:
        """LAYER's mask: its window's (a full layer's: no window)."""
        return self.mask if self.masks is None else self.masks[self.cfg.window(layer)]

    def rope_of(self, layer: int) -> tuple[np.ndarray, np.ndarray] | None:
        """LAYER's cos, sin: global, local (its own base, Gemma 3) or None (no RoPE, SmolLM3's no_rope_layers)."""
        return self.rope if self.ropes is None else self.ropes[self.cfg.rope_kind(layer)]

    def step_bias_of(self, layer: int) -> np.ndarray | None:
        """LAYER's mask M of a one-token step (None if it hides nothing)."""
        return self.step_bias if self.step_biases is None else self.step_biases[self.cfg.window(layer)]


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
    cap = cfg.attn_softcap if ctx.memory is None else None    # Gemma 2: S = c·tanh(S/c) before the mask
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
    if cfg.qk_norm == "head":                                 # Qwen3, Phi: each head's q and k normalised
        pre = (q, k)
        q, k = norm(q, w.q_norm, cfg), norm(k, w.k_norm, cfg)   # over d_k, before RoPE
    if rope is not None:
        q, k = apply_rope(q, *rope, cfg.rope_interleaved), apply_rope(k, *rope, cfg.rope_interleaved)   # by position
    hooks = ctx.hooks                                         # None: no hook anywhere (the fast path)
    if hooks is not None:
        q, k, v = hooks.qkv(layer, q, k, v)                   # the new positions', before the cache
    if ctx.cache is not None:
        k, v = ctx.cache.append(layer, k, v)                  # (B, Hkv, m, d_k) past + new
    want = rec.wants(layer, "attentions") or rec.wants(layer, "scores")
    if hooks is not None and hooks.on_weights(layer):         # S or A hooked: step by step, plain
        z, a, s = hooks.attention(layer, q, k, v, mask, rec, scale, cap)
    elif want and rec.heads is None and not rec.beside or ctx.tape is not None:   # every head's weights (a tape
        z, a, s = scaled_dot_product_attention(q, k, v, mask.bias(q.dtype),         # keeps A): the plain path
                                               keep_scores=rec.wants(layer, "scores"), scale=scale, cap=cap)
    else:
        z = attention_output(q, k, v, mask, scale, cap)       # (B, H, n, d_k) plain or tiled
        heads = rec.heads if rec.heads is not None else range(cfg.n_heads)
        a, s = attention_weights(q, k, mask, heads, scale=scale, cap=cap) if want else (None, None)
    if ctx.ablate is not None:                                # (B, H, n, d_k) ablated heads replaced
        z = ctx.ablate.apply(layer, z, ctx.query_mask if ctx.memory is not None
                             else None if mask.key_mask is None else mask.key_mask[:, -z.shape[2]:])
    if hooks is not None:
        z = hooks(layer, "heads", z)
    for name, value in (("q", q), ("k", k), ("v", v), ("scores", s), ("attentions", a), ("heads", z)):
        rec.put(layer, name, value)
    if rec.wants(layer, "attention_top"):                     # each row's largest weights: from A if it is there
        rec.put(layer, "attention_top", top_of(a, rec.top) if a is not None and rec.heads is None
                else attention_top(q, k, mask, rec.top, scale=scale, cap=cap))
    z = merge_heads(z)                                        # (B, n, H·d_k) Concat(Z)
    if ctx.tape is not None:
        ctx.tape.put(layer, "attn", AttentionTape(x, q, k, v, a, z, rope, pre,
                                                  cfg.position == "relative" and mask.position_bias is not None))
    return linear(z, w.W_O, w.b_O)                            # (B, n, d_model); its hook: the block's (`after`)


def cross_memory(encoded: np.ndarray, blocks: list[BlockWeights], cfg: ModelConfig) -> list[tuple[np.ndarray, np.ndarray]]:
    """Each decoder layer's cross-attention K = M·W_K + b_K and V = M·W_V + b_V of the encoder's output
    M (B, n_src, d_model): (B, Hkv, n_src, d_k) each, computed once per source and read by every step."""
    return [(split_heads(linear(encoded, b.cross_attn.W_K, b.cross_attn.b_K), cfg.n_kv_heads),
             split_heads(linear(encoded, b.cross_attn.W_V, b.cross_attn.b_V), cfg.n_kv_heads)) for b in blocks]


def feed_forward(x: np.ndarray, w: FFNWeights | MoEWeights, cfg: ModelConfig, tape: Tape | None = None,
                 layer: int = 0, rec: Recorder | None = None, hooks: Hooks | None = None) -> np.ndarray:
    """FFN(x) = act(x·W_in + b)·W_out + b, or gated (SwiGLU): (act(x·W_gate) ⊙ x·W_in)·W_out; a MoE layer's
    (w a MoEWeights) is `routed_feed_forward`. The hidden h = act(x·W_in + b) (B, n, d_ff) is "neurons": h_i is
    neuron i's coefficient on its output vector W_out[i] (a key–value memory, Geva et al. 2021), hooked
    (`hooks`; a replacement is what W_out reads: neuron ablation) and then recorded (`rec`). A MoE layer has
    no single d_ff hidden (each token's k experts have their own): it records none, and qkv.core.hooks
    refuses a hook on it. tape: where to keep what the backward reads, as (layer, "ffn"); None: nothing
    kept. rec: where the hidden, or a routed FFN's router choice, is recorded; None: nowhere."""
    if isinstance(w, MoEWeights):
        return routed_feed_forward(x, w, cfg, tape, layer, rec)
    act = ACTIVATIONS[cfg.activation]
    if w.W_gate_in is not None:                              # laid out by qkv.core.layout: one product,
        gate_in = linear(x, w.W_gate_in)                     # (B, n, 2·d_ff) = [x·W_gate | x·W_in]
        d_ff = w.W_in.shape[1]
        u, g = gate_in[..., d_ff:], gate_in[..., :d_ff]     # x·W_in, x·W_gate
        if w.b_in is not None:
            u += w.b_in
        h = act(g)                                           # act(x·W_gate)
        h *= u                                               # ⊙ (x·W_in + b_in)
    else:
        u = linear(x, w.W_in, w.b_in)                        # (B, n, d_ff)
        g = None if w.W_gate is None else linear(x, w.W_gate)
        if g is None:
            h = act(u)
        else:
            h = act(g)
            h *= u                                           # act(x·W_gate) ⊙ (x·W_in + b_in)
    if hooks is not None and hooks.wants(layer, "neurons"):
        h = hooks(layer, "neurons", h)                       # (B, n, d_ff) e.g. a neuron set to 0
    if tape is not None:
        tape.put(layer, "ffn", FFNTape(x, u, g, h))
    if rec is not None:
        rec.put(layer, "neurons", h)                         # kept only when asked for (trace.OPT_IN)
    del u, g                                                 # freed before the last product, unless kept
    return linear(h, w.W_out, w.b_out)                       # (B, n, d_model)


def route(x: np.ndarray, w: MoEWeights, cfg: ModelConfig) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The router of a MoE layer: x (N, d_model) → (p (N, E), chosen (N, k), weights (N, k)).

        p = softmax(x·W_router)         each token's probability of each expert
        chosen = the k largest of p     most probable first, as torch.topk gives them; among exactly
                                        equal probabilities the lower expert first (torch.topk's order
                                        there is its sort's own; only a degenerate router, e.g. all zero, ties)
        weights = p[chosen] / Σ p[chosen]   where cfg.norm_top_k (Mixtral always), else p[chosen]
    """
    p = softmax(x @ w.W_router)                                  # (N, E)
    chosen = np.argsort(-p, axis=-1, kind="stable")[:, :cfg.experts_per_token]   # (N, k)
    weights = np.take_along_axis(p, chosen, axis=-1)             # (N, k)
    if cfg.norm_top_k:
        weights = weights / weights.sum(axis=-1, keepdims=True)
    return p, chosen, weights


def routed_feed_forward(x: np.ndarray, w: MoEWeights, cfg: ModelConfig, tape: Tape | None = None, layer: int = 0,
                        rec: Recorder | None = None) -> np.ndarray:
    """MoE(x) = Σ_j w_j·FFN_{e_j}(x) over the k experts the router chose for each token (`route`),
    + σ(x·W_shared_gate)·FFN_shared(x) with a shared expert (Qwen2-MoE). Each expert is the gated FFN
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
        y = feed_forward(x2[rows], w.experts[e], cfg, t, layer)  # (r, d_model) FFN_e of its tokens
        out[rows] += y * gate[rows, slot][:, None]
        if t is not None:
            kept.append((int(e), rows, slot, t.pop(layer, "ffn"), y))
    shared = None
    if w.shared is not None:
        t = None if tape is None else Tape()
        s = feed_forward(x2, w.shared, cfg, t, layer)            # (N, d_model)
        sg = sigmoid(x2 @ w.W_shared_gate)                       # (N, 1) its gate σ(x·w)
        out += sg * s
        shared = None if t is None else (t.pop(layer, "ffn"), s, sg)
    if tape is not None:
        tape.put(layer, "ffn", MoETape(x2, p, chosen, gate, kept, shared))
    if rec is not None:
        for name, value in (("router", p), ("experts", chosen), ("expert_weights", gate)):
            rec.put(layer, name, value.reshape(*shape[:-1], value.shape[-1]))   # (B, n, E or k)
    return out.reshape(shape)                                    # (B, n, d_model)


def row_norm(x: np.ndarray, w: NormWeights, cfg: ModelConfig) -> np.ndarray:
    """`norm` of one row (1, 1, d): RMSNorm's three steps on its one number (mean, + eps, √) done as
    scalars instead of (1, 1, 1) arrays (each NumPy call on an array costs ~2–4 µs; a SmolLM2 step
    makes 61 norms). The same float32 numbers: each scalar step is computed in float64 and rounded
    to float32, which for ÷, + and √ equals the float32 operation (float64 has more than 2·24 + 2 bits).
    Plain form: rms_norm(x, w.weight, cfg.norm_eps)."""
    if cfg.norm != "rms" or x.size != x.shape[-1]:
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

      - Q, K, V are one product and stay one buffer: its heads are (B, H + 2·Hkv, 1, d_k), and
        RoPE turns the Q and K heads in one call (plain form: apply_rope(q), apply_rope(k));
      - K and V of the new position go straight into the cache (plain form: cache.append);
      - a mask that hides nothing is not added (plain form: S + 0); a recorder may keep only the weights A;
      - RMSNorm of the one row with scalars (`row_norm`).
    Layers of different kinds take their own window's mask and their own rotation (ctx.step_bias_of, rope_of).
    """
    cfg, cache, a = ctx.cfg, ctx.cache, w.attn
    B = x.shape[0]
    H, Hkv, dk = cfg.n_heads, cfg.n_kv_heads, cfg.d_head
    hq, hk = H * dk, Hkv * dk
    post = cfg.norm_place == "post"                             # OPT-350m: Norm(x + Box(x)) after each box
    h_attn = x if w.attn_norm is None or post else row_norm(x, w.attn_norm, cfg)   # (B, 1, d_model)
    qkv = linear(h_attn, a.W_QKV)                               # (B, 1, (H + 2·Hkv)·d_k) = X·[W_Q | W_K | W_V]
    for lo, hi, b in ((0, hq, a.b_Q), (hq, hq + hk, a.b_K), (hq + hk, hq + 2 * hk, a.b_V)):
        if b is not None:
            qkv[..., lo:hi] += b
    if cfg.qk_norm == "all":                                    # OLMo 2: q and k normalised over the projection
        qkv[..., :hq], qkv[..., hq:hq + hk] = norm(qkv[..., :hq], a.q_norm, cfg), norm(qkv[..., hq:hq + hk], a.k_norm, cfg)
    heads = qkv.reshape(B, H + 2 * Hkv, 1, dk)                  # (B, H + 2·Hkv, 1, d_k): Q, K, V heads
    qk = heads[:, :H + Hkv]
    if cfg.qk_norm == "head":                                   # Qwen3, Phi: each head's q and k normalised first
        qk = np.concatenate([norm(qk[:, :H], a.q_norm, cfg), norm(qk[:, H:], a.k_norm, cfg)], axis=1)
    rope = ctx.rope_of(layer)
    if rope is not None:
        qk = apply_rope(qk, *rope, cfg.rope_interleaved)        # (B, H + Hkv, 1, d_k) rotated by position
    t = cache.length
    cache.k[layer, :, :, t] = qk[:, H:, 0]                      # the new position's K and V, in place
    cache.v[layer, :, :, t] = heads[:, H + Hkv:, 0]
    k, v = cache.k[layer, :, :, :t + 1], cache.v[layer, :, :, :t + 1]    # (B, Hkv, t + 1, d_k) views
    z, att, _ = scaled_dot_product_attention(qk[:, :H], k, v, ctx.step_bias_of(layer), scale=ctx.scale,
                                             cap=cfg.attn_softcap)   # (B, H, 1, d_k), A (B, H, 1, t + 1)
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


def residual(x: np.ndarray, w: NormWeights | None, cfg: ModelConfig, box, *args, after=None, keep=None
             ) -> tuple[np.ndarray, np.ndarray]:
    """One residual step of a block: (the stream after it, what joined it).

        pre-norm (GPT-2, Llama, T5)    x + After(Box(Norm(x)))     no Norm (OLMo 2): x + After(Box(x))
        post-norm (BERT, Marian, BART) Norm(x + After(Box(x)))
    After: what the box's output goes through before it joins the stream — its own norm (OLMo 2) and
    the hooks on it (`after_box`); None: nothing. keep: (tape, layer, name) to keep the norm's input for
    its backward (training); None: nothing kept."""
    if cfg.norm_place == "post":
        out = box(x, *args)
        out = out if after is None else after(out)
        r = x + out                                          # (B, n, d_model) what the norm reads
        if keep is not None:
            keep[0].put(keep[1], keep[2], r)
        return norm(r, w, cfg), out
    if keep is not None:
        keep[0].put(keep[1], keep[2], x)
    out = box(x if w is None else norm(x, w, cfg), *args)
    out = out if after is None else after(out)
    return x + out, out                                      # (B, n, d_model) each


def after_box(out_norm: NormWeights | None, hooks: Hooks | None, layer: int, name: str, cfg: ModelConfig,
              tape: Tape | None = None):
    """The output norm (OLMo 2), the residual multiplier (Granite: × m) and then the hooks on NAME, as one
    function of a box's output; None when there are none of them (the fast path). What it returns is what
    joins the stream and what the trace records as NAME. tape: keeps the output norm's input as
    (layer, NAME + "_norm") for its backward."""
    hooked = hooks is not None and hooks.wants(layer, name)
    m = cfg.residual_multiplier
    if out_norm is None and not hooked and m == 1:
        return None

    def after(out: np.ndarray) -> np.ndarray:
        if tape is not None and out_norm is not None:
            tape.put(layer, name + "_norm", out)
        out = out if out_norm is None else norm(out, out_norm, cfg)
        out = out if m == 1 else out * m
        return hooks(layer, name, out) if hooked else out
    return after


# What a pass does where float32 overflows (weights near 3e38, a q·k of 1e40): NumPy's warnings are silenced
# inside the pass and the first non-finite stream stops it, naming where (`check_finite`), instead of tables of nan.
QUIET = dict(over="ignore", invalid="ignore", divide="ignore")


class NotFinite(QkvError):
    """A pass's stream held inf or NaN (`check_finite`): callers with their own words for it (training) catch this."""


def check_finite(x: np.ndarray, where: str, hooks: Hooks | None = None) -> None:
    """One NotFinite when X holds inf or NaN: WHERE (e.g. "layer 3's output") is where the pass first overflowed.
    What it blames: the weights, or with HOOKS in the pass (engine.hooks; their values are finite, `_replacement`)
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


def block(x: np.ndarray, w: BlockWeights, ctx: Context, layer: int) -> np.ndarray:
    """One transformer block (guide: block): attention, then (an encoder–decoder's decoder) cross-attention
    reading the encoder's output, then the FFN, each a residual step with its norm."""
    cfg, hooks = ctx.cfg, ctx.hooks
    if ctx.one_step:
        return step_block(x, w, ctx, layer)
    if hooks is not None:
        x = hooks(layer, "residual", x)
    ctx.rec.put(layer, "residual", x)
    tape = ctx.tape
    after_attn = after_box(w.attn_out_norm, hooks, layer, "attn_out", cfg, tape)
    after_ffn = after_box(w.ffn_out_norm, hooks, layer, "ffn_out", cfg, tape)
    if cfg.parallel_residual:                                # GPT-NeoX: both branches read the block's input
        if tape is not None:
            tape.put(layer, "attn_norm", x)                  # both norms read x (their backward's input)
        h = norm(x, w.attn_norm, cfg)                        # (B, n, d_model)
        a = attention(h, w.attn, ctx, layer)
        a = a if after_attn is None else after_attn(a)
        h = h if w.ffn_norm is None else norm(x, w.ffn_norm, cfg)   # Phi: one norm read by both branches
        f = feed_forward(h, w.ffn, cfg, tape, layer, ctx.rec, hooks)
        f = f if after_ffn is None else after_ffn(f)
        ctx.rec.put(layer, "attn_out", a)
        ctx.rec.put(layer, "ffn_out", f)
        return (f + a) + x                                   # (B, n, d_model), transformers' order of the sum
    x, a = residual(x, w.attn_norm, cfg, attention, w.attn, ctx, layer, after=after_attn,
                    keep=None if tape is None else (tape, layer, "attn_norm"))
    if w.cross_attn is not None:
        cross = ctx.cross
        x, c = residual(x, w.cross_norm, cfg, attention, w.cross_attn, cross, layer,
                        after=after_box(None, cross.hooks, layer, "attn_out", cfg),
                        keep=None if tape is None else (tape, layer, "cross_norm"))
        cross.rec.put(layer, "attn_out", c)
    x, f = residual(x, w.ffn_norm, cfg, feed_forward, w.ffn, cfg, tape, layer, ctx.rec, hooks, after=after_ffn,
                    keep=None if tape is None else (tape, layer, "ffn_norm"))
    ctx.rec.put(layer, "attn_out", a)
    ctx.rec.put(layer, "ffn_out", f)
    return x                                                 # (B, n, d_model)


def attention_mask_of(cfg: ModelConfig, attention_mask: np.ndarray, n: int, layer: int = 0) -> AttentionMask:
    """Who may see whom (guide: mask): causal for decoders, within LAYER's sliding window if it has one
    (an encoder's reaches both ways: ModernBERT's local layers), never a padding key; with ALiBi (BLOOM,
    Falcon, MPT) each head's slope times the key's position, added to S for every query (the one-token
    step's row too). attention_mask (B, m) covers every key; the n queries are the last n of them."""
    alibi = None
    if cfg.position == "alibi":
        scale = None if not cfg.alibi_scaled else cfg.score_scale or 1.0 / math.sqrt(cfg.d_head)
        alibi = alibi_bias(attention_mask, alibi_slopes(cfg.n_heads), scale, cfg.alibi_bfloat16)   # (B, H, 1, m)
    return AttentionMask(n=n, m=attention_mask.shape[1], causal=cfg.causal, window=cfg.window(layer),
                         key_mask=None if attention_mask.all() else attention_mask.astype(bool), position_bias=alibi)


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
