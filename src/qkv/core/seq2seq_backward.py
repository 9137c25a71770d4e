"""Backprop through an encoder–decoder (Marian, BART, mBART, Pegasus, T5, mT5, UMT5): the engine's two
passes keeping their tapes, then the boxes' backwards in reverse.

    encoder   M = Blocks_enc(E[src]·s + P)                      self-attention both ways, padding hidden
    decoder   Y = Blocks_dec(E[tgt_in]·s + P, M)                causal self-attention, cross-attention, FFN
              cross-attention: Q = Y·W_Q, K = M·W_K, V = M·W_V   (n_tgt × n_src)

The forward is qkv.models.seq2seq's (encoder_pass, memory_of, decoder_pass) with a Tape per stack (`taped`);
every backward is qkv.core.blocks_backward's (`backward`, from a gradient on the logits: training's loss,
qkv.train.seq2seq_backprop, or one logit, input attribution). Backwards, the cross-attention is where the
two stacks meet: each decoder layer's dK and dV flow into dM, the gradient of the encoder's output
(`back.memory`), which then runs back through the encoder. T5 and mT5: the scores unscaled (scale 1), the
relative position bias learned — each stack's one table, whose gradient sums every layer's dB by bucket
(`bias_table_grad`; UMT5: each layer's table its own) — and v1.0's tied head read after × d_model^-0.5.
"""

from __future__ import annotations

import numpy as np

from . import blocks_backward as back
from .blocks_backward import Tape
from .config import ModelConfig
from .positions import relative_buckets
from .stack import Stacks, decoder_pass, encoder_pass, memory_of
from .weights import Seq2SeqWeights, Weights


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


def taped(weights: Seq2SeqWeights, cfg: ModelConfig, src: np.ndarray, src_mask: np.ndarray, tgt_in: np.ndarray,
          source_tokens: np.ndarray | None = None, target_tokens: np.ndarray | None = None
          ) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict[str, Tape]]:
    """Both passes keeping their tapes: (M (B, n_src, d), decoder hidden (B, n_tgt, d), logits (B, n_tgt, V),
    tapes). source_tokens, target_tokens: token embeddings E[ids]·s to use instead of the table's."""
    tapes = {"encoder": Tape(), "decoder": Tape(), "cross": Tape()}
    stacks = Stacks(tape=tapes)
    m = encoder_pass(weights, cfg, src, src_mask, stacks, tokens=source_tokens)      # M (B, n_src, d_model)
    h, logits = decoder_pass(weights, cfg, tgt_in, None, memory_of(weights, cfg, m), src_mask, stacks=stacks,
                             tokens=target_tokens)
    if cfg.final_softcap is not None:                    # T5Gemma: the capped logits, which their backward reads
        tapes["decoder"].put(None, "logits", logits)
    return m, h, logits, tapes


def backward(dlogits: np.ndarray, m: np.ndarray, h: np.ndarray, weights: Seq2SeqWeights, cfg: ModelConfig,
             tapes: dict[str, Tape], inputs: dict[str, np.ndarray] | None = None) -> Seq2SeqWeights:
    """Every weight's gradient of a scalar whose gradient on the logits is DLOGITS (B, n_tgt, V), back through
    what `taped` kept (M, h its outputs; the tapes are used up). inputs: a dict that receives "source_tokens"
    and "target_tokens", the gradients of both sides' token embeddings E[ids]·s."""
    enc, dec = weights.encoder, weights.decoder
    source: dict[str, np.ndarray] = {}
    target: dict[str, np.ndarray] = {}
    # backward: the decoder (collecting each layer's dK, dV of the memory), then the memory, then the encoder
    if cfg.final_softcap is not None:                    # T5Gemma: y = c·tanh(ℓ/c), dℓ = dy ⊙ (1 − (y/c)²)
        dlogits = dlogits * (1 - np.square(tapes["decoder"].pop(None, "logits") / cfg.final_softcap))
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
    d_tok = np.zeros_like(dec.tok_embed)                  # (V, d_model), the decoder's table (the shared one)
    _, d_pos_dec, _, g_dec_embed = back.embed(dy, dec, cfg, dec_tape.pop(None, "embed"), d_tok, grads=target)
    dm = back.memory(d_kv, m, dec.blocks, g_dec)          # (B, n_src, d_model)
    enc_tape, g_enc_final = tapes["encoder"], None
    if enc.final_norm is not None:
        dm, g_enc_final = back.norm(dm, enc_tape.pop(None, "final_norm"), enc.final_norm, cfg)
    g_enc = [None] * len(enc.blocks)
    dx = dm
    for i in reversed(range(len(enc.blocks))):
        dx, g_enc[i], _ = back.block(dx, enc.blocks[i], enc_tape, i, cfg)
    g_enc_bias = bias_grads(enc_tape, enc, g_enc, cfg, True)
    shared = np.shares_memory(enc.tok_embed, dec.tok_embed)   # one table, or each stack's own (untied)
    d_src = d_tok if shared else np.zeros_like(enc.tok_embed)
    _, d_pos_enc, _, g_enc_embed = back.embed(dx, enc, cfg, enc_tape.pop(None, "embed"), d_src, grads=source)
    if inputs is not None:
        inputs["source_tokens"], inputs["target_tokens"] = source["tokens"], target["tokens"]
    if np.shares_memory(dec.W_vocab, dec.tok_embed):
        d_tok += dW_vocab.T                               # tied: W_vocab = Eᵀ
        dW_vocab = d_tok.T
    return Seq2SeqWeights(
        Weights(tok_embed=d_src, blocks=g_enc, pos_embed=d_pos_enc, embed_norm=g_enc_embed, final_norm=g_enc_final,
                rel_bias=g_enc_bias),
        Weights(tok_embed=d_tok, blocks=g_dec, pos_embed=d_pos_dec, embed_norm=g_dec_embed, final_norm=g_dec_final,
                W_vocab=dW_vocab, rel_bias=g_dec_bias))


