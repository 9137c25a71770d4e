"""Backprop through a decoder: the engine's own forward keeping a tape, then the boxes' backwards in reverse.

    forward: qkv.engine.model.transformer(…, tape=Tape())      embed → L × block → final norm → logits
    loss:    L = mean −log softmax(logits)[next id]            dlogits = (softmax(logits) − onehot(next id)) / N
    backward (qkv.engine.blocks_backward: each box's under its forward's name), in the opposite order:
             logits_of → norm (final) → block (L − 1 … 0: FFN's residual step, attention's) → embed
             a tied W_vocab's gradient is added into the embedding table's (one table, two uses)

No forward is written here: the pass is the one inference runs (qkv.engine.blocks), which keeps, per
block, the inputs of each norm and box, Q, K, V, the attention weights A (L · B · H · n² floats: what
training on short sequences can afford), Concat(Z) and the FFN's pre-activations, only when given a tape.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from ..engine import blocks_backward as back
from ..engine.blocks_backward import Tape, fused_qkv
from ..engine.config import ModelConfig
from ..engine.errors import QkvError
from ..engine.model import transformer
from ..engine.weights import Weights


# ── the loss ─────────────────────────────────────────────────────────────────────

def token_loss(logits: np.ndarray, targets: np.ndarray, counted: np.ndarray) -> tuple[float, np.ndarray]:
    """(L, dL/dlogits) of L = mean over counted positions t of −log softmax(logits[t])[targets[t]].

    logits (B, n, V), targets and counted (B, n). The gradient is (softmax(logits[t]) − onehot(targets[t])) / N
    at each of the N counted positions, 0 elsewhere.
    """
    m = logits.max(axis=-1, keepdims=True)                # (B, n, 1)
    p = np.exp(logits - m)                                # (B, n, V)
    total = p.sum(axis=-1, keepdims=True)
    at = targets[..., None]                               # (B, n, 1)
    logp_target = (np.take_along_axis(logits, at, -1) - m - np.log(total))[..., 0]   # (B, n)
    N = int(counted.sum())
    loss = float(-(logp_target.astype(np.float64) * counted).sum() / N)
    p /= total                                            # softmax
    np.put_along_axis(p, at, np.take_along_axis(p, at, -1) - 1.0, -1)
    p *= (counted / N).astype(p.dtype)[..., None]
    return loss, p


def next_token_loss(logits: np.ndarray, ids: np.ndarray, counted: np.ndarray) -> tuple[float, np.ndarray]:
    """token_loss with position t predicting ids[t+1] (teacher forcing): counted (B, n − 1); the last
    position predicts nothing and gets no gradient."""
    loss, d = token_loss(logits[:, :-1], ids[:, 1:], counted)
    dlogits = np.zeros_like(logits)                       # (B, n, V)
    dlogits[:, :-1] = d
    return loss, dlogits


def counted_positions(attention_mask: np.ndarray, loss_mask: np.ndarray | None = None) -> np.ndarray:
    """(B, n − 1) bool: positions t whose next-token loss counts — t and t+1 both real tokens
    (transformers' labels=input_ids with padding labelled −100, padded on the right), and
    loss_mask[t] where given."""
    real = attention_mask.astype(bool)
    counted = real[:, :-1] & real[:, 1:]
    if loss_mask is not None:
        counted &= np.asarray(loss_mask, dtype=bool)[:, :-1]
    if not counted.any():
        raise QkvError("no position has a next token to learn from; give sequences of at least 2 real tokens")
    return counted


# ── the whole model ──────────────────────────────────────────────────────────────

def _with_fused_qkv(weights: Weights) -> Weights:
    """The same weights, with W_QKV given where W_Q, W_K, W_V are column blocks of one matrix (GPT-2's
    c_attn, viewed by weights_from_tensors): the forward then makes Q, K, V in one product, as the backward."""
    blocks = []
    for b in weights.blocks:
        fused = fused_qkv(b.attn)
        blocks.append(b if fused is None or b.attn.W_QKV is not None else replace(b, attn=replace(b.attn, W_QKV=fused)))
    return replace(weights, blocks=blocks)


def loss_and_grads(weights: Weights, cfg: ModelConfig, ids: np.ndarray, attention_mask: np.ndarray | None = None,
                   loss_mask: np.ndarray | None = None) -> tuple[float, Weights]:
    """The mean next-token cross-entropy of ids (B, n) and its gradient for every weight.

    The gradients come back as a Weights tree of the same shapes (None where there is no
    weight or no gradient: a sinusoidal table is fixed). A tied W_vocab's gradient is added
    into tok_embed's, and the tree's W_vocab is then its transposed view (one table, one
    gradient). ids and masks are checked by the caller (`gradients`, the training loop).
    """
    if not cfg.causal or weights.W_vocab is None:
        raise QkvError(f"training needs a decoder with W_vocab (a causal LM); this is a {cfg.family} encoder")
    mask = np.ones(ids.shape, np.int64) if attention_mask is None else np.asarray(attention_mask)
    counted = counted_positions(mask, loss_mask)

    tape = Tape()
    h, logits = transformer(_with_fused_qkv(weights), cfg, ids, mask, tape=tape)   # (B, n, d_model), (B, n, V)
    loss, dlogits = next_token_loss(logits, ids, counted)
    del logits

    dh, dW_vocab, db_vocab = back.logits_of(dlogits, h, weights, cfg)
    del dlogits, h
    dh, d_unembed_in = back.unembed_in(dh, weights, tape)   # OPT-350m: back to d_model; else dh itself
    g_final = None
    if weights.final_norm is not None:
        dh, g_final = back.norm(dh, tape.pop(None, "final_norm"), weights.final_norm, cfg)
    dx = dh                                               # (B, n, d_model)
    g_blocks = [None] * len(weights.blocks)
    for i in reversed(range(len(weights.blocks))):
        dx, g_blocks[i], _ = back.block(dx, weights.blocks[i], tape, i, cfg)   # frees what block i kept
    projected: dict[str, np.ndarray] = {}
    d_tok, d_pos, d_type, g_embed = back.embed(dx, weights, cfg, tape.pop(None, "embed"), grads=projected)
    if np.shares_memory(weights.W_vocab, weights.tok_embed):
        d_tok += dW_vocab.T                               # tied: W_vocab = Eᵀ, one table
        dW_vocab = d_tok.T
    return loss, Weights(tok_embed=d_tok, blocks=g_blocks, pos_embed=d_pos, type_embed=d_type, embed_norm=g_embed,
                         final_norm=g_final, W_vocab=dW_vocab, b_vocab=db_vocab,
                         embed_in=projected.get("embed_in"), unembed_in=d_unembed_in)
