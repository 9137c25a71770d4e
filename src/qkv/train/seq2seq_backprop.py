"""Backprop through an encoder–decoder (Marian, BART): the engine's two passes keeping their tapes, then
the boxes' backwards in reverse.

    encoder   M = Blocks_enc(E[src]·s + P)                      self-attention both ways, padding hidden
    decoder   Y = Blocks_dec(E[tgt_in]·s + P, M)                causal self-attention, cross-attention, FFN
              cross-attention: Q = Y·W_Q, K = M·W_K, V = M·W_V   (n_tgt × n_src)
    loss      mean −log softmax(Y·W_vocab + b)[label]           labels −100 are not learned

The forward is qkv.engine.seq2seq's (encoder_pass, memory_of, decoder_pass) with a Tape per stack; every
backward is qkv.engine.blocks_backward's. Backwards, the cross-attention is where the two stacks meet:
each decoder layer's dK and dV flow into dM, the gradient of the encoder's output (`back.memory`), which
then runs back through the encoder. The loss is transformers' for `model(input_ids, attention_mask,
labels=labels)`: the decoder reads [start] + labels[:-1] (mBART: start = the labels' language id). T5's relative position bias and unscaled
scores are not trained here (a clear error says so).
"""

from __future__ import annotations

import numpy as np

from ..engine import blocks_backward as back
from ..engine.blocks_backward import Tape
from ..engine.config import ModelConfig
from ..engine.errors import QkvError
from ..engine.seq2seq import Stacks, decoder_pass, encoder_pass, memory_of
from ..engine.weights import Seq2SeqWeights, Weights
from .backprop import token_loss


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
    dh, dW_vocab, _ = back.linear(dlogits, h, dec.W_vocab, False)   # final_logits_bias: a fixed buffer
    dec_tape, g_dec_final = tapes["decoder"], None
    if dec.final_norm is not None:
        dh, g_dec_final = back.norm(dh, dec_tape.pop(None, "final_norm"), dec.final_norm, cfg)
    g_dec, d_kv = [None] * len(dec.blocks), [None] * len(dec.blocks)
    dy = dh
    for i in reversed(range(len(dec.blocks))):
        dy, g_dec[i], d_kv[i] = back.block(dy, dec.blocks[i], dec_tape, i, cfg, tapes["cross"])
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
    _, d_pos_enc, _, g_enc_embed = back.embed(dx, enc, cfg, enc_tape.pop(None, "embed"), d_tok)
    if np.shares_memory(dec.W_vocab, weights.tok_embed):
        d_tok += dW_vocab.T                               # tied: W_vocab = Eᵀ
        dW_vocab = d_tok.T
    return loss, Seq2SeqWeights(
        Weights(tok_embed=d_tok, blocks=g_enc, pos_embed=d_pos_enc, embed_norm=g_enc_embed, final_norm=g_enc_final),
        Weights(tok_embed=d_tok, blocks=g_dec, pos_embed=d_pos_dec, embed_norm=g_dec_embed, final_norm=g_dec_final,
                W_vocab=dW_vocab))


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
