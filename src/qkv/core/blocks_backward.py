"""The backward of each box of qkv.core.blocks (and of qkv.core.layer's residual step and block), under the
same names, and the `Tape` a forward pass fills for them when asked (`Context.tape`).

    forward (blocks.py, layer.py)                        backward (here, the same letters)
    X = E[ids] + P[pos] (+ T[types]), Norm?          embed: dE[ids] += dX, dP[pos] += dX (Norm first)
    N = Norm(X)                                      norm: ops.layer_norm_backward / rms_norm_backward
    Q, K, V = N·W_Q, N·W_K, N·W_V                    projections: dW_Q = Nᵀ·dQ …, dN = dQ·W_Qᵀ + dK·W_Kᵀ + dV·W_Vᵀ
    Q, K ← RoPE(Q), RoPE(K)                          positions.apply_rope_backward (the opposite turn)
    Z = softmax(Q·Kᵀ/√d_k + M)·V                     attention.attention_backward (dS = A ⊙ (dA − rowsum(dA ⊙ A)))
    (+ a sink logit s_h in the softmax, gpt-oss)     attention.sink_backward: d s_h = −Σ (1 − Σ_j A)·(dZ·Z)
    S += B (T5's learned position bias)              position_bias: dB = Σ_batch dS
    O = Concat(Z)·W_O + b_O                          linear: dW_O = Zᵀ·dO, dZ = dO·W_Oᵀ, db_O = Σ dO
    F = act(N·W_in + b)·W_out (+ SwiGLU gate)        feed_forward: ops.*_backward of the activation
    F = Σ_j w_j·FFN_{e_j}(N) (+ σ(N·w_s)·FFN_s(N))   routed_feed_forward: each chosen expert's, and the router's
                                                     softmax through the weights w_j (the choice: no gradient)
    X ← X + O, or Norm(X + O) (post-norm)            residual: dX passes on unchanged, the box adds its path
    logits = Z·W_vocab + b                           logits_of: dW_vocab = Zᵀ·dlogits
    Z ← Norm(act(Z·W_head + b)) (masked-LM head)     head; X·W_embed + b (ELECTRA): embed_projection

Each backward(dy, …) takes dL/d(its output) and returns dL/d(its input) and its weights' gradients
(a tree of the same dataclass as its weights). It reads what the forward kept: a forward run with
`Context(…, tape=Tape())` (and `transformer(…, tape=…)`) puts one record per box into the tape —
the inputs of the norms and boxes, Q, K, V, A, Concat(Z), the FFN's pre-activations — and a backward
takes its record out (`Tape.pop`), so each is freed once used. Without a tape the forward keeps
nothing more than it did. The tape's pass is the plain one (no KV cache, hooks or ablation).
Shapes as in blocks.py.

`block` runs its boxes' backwards from a `Boxes` (EXACT by default: the functions here). Another set runs
the same block code as the backward of another linear system: FROZEN is the local replacement model of an
attribution graph (qkv.graphs), whose norms divide by the scale the real pass had (`frozen_norm`), whose
attention passes gradient through V only, its pattern A fixed (`value_path`), and whose FFN is cut by the
caller's `ffn` (the transcoder that replaces it); none of them computes weight gradients.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np

from .attention import attention_backward, merge_heads, sink_backward, split_heads
from .config import ModelConfig
from .disentangled import RelativeTable, terms_backward
from .ops import (ACTIVATION_BACKWARDS, ACTIVATIONS, clamped_glu_backward, layer_norm_backward, rms_norm,
                  rms_norm_backward, softmax_backward, xielu_backward)
from .positions import apply_rope_backward
from ..runtime.errors import QkvError
from .weights import (AttentionWeights, BlockWeights, ConvWeights, FFNWeights, MoEWeights, NormWeights, Weights,
                      XIELUWeights)


# ── what the forward keeps ───────────────────────────────────────────────────────

@dataclass
class AttentionTape:
    """What attention's backward reads: its input, Q, K (rotated), V, A and Concat(Z)."""

    x: np.ndarray                                  # (B, n, d_model)
    q: np.ndarray                                  # (B, H, n, d_k)
    k: np.ndarray                                  # (B, Hkv, n, d_k)
    v: np.ndarray                                  # (B, Hkv, n, d_k)
    a: np.ndarray                                  # (B, H, n, n)
    z: np.ndarray                                  # (B, n, H·d_k)
    rope: tuple[np.ndarray, np.ndarray] | None     # cos, sin of the positions; None without RoPE
    pre: tuple[np.ndarray, np.ndarray] | None = None   # q, k before their norms (cfg.qk_norm); None: no such norm
    biased: bool = False                           # T5's learned position bias B was added (not a fixed one)
    d_bias: np.ndarray | None = None               # its gradient dS summed over the batch (H, n, m), set by the backward
    relative: RelativeTable | None = None          # DeBERTa: the relative table the position terms read (cfg.disentangled)
    d_rel: np.ndarray | None = None                # the table's gradient from this layer (2k, d_model), set by the backward
    latent: tuple[np.ndarray | None, np.ndarray] | None = None   # MLA: q's latent (B, n, r_q) or None and the K/V
                                                   # latent (B, 1, n, r_kv), each before its norm; k, v (B, H, n, ·)
    q_scale: np.ndarray | None = None              # Llama 4's NoPE layers: q's factor (B, 1, n, 1) by position; None


@dataclass
class FFNTape:
    """What feed_forward's backward reads: its input, x·W_in + b, x·W_gate (gated) and what W_out multiplies."""

    x: np.ndarray                 # (B, n, d_model)
    u: np.ndarray                 # (B, n, d_ff) x·W_in + b_in
    g: np.ndarray | None          # (B, n, d_ff) x·W_gate + b_gate (SwiGLU), else None
    h: np.ndarray                 # (B, n, d_ff) act(u), or act(g) ⊙ u


@dataclass
class MoETape:
    """What routed_feed_forward's backward reads: its input rows, the router's p, choice and weights, and per
    expert that some token went to: (expert, its rows, e's place in their k, its FFNTape, its output)."""

    x: np.ndarray                 # (N, d_model), N = B·n
    p: np.ndarray                 # (N, E) the router's scores s: softmax(x·W_router), or σ(x·W_router) each
    chosen: np.ndarray            # (N, k)
    gate: np.ndarray              # (N, k) the weights of the chosen experts' outputs
    experts: list[tuple[int, np.ndarray, np.ndarray, FFNTape, np.ndarray]]   # (e, rows (r,), slot (r,), tape, y (r, d))
    shared: tuple[FFNTape, np.ndarray, np.ndarray] | None = None   # the shared expert's tape, output (N, d), gate (N, 1)


@dataclass
class EmbedTape:
    """What embed's backward reads: the looked-up rows and, with an embedding norm, what it normalised."""

    ids: np.ndarray                  # (B, n)
    positions: np.ndarray            # (B, n)
    types: np.ndarray | None         # (B, n) token types, None: all 0
    norm_in: np.ndarray | None       # (B, n, d_model) before the embedding norm; None without one
    proj_in: np.ndarray | None = None    # (B, n, E) what W_embed projects (ELECTRA); None without it
    tokens: np.ndarray | None = None     # (B, n, d_embed) token embeddings given instead of E[ids]·s; None: looked up


@dataclass
class HeadTape:
    """What a masked-LM head's backward reads: its input Z, Z·W_head + b_head, and what W_vocab multiplies."""

    z: np.ndarray                    # (B, n, d_model)
    u: np.ndarray                    # (B, n, E) Z·W_head + b_head
    out: np.ndarray                  # (B, n, E) Norm(act(u))


class Tape:
    """The records a forward pass keeps for its backward, by (layer, box): (i, "attn") an AttentionTape,
    (i, "ffn") an FFNTape, (i, "attn_norm") and (i, "ffn_norm") the arrays those norms normalised;
    (None, "embed") an EmbedTape, (None, "final_norm") the final norm's input, (None, "head") a masked-LM
    head's HeadTape."""

    def __init__(self) -> None:
        self.records: dict[tuple[int | None, str], object] = {}

    def put(self, layer: int | None, box: str, record) -> None:
        self.records[layer, box] = record

    def pop(self, layer: int | None, box: str):
        """The record of that box, taken out of the tape (a backward reads it once)."""
        return self.records.pop((layer, box))


# ── the boxes' backwards ─────────────────────────────────────────────────────────

def linear(dy: np.ndarray, x: np.ndarray, W: np.ndarray, bias: bool
           ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """(dx, dW, db) of y = x·W + b over the last axis: dx = dy·Wᵀ, dW = xᵀ·dy, db = Σ_rows dy (None if no b)."""
    rows = math.prod(x.shape[:-1])                        # B·n (not -1: d_ff may be 0, attention-only)
    x2 = x.reshape(rows, x.shape[-1])                     # (B·n, in)
    dy2 = dy.reshape(rows, dy.shape[-1])                  # (B·n, out)
    dx = (dy2 @ W.T).reshape(*x.shape)                    # (B, n, in)
    return dx, x2.T @ dy2, (np.add.reduce(dy2, axis=0) if bias else None)   # (in, out), (out,)


def norm(dy: np.ndarray, x: np.ndarray, w: NormWeights, cfg: ModelConfig) -> tuple[np.ndarray, NormWeights]:
    """dx and the norm's gradients (dγ, dβ) of LayerNorm or RMSNorm of x, as the config says. A norm per head
    (γ (H, d_k), x (B, H, n, d_k): StableLM) is H norms, each head's gradient summed over its own rows only."""
    if w.weight.ndim == 2:
        heads = [norm(dy[:, h], x[:, h], NormWeights(w.weight[h], None if w.bias is None else w.bias[h]), cfg)
                 for h in range(w.weight.shape[0])]
        dx = np.stack([d for d, _ in heads], axis=1)                      # (B, H, n, d_k)
        return dx, NormWeights(np.stack([g.weight for _, g in heads]),    # (H, d_k)
                               None if w.bias is None else np.stack([g.bias for _, g in heads]))
    if cfg.norm == "rms":
        dx, dg = rms_norm_backward(dy, x, w.weight, cfg.norm_eps)
        return dx, NormWeights(dg)
    dx, dg, db = layer_norm_backward(dy, x, w.weight, cfg.norm_eps)
    return dx, NormWeights(dg, db if w.bias is not None else None)


def fused_qkv(w: AttentionWeights) -> np.ndarray | None:
    """[W_Q | W_K | W_V] as one (d_model, (H + 2·Hkv)·d_k) array when the three are its column blocks
    (qkv.core.layout's W_QKV, or GPT-2's c_attn, which the checkpoint stores fused), else None.
    One product then does the work of three, forwards (blocks.projections, given W_QKV) and backwards."""
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


def projections(dq: np.ndarray, dk: np.ndarray, dv: np.ndarray, x: np.ndarray, w: AttentionWeights
                ) -> tuple[np.ndarray, AttentionWeights]:
    """dX and the gradients of W_Q, W_K, W_V (and b_Q, b_K, b_V) from dQ (B, n, H·d_k), dK, dV (B, n, Hkv·d_k);
    the returned tree's W_O, b_O are None. X feeds all three: dX = dQ·W_Qᵀ + dK·W_Kᵀ + dV·W_Vᵀ, one product
    [dQ | dK | dV]·[W_Q | W_K | W_V]ᵀ when the weights are one matrix's column blocks (`fused_qkv`)."""
    fused = fused_qkv(w)
    if fused is not None:
        dx, dW, _ = linear(np.concatenate([dq, dk, dv], axis=-1), x, fused, False)
        hq, hk = dq.shape[-1], dk.shape[-1]
        dW_Q, dW_K, dW_V = dW[:, :hq], dW[:, hq:hq + hk], dW[:, hq + hk:]
        db_Q, db_K, db_V = (None if b is None else np.add.reduce(d.reshape(-1, d.shape[-1]), axis=0)
                            for b, d in ((w.b_Q, dq), (w.b_K, dk), (w.b_V, dv)))
    else:
        dx, dW_Q, db_Q = linear(dq, x, w.W_Q, w.b_Q is not None)
        dx_k, dW_K, db_K = linear(dk, x, w.W_K, w.b_K is not None)
        dx_v, dW_V, db_V = linear(dv, x, w.W_V, w.b_V is not None)
        dx += dx_k
        dx += dx_v                                        # (B, n, d_model)
    return dx, AttentionWeights(W_Q=dW_Q, W_K=dW_K, W_V=dW_V, W_O=None, b_Q=db_Q, b_K=db_K, b_V=db_V)


def attention(dout: np.ndarray, w: AttentionWeights, t: AttentionTape, cfg: ModelConfig | None = None
              ) -> tuple[np.ndarray, AttentionWeights]:
    """dX and the gradients of W_Q, W_K, W_V, W_O (and biases) from dL/dMultiHead(X); GQA/MQA, RoPE (full or
    partial) and the mask (causal, window, padding) come in through A and the tape's rotation; q/k norms
    (cfg.qk_norm: each head's, Qwen3, or the whole projection's, OLMo 2) through the tape's q, k before them."""
    if t.latent is not None:                                           # MLA (DeepSeek): its own box
        return latent_attention(dout, w, t, cfg)
    dz, dW_O, db_O = linear(dout, t.z, w.W_O, w.b_O is not None)      # (B, n, H·d_k)
    dz = split_heads(dz, t.q.shape[1])                                 # (B, H, n, d_k)
    dq, dk, dv = attention_backward(dz, t.q, t.k, t.v, t.a, None if cfg is None else cfg.score_scale,
                                    None if cfg is None else cfg.attn_softcap)
    d_sinks = (sink_backward(dz, split_heads(t.z, t.q.shape[1]), t.a)   # (H,) gpt-oss's sink logits
               if w.sinks is not None and cfg is not None and cfg.attn_sinks else None)
    if t.biased:
        t.d_bias = position_bias(dz, t)                                # (H, n, m)
    g_rel = {}
    if t.relative is not None:                                         # DeBERTa: S's c2p, p2c back to q, k, the table
        dq_r, dk_r, t.d_rel, g_rel = terms_backward(score_grad(dz, t), t.q, t.k, w, t.relative, cfg.disentangled,
                                                    cfg.score_scale)
        dq += dq_r
        dk += dk_r
    g_qn = g_kn = None
    if t.q_scale is not None:                            # Llama 4's temperature: q = q₀·s, dq₀ = dq·s
        dq = dq * t.q_scale
    l2 = cfg is not None and cfg.qk_l2_norm and t.rope is not None   # Llama 4: RMS without γ after RoPE
    if l2:
        dq, dk = rms_norm_backward(dq, t.pre[0], 1.0, cfg.norm_eps)[0], rms_norm_backward(dk, t.pre[1], 1.0, cfg.norm_eps)[0]
    after = cfg is not None and cfg.qk_norm_after_rope or l2   # Hunyuan: the norms came after RoPE: back through them
    if after and not l2:
        (dq, g_qn), (dk, g_kn) = norm(dq, t.pre[0], w.q_norm, cfg), norm(dk, t.pre[1], w.k_norm, cfg)
    if t.rope is not None:
        turn = cfg is not None and cfg.rope_interleaved              # GPT-J, Cohere: pairs (2i, 2i+1)
        dq, dk = apply_rope_backward(dq, *t.rope, turn), apply_rope_backward(dk, *t.rope, turn)
    if t.pre is not None and t.pre[0].ndim == 4 and not after:    # each head's: (B, H, n, d_k)
        (dq, g_qn), (dk, g_kn) = norm(dq, t.pre[0], w.q_norm, cfg), norm(dk, t.pre[1], w.k_norm, cfg)
    dq, dk, dv = merge_heads(dq), merge_heads(dk), merge_heads(dv)   # (B, n, H·d_k), (B, n, Hkv·d_k) × 2
    if t.pre is not None and t.pre[0].ndim == 3:          # the whole projection's: (B, n, H·d_k)
        (dq, g_qn), (dk, g_kn) = norm(dq, t.pre[0], w.q_norm, cfg), norm(dk, t.pre[1], w.k_norm, cfg)
    dx, g = projections(dq, dk, dv, t.x, w)
    g.W_O, g.b_O, g.q_norm, g.k_norm, g.sinks = dW_O, db_O, g_qn, g_kn, d_sinks
    for name, value in g_rel.items():              # W_Kr, b_Kr, W_Qr, b_Qr; or (share_att_key) more for W_K, b_K, …
        have = getattr(g, name)
        if value is not None:
            setattr(g, name, value if have is None else have + value)
    return dx, g


def latent_attention(dout: np.ndarray, w: AttentionWeights, t: AttentionTape, cfg: ModelConfig
                     ) -> tuple[np.ndarray, AttentionWeights]:
    """dX and the gradients of multi-head latent attention's weights (latent.latent_attention), the forward backwards:

        dZ, dW_O = back through Concat(Z)·W_O;  dQ, dK, dV = attention_backward (V d_v wide)
        dk_R = Σ_h dK_h[d_nope:], turned back (one key for every head);  [dK_nope | dV] → c·W_KV_b: dc, dW_KV_b
        dc through c = Norm(x·W_V + b_V): rms_norm_backward (ε latent_norm_eps) → d(x·W_V), dγ
        dQ's turned part turned back;  with q's latent: through Norm(x·W_Q + b_Q)·W_Q_b alike
        dX = d(x·W_Q)·W_Qᵀ + d(x·W_K)·W_Kᵀ + d(x·W_V)·W_Vᵀ (`projections`)
    """
    H, d_nope, eps = cfg.n_heads, cfg.d_head - cfg.rotary_dim, cfg.latent_norm_eps
    q_raw, c_raw = t.latent
    dz, dW_O, db_O = linear(dout, t.z, w.W_O, w.b_O is not None)      # (B, n, H·d_v)
    dz = split_heads(dz, H)                                            # (B, H, n, d_v)
    dq, dk, dv = attention_backward(dz, t.q, t.k, t.v, t.a, cfg.score_scale)
    dk_rot = latent_rope_backward(dk[..., d_nope:].sum(axis=1, keepdims=True), t.rope, cfg)   # (B, 1, n, d_rot)
    dq = np.concatenate([dq[..., :d_nope], latent_rope_backward(dq[..., d_nope:], t.rope, cfg)], axis=-1)
    c = rms_norm(c_raw, w.kv_latent_norm.weight, eps)[:, 0]           # (B, n, r_kv)
    dc, dW_KV_b, _ = linear(merge_heads(np.concatenate([dk[..., :d_nope], dv], axis=-1)), c, w.W_KV_b, False)
    dc_raw, dg_kv = rms_norm_backward(dc, c_raw[:, 0], w.kv_latent_norm.weight, eps)   # (B, n, r_kv)
    dq = merge_heads(dq)                                               # (B, n, H·d_k)
    dW_Q_b = dg_q = None
    if w.W_Q_b is not None:                                            # q's own latent
        dqn, dW_Q_b, _ = linear(dq, rms_norm(q_raw, w.q_latent_norm.weight, eps), w.W_Q_b, False)
        dq, dg_q = rms_norm_backward(dqn, q_raw, w.q_latent_norm.weight, eps)          # (B, n, r_q)
    dx, g = projections(dq, dk_rot[:, 0], dc_raw, t.x, w)
    g.W_O, g.b_O, g.W_KV_b, g.W_Q_b = dW_O, db_O, dW_KV_b, dW_Q_b
    g.kv_latent_norm = NormWeights(dg_kv)
    g.q_latent_norm = None if dg_q is None else NormWeights(dg_q)
    return dx, g


def latent_rope_backward(dy: np.ndarray, rope: tuple[np.ndarray, np.ndarray] | None, cfg: ModelConfig) -> np.ndarray:
    """dx of latent.latent_rope: the turn back, then (rope_deinterleave) the halves laid out as pairs again."""
    if rope is None:
        return dy
    dx = apply_rope_backward(dy, *rope, cfg.rope_interleaved)
    if cfg.rope_deinterleave:                                          # [x_0, x_2, …, x_1, x_3, …] → x
        half = dx.shape[-1] // 2
        out = np.empty_like(dx)
        out[..., 0::2], out[..., 1::2] = dx[..., :half], dx[..., half:]
        return out
    return dx


def score_grad(dz: np.ndarray, t: AttentionTape) -> np.ndarray:
    """dS (B, H, n, m) of S = … (+ a bias that varies per row of the batch: DeBERTa's position terms) from dZ:
    A ⊙ (dA − rowsum(dA ⊙ A)), dA = dZ·Vᵀ (attention_backward's own dS, for the terms' backward)."""
    B, H, n, dk = dz.shape
    Hkv = t.v.shape[1]
    dA = np.matmul(dz.reshape(B, Hkv, -1, dk), t.v.swapaxes(-1, -2))           # (B, Hkv, G·n, m)
    return softmax_backward(dA, t.a.reshape(dA.shape)).reshape(B, H, n, -1)    # (B, H, n, m)


def position_bias(dz: np.ndarray, t: AttentionTape) -> np.ndarray:
    """dB of S = Q·Kᵀ·scale + B (T5's bias, added after the scale, the same for every row of the batch):
    dS = A ⊙ (dA − rowsum(dA ⊙ A)) with dA = dZ·Vᵀ, summed over the batch → (H, n, m). The pass that
    made B from its table of buckets (positions.relative_bias) turns it into the table's gradient."""
    B, H, n, dk = dz.shape
    Hkv = t.v.shape[1]
    dA = np.matmul(dz.reshape(B, Hkv, -1, dk), t.v.swapaxes(-1, -2))           # (B, Hkv, G·n, m)
    dS = softmax_backward(dA, t.a.reshape(dA.shape))                            # (B, Hkv, G·n, m)
    return np.add.reduce(dS.reshape(B, H, n, -1), axis=0)                       # (H, n, m)


def feed_forward(dout: np.ndarray, w: FFNWeights | MoEWeights, t: FFNTape | MoETape, cfg: ModelConfig
                 ) -> tuple[np.ndarray, FFNWeights | MoEWeights]:
    """dx and the FFN's gradients. Plain: du = act'(u) ⊙ dh. Gated: du = dh ⊙ act(g), dg = act'(g) ⊙ dh ⊙ u
    (db_gate = Σ dg over tokens, as db_in = Σ du),
    through [W_gate | W_in] in one product when the weights are laid out so (W_gate_in). A routed FFN's
    (w a MoEWeights): `routed_feed_forward`."""
    if isinstance(w, MoEWeights):
        return routed_feed_forward(dout, w, t, cfg)
    dh, dW_out, db_out = linear(dout, t.h, w.W_out, w.b_out is not None)    # (B, n, d_ff)
    if w.xielu is not None:                               # Apertus: xIELU with this FFN's learned a_p, a_n
        p = w.xielu
        du, da_p, da_n = xielu_backward(dh, t.u, p.alpha_p, p.alpha_n, p.beta, p.eps)
        dx, dW_in, db_in = linear(du, t.x, w.W_in, w.b_in is not None)
        return dx, FFNWeights(W_in=dW_in, W_out=dW_out, b_in=db_in, b_out=db_out,
                              xielu=XIELUWeights(alpha_p=da_p, alpha_n=da_n))
    act_backward = ACTIVATION_BACKWARDS[cfg.activation]
    if t.g is None:
        dx, dW_in, db_in = linear(act_backward(dh, t.u), t.x, w.W_in, w.b_in is not None)
        return dx, FFNWeights(W_in=dW_in, W_out=dW_out, b_in=db_in, b_out=db_out)
    if cfg.glu_limit is not None:                         # gpt-oss's clamped SwiGLU (ops.clamped_glu_backward)
        dg, du = clamped_glu_backward(dh, t.g, t.u, cfg.glu_alpha, cfg.glu_limit)
    else:
        du = dh * ACTIVATIONS[cfg.activation](t.g)
        dg = act_backward(dh * t.u, t.g)
    db_in = None if w.b_in is None else np.add.reduce(du.reshape(-1, du.shape[-1]), axis=0)
    db_gate = None if w.b_gate is None else np.add.reduce(dg.reshape(-1, dg.shape[-1]), axis=0)   # (d_ff,)
    if w.W_gate_in is not None:                           # [dg | du]·[W_gate | W_in]ᵀ
        dx, dW, _ = linear(np.concatenate([dg, du], axis=-1), t.x, w.W_gate_in, False)
        d_ff = du.shape[-1]
        dW_gate, dW_in = dW[:, :d_ff], dW[:, d_ff:]
    else:
        dx, dW_in, _ = linear(du, t.x, w.W_in, False)
        dx_g, dW_gate, _ = linear(dg, t.x, w.W_gate, False)
        dx += dx_g
    return dx, FFNWeights(W_in=dW_in, W_out=dW_out, b_in=db_in, b_out=db_out, W_gate=dW_gate, b_gate=db_gate)


def routed_feed_forward(dout: np.ndarray, w: MoEWeights, t: MoETape, cfg: ModelConfig) -> tuple[np.ndarray, MoEWeights]:
    """dx and the routed FFN's gradients, of out = Σ_j g_j·y_j + σ(x·W_s)·FFN_s(x), y_j = FFN_{e_j}(x):

        dy_j = g_j·dout → each chosen expert's FFN backward (an expert no token chose gets zeros)
        (Llama 4's y_j = FFN_{e_j}(g_j·x), out = Σ_j y_j + …: d(g_j·x) = that backward of dout, dx += g_j·d(g_j·x),
        dg_j = d(g_j·x)·x)
        dg_j = dout·y_j;  g = c·q / D, q = s[chosen] (`route_backward`): dq = (c·dg − Σ_j g_j·dg_j) / D
        ds = dq at the chosen experts, 0 elsewhere;  dlogits = softmax_backward(ds, s), or ds·s(1 − s) (sigmoid)
        dW_router = xᵀ·dlogits,  dx += dlogits·W_routerᵀ
        shared: d FFN_s = σ·dout, dz = (dout·FFN_s(x))·σ(1 − σ), dW_s = xᵀ·dz, dx += dz·W_sᵀ (ungated: σ = 1)
    Which k experts a token goes to is a step function of x: it has no gradient (as in torch, where
    topk's indices are constants); the gradient flows through the chosen experts and the weights s gives them.
    The choice bias b_choice, the groups' ranking and the choice itself get none (b_choice's gradient: None).
    """
    shape = dout.shape
    d2 = dout.reshape(-1, shape[-1])                            # (N, d_model)
    dx = np.zeros_like(t.x)                                     # (N, d_model)
    dgate = np.zeros_like(t.gate)                               # (N, k)
    grads: list[FFNWeights | None] = [None] * len(w.experts)
    for e, rows, slot, tape, y in t.experts:
        g = t.gate[rows, slot][:, None]                         # (r, 1)
        if cfg.expert_input_scaled:                             # Llama 4: y_j = FFN(g_j·x): d(g·x) = FFN's dx
            dxg, grads[e] = feed_forward(d2[rows], w.experts[e], tape, cfg)   # (r, d_model)
            dgate[rows, slot] = np.einsum("rd,rd->r", dxg, t.x[rows])   # d(g·x)·x
            dx[rows] += dxg * g
            continue
        dgate[rows, slot] = np.einsum("rd,rd->r", d2[rows], y)  # dout·y_j
        dx_e, grads[e] = feed_forward(d2[rows] * g, w.experts[e], tape, cfg)
        dx[rows] += dx_e
    for e, g in enumerate(grads):
        if g is None:                                           # no token went to expert e
            f = w.experts[e]
            grads[e] = FFNWeights(W_in=np.zeros_like(f.W_in), W_out=np.zeros_like(f.W_out),
                                  W_gate=None if f.W_gate is None else np.zeros_like(f.W_gate),
                                  **{b: np.zeros_like(getattr(f, b)) for b in ("b_in", "b_out", "b_gate")
                                     if getattr(f, b) is not None})   # gpt-oss's experts' biases
    dq = route_backward(dgate, t, cfg)                          # (N, k)
    dp = np.zeros_like(t.p)                                     # (N, E)
    np.put_along_axis(dp, t.chosen, dq, axis=-1)
    dlogits = dp * t.p * (1 - t.p) if cfg.router_score == "sigmoid" else softmax_backward(dp, t.p)   # (N, E)
    dx_r, dW_router, db_router = linear(dlogits, t.x, w.W_router, w.b_router is not None)   # gpt-oss: its bias
    dx += dx_r
    g_shared = dW_gate = None
    if t.shared is not None:
        tape, s, sg = t.shared
        dx_s, g_shared = feed_forward(d2 if sg is None else d2 * sg, w.shared, tape, cfg)
        dx += dx_s
        if sg is not None:                                      # its gate σ(x·W_s) (Qwen2-MoE)
            dz = np.einsum("nd,nd->n", d2, s)[:, None] * sg * (1 - sg)   # (N, 1)
            dx_g, dW_gate, _ = linear(dz, t.x, w.W_shared_gate, False)
            dx += dx_g
    return dx.reshape(shape), MoEWeights(W_router=dW_router, experts=grads, shared=g_shared, W_shared_gate=dW_gate,
                                         b_router=db_router)


def top_k_denominator(q: np.ndarray, cfg: ModelConfig) -> tuple[np.ndarray, np.ndarray]:
    """(D, Σ) (N, 1) each of the chosen scores q (N, k), blocks.route's renormalisation g = q / D (kept here
    beside its backward): Σ = Σq, + 1e-20 for sigmoid scores (transformers' DeepSeek-V3 and dots1 routers);
    D = max(Σ, cfg.norm_top_k_min) (Ernie 4.5's moe_norm_min; 0: D = Σ)."""
    total = q.sum(axis=-1, keepdims=True)                        # (N, 1)
    if cfg.router_score == "sigmoid":
        total += 1e-20
    return (np.maximum(total, cfg.norm_top_k_min) if cfg.norm_top_k_min else total), total


def route_backward(dgate: np.ndarray, t: MoETape, cfg: ModelConfig) -> np.ndarray:
    """dq (N, k) of the chosen scores q = s[chosen] from dL/d(the weights) dg (N, k), blocks.route's
    g = c·q / D: D = max(Σq (+ 1e-20 sigmoid), norm_top_k_min) renormalised (norm_top_k), else D = 1;
    c = routed_scaling. ∂g_i/∂q_j = c·δ_ij / D − g_i / D · ∂D/∂Σq, so dq = (c·dg − [∂D/∂Σq]·Σ_i dg_i·g_i) / D,
    ∂D/∂Σq = 1, but 0 where the floor norm_top_k_min holds D (as torch's clamp)."""
    c = cfg.routed_scaling
    if not cfg.norm_top_k:
        return dgate * c if c != 1 else dgate
    q = np.take_along_axis(t.p, t.chosen, axis=-1)              # (N, k)
    D, total = top_k_denominator(q, cfg)                        # (N, 1) each
    through = np.einsum("nk,nk->n", dgate, t.gate)[:, None]     # (N, 1) Σ_i dg_i·g_i
    if cfg.norm_top_k_min:
        through = np.where(total >= cfg.norm_top_k_min, through, 0.0)
    return (c * dgate - through) / D


def residual(dy: np.ndarray, w: NormWeights, cfg: ModelConfig, norm_in: np.ndarray,
             box_backward: Callable[[np.ndarray], tuple[np.ndarray, object]], norm=norm
             ) -> tuple[np.ndarray, NormWeights, object]:
    """(dx, the norm's gradients, the box's gradients) of one residual step of `block`: y = x + Box(Norm(x))
    (pre-norm, norm_in = x) or y = Norm(x + Box(x)) (post-norm, norm_in = x + Box(x)).
    box_backward(d_out) → (d_in, gradients). The residual passes dy on unchanged; the box adds its path.
    w None (OLMo 2: no norm before the box): y = x + Box(x). norm: the norm's backward (`Boxes.norm`)."""
    if w is None:
        dx, g_box = box_backward(dy)
        dx += dy
        return dx, None, g_box
    if cfg.norm_place == "post":
        dr, g_norm = norm(dy, norm_in, w, cfg)
        dx, g_box = box_backward(dr)
        dx += dr
        return dx, g_norm, g_box
    dh, g_box = box_backward(dy)
    dx, g_norm = norm(dh, norm_in, w, cfg)
    dx += dy
    return dx, g_norm, g_box


def cross_attention(dout: np.ndarray, w: AttentionWeights, t: AttentionTape, cfg: ModelConfig | None = None
                    ) -> tuple[np.ndarray, tuple[np.ndarray, np.ndarray], AttentionWeights]:
    """(dY, (dK, dV) (B, Hkv, n_src, d_k) for the encoder output's projections, the gradients of W_Q, W_O
    and their biases) from dL/dCrossAttention(Y): dQ goes back to the decoder's stream Y, dK and dV to
    the memory (`memory`), computed once per source as its K and V were."""
    dz, dW_O, db_O = linear(dout, t.z, w.W_O, w.b_O is not None)      # (B, n_tgt, H·d_k)
    dq, dk, dv = attention_backward(split_heads(dz, t.q.shape[1]), t.q, t.k, t.v, t.a,
                                    None if cfg is None else cfg.score_scale,
                                    None if cfg is None else cfg.attn_softcap)   # T5Gemma soft-caps it too
    dy, dW_Q, db_Q = linear(merge_heads(dq), t.x, w.W_Q, w.b_Q is not None)   # (B, n_tgt, d_model)
    return dy, (dk, dv), AttentionWeights(W_Q=dW_Q, W_K=None, W_V=None, W_O=dW_O, b_Q=db_Q, b_O=db_O)


def memory(d_kv: list[tuple[np.ndarray, np.ndarray]], encoded: np.ndarray, blocks: list[BlockWeights],
           grads: list[BlockWeights]) -> np.ndarray:
    """dM of blocks.cross_memory (K = M·W_K + b_K, V = M·W_V + b_V for every decoder layer) given each
    layer's (dK, dV); fills in each layer's cross-attention gradients of W_K, W_V (and biases) in GRADS.
    M feeds every layer's K and V: dM = Σ_l dK_l·W_K,lᵀ + dV_l·W_V,lᵀ."""
    dm = np.zeros_like(encoded)                                        # (B, n_src, d_model)
    for (dk, dv), w, g in zip(d_kv, blocks, grads):
        a, c = w.cross_attn, g.cross_attn
        d_k, c.W_K, c.b_K = linear(merge_heads(dk), encoded, a.W_K, a.b_K is not None)
        d_v, c.W_V, c.b_V = linear(merge_heads(dv), encoded, a.W_V, a.b_V is not None)
        dm += d_k
        dm += d_v
    return dm


def block(dy: np.ndarray, w: BlockWeights, tape: Tape, layer: int, cfg: ModelConfig, cross_tape: Tape | None = None,
          boxes: "Boxes | None" = None) -> tuple[np.ndarray, BlockWeights, tuple[np.ndarray, np.ndarray] | None]:
    """dX of the block's input, its weights' gradients and, with a cross-attention (an encoder–decoder's
    decoder, CROSS_TAPE its records), the (dK, dV) its memory gets: the FFN's residual step, then
    cross-attention's, then attention's. A parallel block (GPT-NeoX, Phi): dX = dY + both branches'
    paths back through their norms (one norm for both: their sum through it). Output norms (OLMo 2): each
    box's gradient first goes back through its own. boxes: the backwards of the norms, attention and the FFN
    (None: EXACT); a `Boxes.ffn` takes the FFN's whole step (its output norm and multiplier too)."""
    boxes = EXACT if boxes is None else boxes
    norm = boxes.norm
    out_norms: dict[str, NormWeights] = {}

    def through(name: str, out_norm: NormWeights | None, box_backward):
        """box_backward after the residual multiplier's (Granite: d × m) and the output norm NAME's backward
        (its input kept as (layer, NAME + "_norm"))."""
        m = cfg.residual_multiplier
        if out_norm is None and m == 1:
            return box_backward

        def back_box(d: np.ndarray):
            d = d if m == 1 else d * m
            if out_norm is not None:
                d, out_norms[name] = norm(d, tape.pop(layer, name + "_norm"), out_norm, cfg)
            return box_backward(d)
        return back_box

    d_beside = g_conv = g_conv_norm = None
    if w.conv is not None:                                # DeBERTa-v2: back through the convolution beside layer 0
        dy, d_beside, g_conv, g_conv_norm = conv_beside(dy, w, tape.pop(layer, "conv"), cfg)
    attn_tape = tape.pop(layer, "attn")
    attn_back = through("attn_out", w.attn_out_norm, lambda d: boxes.attention(d, w.attn, attn_tape, cfg))
    ffn_back = (through("ffn_out", w.ffn_out_norm, lambda d: feed_forward(d, w.ffn, tape.pop(layer, "ffn"), cfg))
                if boxes.ffn is None else lambda d: boxes.ffn(layer, d))
    if cfg.parallel_residual:                             # y = x + Attn(N₁(x)) + FFN(N₂(x))
        x = tape.pop(layer, "attn_norm")
        d_ffn, g_ffn = ffn_back(dy)
        d_attn, g_attn = attn_back(dy)
        if w.ffn_norm is None:                            # Phi: one norm read by both
            dx, g_attn_norm = norm(d_attn + d_ffn, x, w.attn_norm, cfg)
            g_ffn_norm = None
        else:
            dx, g_attn_norm = norm(d_attn, x, w.attn_norm, cfg)
            dx_f, g_ffn_norm = norm(d_ffn, x, w.ffn_norm, cfg)
            dx += dx_f
        dx += dy
        return dx, BlockWeights(attn_norm=g_attn_norm, attn=g_attn, ffn_norm=g_ffn_norm, ffn=g_ffn), None
    dx, g_ffn_norm, g_ffn = residual(dy, w.ffn_norm, cfg, tape.pop(layer, "ffn_norm"), ffn_back, norm)
    g_cross = g_cross_norm = g_cross_out = d_kv = None
    if w.cross_attn is not None:
        def cross_back(d):
            nonlocal d_kv, g_cross_out
            if w.cross_out_norm is not None:              # T5Gemma: back through its output norm first
                d, g_cross_out = norm(d, cross_tape.pop(layer, "attn_out_norm"), w.cross_out_norm, cfg)
            d_in, d_kv, g = cross_attention(d, w.cross_attn, cross_tape.pop(layer, "attn"), cfg)
            return d_in, g
        dx, g_cross_norm, g_cross = residual(dx, w.cross_norm, cfg, tape.pop(layer, "cross_norm"), cross_back, norm)
    dx, g_attn_norm, g_attn = residual(dx, w.attn_norm, cfg, tape.pop(layer, "attn_norm"), attn_back, norm)
    if attn_tape.d_bias is not None:                      # T5: dB of the stack's shared bias, for its pass to collect
        tape.put(layer, "d_position_bias", attn_tape.d_bias)
    if attn_tape.d_rel is not None:                       # DeBERTa: dP of the relative table, for the pass to collect
        tape.put(layer, "d_relative", attn_tape.d_rel)
    if d_beside is not None:
        dx += d_beside                                    # the block's input read by the convolution too
    return dx, BlockWeights(attn_norm=g_attn_norm, attn=g_attn, ffn_norm=g_ffn_norm, ffn=g_ffn,
                            cross_attn=g_cross, cross_norm=g_cross_norm, cross_out_norm=g_cross_out,
                            attn_out_norm=out_norms.get("attn_out"),
                            ffn_out_norm=out_norms.get("ffn_out"), conv=g_conv, conv_norm=g_conv_norm), d_kv


def conv_beside(dout: np.ndarray, w: BlockWeights, t: tuple, cfg: ModelConfig
                ) -> tuple[np.ndarray, np.ndarray, ConvWeights, NormWeights]:
    """The backward of blocks.conv_beside, out = Norm(y + act(c)) ⊙ m with c = conv(x ⊙ m) ⊙ m: (dy of the block's
    own output, dx of its input through the convolution, the convolution's and the norm's gradients).

        dz = Norm'ᵀ(dout ⊙ m)      dy = dz      dc = act'(c) ⊙ dz ⊙ m
        c = windows(x ⊙ m)·W + b   →  dW = windowsᵀ·dc, db = Σ dc, d(x ⊙ m) = each window's share of dc·Wᵀ"""
    xm, c, z, m = t
    d = dout if m is None else dout * m
    dz, g_norm = norm(d, z, w.conv_norm, cfg)                            # (B, n, d_model)
    act = cfg.first_conv[1]
    dc = dz * (1 - np.tanh(c) ** 2) if act == "tanh" else ACTIVATION_BACKWARDS[act](dz, c)
    if m is not None:
        dc = dc * m
    conv = w.conv
    B, T, C = xm.shape
    padded = np.pad(xm, ((0, 0), (conv.padding, conv.padding), (0, 0)))
    windows = np.concatenate([padded[:, j:j + T] for j in range(conv.kernel)], axis=-1)   # (B, T, k·C), stride 1
    dwin, dW, db = linear(dc, windows, conv.W, True)                     # (B, T, k·C)
    dpad = np.zeros_like(padded)
    for j in range(conv.kernel):                                         # window j read rows j … j + T − 1
        dpad[:, j:j + T] += dwin[..., j * C:(j + 1) * C]
    dx = dpad[:, conv.padding:conv.padding + T]
    return dz, (dx if m is None else dx * m), ConvWeights(dW, db, conv.kernel, conv.stride, conv.padding), g_norm


# ── which backwards `block` runs ─────────────────────────────────────────────────

@dataclass(frozen=True)
class Boxes:
    """The backwards `block` runs: norm(dy, x, w, cfg) → (dx, gradients) of a norm that read x;
    attention(dout, w, tape, cfg) → (dX, gradients); ffn: None (the FFN's own backward, `feed_forward`,
    through its output norm and multiplier) or ffn(layer, d) → (d_in, gradients), d the gradient of what the
    FFN's step adds to the stream (after its output norm and multiplier), d_in that of what the FFN read."""

    norm: Callable = norm
    attention: Callable = attention
    ffn: Callable | None = None


def norm_scale_of(x: np.ndarray, cfg: ModelConfig) -> np.ndarray:
    """s (…,) of x (…, d), what the norm divided each row by (qkv.core.blocks.norm_scale's formula)."""
    if cfg.norm == "rms":
        return np.sqrt(np.mean(x * x, axis=-1) + float(cfg.norm_eps))               # (…,)
    xc = x - x.mean(axis=-1, keepdims=True)                                        # (…, d)
    return np.sqrt(np.mean(xc * xc, axis=-1) + float(cfg.norm_eps))               # (…,)


def frozen_norm(dy: np.ndarray, x: np.ndarray, w: NormWeights, cfg: ModelConfig) -> tuple[np.ndarray, None]:
    """dx of a norm whose scale s is held at what it was for x (the taped input): y = x/s·γ (RMSNorm),
    y = (x − mean(x))/s·γ + β (LayerNorm), linear in x: dx = γ⊙dy/s, centred for LayerNorm (the centring
    matrix is its own transpose). No gradients. x (1 or B, n, d), dy (B, n, d)."""
    d = dy * w.weight / norm_scale_of(x, cfg)[..., None]                          # (B, n, d)
    return (d if cfg.norm == "rms" else d - d.mean(axis=-1, keepdims=True)), None


def value_path(dout: np.ndarray, w: AttentionWeights, t: AttentionTape, cfg: ModelConfig | None = None
               ) -> tuple[np.ndarray, None]:
    """dX of MultiHead(X) with each head's pattern A held at the taped one: Z_h = A_h·(X·W_V,h + b_V,h), so
    dZ = dout·W_Oᵀ, dV_h = A_hᵀ·dZ_h (summed over the query heads sharing a K/V head: GQA), dX = dV·W_Vᵀ;
    Q and K get nothing. No gradients. t.a (1 or B, H, n, n), dout (B, n, d_model)."""
    B, n, d = dout.shape
    H, Hkv = t.q.shape[1], t.v.shape[1]
    dz = dout.reshape(B * n, d) @ w.W_O.T                                          # (B·n, H·d_k) one product
    if t.a.shape[0] != 1:                                                          # a pattern per row: the plain form
        dv = np.matmul(t.a.swapaxes(-1, -2), split_heads(dz.reshape(B, n, -1), H))   # (B, H, n, d_k) A_hᵀ·dZ_h
        dv = merge_heads(dv.reshape(B, Hkv, H // Hkv, n, -1).sum(axis=2))         # (B, n, Hkv·d_k)
        return (dv.reshape(B * n, -1) @ w.W_V.T).reshape(B, n, d), None
    # one pattern for every row (the graph's B targets): the same sums as H products A_hᵀ·[dZ_h of all B rows],
    # each (n, n)·(n, B·d_k), instead of B·H products of (n, n)·(n, d_k)
    dz = dz.reshape(B, n, H, -1).transpose(2, 1, 0, 3).reshape(H, n, -1)           # (H, n, B·d_k)
    dv = np.matmul(t.a[0].swapaxes(-1, -2), dz)                                    # (H, n, B·d_k)
    dv = dv.reshape(Hkv, H // Hkv, n, B, -1).sum(axis=1)                           # (Hkv, n, B, d_k) GQA's groups
    dv = dv.transpose(2, 1, 0, 3).reshape(B * n, -1)                               # (B·n, Hkv·d_k)
    return (dv @ w.W_V.T).reshape(B, n, d), None                                   # (B, n, d_model)


EXACT = Boxes()
FROZEN = Boxes(norm=frozen_norm, attention=value_path)    # its ffn: the caller's (Boxes(..., ffn=…))


def logits_of(dlogits: np.ndarray, hidden: np.ndarray, weights: Weights, cfg: ModelConfig | None = None,
              logits: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """(dZ, dW_vocab, db_vocab) of logits = (Z·W_vocab + b)·s, s = cfg.logit_scale (Cohere, Granite; 1 without
    a config). A tied W_vocab's gradient is the caller's to add into the embedding table's (one table, two uses).
    Soft-capped (cfg.final_softcap, Gemma 2): y = c·tanh(ℓ/c) gives dℓ = dy ⊙ (1 − (y/c)²), read from LOGITS,
    the capped ones the forward returned."""
    if cfg is not None and cfg.final_softcap is not None:
        dlogits = dlogits * (1 - np.square(logits / cfg.final_softcap))
    if cfg is not None and cfg.logit_scale != 1:
        dlogits = dlogits * cfg.logit_scale
    return linear(dlogits, hidden, weights.W_vocab, weights.b_vocab is not None)


def head(dy: np.ndarray, weights: Weights, cfg: ModelConfig, t: HeadTape
         ) -> tuple[np.ndarray, np.ndarray, np.ndarray, NormWeights]:
    """(dZ, dW_head, db_head, the head norm's gradients) of a masked-LM head Norm(act(Z·W_head + b_head)),
    from dL/d(its output) (the dZ of logits_of)."""
    a = ACTIVATIONS[cfg.head_activation](t.u)                            # (B, n, E) what the norm read
    da, g_norm = norm(dy, a, weights.head_norm, cfg)
    du = ACTIVATION_BACKWARDS[cfg.head_activation](da, t.u)
    dz, dW, db = linear(du, t.z, weights.W_head, weights.b_head is not None)   # (B, n, d_model)
    return dz, dW, db, g_norm


def embed_projection(dy: np.ndarray, weights: Weights, t: EmbedTape) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(dX before the projection, dW_embed, db_embed) of X·W_embed + b_embed (ELECTRA's E → d_model)."""
    return linear(dy, t.proj_in, weights.W_embed, True)


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


def embedding(d_table: np.ndarray, ids: np.ndarray, dx: np.ndarray, cfg: ModelConfig) -> None:
    """dE[ids] += dX for the lookup X = E[ids], into d_table (V, d_model) in place; ids (B, n), dx (B, n, d_model).
    With cfg.pad_embedding_frozen a lookup of pad_token_id adds nothing to its row (torch's padding_idx)."""
    rows = dx.reshape(-1, dx.shape[-1])                   # (B·n, d_model)
    flat = ids.reshape(-1)
    if cfg.pad_embedding_frozen and cfg.pad_token_id is not None:
        keep = flat != cfg.pad_token_id
        flat, rows = flat[keep], rows[keep]
    add_rows(d_table, flat, rows)


def mask_dropout_scale(ids: np.ndarray, cfg: ModelConfig) -> np.ndarray:
    """ESM's token_dropout as a factor on each row of E[ids]·s (blocks.mask_dropout), ids (B, n) → (B, n): 0 on
    <mask> (cfg.mask_dropout_id), 1/(1 − r) elsewhere, r the row's share of <mask> among its ids that are not
    pad_token_id. A constant of the ids: the backward multiplies d(E[ids]·s) by the same factor."""
    masked = ids == cfg.mask_dropout_id                                  # (B, n)
    real = (ids != cfg.pad_token_id).sum(-1)                             # (B,)
    share = masked.sum(-1) / np.maximum(real, 1)                         # (B,) r
    if (share >= 1).any():
        raise QkvError("every token of a row is <mask>: ESM's token_dropout would divide by 0; unmask a token")
    return np.where(masked, 0.0, 1.0 / (1.0 - share)[:, None])          # (B, n)


def embed(dx: np.ndarray, weights: Weights, cfg: ModelConfig, t: EmbedTape, d_tok: np.ndarray | None = None,
          grads: dict[str, np.ndarray] | None = None
          ) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None, NormWeights | None]:
    """(dE, dP, dT, the embedding norm's gradients) of blocks.embed: X = Norm?(E[ids]·s·embed_in? + P[rows] + T[types]),
    s = cfg.embed_scale (√d_model: Marian, Gemma; Granite's multiplier), rows the positions (+ BART's offset)
    the tape kept.
    dE is added into d_tok (a new table of zeros if None); dP only for a learned table (a sinusoidal one
    is fixed), dT only with token types; None where there is none. With embed_in (OPT-350m) its gradient
    E[ids]ᵀ·dX goes into GRADS["embed_in"] and the table's rows get dX·embed_inᵀ. GRADS["tokens"] is the
    gradient of the token embeddings E[ids]·s themselves (B, n, d_embed), before it is added into the table
    (input attribution). An image model (ViT): dE[0] is [CLS]'s, GRADS gets W_patch's and b_patch's, and
    GRADS["tokens"] is the patches' pixels' (B, P, C·p·p)."""
    g_norm = None
    if weights.embed_norm is not None:
        dx, g_norm = norm(dx, t.norm_in, weights.embed_norm, cfg)
    d = dx.shape[-1]
    d_tok = np.zeros_like(weights.tok_embed) if d_tok is None else d_tok      # (V, d_model)
    d_rows = dx
    if weights.W_patch is not None:                                            # ViT: X = [E[0]; patches·W + b] + P
        first = 1 if cfg.class_token else 0                                    # SigLIP: no [CLS]
        if first:
            d_tok[0] += dx[:, 0].sum(axis=0)                                   # [CLS]
        d_rows, d_W, d_b = linear(dx[:, first:], t.tokens, weights.W_patch, True)   # (B, P, C·p·p), (C·p·p, d), (d,)
        if grads is not None:
            grads |= {"W_patch": d_W, "b_patch": d_b}
    else:
        if cfg.mask_dropout_id is not None and (t.ids == cfg.mask_dropout_id).any():   # ESM: X = E[ids]·s·c, c per row
            d_rows = dx * mask_dropout_scale(t.ids, cfg)[..., None].astype(dx.dtype)  # (B, n, d)
        if weights.embed_in is not None:                                       # X = (E[ids]·s)·embed_in + …
            rows = weights.tok_embed[t.ids] * (cfg.embed_scale or 1.0) if t.tokens is None else t.tokens   # (B, n, d_embed)
            d_rows, d_proj, _ = linear(dx, rows, weights.embed_in, False)     # (B, n, d_embed), (d_embed, d_model)
            if grads is not None:
                grads["embed_in"] = d_proj
        embedding(d_tok, t.ids, d_rows if cfg.embed_scale is None else d_rows * cfg.embed_scale, cfg)   # E[ids]·s
    if grads is not None:
        grads["tokens"] = d_rows                      # d(E[ids]·s) (B, n, d_embed); ViT: the pixels' (a saliency map)
    d_pos = d_type = None
    if weights.pos_embed is not None and cfg.position == "learned":
        d_pos = np.zeros_like(weights.pos_embed)                               # (P, d_model)
        rows, drows = t.positions.reshape(-1), dx.reshape(-1, d)
        if cfg.positions_from_ids:                       # RoBERTa: the pads' row is padding_idx, never learned
            keep = rows != cfg.pad_token_id
            rows, drows = rows[keep], drows[keep]
        add_rows(d_pos, rows, drows)
    if weights.type_embed is not None:
        d_type = np.zeros_like(weights.type_embed)                             # (T, d_model)
        types = np.zeros_like(t.ids) if t.types is None else t.types
        add_rows(d_type, types.reshape(-1), dx.reshape(-1, d))
    return d_tok, d_pos, d_type, g_norm


def unembed_in(dz: np.ndarray, weights: Weights, tape: Tape) -> tuple[np.ndarray, np.ndarray | None]:
    """(dX, d unembed_in) of blocks.unembed_in, Z = X·unembed_in (OPT-350m); (dZ, None) without it."""
    if weights.unembed_in is None:
        return dz, None
    dx, dW, _ = linear(dz, tape.pop(None, "unembed_in"), weights.unembed_in, False)
    return dx, dW                                                              # (B, n, d_model), (d_model, d_embed)
