"""Backprop through a decoder, box by box: the forward of qkv.engine.blocks keeping what the backward needs.

    forward (qkv.engine.blocks)                         backward (here, the same letters)
    X = E[ids] + P[pos]                         dE[ids] += dX,  dP[pos] += dX
    N = Norm(X)                                 ops.layer_norm_backward / rms_norm_backward
    Q, K, V = N·W_Q, N·W_K, N·W_V               dW_Q = Nᵀ·dQ …,  dN = dQ·W_Qᵀ + dK·W_Kᵀ + dV·W_Vᵀ
    Q, K ← RoPE(Q), RoPE(K)                     positions.apply_rope_backward (the opposite turn)
    Z = softmax(Q·Kᵀ/√d_k + M)·V                attention.attention_backward (dS = A ⊙ (dA − rowsum(dA ⊙ A)))
    O = Concat(Z)·W_O + b_O                     dW_O = Zᵀ·dO,  dZ = dO·W_Oᵀ
    X ← X + O                                   the residual passes dX on unchanged, and adds dO's path
    F = act(N·W_in + b)·W_out (+ SwiGLU gate)   ops.*_backward of the activation
    logits = Norm(X)·W_vocab                    dW_vocab = Hᵀ·dlogits (tied: added to dE)
    L = mean −log softmax(logits)[next id]      dlogits = (softmax(logits) − onehot(next id)) / N

The elementwise backwards sit beside their forwards (ops.py, positions.py, attention.py); this
module composes them in the order of qkv.engine.blocks' boxes, reusing its forward functions, so the
inference path is untouched. The forward keeps, per block, the inputs of each box and the
attention weights A (L · B · H · n² floats: what training on short sequences can afford).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from ..engine.attention import attention_backward, merge_heads, scaled_dot_product_attention, split_heads
from ..engine.blocks import attention_mask_of, linear, norm, projections
from ..engine.config import ModelConfig
from ..engine.errors import QkvError
from ..engine.ops import ACTIVATION_BACKWARDS, ACTIVATIONS, layer_norm_backward, rms_norm_backward
from ..engine.positions import apply_rope, apply_rope_backward, positions_from_mask, rope_cos_sin, rope_inv_freq
from ..engine.weights import AttentionWeights, BlockWeights, FFNWeights, NormWeights, Weights


# ── the boxes' backwards ─────────────────────────────────────────────────────────

def linear_backward(dy: np.ndarray, x: np.ndarray, W: np.ndarray, bias: bool
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """(dx, dW, db) of y = x·W + b over the last axis: dx = dy·Wᵀ, dW = xᵀ·dy, db = Σ_rows dy."""
    rows = math.prod(x.shape[:-1])                        # B·n (not -1: d_ff may be 0, attention-only)
    x2 = x.reshape(rows, x.shape[-1])                     # (B·n, in)
    dy2 = dy.reshape(rows, dy.shape[-1])                  # (B·n, out)
    dx = (dy2 @ W.T).reshape(*x.shape)                    # (B, n, in)
    return dx, x2.T @ dy2, (np.add.reduce(dy2, axis=0) if bias else None)   # (in, out), (out,)


def norm_backward(dy: np.ndarray, x: np.ndarray, w: NormWeights, cfg: ModelConfig
                  ) -> tuple[np.ndarray, NormWeights]:
    """dx and the norm's gradients (dγ, dβ) for LayerNorm or RMSNorm, as the config says."""
    if cfg.norm == "rms":
        dx, dg = rms_norm_backward(dy, x, w.weight, cfg.norm_eps)
        return dx, NormWeights(dg)
    dx, dg, db = layer_norm_backward(dy, x, w.weight, cfg.norm_eps)
    return dx, NormWeights(dg, db if w.bias is not None else None)


@dataclass
class AttentionTape:
    """What self_attention's backward needs: its input and Q, K, V (rotated), A, Concat(Z)."""

    x: np.ndarray        # (B, n, d_model)
    q: np.ndarray        # (B, H, n, d_k)
    k: np.ndarray        # (B, Hkv, n, d_k)
    v: np.ndarray        # (B, Hkv, n, d_k)
    a: np.ndarray        # (B, H, n, n)
    z: np.ndarray        # (B, n, H·d_k)


def fused_qkv(w: AttentionWeights) -> np.ndarray | None:
    """[W_Q | W_K | W_V] as one (d_model, (H + 2·Hkv)·d_k) array when the three are its column blocks
    (qkv.engine.layout's W_QKV, or GPT-2's c_attn, which the checkpoint stores fused), else None.
    One product then does the work of three, forwards and backwards."""
    if w.W_QKV is not None:
        return w.W_QKV
    base = w.W_Q.base
    if base is None or base is not w.W_K.base or base is not w.W_V.base or base.ndim != 2:
        return None
    at = [a.__array_interface__["data"][0] for a in (base, w.W_Q, w.W_K, w.W_V)]
    step = base.itemsize
    hq, hk = w.W_Q.shape[1], w.W_K.shape[1]
    if (base.shape[1] == hq + 2 * hk and w.W_Q.strides == base.strides
            and at[1:] == [at[0], at[0] + hq * step, at[0] + (hq + hk) * step]):
        return base
    return None


def attention_forward(x: np.ndarray, w: AttentionWeights, cfg: ModelConfig, bias: np.ndarray | None,
                      rope: tuple[np.ndarray, np.ndarray] | None) -> tuple[np.ndarray, AttentionTape]:
    """MultiHead(X) as qkv.engine.blocks.self_attention computes it, keeping the tape."""
    fused = fused_qkv(w)
    q, k, v = projections(x, w if fused is None or w.W_QKV is not None else replace(w, W_QKV=fused))
    q = split_heads(q, cfg.n_heads)                       # (B, H, n, d_k)
    k = split_heads(k, cfg.n_kv_heads)                    # (B, Hkv, n, d_k)
    v = split_heads(v, cfg.n_kv_heads)                    # (B, Hkv, n, d_k)
    if rope is not None:
        q, k = apply_rope(q, *rope), apply_rope(k, *rope)
    z, a, _ = scaled_dot_product_attention(q, k, v, bias) # (B, H, n, d_k), (B, H, n, n)
    z = merge_heads(z)                                    # (B, n, H·d_k)
    return linear(z, w.W_O, w.b_O), AttentionTape(x, q, k, v, a, z)


def attention_backward_box(dout: np.ndarray, w: AttentionWeights, t: AttentionTape,
                           rope: tuple[np.ndarray, np.ndarray] | None) -> tuple[np.ndarray, AttentionWeights]:
    """dX and the gradients of W_Q, W_K, W_V, W_O (and biases) from dL/dMultiHead(X)."""
    dz, dW_O, db_O = linear_backward(dout, t.z, w.W_O, w.b_O is not None)    # (B, n, H·d_k)
    dz = split_heads(dz, t.q.shape[1])                    # (B, H, n, d_k)
    dq, dk, dv = attention_backward(dz, t.q, t.k, t.v, t.a)
    if rope is not None:
        dq, dk = apply_rope_backward(dq, *rope), apply_rope_backward(dk, *rope)
    dq, dk, dv = merge_heads(dq), merge_heads(dk), merge_heads(dv)   # (B, n, H·d_k), (B, n, Hkv·d_k) × 2
    fused = fused_qkv(w)
    if fused is not None:                                 # one product for the three: [dQ | dK | dV]
        dx, dW, _ = linear_backward(np.concatenate([dq, dk, dv], axis=-1), t.x, fused, False)
        hq, hk = dq.shape[-1], dk.shape[-1]
        dW_Q, dW_K, dW_V = dW[:, :hq], dW[:, hq:hq + hk], dW[:, hq + hk:]
        db_Q, db_K, db_V = (None if b is None else np.add.reduce(d.reshape(-1, d.shape[-1]), axis=0)
                            for b, d in ((w.b_Q, dq), (w.b_K, dk), (w.b_V, dv)))
    else:
        dx, dW_Q, db_Q = linear_backward(dq, t.x, w.W_Q, w.b_Q is not None)
        dx_k, dW_K, db_K = linear_backward(dk, t.x, w.W_K, w.b_K is not None)
        dx_v, dW_V, db_V = linear_backward(dv, t.x, w.W_V, w.b_V is not None)
        dx += dx_k
        dx += dx_v                                        # (B, n, d_model): X feeds Q, K and V
    return dx, AttentionWeights(W_Q=dW_Q, W_K=dW_K, W_V=dW_V, W_O=dW_O, b_Q=db_Q, b_K=db_K, b_V=db_V, b_O=db_O)


@dataclass
class FFNTape:
    """What feed_forward's backward needs: its input, x·W_in + b, x·W_gate (gated) and act(…)."""

    x: np.ndarray                 # (B, n, d_model)
    u: np.ndarray                 # (B, n, d_ff) x·W_in + b_in
    g: np.ndarray | None          # (B, n, d_ff) x·W_gate (SwiGLU), else None
    h: np.ndarray                 # (B, n, d_ff) what W_out multiplies


def ffn_forward(x: np.ndarray, w: FFNWeights, cfg: ModelConfig) -> tuple[np.ndarray, FFNTape]:
    """FFN(x) = act(x·W_in + b)·W_out + b, or (act(x·W_gate) ⊙ (x·W_in + b))·W_out + b (SwiGLU)."""
    act = ACTIVATIONS[cfg.activation]
    u = linear(x, w.W_in, w.b_in)                         # (B, n, d_ff)
    g = None if w.W_gate is None else linear(x, w.W_gate) # (B, n, d_ff)
    h = act(u) if g is None else act(g) * u               # (B, n, d_ff)
    return linear(h, w.W_out, w.b_out), FFNTape(x, u, g, h)


def ffn_backward(dout: np.ndarray, w: FFNWeights, t: FFNTape, cfg: ModelConfig) -> tuple[np.ndarray, FFNWeights]:
    """dx and the FFN's gradients. Gated: du = dh ⊙ act(g), dg = act'(g) ⊙ dh ⊙ u."""
    act_backward = ACTIVATION_BACKWARDS[cfg.activation]
    dh, dW_out, db_out = linear_backward(dout, t.h, w.W_out, w.b_out is not None)   # (B, n, d_ff)
    if t.g is None:
        du, dW_gate, dx_g = act_backward(dh, t.u), None, None
    else:
        du = dh * ACTIVATIONS[cfg.activation](t.g)
        dx_g, dW_gate, _ = linear_backward(act_backward(dh * t.u, t.g), t.x, w.W_gate, False)
    dx, dW_in, db_in = linear_backward(du, t.x, w.W_in, w.b_in is not None)
    if dx_g is not None:
        dx += dx_g
    return dx, FFNWeights(W_in=dW_in, W_out=dW_out, b_in=db_in, b_out=db_out, W_gate=dW_gate)


def residual_forward(x: np.ndarray, w: NormWeights, cfg: ModelConfig, box) -> tuple[np.ndarray, tuple]:
    """One residual step and its tape: x + Box(Norm(x)) (pre-norm) or Norm(x + Box(x)) (post-norm).

    box(h) → (Box(h), its tape). The tape keeps what the norm normalised and the box's tape.
    """
    if cfg.norm_place == "post":                          # BERT, Marian, BART
        out, tape = box(x)
        r = x + out                                       # (B, n, d_model)
        return norm(r, w, cfg), (r, tape)
    out, tape = box(norm(x, w, cfg))
    return x + out, (x, tape)                             # GPT-2, Llama, T5


def residual_backward(dy: np.ndarray, w: NormWeights, cfg: ModelConfig, saved: tuple, box_backward
                      ) -> tuple[np.ndarray, NormWeights, object]:
    """(dx, the norm's gradients, the box's gradients) of one residual step; box_backward(d_out, tape) →
    (d_in, gradients). The residual passes its gradient on unchanged, the box adds its own path."""
    norm_in, tape = saved
    if cfg.norm_place == "post":
        dr, g_norm = norm_backward(dy, norm_in, w, cfg)   # y = Norm(r), r = x + Box(x)
        dx, g_box = box_backward(dr, tape)
        dx += dr
        return dx, g_norm, g_box
    dh, g_box = box_backward(dy, tape)                    # y = x + Box(h), h = Norm(x)
    dx, g_norm = norm_backward(dh, norm_in, w, cfg)
    dx += dy
    return dx, g_norm, g_box


def block_forward(x: np.ndarray, w: BlockWeights, cfg: ModelConfig, bias: np.ndarray | None,
                  rope: tuple[np.ndarray, np.ndarray] | None) -> tuple[np.ndarray, tuple]:
    """One block as qkv.engine.blocks.block (attention, then FFN, each a residual step), keeping its tape."""
    x, t_attn = residual_forward(x, w.attn_norm, cfg, lambda h: attention_forward(h, w.attn, cfg, bias, rope))
    x, t_ffn = residual_forward(x, w.ffn_norm, cfg, lambda h: ffn_forward(h, w.ffn, cfg))
    return x, (t_attn, t_ffn)


def block_backward(dy: np.ndarray, w: BlockWeights, tape: tuple, cfg: ModelConfig,
                   rope: tuple[np.ndarray, np.ndarray] | None) -> tuple[np.ndarray, BlockWeights]:
    """dX of the block's input and its weights' gradients, the two residual steps in reverse."""
    t_attn, t_ffn = tape
    dx, g_ffn_norm, g_ffn = residual_backward(dy, w.ffn_norm, cfg, t_ffn,
                                              lambda d, t: ffn_backward(d, w.ffn, t, cfg))
    dx, g_attn_norm, g_attn = residual_backward(dx, w.attn_norm, cfg, t_attn,
                                                lambda d, t: attention_backward_box(d, w.attn, t, rope))
    return dx, BlockWeights(attn_norm=g_attn_norm, attn=g_attn, ffn_norm=g_ffn_norm, ffn=g_ffn)


def embedding_backward(d_table: np.ndarray, ids: np.ndarray, dx: np.ndarray, cfg: ModelConfig) -> None:
    """dE[ids] += dX for X = E[ids], into d_table (V, d_model) in place; ids (B, n), dx (B, n, d_model).
    A repeated id sums its rows' gradients (`add_rows`; fancy-index assignment would keep one). With
    cfg.pad_embedding_frozen a lookup of pad_token_id adds nothing to its row (torch's padding_idx)."""
    rows = dx.reshape(-1, dx.shape[-1])                   # (B·n, d_model)
    flat = ids.reshape(-1)
    if cfg.pad_embedding_frozen and cfg.pad_token_id is not None:
        keep = flat != cfg.pad_token_id
        flat, rows = flat[keep], rows[keep]
    add_rows(d_table, flat, rows)


def add_rows(table: np.ndarray, idx: np.ndarray, rows: np.ndarray) -> None:
    """table[idx[i]] += rows[i] for every i, repeated indices summed: idx (N,), rows (N, d).

    Plain form: np.add.at(table, idx, rows). Sorting the indices and summing each run of equal ones
    with one reduceat is the same sum, several times faster (add.at handles one row at a time).
    """
    if idx.size == 0:
        return
    order = np.argsort(idx, kind="stable")
    idx_sorted = idx[order]
    starts = np.flatnonzero(np.r_[True, idx_sorted[1:] != idx_sorted[:-1]])   # first row of each index
    table[idx_sorted[starts]] += np.add.reduceat(rows[order], starts, axis=0)  # (unique, d)


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
    dtype = weights.tok_embed.dtype
    B, n = ids.shape
    positions = positions_from_mask(mask)                 # (B, n)

    # forward: X = E[ids] + P[positions] → blocks → final norm → logits
    x = weights.tok_embed[ids]                            # (B, n, d_model)
    if weights.pos_embed is not None:
        x += weights.pos_embed[positions]
    rope = None
    if cfg.position == "rope":
        rope = rope_cos_sin(positions, rope_inv_freq(cfg.d_head, cfg.rope_theta, cfg.rope_scaling, dtype))
    bias = attention_mask_of(cfg, mask, n).bias(dtype)    # (B or 1, 1, n, n) M
    tapes = []
    for w in weights.blocks:
        x, tape = block_forward(x, w, cfg, bias, rope)
        tapes.append(tape)
    h = x if weights.final_norm is None else norm(x, weights.final_norm, cfg)   # (B, n, d_model)
    logits = linear(h, weights.W_vocab, weights.b_vocab)  # (B, n, V)
    loss, dlogits = next_token_loss(logits, ids, counted)
    del logits

    # backward, the same boxes in the opposite order
    dh, dW_vocab, db_vocab = linear_backward(dlogits, h, weights.W_vocab, weights.b_vocab is not None)
    del dlogits
    g_final = None
    if weights.final_norm is not None:
        dh, g_final = norm_backward(dh, x, weights.final_norm, cfg)
    dx = dh                                               # (B, n, d_model)
    g_blocks = [None] * len(weights.blocks)
    for i in reversed(range(len(weights.blocks))):
        dx, g_blocks[i] = block_backward(dx, weights.blocks[i], tapes[i], cfg, rope)
        tapes[i] = None                                   # free what this block kept
    d = cfg.d_model
    d_tok = np.zeros_like(weights.tok_embed)              # (V, d_model)
    embedding_backward(d_tok, ids, dx, cfg)               # dE[ids] += dX
    d_pos = None
    if weights.pos_embed is not None and cfg.position == "learned":
        d_pos = np.zeros_like(weights.pos_embed)          # (P, d_model)
        add_rows(d_pos, positions.reshape(-1), dx.reshape(-1, d))     # dP[positions] += dX
    if np.shares_memory(weights.W_vocab, weights.tok_embed):
        d_tok += dW_vocab.T                               # tied: W_vocab = Eᵀ, one table
        dW_vocab = d_tok.T
    return loss, Weights(tok_embed=d_tok, blocks=g_blocks, pos_embed=d_pos, final_norm=g_final,
                         W_vocab=dW_vocab, b_vocab=db_vocab)
