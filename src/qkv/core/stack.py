"""The stack runner: embeddings → blocks → final norm → logits, one function for every kind of model.

    run_stack      ids ─embed (+ positions)─▶ X (or a given stream) ─▶ blocks START..STOP-1 ─▶ final norm ─▶ logits

Its callers only set up what differs between kinds, the `Context` the blocks share (mask, positions, rotation,
position bias, cross-attention's memory), and hand the rest to `run_stack`:

    transformer    decoder, encoder, image (ViT: its patches as `tokens`): positions from the mask, RoPE,
                   sliding windows, ALiBi, the one-token step of writing, LongRoPE's re-read of a cache
    encoder_pass   an encoder–decoder's encoder (Whisper's: its log-mel frames as `tokens`): every source token
                   sees every real one, T5's relative bias both ways (T5Gemma: RoPE and sliding layers,
                   `rope_and_windows`); source ─▶ M
    decoder_pass   its decoder: causal self-attention (+ T5's bias backwards), cross-attention reading M ─▶ logits

The boxes are core/blocks.py's, the block they make core/layer.py's, and the `Context` every box of one pass
shares (config, mask, rotation of positions, recorder, KV cache, hooks, ablation) core/context.py's.
Everything works on a batch: B rows of n tokens.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from ..runtime import llama_arith
from ..runtime.errors import QkvError
from .attention import AttentionMask
from .blocks import attention_mask_of, cross_memory, embed, logits_of, unembed_in
from .layer import block, final_norm
from .delta import delta_layer
from .mamba import check_layer_hooks, mamba_layer, mamba_pass
from .lightning import minimax_block
from .mamba2 import Mamba2, mamba2_pass
from .mamba2_layers import mamba2_layer, parallel_layer
from .disentangled import relative_table
from . import step_compiled
from .context import QUIET, Ablation, Context, check_finite, check_given
from .blocks_backward import Tape
from .cache import KVCache
from .config import ModelConfig
from .hooks import Hooks
from .layout import unjoinable
from .positions import (positions_from_ids, positions_from_mask, relative_bias, relative_buckets, rope_attention_factor,
                        rope_cos_sin, rope_inv_freq, rope_keeps_turned_keys, rope_kind, temperature_scales)
from .trace import Recorder
from .weights import Seq2SeqWeights, Weights


# ── what a pass reads ──────────────────────────────────────────────────────────

def rope_speeds(cfg: ModelConfig, dtype, length: int) -> dict[str, np.ndarray]:
    """RoPE's speeds ω of each kind of layer a pass over LENGTH positions turns: {"global": (d_rot/2,)}, and
    "local" for Gemma 3's windowed layers with a base of their own; {} without RoPE. A table may depend on the
    length (LongRoPE: short factors up to original_max_position_embeddings, long ones past it; dynamic NTK: a
    base grown past max_position_embeddings), so a KV cache compares them with the speeds its keys were turned
    with (KVCache.fits; dynamic NTK keeps its keys as they were turned, as transformers does)."""
    if cfg.position != "rope":
        return {}
    d_rot = cfg.rotary_dim or cfg.d_head
    speeds = {"global": rope_inv_freq(d_rot, cfg.rope_theta, cfg.rope_scaling, dtype, length=length)}
    if cfg.local_rope_theta is not None:
        speeds["local"] = rope_inv_freq(d_rot, cfg.local_rope_theta, cfg.local_rope_scaling, dtype, length=length)
    return speeds


def rotation(cfg: ModelConfig, positions: np.ndarray, speeds: dict[str, np.ndarray], kind: str = "global"
             ) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin, 2 × (B, 1, n, d_rot), of RoPE at POSITIONS (B, n) for the layers of KIND ("global", "local")
    turning at SPEEDS[kind] (`rope_speeds`): the angles p·ω_i (positions.rope_cos_sin), or with llama.cpp's
    arithmetic (cfg.arith) and plain RoPE ggml's own angles (llama_arith.rope_cos_sin; a scaled RoPE keeps qkv's)."""
    scaling = cfg.rope_scaling if kind == "global" else cfg.local_rope_scaling
    if cfg.arith == "llama.cpp" and rope_kind(scaling) == "default":
        theta = cfg.rope_theta if kind == "global" else cfg.local_rope_theta
        return llama_arith.rope_cos_sin(positions, 2 * len(speeds[kind]), theta, cfg.rope_interleaved)
    return rope_cos_sin(positions, speeds[kind], rope_attention_factor(scaling), interleaved=cfg.rope_interleaved)


@dataclass
class Output:
    """What `Model.forward` returns."""

    hidden: np.ndarray                  # (B, n, d_model) after the final norm where there is one
    logits: np.ndarray | None           # (B, n, V), None for encoders
    attentions: np.ndarray | None       # (L, B, H, n, n) weights after softmax


# ── the one runner ───────────────────────────────────────────────────────────────

# The block each kind of layer runs (ModelConfig.layer_kinds; config.LAYER_KINDS): a transformer block, or the same
# block with another box in attention's place (Jamba's Mamba layers: core/mamba.py's mixer).
LAYER_BLOCKS = {"attention": block, "mamba": mamba_layer, "delta": delta_layer}   # (delta: Qwen3-Next, core/delta.py)


def block_of(cfg: ModelConfig, layer: int):
    """The function that runs block LAYER of a stack under CFG: its kind's (LAYER_BLOCKS), MiniMax's own block."""
    if cfg.lightning is not None:
        return minimax_block                                 # MiniMax: its own block (core/lightning.py)
    if isinstance(cfg.mamba, Mamba2) and cfg.mamba.beside is not None:
        return parallel_layer                                # Falcon-H1: attention and Mamba-2 side by side
    if isinstance(cfg.mamba, Mamba2) and cfg.layer_kind(layer) == "mamba":
        return mamba2_layer                                  # Granite 4's Mamba-2 layers (core/mamba2.py)
    return LAYER_BLOCKS[cfg.layer_kind(layer)]


@np.errstate(**QUIET)
def run_stack(weights: Weights, ctx: Context, *, ids: np.ndarray | None = None, positions: np.ndarray | None = None,
              token_type_ids: np.ndarray | None = None, tokens: np.ndarray | None = None,
              stream: np.ndarray | None = None, start: int = 0, stop: int | None = None, logits: str | None = "all",
              speeds: dict[str, np.ndarray] | None = None, stack: str | None = None
              ) -> tuple[np.ndarray, np.ndarray | None]:
    """One stack of blocks, whatever the kind: (hidden (B, n, d_model) after the final norm (then unembed_in:
    (B, n, d_embed), OPT-350m), logits (B, n, V) | (B, 1, V) with logits="last" | None without a head or with
    logits=None (an encoder–decoder's encoder: its output M)).

    X = embed(ids at positions, token types, or the given `tokens`), or STREAM (B, n, d_model), the residual
    stream entering block START (activation patching); then X = block_l(X) for l = START..STOP-1 under CTX, each
    output checked finite (not with a tape: training checks its own loss); STOP before the last block returns
    (the stream entering block STOP, None), no final norm or logits. At the end of the stack the KV cache (ctx's)
    counts the n new positions (their ids and the RoPE SPEEDS they were turned with, `KVCache.advance`), and the
    tape (ctx's) keeps what the final norm, unembed_in and a masked-LM head read, for the backward.
    stack: "encoder" or "decoder", named in errors (None: a single stack).
    """
    cache, tape, hooks = ctx.cache, ctx.tape, ctx.hooks
    if tape is not None and (cache is not None or ctx.ablate is not None or hooks is not None
                             or ctx.rec.heads is not None):
        raise QkvError("a tape keeps the plain pass for its backward: run it without a KV cache, "
                       "ablation, hooks or a recorder of some heads")
    if stop is not None and cache is not None:
        raise QkvError("a pass that stops early would leave the later layers' KV cache unfilled; "
                       "run it without a cache")
    if ctx.ablate is not None and ctx.ablate.how == "mean" and cache is not None:
        raise QkvError("mean-ablation needs the whole input in one pass; run it without a KV cache")
    whose = "" if stack is None else f"{stack}'s "
    check_given(stream, f"the residual stream given to the {whose}pass (from_layer's x)")
    check_given(tokens, f"the token embeddings given to the {whose}pass")
    blame = hooks if hooks is not None or ctx.cross is None else ctx.cross.hooks   # whose values may overflow
    where = "" if stack is None else f"{stack} "
    checked = tape is None                                   # training checks its own loss (train.loop)
    if stream is None:
        x = embed(weights, ctx.cfg, ids, positions, token_type_ids, tape, tokens)   # (B, n, d_model)
        if checked:
            check_finite(x, f"the {where}embeddings")
    else:
        x = stream                                           # (B, n, d_model) entering block START
    depth = len(weights.blocks)
    for layer in range(start, depth if stop is None else stop):
        x = block_of(ctx.cfg, layer)(x, weights.blocks[layer], ctx, layer)   # (B, n, d_model)
        if checked:
            check_finite(x, f"{where}layer {layer}'s output", blame)
    if stop is not None and stop < depth:
        return x, None                                       # (B, n, d_model) entering block STOP
    if cache is not None:
        cache.advance(x.shape[1], ids, speeds)
    if weights.final_norm is not None:
        if tape is not None:
            tape.put(None, "final_norm", x)
        x = final_norm(x, weights.final_norm, ctx, depth - 1)   # its scale: the last layer's final_norm_scale
    x = unembed_in(x, weights, tape)                         # (B, n, d_embed) OPT-350m; else x itself
    if logits is None:
        return x, None
    out = logits_of(x[:, -1:] if logits == "last" else x, weights, ctx.cfg, tape)   # (B, n | 1, V) or None
    if checked and out is not None:
        check_finite(out, "the logits", blame)
    return x, out


# ── a single stack: decoder, encoder, image ─────────────────────────────────────

@np.errstate(**QUIET)
def transformer(weights: Weights, cfg: ModelConfig, ids: np.ndarray, attention_mask: np.ndarray, *,
                token_type_ids: np.ndarray | None = None, rec: Recorder | None = None,
                cache: KVCache | None = None, logits: str = "all",
                ablate: Ablation | None = None, hooks: Hooks | None = None,
                start: int = 0, stream: np.ndarray | None = None, tape: Tape | None = None,
                tokens: np.ndarray | None = None, stop: int | None = None) -> tuple[np.ndarray, np.ndarray | None]:
    """ids (B, n) → (final hidden states (B, n, d_model), logits (B, n, V) or None); the hidden states are
    (B, n, d_embed) where unembed_in maps them back to the table's width (OPT-350m, as transformers gives them).

    rec: the intermediates to keep (default none); ablate: heads to knock out (see Ablation);
    hooks: functions reading or replacing intermediates (qkv.core.hooks);
    tape: where to keep, box by box, what the backward reads (qkv.core.blocks_backward; training),
    for the plain pass only: not with a cache, ablation, hooks or a recorder of some heads.
    With a KV cache, ids are the n new tokens after the cache's past and attention_mask
    (B, past + n) covers past and new. When this pass's RoPE speeds are not those the cached keys were turned
    with (LongRoPE's table switches to the long factors once the sequence passes original_max_position_embeddings),
    the cache is emptied and the pass reads the whole sequence again, past ids and new, with the new speeds
    (KVCache.reread; transformers' Phi-3 drops its cache there alike): the hidden states, logits="all" and what
    REC keeps then cover all past + n positions.
    logits="last" computes them for the last position only (all that generation needs).
    start, stream: run blocks START..L-1 on STREAM (B, n, d_model), the residual stream entering
    block START, instead of embedding ids (what activation patching reruns; ids may then be None).
    stop: run blocks up to STOP-1 only and return (the residual stream leaving block STOP-1, None), no final
    norm or logits (what reading one layer's intermediates over a corpus needs: qkv.analysis.neurons).
    tokens (B, n, d_embed): the token embeddings E[ids]·s to add positions to, instead of looking them up
    (input attribution: the embeddings scaled towards a baseline).

    What is a single stack's own is set up here (positions, RoPE, masks per window, the one-token step);
    `run_stack` runs it. A Mamba model (cfg.mamba) runs its own stack, core/mamba.py's (Mamba-2's: core/mamba2.py's),
    with the same arguments; a stack of layers of different kinds (cfg.layer_kinds: Jamba) runs here, each layer
    its kind's block (`block_of`).
    """
    if cfg.mamba is not None and cfg.layer_kinds is None:    # a state-space stack: Mamba's, or Mamba-2's
        run = mamba2_pass if isinstance(cfg.mamba, Mamba2) else mamba_pass
        return run(weights, cfg, ids, attention_mask, token_type_ids=token_type_ids, rec=rec, cache=cache,
                   logits=logits, ablate=ablate, hooks=hooks, start=start, stream=stream, tape=tape,
                   tokens=tokens, stop=stop)
    if cfg.layer_kinds is not None:                          # Jamba: no hook on a point its Mamba layers have not
        check_layer_hooks(hooks, cfg)
    dtype = weights.tok_embed.dtype
    n = (ids if stream is None else stream).shape[1]
    # Decoders count positions over real tokens (left padding does not shift them);
    # BERT numbers positions 0..n-1 whatever the mask, as transformers does.
    counted = cfg.causal and not cfg.index_positions           # (CLIP's text: causal, numbered 0..n-1 as BERT)
    positions = positions_from_mask(attention_mask)[:, -n:] if counted else np.broadcast_to(
        np.arange(n), attention_mask.shape[:1] + (n,))
    if cfg.positions_from_ids and ids is not None:           # RoBERTa: counted over the ids that are not pads
        positions = positions_from_ids(ids, cfg.pad_token_id)
    speeds = rope_speeds(cfg, dtype, int(positions.max()) + 1)   # LongRoPE, dynamic NTK: a table by the length
    if (cache is not None and not cache.fits(speeds)         # the past's keys were turned by another table
            and not rope_keeps_turned_keys(cfg.rope_scaling)):   # (dynamic NTK keeps them, as transformers):
        if ids is None or tokens is not None:                # read all of it again with this one
            raise QkvError("the KV cache's keys were turned by other RoPE speeds and a pass from embeddings cannot "
                           "read its past again; run it without a cache")
        ids = cache.reread(ids)                              # (B, past + n)
        n = ids.shape[1]
        positions = positions_from_mask(attention_mask)[:, -n:]                 # (B, past + n)
    rope = None
    if "global" in speeds:
        rope = rotation(cfg, positions, speeds)                      # 2 × (B, 1, n, d_k)
    mask = attention_mask_of(cfg, attention_mask, n)
    if weights.rel_bias is not None:                         # MPNet: T5's bias of j − i both ways, every layer's
        m = attention_mask.shape[1]
        mask = replace(mask, position_bias=relative_bias(weights.rel_bias, np.arange(m - n, m), np.arange(m), True,
                                                         cfg.relative_max_distance))       # (1, H, n, m)
    ctx = Context(cfg, mask, rope, rec or Recorder(keep=()), cache, ablate, hooks,
                  scale=cfg.score_scale, tape=tape)
    if not cfg.uniform_layers:                               # layers of different kinds: a mask per window,
        first = {cfg.mask_kind(i): i for i in reversed(range(cfg.n_layers))}  # each window, chunk → its first layer
        ctx.masks = {kind: attention_mask_of(cfg, attention_mask, n, i) for kind, i in first.items()}
        ctx.ropes = {None: None, "global": rope}             # a rotation per kind, each made once
        if "local" in speeds:
            ctx.ropes["local"] = rotation(cfg, positions, speeds, "local")
    if cfg.temperature_floor is not None:                    # Llama 4's NoPE layers: q × a factor by position
        ctx.temperature = temperature_scales(positions, cfg.temperature_floor, cfg.temperature_scale, dtype)
    if cfg.disentangled is not None:                         # DeBERTa: the relative positions' table, once a pass
        ctx.relative = relative_table(weights.rel_embed, weights.rel_norm, cfg.norm_eps, n, cfg.disentangled)
    if (n == 1 and cache is not None and ablate is None and hooks is None and ctx.rec.keep <= {"attentions"}
            and not cfg.attn_output_gate                     # (Qwen3-Next's gate: `block`'s box, not the step's)
            and all(b.attn is not None and b.cross_attn is None and (b.attn.W_QKV is not None or unjoinable(
                (b.attn.W_Q, b.attn.W_K, b.attn.W_V))) for b in weights.blocks)):
        def hiding(mask) -> np.ndarray | None:
            bias = mask.bias(dtype)                              # (B or 1, 1, 1, m) or None
            return None if bias is None or not bias.any() else bias
        ctx.one_step, ctx.step_bias = True, hiding(ctx.mask)
        ctx.compiled_step = not ctx.rec.keep and step_compiled.wanted()   # recording A: the readable step
        if ctx.masks is not None:                            # one per window
            ctx.step_biases = {kind: hiding(mask) for kind, mask in ctx.masks.items()}
    return run_stack(weights, ctx, ids=ids, positions=positions, token_type_ids=token_type_ids, tokens=tokens,
                     stream=stream, start=start, stop=stop, logits=logits, speeds=speeds)

# ── an encoder–decoder's two passes ──────────────────────────

@dataclass
class Stacks:
    """What an encoder–decoder's pass does besides computing: per stack (encoder, the decoder's
    self-attention and FFN, its cross-attention), the recorder, hooks and ablation. None: nothing."""

    rec: dict[str, Recorder] = field(default_factory=dict)
    hooks: dict[str, Hooks | None] = field(default_factory=dict)
    ablate: dict[str, Ablation | None] = field(default_factory=dict)
    tape: dict[str, Tape] = field(default_factory=dict)     # training: what each stack's backward reads

    def context(self, stack: str, cfg: ModelConfig, mask: AttentionMask, **more: Any) -> Context:
        return Context(cfg, mask, None, self.rec.get(stack) or Recorder(keep=()), ablate=self.ablate.get(stack),
                       hooks=self.hooks.get(stack), scale=cfg.score_scale, tape=self.tape.get(stack), **more)


@np.errstate(**QUIET)
def encoder_pass(weights: Seq2SeqWeights, cfg: ModelConfig, ids: np.ndarray, mask: np.ndarray,
                 stacks: Stacks | None = None, tokens: np.ndarray | None = None) -> np.ndarray:
    """Source ids (B, n_src), mask (B, n_src) → the encoder's output M (B, n_src, d_model).

    Bidirectional: every source token sees every real source token (padding never); T5 adds its
    relative position bias (both directions) to the scores. Positions 0..n-1 whatever the padding,
    as transformers numbers them in these families. tokens: the token embeddings E[ids]·s to use (B, n_src, d)
    instead of looking them up (input attribution).
    """
    w, n, stacks = weights.encoder, ids.shape[1], stacks or Stacks()
    cfg = cfg.encoder_config()                                     # T5Gemma: the encoder's own windows
    pos = np.arange(n)                                             # (n_src,)
    bias = None if w.rel_bias is None else relative_bias(w.rel_bias, pos, pos, True, cfg.relative_max_distance)
    attend = AttentionMask(n, n, causal=False, key_mask=None if mask.all() else mask.astype(bool), position_bias=bias)
    ctx = stacks.context("encoder", cfg, attend, rel_buckets=layer_buckets(w, cfg, pos, pos, True))
    rope_and_windows(ctx, pos, len(w.blocks), w.tok_embed.dtype)
    return run_stack(w, ctx, ids=ids, positions=pos, tokens=tokens, logits=None, stack="encoder")[0]   # (B, n_src, d)


def rope_and_windows(ctx: Context, pos: np.ndarray, depth: int, dtype) -> dict[str, np.ndarray]:
    """An encoder–decoder stack's RoPE and windows, put in its Context CTX (T5Gemma: Gemma 2's layers, RoPE at
    positions POS (n,), sliding and full layers alternating): the rotation, and with layers of different kinds a
    mask per window (each ctx.mask's own, a window added: the encoder's reaching both ways) and a rotation per
    kind. Returns the RoPE speeds ({} without RoPE: every other family, whose ctx it leaves as it was)."""
    cfg = ctx.cfg
    speeds = rope_speeds(cfg, dtype, int(pos[-1]) + 1 if len(pos) else 1)
    if "global" in speeds:
        ctx.rope = rotation(cfg, pos[None], speeds)                      # 2 × (1, 1, n, d_k)
    if cfg.uniform_layers:
        if cfg.sliding_window is not None:
            ctx.mask = replace(ctx.mask, window=cfg.sliding_window, _bias={})
        return speeds
    ctx.masks = {cfg.mask_kind(i): replace(ctx.mask, window=cfg.window(i), _bias={}) for i in range(depth)}
    ctx.ropes = {None: None, "global": ctx.rope}
    if "local" in speeds:
        ctx.ropes["local"] = rotation(cfg, pos[None], speeds, "local")
    return speeds


def layer_buckets(w, cfg: ModelConfig, q_pos: np.ndarray, k_pos: np.ndarray, bidirectional: bool) -> np.ndarray | None:
    """(n_q, n_k) T5 buckets when the stack's layers each have their own bias table (UMT5), else None."""
    if not w.blocks or w.blocks[0].attn.rel_bias is None:
        return None
    return relative_buckets(q_pos, k_pos, bidirectional, cfg.relative_buckets, cfg.relative_max_distance)


def memory_of(weights: Seq2SeqWeights, cfg: ModelConfig, encoded: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
    """Each decoder layer's cross-attention K, V of the encoder's output (blocks.cross_memory)."""
    return cross_memory(encoded, weights.decoder.blocks, cfg)


@np.errstate(**QUIET)
def decoder_pass(weights: Seq2SeqWeights, cfg: ModelConfig, ids: np.ndarray, mask: np.ndarray | None,
                 memory: list[tuple[np.ndarray, np.ndarray]], source_mask: np.ndarray, *,
                 cache: KVCache | None = None, stacks: Stacks | None = None, logits: str = "all",
                 start: int = 0, stream: np.ndarray | None = None, tokens: np.ndarray | None = None
                 ) -> tuple[np.ndarray, np.ndarray]:
    """Decoder ids (B, n) → (hidden (B, n, d_model), logits (B, n, V); logits="last": (B, 1, V)).

    mask (B, past + n) covers the target's past and new tokens (None: no padding); source_mask
    (B, n_src) the source's. With a KV cache, ids are the n new tokens after the cache's past.
    Each block: causal self-attention (+ T5's backward-only position bias), cross-attention reading
    memory (the encoder output's K, V), FFN. start, stream: run blocks START.. on STREAM (B, n, d_model),
    the residual stream entering block START, instead of embedding ids (activation patching); tokens: the
    target's token embeddings E[ids]·s to use (B, n, d) instead of looking them up (input attribution).
    """
    w, n, stacks = weights.decoder, (ids if stream is None else stream).shape[1], stacks or Stacks()
    past = 0 if cache is None else cache.length
    pos = np.arange(past, past + n)                                # (n,) positions of the new tokens
    key_mask = None if mask is None or mask.all() else mask.astype(bool)
    bias = None if w.rel_bias is None else relative_bias(w.rel_bias, pos, np.arange(past + n), False,
                                                            cfg.relative_max_distance)
    own = AttentionMask(n, past + n, causal=True, key_mask=key_mask, position_bias=bias)
    src = AttentionMask(n, source_mask.shape[1], causal=False,
                        key_mask=None if source_mask.all() else source_mask.astype(bool))
    cross = stacks.context("cross", cfg, src, memory=memory, query_mask=None if key_mask is None else key_mask[:, -n:])
    ctx = stacks.context("decoder", cfg, own, cache=cache, cross=cross,
                         rel_buckets=layer_buckets(w, cfg, pos, np.arange(past + n), False))
    speeds = rope_and_windows(ctx, pos, len(w.blocks), w.tok_embed.dtype)   # T5Gemma: RoPE, its sliding layers
    return run_stack(w, ctx, ids=ids, positions=pos, tokens=tokens, stream=stream, start=start, logits=logits,
                     speeds=speeds or None, stack="decoder")       # (B, n, d_model), (B, n | 1, V)
