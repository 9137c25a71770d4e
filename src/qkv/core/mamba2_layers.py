"""Mamba-2 mixers in stacks of layers of different kinds (core/mamba2.py's mixer, its state in the KV cache beside the
attention layers' K, V): Granite 4's hybrids, a Mamba-2 layer in attention's place (`mamba2_layer`), and Falcon-H1,
a Mamba-2 mixer beside attention in every layer (`parallel_layer`). Each is the transformer block's two residual
steps (core/layer.py's `residual`) around another box, run by core/stack.py's `run_stack` as its layer's kind says.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ..runtime.errors import QkvError
from .blocks import attention, feed_forward
from .layer import after_box, residual
from .mamba import NO_BACKWARD, Pass, seen
from .mamba2 import Mamba2BlockWeights, mixer, state_of
from .trace import MIXER, Recorder

if TYPE_CHECKING:
    from .context import Context


def pass_of(ctx: "Context", layer: int) -> Pass:
    """The `Pass` a Mamba-2 layer of a stack of different kinds reads from the stack's Context CTX: its padding (LAYER's
    mask's key_mask (B, m), None: none), recorder, hooks, ablation, and the state the KV cache carries beside the
    attention layers' K, V (None without a cache), its past the positions the cache holds."""
    cache = ctx.cache
    return Pass(ctx.cfg, ctx.mask_of(layer).key_mask, ctx.rec, ctx.hooks, ctx.ablate,
                None if cache is None else state_of(cache), 0 if cache is None else cache.length)


def mamba2_layer(x: np.ndarray, w: Mamba2BlockWeights, ctx: "Context", layer: int) -> np.ndarray:
    """A Mamba-2 layer of a stack of layers of different kinds (cfg.layer_kinds: Granite 4's hybrids): the transformer
    block's two residual steps (core/layer.py's `residual`, Granite's residual_multiplier included) with the mixer in
    attention's place,

        x + Mixer(RMSNorm(x))·m,  then  + FFN(RMSNorm(·))·m        (B, n, d_model), the FFN dense or routed

    each point hooked and recorded as core/mamba.py's `mamba_layer` does (the mixer's "attentions": each of the
    attention layers' H heads a group of the Mamba heads). Training refused in one line."""
    cfg, hooks = ctx.cfg, ctx.hooks
    if ctx.tape is not None:
        raise QkvError(NO_BACKWARD)
    x = seen(ctx, layer, "residual", x)
    x, a = residual(x, w.attn_norm, ctx, layer, mixer, w.mixer, pass_of(ctx, layer), layer, cfg.mamba,
                    after=after_box(w.attn_out_norm, hooks, layer, "attn_out", cfg, None, ctx.rec))
    x = seen(ctx, layer, "residual_mid", x)
    x, f = residual(x, w.ffn_norm, ctx, layer, feed_forward, w.ffn, cfg, None, layer, ctx.rec, hooks,
                    after=after_box(w.ffn_out_norm, hooks, layer, "ffn_out", cfg, None, ctx.rec),
                    names=("ffn_norm_scale", "ffn_in"))
    ctx.rec.put(layer, "attn_out", a)
    ctx.rec.put(layer, "ffn_out", f)
    return seen(ctx, layer, "residual_out", x)                # (B, n, d_model)


def steps_only(rec: Recorder) -> Recorder:
    """A recorder that keeps, into REC's store, only the mixer's own steps REC asks for (trace.MIXER): Falcon-H1's
    mixer beside attention, whose "attentions" and "heads" are the attention box's."""
    quiet = Recorder(layers=rec.layers, keep=rec.keep & set(MIXER))
    quiet.store = rec.store
    return quiet


def parallel_layer(x: np.ndarray, w: Mamba2BlockWeights, ctx: "Context", layer: int) -> np.ndarray:
    """A Falcon-H1 layer (Mamba2.beside: its multipliers m): attention and the Mamba-2 mixer side by side on one
    norm's output, then the FFN, as transformers' FalconH1DecoderLayer,

        x + Attn(h·m_attn_in)·m_attn_out + Mixer(h)·m_ssm_out,  h = RMSNorm(x);  then  + FFN(RMSNorm(·))·m_ffn_out

    (B, n, d_model). The attention box is any attention layer's: q, k, v, scores, "attentions" and "heads" are its
    (hooked, recorded, ablated), attn_out the sum of both boxes, what joins the stream. The mixer beside it starts from
    and updates the KV cache's state; its implied attention (`implied_attention`) is not the trace's "attentions",
    which are the softmax's, but its own steps are kept when asked for (trace.MIXER: mix_matrix, one per Mamba head).
    Training refused in one line."""
    cfg, hooks, b = ctx.cfg, ctx.hooks, ctx.cfg.mamba.beside
    if ctx.tape is not None:
        raise QkvError(NO_BACKWARD)
    cache = ctx.cache
    quiet = Pass(cfg, ctx.mask_of(layer).key_mask, steps_only(ctx.rec), None, None,   # the mixer: its steps only
                 None if cache is None else state_of(cache), 0 if cache is None else cache.length)

    def both(h: np.ndarray) -> np.ndarray:                    # (B, n, d_model) what the norm gave
        a = attention(h * b.attn_in if b.attn_in != 1 else h, w.attn, ctx, layer)   # (B, n, d_model)
        return a * b.attn_out + mixer(h, w.mixer, quiet, layer, cfg.mamba) * b.ssm_out

    def ffn(h: np.ndarray) -> np.ndarray:                     # (B, n, d_model)
        return feed_forward(h, w.ffn, cfg, None, layer, ctx.rec, hooks) * b.ffn_out

    x = seen(ctx, layer, "residual", x)
    x, a = residual(x, w.attn_norm, ctx, layer, both, after=after_box(None, hooks, layer, "attn_out", cfg))
    x = seen(ctx, layer, "residual_mid", x)
    x, f = residual(x, w.ffn_norm, ctx, layer, ffn, after=after_box(None, hooks, layer, "ffn_out", cfg),
                    names=("ffn_norm_scale", "ffn_in"))
    ctx.rec.put(layer, "attn_out", a)
    ctx.rec.put(layer, "ffn_out", f)
    return seen(ctx, layer, "residual_out", x)                # (B, n, d_model)
