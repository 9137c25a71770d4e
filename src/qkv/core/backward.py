"""The whole model's backward: the forward pass keeping a tape, then the boxes' backwards in reverse order.

    taped      qkv.core.stack.transformer(…, tape=Tape())    embed → L × block → final norm → logits
    backward   given dL/dlogits: logits_of → norm (final) → block (L − 1 … 0: FFN's residual step,
               attention's) → embed (blocks_backward: each box's under its forward's name); a tied
               W_vocab's gradient is added into the embedding table's (one table, two uses), a stored layer's
               (ALBERT's blocks share them) is the sum of its blocks', and MPNet's relative bias table gets
               every layer's dB by bucket

No forward is written here: the pass is the one inference runs (qkv.core.blocks), which keeps, per
block, the inputs of each norm and box, Q, K, V, the attention weights A (L · B · H · n² floats: what
short sequences can afford), Concat(Z) and the FFN's pre-activations, only when given a tape. Training
(qkv.train.backprop: the loss) and input attribution (qkv.analysis.input_attribution: one logit,
differentiated with respect to the token embeddings) both start from a gradient on the logits.
"""

from __future__ import annotations

from dataclasses import fields, is_dataclass, replace

import numpy as np

from . import blocks_backward as back
from .blocks_backward import Tape, fused_qkv
from .config import ModelConfig
from .disentangled import table_backward
from .seq2seq_backward import bias_table_grad
from .stack import transformer
from .weights import BlockWeights, Weights


def _with_fused_qkv(weights: Weights) -> Weights:
    """The same weights, with W_QKV given where W_Q, W_K, W_V are column blocks of one matrix (GPT-2's
    c_attn, viewed by weights_from_tensors): the forward then makes Q, K, V in one product, as the backward."""
    blocks = []
    for b in weights.blocks:
        fused = None if b.attn is None else fused_qkv(b.attn)          # (a Mamba block: none)
        blocks.append(b if fused is None or b.attn.W_QKV is not None else replace(b, attn=replace(b.attn, W_QKV=fused)))
    return replace(weights, blocks=blocks)


def taped(weights: Weights, cfg: ModelConfig, ids: np.ndarray, attention_mask: np.ndarray,
          tokens: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, Tape]:
    """The forward pass keeping its tape: (final hidden (B, n, d_model), logits (B, n, V), tape), for `backward`.
    tokens: the token embeddings E[ids]·s to use instead of the table's (B, n, d_embed)."""
    tape = Tape()
    h, logits = transformer(_with_fused_qkv(weights), cfg, ids, attention_mask, tape=tape, tokens=tokens)
    return h, logits, tape


def backward(dlogits: np.ndarray | None, h: np.ndarray, logits: np.ndarray | None, weights: Weights, cfg: ModelConfig,
             tape: Tape, inputs: dict[str, np.ndarray] | None = None, dhidden: np.ndarray | None = None) -> Weights:
    """Every weight's gradient of a scalar whose gradient on the logits is DLOGITS (B, n, V), back through the
    pass `taped` kept (h, logits its outputs; the tape is used up); or, with DLOGITS None, whose gradient on the
    final hidden states h is DHIDDEN (B, n, d) (an encoder's sentence embedding: no head, no W_vocab gradient).
    inputs: a dict that receives "tokens", the gradient of the token embeddings E[ids]·s (B, n, d_embed)
    (input attribution)."""
    head = tape.pop(None, "head") if weights.W_head is not None else None
    dW_vocab = db_vocab = dW_head = db_head = g_head_norm = None
    if dlogits is None:
        dh = dhidden
    else:
        dh, dW_vocab, db_vocab = back.logits_of(dlogits, h if head is None else head.out, weights, cfg, logits)
        if head is not None:                              # the masked-LM head, between Z and W_vocab
            dh, dW_head, db_head, g_head_norm = back.head(dh, weights, cfg, head)
    del dlogits, h, logits
    dh, d_unembed_in = back.unembed_in(dh, weights, tape)   # OPT-350m: back to d_model; else dh itself
    g_final = None
    if weights.final_norm is not None:
        dh, g_final = back.norm(dh, tape.pop(None, "final_norm"), weights.final_norm, cfg)
    dx = dh                                               # (B, n, d_model)
    g_blocks = [None] * len(weights.blocks)
    for i in reversed(range(len(weights.blocks))):
        dx, g_blocks[i], _ = back.block(dx, weights.blocks[i], tape, i, cfg)   # frees what block i kept
    if cfg.shared_groups:                                 # ALBERT: a stored layer, read by several blocks
        g_blocks = shared_gradients(g_blocks, cfg)
    d_rel = None
    if weights.rel_bias is not None:                      # MPNet: one table of buckets, read by every layer
        d_rel = bias_table_grad([tape.pop(i, "d_position_bias") for i in range(len(weights.blocks))],
                                weights.rel_bias, cfg, True)
    d_table = g_table_norm = None
    if cfg.disentangled is not None:                      # DeBERTa: the relative table, read by every layer
        d_table, g_table_norm = table_backward([tape.pop(i, "d_relative") for i in range(len(weights.blocks))],
                                               weights.rel_embed, weights.rel_norm, cfg.norm_eps)
    embed = tape.pop(None, "embed")
    dW_embed = db_embed = None
    if weights.W_embed is not None:                       # ELECTRA: back through E → d_model first
        dx, dW_embed, db_embed = back.embed_projection(dx, weights, embed)
    projected: dict[str, np.ndarray] = {}
    d_tok, d_pos, d_type, g_embed = back.embed(dx, weights, cfg, embed, grads=projected)
    if inputs is not None:
        inputs["tokens"] = projected["tokens"]
    if dW_vocab is not None and np.shares_memory(weights.W_vocab, weights.tok_embed):
        d_tok += dW_vocab.T                               # tied: W_vocab = Eᵀ, one table
        dW_vocab = d_tok.T
    return Weights(tok_embed=d_tok, blocks=g_blocks, pos_embed=d_pos, type_embed=d_type, embed_norm=g_embed,
                         W_embed=dW_embed, b_embed=db_embed, final_norm=g_final, W_head=dW_head, b_head=db_head,
                         head_norm=g_head_norm, W_vocab=dW_vocab, b_vocab=db_vocab,
                         embed_in=projected.get("embed_in"), unembed_in=d_unembed_in,
                         W_patch=projected.get("W_patch"), b_patch=projected.get("b_patch"), rel_bias=d_rel,
                         rel_embed=d_table, rel_norm=g_table_norm)


def shared_gradients(grads: list[BlockWeights], cfg: ModelConfig) -> list[BlockWeights]:
    """Each block's gradient replaced by its stored layer's (cfg.stored_layer: ALBERT's blocks share their weights):
    the sum over every block that reads it, one tensor used several times as a tied table is; the blocks of one
    stored layer then hold the same tree (the checkpoint's table writes it once)."""
    total: dict[int, BlockWeights] = {}
    for i, g in enumerate(grads):
        s = cfg.stored_layer(i)
        total[s] = g if s not in total else _added(total[s], g)
    return [total[cfg.stored_layer(i)] for i in range(len(grads))]


def _added(a, b):
    """The sum of two gradient trees of one shape (arrays added, None where both are None)."""
    if isinstance(a, np.ndarray):
        return a + b
    if isinstance(a, list):
        return [_added(x, y) for x, y in zip(a, b)]
    if is_dataclass(a):
        return type(a)(**{f.name: _added(getattr(a, f.name), getattr(b, f.name)) for f in fields(a)})
    return a                                              # None, or a number (NormWeights.stored_offset)
