"""Backprop through an encoder–decoder (Marian, BART): a forward keeping its tape, then the backwards in reverse.

    encoder   M = Blocks_enc(E[src]·s + P)                      self-attention both ways, padding hidden
    decoder   Y = Blocks_dec(E[tgt_in]·s + P, M)                causal self-attention, cross-attention, FFN
              cross-attention: Q = Y·W_Q, K = M·W_K, V = M·W_V   (n_tgt × n_src)
    loss      mean −log softmax(Y·W_vocab + b)[label]           labels −100 are not learned

Backwards, the cross-attention is where the two stacks meet: its dK and dV flow into dM, the
gradient of the encoder's output, which then runs back through the encoder. Every other box, forward
and backward, is the engine's (qkv.engine.blocks with a Tape, qkv.engine.blocks_backward): the encoder's
blocks are `block`s; the decoder's residual steps, its cross-attention and the scaled embeddings are
written here until the engine's block has a cross-attention box. The loss is transformers' for
`model(input_ids, attention_mask, labels=labels)`: the decoder reads [start] + labels[:-1].
T5's relative position bias and unscaled scores are not trained here (a clear error says so).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..engine import blocks_backward as back
from ..engine.attention import AttentionMask, attention_backward, merge_heads, scaled_dot_product_attention, split_heads
from ..engine.blocks import Context, attention, block, feed_forward, linear, norm
from ..engine.blocks_backward import Tape
from ..engine.config import ModelConfig
from ..engine.errors import QkvError
from ..engine.trace import Recorder
from ..engine.weights import AttentionWeights, BlockWeights, NormWeights, Seq2SeqWeights, Weights
from .grads import token_loss


@dataclass
class CrossTape:
    """What cross-attention's backward needs: the decoder stream Y, the encoder output M, Q, K, V, A, Concat(Z)."""

    y: np.ndarray        # (B, n_tgt, d_model)
    m: np.ndarray        # (B, n_src, d_model)
    q: np.ndarray        # (B, H, n_tgt, d_k)
    k: np.ndarray        # (B, H, n_src, d_k)
    v: np.ndarray        # (B, H, n_src, d_k)
    a: np.ndarray        # (B, H, n_tgt, n_src)
    z: np.ndarray        # (B, n_tgt, H·d_k)


def cross_forward(y: np.ndarray, m: np.ndarray, w: AttentionWeights, cfg: ModelConfig,
                  bias: np.ndarray | None, tape: Tape, layer: int) -> np.ndarray:
    """Concat_h softmax(Q_h·K_hᵀ/√d_k + M_pad)·V_h · W_O, Q from the decoder Y, K and V from the encoder's M;
    keeps its CrossTape as (layer, "cross")."""
    H = cfg.n_heads
    q = split_heads(linear(y, w.W_Q, w.b_Q), H)           # (B, H, n_tgt, d_k)
    k = split_heads(linear(m, w.W_K, w.b_K), H)           # (B, H, n_src, d_k)
    v = split_heads(linear(m, w.W_V, w.b_V), H)
    z, a, _ = scaled_dot_product_attention(q, k, v, bias)  # (B, H, n_tgt, d_k), (B, H, n_tgt, n_src)
    z = merge_heads(z)                                    # (B, n_tgt, H·d_k)
    tape.put(layer, "cross", CrossTape(y, m, q, k, v, a, z))
    return linear(z, w.W_O, w.b_O)


def cross_backward(dout: np.ndarray, w: AttentionWeights, t: CrossTape
                   ) -> tuple[np.ndarray, np.ndarray, AttentionWeights]:
    """(dY, dM, gradients): dQ goes back to the decoder's stream, dK and dV to the encoder's output."""
    dz, dW_O, db_O = back.linear(dout, t.z, w.W_O, w.b_O is not None)
    dq, dk, dv = attention_backward(split_heads(dz, t.q.shape[1]), t.q, t.k, t.v, t.a)
    dy, dW_Q, db_Q = back.linear(merge_heads(dq), t.y, w.W_Q, w.b_Q is not None)
    dm, dW_K, db_K = back.linear(merge_heads(dk), t.m, w.W_K, w.b_K is not None)
    dm_v, dW_V, db_V = back.linear(merge_heads(dv), t.m, w.W_V, w.b_V is not None)
    dm += dm_v                                            # (B, n_src, d_model): M feeds K and V
    return dy, dm, AttentionWeights(W_Q=dW_Q, W_K=dW_K, W_V=dW_V, W_O=dW_O, b_Q=db_Q, b_K=db_K, b_V=db_V, b_O=db_O)


def embed_forward(w: Weights, cfg: ModelConfig, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(X, what the embedding norm normalised) for X = Norm?(E[ids]·s + P[p + offset]), s = √d_model if scaled."""
    n = ids.shape[1]
    e = w.tok_embed[ids]                                  # (B, n, d_model)
    if cfg.scale_embedding:
        e *= math.sqrt(cfg.d_model)
    if w.pos_embed is not None:
        e += w.pos_embed[np.arange(n) + cfg.position_offset]
    return (e if w.embed_norm is None else norm(e, w.embed_norm, cfg)), e


def embed_backward(dx: np.ndarray, w: Weights, cfg: ModelConfig, ids: np.ndarray, e: np.ndarray, d_tok: np.ndarray
                   ) -> tuple[np.ndarray | None, object]:
    """Adds dE[ids] into d_tok (shared by both stacks); returns (dP of a learned table or None, the norm's gradients)."""
    g_norm = None
    if w.embed_norm is not None:
        dx, g_norm = back.norm(dx, e, w.embed_norm, cfg)
    d = cfg.d_model
    back.embedding(d_tok, ids, dx * math.sqrt(d) if cfg.scale_embedding else dx, cfg)
    d_pos = None
    if w.pos_embed is not None and cfg.position == "learned":
        d_pos = np.zeros_like(w.pos_embed)                # (P, d_model)
        d_pos[np.arange(ids.shape[1]) + cfg.position_offset] += dx.sum(axis=0)
    return d_pos, g_norm


def residual_forward(x: np.ndarray, w: NormWeights, cfg: ModelConfig, tape: Tape, layer: int, name: str,
                     box) -> np.ndarray:
    """One residual step of a decoder block, as `block` takes it: x + Box(Norm(x)) (pre-norm) or
    Norm(x + Box(x)) (post-norm), keeping what the norm normalised as (layer, name) for back.residual."""
    if cfg.norm_place == "post":                          # Marian, BART
        r = x + box(x)                                    # (B, n, d_model)
        tape.put(layer, name, r)
        return norm(r, w, cfg)
    tape.put(layer, name, x)
    return x + box(norm(x, w, cfg))


def _check(cfg: ModelConfig, weights: Seq2SeqWeights) -> None:
    if cfg.position == "relative" or not cfg.scale_scores or cfg.scale_decoder_output:
        raise QkvError(f"training {cfg.family} (relative position buckets, unscaled scores) is not supported; "
                       "train a marian or bart model")


def loss_and_grads(weights: Seq2SeqWeights, cfg: ModelConfig, src: np.ndarray, src_mask: np.ndarray,
                   tgt_in: np.ndarray, labels: np.ndarray) -> tuple[float, Seq2SeqWeights]:
    """Mean cross-entropy of labels (B, n_tgt) given the source (B, n_src) and the decoder's input tgt_in
    (B, n_tgt), and the gradient of every weight as a Seq2SeqWeights tree (one shared table: its
    gradient is the sum over the encoder's, the decoder's embeddings and a tied W_vocab). Labels −100:
    not learned. Inputs are checked by the caller (`gradients`, the training loop)."""
    _check(cfg, weights)
    enc, dec = weights.encoder, weights.decoder
    n_src, n_tgt = src.shape[1], tgt_in.shape[1]
    counted = labels != -100                              # (B, n_tgt)
    if not counted.any():
        raise QkvError("no label to learn from; give target sentences of at least one token")
    pad = AttentionMask(n_src, n_src, causal=False, key_mask=None if src_mask.all() else src_mask.astype(bool))
    src_bias = pad.bias(enc.tok_embed.dtype)              # (B, 1, 1, n_src) or None: cross-attention's M
    enc_tape, dec_tape = Tape(), Tape()
    enc_ctx = Context(cfg, pad, None, Recorder(keep=()), tape=enc_tape)
    dec_ctx = Context(cfg, AttentionMask(n_tgt, n_tgt, causal=True), None, Recorder(keep=()), tape=dec_tape)

    # forward: the encoder (the engine's blocks), then the decoder reading it
    x, e_src = embed_forward(enc, cfg, src)
    for i, w in enumerate(enc.blocks):
        x = block(x, w, enc_ctx, i)
    m = x if enc.final_norm is None else norm(x, enc.final_norm, cfg)   # M (B, n_src, d_model)
    y, e_tgt = embed_forward(dec, cfg, tgt_in)
    for i, w in enumerate(dec.blocks):
        y = residual_forward(y, w.attn_norm, cfg, dec_tape, i, "attn_norm",
                             lambda h: attention(h, w.attn, dec_ctx, i))
        y = residual_forward(y, w.cross_norm, cfg, dec_tape, i, "cross_norm",
                             lambda h: cross_forward(h, m, w.cross_attn, cfg, src_bias, dec_tape, i))
        y = residual_forward(y, w.ffn_norm, cfg, dec_tape, i, "ffn_norm",
                             lambda h: feed_forward(h, w.ffn, cfg, dec_tape, i))
    h = y if dec.final_norm is None else norm(y, dec.final_norm, cfg)
    logits = linear(h, dec.W_vocab, dec.b_vocab)          # (B, n_tgt, V)
    loss, dlogits = token_loss(logits, np.where(counted, labels, 0), counted)

    # backward: the decoder (collecting dM from every cross-attention), then the encoder
    dh, dW_vocab, _ = back.linear(dlogits, h, dec.W_vocab, False)   # final_logits_bias: a fixed buffer
    g_dec_final = None
    if dec.final_norm is not None:
        dh, g_dec_final = back.norm(dh, y, dec.final_norm, cfg)
    dm = np.zeros_like(m)                                 # (B, n_src, d_model)
    g_dec = [None] * len(dec.blocks)
    dy = dh
    for i in reversed(range(len(dec.blocks))):
        w = dec.blocks[i]

        def cross_back(d, w=w, i=i):
            nonlocal dm
            d_in, d_mem, g = cross_backward(d, w.cross_attn, dec_tape.pop(i, "cross"))
            dm += d_mem
            return d_in, g

        dy, g_ffn_norm, g_ffn = back.residual(dy, w.ffn_norm, cfg, dec_tape.pop(i, "ffn_norm"),
                                              lambda d: back.feed_forward(d, w.ffn, dec_tape.pop(i, "ffn"), cfg))
        dy, g_cross_norm, g_cross = back.residual(dy, w.cross_norm, cfg, dec_tape.pop(i, "cross_norm"), cross_back)
        dy, g_attn_norm, g_attn = back.residual(dy, w.attn_norm, cfg, dec_tape.pop(i, "attn_norm"),
                                                lambda d: back.attention(d, w.attn, dec_tape.pop(i, "attn")))
        g_dec[i] = BlockWeights(attn_norm=g_attn_norm, attn=g_attn, ffn_norm=g_ffn_norm, ffn=g_ffn,
                                cross_attn=g_cross, cross_norm=g_cross_norm)
    d_tok = np.zeros_like(weights.tok_embed)              # (V, d_model), the shared table
    d_pos_dec, g_dec_embed = embed_backward(dy, dec, cfg, tgt_in, e_tgt, d_tok)
    g_enc_final = None
    if enc.final_norm is not None:
        dm, g_enc_final = back.norm(dm, x, enc.final_norm, cfg)
    g_enc = [None] * len(enc.blocks)
    dx = dm
    for i in reversed(range(len(enc.blocks))):
        dx, g_enc[i] = back.block(dx, enc.blocks[i], enc_tape, i, cfg)
    d_pos_enc, g_enc_embed = embed_backward(dx, enc, cfg, src, e_src, d_tok)
    if np.shares_memory(dec.W_vocab, weights.tok_embed):
        d_tok += dW_vocab.T                               # tied: W_vocab = Eᵀ
        dW_vocab = d_tok.T
    return loss, Seq2SeqWeights(
        Weights(tok_embed=d_tok, blocks=g_enc, pos_embed=d_pos_enc, embed_norm=g_enc_embed, final_norm=g_enc_final),
        Weights(tok_embed=d_tok, blocks=g_dec, pos_embed=d_pos_dec, embed_norm=g_dec_embed, final_norm=g_dec_final,
                W_vocab=dW_vocab))


def decoder_inputs(labels: np.ndarray, start: int, pad: int) -> np.ndarray:
    """transformers' shift_tokens_right: the decoder reads [start] + labels[:-1], −100 read as pad."""
    tgt = np.empty_like(labels)
    tgt[:, 0] = start
    tgt[:, 1:] = labels[:, :-1]
    return np.where(tgt == -100, pad, tgt)
