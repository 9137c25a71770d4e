"""Backprop through an encoder–decoder (Marian, BART, mBART, Pegasus, T5, mT5, UMT5): the engine's two
passes keeping their tapes, then the boxes' backwards in reverse.

    encoder   M = Blocks_enc(E[src]·s + P)                      self-attention both ways, padding hidden
    decoder   Y = Blocks_dec(E[tgt_in]·s + P, M)                causal self-attention, cross-attention, FFN
              cross-attention: Q = Y·W_Q, K = M·W_K, V = M·W_V   (n_tgt × n_src)
    loss      mean −log softmax(Y·W_vocab + b)[label]           labels −100 are not learned

The forward is qkv.engine.seq2seq's (encoder_pass, memory_of, decoder_pass) with a Tape per stack; every
backward is qkv.engine.blocks_backward's. Backwards, the cross-attention is where the two stacks meet:
each decoder layer's dK and dV flow into dM, the gradient of the encoder's output (`back.memory`), which
then runs back through the encoder. The loss is transformers' for `model(input_ids, attention_mask,
labels=labels)`: the decoder reads [start] + labels[:-1] (mBART: start = the labels' language id).
T5 and mT5: the scores unscaled (scale 1), the relative position bias learned — each stack's one table,
whose gradient sums every layer's dB by bucket (`bias_table_grad`; UMT5: each layer's table its own) —
and v1.0's tied head read after × d_model^-0.5.
"""

from __future__ import annotations

import numpy as np

from ..engine import blocks_backward as back
from ..engine.blocks_backward import Tape
from ..engine.config import ModelConfig
from ..engine.errors import QkvError
from ..engine.positions import relative_buckets
from ..engine.seq2seq import Stacks, decoder_pass, encoder_pass, memory_of
from ..engine.weights import Seq2SeqWeights, Weights
from .backprop import token_loss


def bias_table_grad(d_bias: list[np.ndarray], table: np.ndarray, cfg: ModelConfig, bidirectional: bool) -> np.ndarray:
    """The gradient of T5's table (buckets, H) from every layer's dB (H, n_q, n_k): the layers share B,
    and B[h, i, j] = table[bucket(j − i), h], so each bucket's row gets the sum of its pairs' dB."""
    n_q, n_k = d_bias[0].shape[1:]
    buckets = relative_buckets(np.arange(n_q), np.arange(n_k), bidirectional, table.shape[0],
                               cfg.relative_max_distance)                       # (n_q, n_k)
    total = np.add.reduce(d_bias)                                               # (H, n_q, n_k)
    grad = np.zeros_like(table)                                                 # (buckets, H)
    np.add.at(grad, buckets.reshape(-1), total.reshape(total.shape[0], -1).T)
    return grad


def bias_grads(tape: Tape, w: Weights, grads: list, cfg: ModelConfig, bidirectional: bool) -> np.ndarray | None:
    """The gradient of a stack's shared table (T5), returned; or of each layer's own (UMT5), put into
    that layer's gradients (GRADS); None without a learned position bias."""
    if w.rel_bias is not None:
        return bias_table_grad([tape.pop(i, "d_position_bias") for i in range(len(w.blocks))], w.rel_bias, cfg,
                               bidirectional)
    for i, (b, g) in enumerate(zip(w.blocks, grads)):
        if b.attn.rel_bias is not None:
            g.attn.rel_bias = bias_table_grad([tape.pop(i, "d_position_bias")], b.attn.rel_bias, cfg, bidirectional)
    return None


def loss_and_grads(weights: Seq2SeqWeights, cfg: ModelConfig, src: np.ndarray, src_mask: np.ndarray,
                   tgt_in: np.ndarray, labels: np.ndarray) -> tuple[float, Seq2SeqWeights]:
    """Mean cross-entropy of labels (B, n_tgt) given the source (B, n_src) and the decoder's input tgt_in
    (B, n_tgt), and the gradient of every weight as a Seq2SeqWeights tree (one shared table: its
    gradient is the sum over the encoder's, the decoder's embeddings and a tied W_vocab). Labels −100:
    not learned. Inputs are checked by the caller (`gradients`, the training loop)."""
    enc, dec = weights.encoder, weights.decoder
    counted = labels != -100                              # (B, n_tgt)
    if not counted.any():
        raise QkvError("no label to learn from; give target sentences of at least one token")
    tapes = {"encoder": Tape(), "decoder": Tape(), "cross": Tape()}
    stacks = Stacks(tape=tapes)

    # forward: the engine's encoder, the cross-attention's K, V of its output M, the decoder reading them
    m = encoder_pass(weights, cfg, src, src_mask, stacks)                   # M (B, n_src, d_model)
    h, logits = decoder_pass(weights, cfg, tgt_in, None, memory_of(weights, cfg, m), src_mask, stacks=stacks)
    loss, dlogits = token_loss(logits, np.where(counted, labels, 0), counted)

    # backward: the decoder (collecting each layer's dK, dV of the memory), then the memory, then the encoder
    s = cfg.d_model ** -0.5 if cfg.scale_decoder_output else None  # T5 v1.0: logits = (h·s)·W_vocab
    dh, dW_vocab, _ = back.linear(dlogits, h if s is None else h * s, dec.W_vocab, False)   # final_logits_bias: fixed
    if s is not None:
        dh *= s
    dec_tape, g_dec_final = tapes["decoder"], None
    if dec.final_norm is not None:
        dh, g_dec_final = back.norm(dh, dec_tape.pop(None, "final_norm"), dec.final_norm, cfg)
    g_dec, d_kv = [None] * len(dec.blocks), [None] * len(dec.blocks)
    dy = dh
    for i in reversed(range(len(dec.blocks))):
        dy, g_dec[i], d_kv[i] = back.block(dy, dec.blocks[i], dec_tape, i, cfg, tapes["cross"])
    g_dec_bias = bias_grads(dec_tape, dec, g_dec, cfg, False)
    d_tok = np.zeros_like(weights.tok_embed)              # (V, d_model), the shared table
    _, d_pos_dec, _, g_dec_embed = back.embed(dy, dec, cfg, dec_tape.pop(None, "embed"), d_tok)
    dm = back.memory(d_kv, m, dec.blocks, g_dec)          # (B, n_src, d_model)
    enc_tape, g_enc_final = tapes["encoder"], None
    if enc.final_norm is not None:
        dm, g_enc_final = back.norm(dm, enc_tape.pop(None, "final_norm"), enc.final_norm, cfg)
    g_enc = [None] * len(enc.blocks)
    dx = dm
    for i in reversed(range(len(enc.blocks))):
        dx, g_enc[i], _ = back.block(dx, enc.blocks[i], enc_tape, i, cfg)
    g_enc_bias = bias_grads(enc_tape, enc, g_enc, cfg, True)
    _, d_pos_enc, _, g_enc_embed = back.embed(dx, enc, cfg, enc_tape.pop(None, "embed"), d_tok)
    if np.shares_memory(dec.W_vocab, weights.tok_embed):
        d_tok += dW_vocab.T                               # tied: W_vocab = Eᵀ
        dW_vocab = d_tok.T
    return loss, Seq2SeqWeights(
        Weights(tok_embed=d_tok, blocks=g_enc, pos_embed=d_pos_enc, embed_norm=g_enc_embed, final_norm=g_enc_final,
                rel_bias=g_enc_bias),
        Weights(tok_embed=d_tok, blocks=g_dec, pos_embed=d_pos_dec, embed_norm=g_dec_embed, final_norm=g_dec_final,
                W_vocab=dW_vocab, rel_bias=g_dec_bias))


def decoder_inputs(labels: np.ndarray, start: int | None, pad: int, from_labels: bool = False) -> np.ndarray:
    """transformers' shift_tokens_right: the decoder reads [start] + labels[:-1], −100 read as pad.
    from_labels (mBART's shift): start is each row's last token that is not pad (its language id), at
    index (number of non-pad tokens) − 1 as mBART counts it."""
    labels = np.where(labels == -100, pad, labels)                          # (B, n_tgt)
    tgt = np.empty_like(labels)
    if from_labels:
        last = np.maximum((labels != pad).sum(axis=1) - 1, 0)               # (B,) torch's gather would wrap −1: 0 here
        tgt[:, 0] = labels[np.arange(len(labels)), last]
    else:
        tgt[:, 0] = start
    tgt[:, 1:] = labels[:, :-1]
    return tgt
