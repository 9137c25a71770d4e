"""The graph of edge attribution (Syed et al. 2023; Hanna et al. 2024, "Have faith in faithfulness") and the
pass that patches its edges, each receiver reading its own copy of the residual stream.

    senders     the input embedding X₀, every attention head (its part Z_h·W_O,h of the layer's output), every FFN
    receivers   every head's input (read through the layer's norm into the head's own Q, K and V), or with qkv=True
                the three inputs its Q, K and V read, each its own; every FFN's input, the logits (through the final
                norm)
    edge s → r  for every sender before the receiver: a layer's heads come before its FFN (not in a parallel
                block, GPT-J, Phi, Falcon, whose FFN reads the block's input as its heads do); all before the logits

In the model every receiver of a layer reads one sum, in_r = c_r + Σ_{s before r} out_s (c_r: the attention output
biases b_O of the blocks before r, the same in every run). Edge patching gives each receiver its own:

    in_r = c_r + Σ_{s before r} (1 − w_sr)·out_s + w_sr·out_s(corrupt)

out_s being this run's output of s (computed from s's own patched input) and w_sr the part of the edge taken from
the corrupt run: w = 0 everywhere is the clean run, w = 1 everywhere the corrupt run, w ∈ {0, 1} a circuit (its
kept edges 0), and w = ε on one edge the first-order term that edge attribution patching estimates:

    d m / d w_sr = (out_s(corrupt) − out_s) · ∂m/∂in_r        (`receiver_gradients`: ∂m/∂in_r for every r)

A head's receiver is the head's own input: its gradient goes back through its own Q, K, V projections and the
layer's norm, not through the sum over the heads (`head_input_gradients`). The heads of one layer, each reading
its own stream, are B = H rows of the engine's own attention (qkv.core.blocks.attention), head h taken from row h:
RoPE, q/k norms, grouped K/V heads, ALiBi, windows and biases come with it. Split into q, k, v, a second pass of
it over the K and V inputs' rows makes each head's K and V, which hooks on k and v (qkv.core.hooks) put into its
row of the first (`EdgePatcher.kv_hooks`). Families that normalise a box's output
before it joins the stream (Gemma 2/3, OLMo 2: a head's part is then no term of the sum), post-norm blocks,
encoders and encoder–decoders are refused (`check_edges`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ..core import blocks_backward as back
from ..core.attention import attention_backward, merge_heads, split_heads
from ..core.backward import taped
from ..core.blocks import attention, attention_mask_of, embed, feed_forward, logits_of, norm, unembed_in
from ..core.blocks_backward import AttentionTape, Tape
from ..core.capabilities import require
from ..core.config import ModelConfig
from ..core.context import Context
from ..core.hooks import Hooks
from ..core.layer import joined, norm_in_front
from ..core.positions import (apply_rope_backward, positions_from_mask, rope_attention_factor, rope_cos_sin,
                              temperature_scales)
from ..core.stack import rope_speeds
from ..core.trace import Recorder
from ..core.weights import AttentionWeights, Weights
from ..runtime.errors import QkvError

if TYPE_CHECKING:
    from ..models.model import Model


def check_edges(model: "Model") -> None:
    """One QkvError where MODEL's graph of edges is not the one this module patches (see the module)."""
    cfg, w = model.config, model.weights
    name = model.name
    if getattr(cfg, "encoder_decoder", False) or not cfg.causal or getattr(w, "W_vocab", None) is None:
        raise QkvError(f"edge attribution explains a decoder's next token; {name} is not a decoder with an LM head: "
                       "use one (--model smollm2)")
    if cfg.norm_place == "post":
        raise QkvError(f"{name} normalises the stream after each box (post-norm), so a head's output is no term of "
                       "the next receiver's input; edge attribution needs a pre-norm decoder (--model smollm2)")
    if any(b.attn_out_norm is not None or b.ffn_out_norm is not None for b in w.blocks):
        raise QkvError(f"{name} normalises each box's output before it joins the stream (Gemma 2/3, OLMo 2/3), so a "
                       "head's part of it is not its own term; edge attribution needs a decoder without output norms")
    if w.W_head is not None or getattr(model, "ablated", None) is not None:
        raise QkvError(f"{name} has a masked-LM head or ablated heads; run edge attribution on a plain decoder")
    require(cfg, name, "edge attribution", {"qkv_heads", "backward", "sum_of_boxes"},
            instead="a head's q, k, v inputs are not X·W_Q, X·W_K, X·W_V as edge attribution splits them; use `qkv "
                    "patch` or `qkv atp`" if cfg.latent else "use `qkv patch` (exact, on every layer kind)")


@dataclass(frozen=True)
class EdgeGraph:
    """The nodes and edges of one decoder (see the module). Senders are numbered embed, L0.H0 … L0.H(H−1), L0.FFN,
    L1.H0, …; receivers L0.H0 … L0.FFN, L1.H0, …, logits, or with QKV each head's input split into the three its
    Q, K and V read, L0.H0.q … L0.H(H−1).q, L0.H0.k …, L0.H0.v …, L0.FFN, …: the senders before receiver r are the
    first `before(r)` of them, so a mask of edges is a prefix per receiver."""

    n_layers: int
    n_heads: int
    parallel: bool                         # the FFN reads the block's input (not after its heads)
    qkv: bool = False                      # each head's Q, K and V read their own copies of the stream

    @property
    def parts(self) -> int:
        """Receivers per head: 3 (q, k, v) with QKV, else 1."""
        return 3 if self.qkv else 1

    @property
    def per_layer(self) -> int:
        """Receivers per layer: its heads' (× parts) and its FFN's."""
        return self.n_heads * self.parts + 1

    @property
    def n_senders(self) -> int:
        return 1 + self.n_layers * (self.n_heads + 1)

    @property
    def n_receivers(self) -> int:
        return self.n_layers * self.per_layer + 1

    def sender(self, layer: int, head: int | None = None) -> int:
        """The index of LAYER's head HEAD (None: its FFN) among the senders."""
        return 1 + layer * (self.n_heads + 1) + (self.n_heads if head is None else head)

    def receiver(self, layer: int, head: int | None = None, part: int = 0) -> int:
        """The index of LAYER's head HEAD's input (PART 0, 1, 2: its q, k, v with QKV; None: the FFN's) among the
        receivers; the logits: n_receivers − 1."""
        H = self.n_heads
        return layer * self.per_layer + (H * self.parts if head is None else part * H + head)

    def before(self, r: int) -> int:
        """How many senders come before receiver R (they are the first ones)."""
        layer, slot = divmod(r, self.per_layer)
        if layer == self.n_layers:
            return self.n_senders                                     # the logits read everything
        ffn_after_heads = slot == self.per_layer - 1 and not self.parallel
        return 1 + layer * (self.n_heads + 1) + (self.n_heads if ffn_after_heads else 0)

    def valid(self) -> np.ndarray:
        """(S, R) bool: which sender → receiver pairs are edges."""
        counts = np.array([self.before(r) for r in range(self.n_receivers)])      # (R,)
        return np.arange(self.n_senders)[:, None] < counts[None, :]               # (S, R)

    def node_names(self) -> tuple[list[str], list[str]]:
        """(senders' names, receivers' names): "embed", "L3.H5", "L3.FFN", "logits"; with QKV the heads'
        receivers "L3.H5.q", "L3.H5.k", "L3.H5.v"."""
        H, L = self.n_heads, self.n_layers
        suffixes = (".q", ".k", ".v") if self.qkv else ("",)
        senders = ["embed"] + [name for l in range(L) for name in [f"L{l}.H{h}" for h in range(H)] + [f"L{l}.FFN"]]
        receivers = [name for l in range(L) for name in
                     [f"L{l}.H{h}{x}" for x in suffixes for h in range(H)] + [f"L{l}.FFN"]]
        return senders, receivers + ["logits"]

    @property
    def n_edges(self) -> int:
        return int(self.valid().sum())


def graph_of(model: "Model", qkv: bool = False) -> EdgeGraph:
    """MODEL's EdgeGraph (after `check_edges`); QKV: each head's q, k and v inputs its own receivers."""
    check_edges(model)
    cfg = model.config
    return EdgeGraph(cfg.n_layers, cfg.n_heads, bool(cfg.parallel_residual), bool(qkv))


def pass_context(weights: Weights, cfg: ModelConfig, n: int) -> Context:
    """The Context of a decoder's pass over one unpadded row of N tokens: its causal mask (each layer's window),
    RoPE's rotation (each kind of layer's), ALiBi: what qkv.core.stack.transformer sets up for the same row."""
    mask = np.ones((1, n), np.int64)                                              # (1, n) all real tokens
    positions = positions_from_mask(mask)[:, -n:]                                 # (1, n) 0..n−1
    speeds = rope_speeds(cfg, weights.tok_embed.dtype, n)
    rope = None
    if "global" in speeds:
        rope = rope_cos_sin(positions, speeds["global"], rope_attention_factor(cfg.rope_scaling),
                            interleaved=cfg.rope_interleaved)                     # 2 × (1, 1, n, d_k)
    ctx = Context(cfg, attention_mask_of(cfg, mask, n), rope, Recorder(keep=()), scale=cfg.score_scale)
    if not cfg.uniform_layers:                                        # a mask per window, a rotation per kind
        first = {cfg.mask_kind(i): i for i in reversed(range(cfg.n_layers))}   # each window, chunk (Llama 4)
        ctx.masks = {kind: attention_mask_of(cfg, mask, n, i) for kind, i in first.items()}
        ctx.ropes = {None: None, "global": rope}
        if "local" in speeds:
            ctx.ropes["local"] = rope_cos_sin(positions, speeds["local"], rope_attention_factor(cfg.local_rope_scaling),
                                             interleaved=cfg.rope_interleaved)
    if cfg.temperature_floor is not None:                            # Llama 4's NoPE layers' queries by position
        ctx.temperature = temperature_scales(positions, cfg.temperature_floor, cfg.temperature_scale,
                                             weights.tok_embed.dtype)
    return ctx


@dataclass
class EdgeRun:
    """One pass over the graph: every sender's output and the logits."""

    outputs: np.ndarray                    # (S, n, d_model) each sender's out_s (the embedding X₀ first)
    logits: np.ndarray                     # (n, V)


class EdgePatcher:
    """The graph's passes over one row of N tokens of MODEL (a decoder `check_edges` accepts): `embed`, `run`
    (edge patching) and `receiver_gradients` (∂m/∂in_r of the plain pass, for EAP)."""

    def __init__(self, model: "Model", n: int, qkv: bool = False):
        """QKV: each head's q, k and v inputs are receivers of their own (`EdgeGraph.qkv`)."""
        self.graph = graph_of(model, qkv)
        self.cfg, self.weights, self.n = model.config, model.weights, n
        self.ctx = pass_context(self.weights, self.cfg, n)
        d = self.cfg.d_model
        bias = [np.zeros(d) if b.attn.b_O is None else joined(b.attn.b_O, self.cfg) for b in self.weights.blocks]
        self.bias_before = np.cumsum([np.zeros(d)] + bias, axis=0)                 # (L + 1, d): Σ of b_O before block l

    def embed(self, ids: np.ndarray, tokens: np.ndarray | None = None) -> np.ndarray:
        """X₀ (1, n, d_model) of IDS (n,), or of the token embeddings TOKENS (1, n, d_embed) at their positions."""
        positions = np.arange(self.n)[None]                                        # (1, n)
        return embed(self.weights, self.cfg, np.asarray(ids)[None], positions, tokens=tokens)

    def inputs(self, rows: slice, outputs: np.ndarray, w: np.ndarray | None, corrupt: np.ndarray | None,
               count: int) -> np.ndarray:
        """The inputs (k, n, d) of the receivers ROWS, each reading the first COUNT senders (all computed): this
        run's OUTPUTS weighted 1 − w, CORRUPT's weighted w (w None: this run's alone), before the biases."""
        S = count
        own = outputs[:S].reshape(S, -1)                                           # (S, n·d)
        if w is None:
            x = np.broadcast_to(own.sum(axis=0), (rows.stop - rows.start, own.shape[1]))   # (k, n·d)
        else:
            part = w[:S, rows]                                                     # (S, k) from the corrupt run
            x = (1 - part).T @ own + part.T @ corrupt[:S].reshape(S, -1)           # (k, n·d)
        return x.reshape(-1, self.n, self.cfg.d_model)                             # (k, n, d)

    def run(self, x0: np.ndarray, w: np.ndarray | None = None, corrupt: EdgeRun | None = None) -> EdgeRun:
        """The pass from the embedding X₀ (1, n, d) with each receiver reading its own stream (module doc): W (S, R)
        the part of each edge taken from CORRUPT's senders (None: none, the model's own pass)."""
        g, cfg, n = self.graph, self.cfg, self.n
        H = cfg.n_heads
        dtype = x0.dtype
        outputs = np.zeros((g.n_senders, n, cfg.d_model), dtype)                  # (S, n, d)
        outputs[0] = x0[0]
        theirs = None if corrupt is None else corrupt.outputs
        for l, b in enumerate(self.weights.blocks):
            heads = slice(g.receiver(l, 0), g.receiver(l, 0) + H * g.parts)
            x = self.inputs(heads, outputs, w, theirs, g.before(heads.start))   # (H · parts, n, d)
            x = (x[:1] if w is None else x) + self.bias_before[l].astype(dtype)   # w None: one stream for all
            kv = (x[H:2 * H], x[2 * H:]) if g.qkv and w is not None else None     # the K and V inputs' rows
            outputs[g.sender(l, 0):g.sender(l, 0) + H] = self.head_outputs(x[:H], l, kv)
            r = g.receiver(l)
            x = self.inputs(slice(r, r + 1), outputs, w, theirs, g.before(r))       # (1, n, d)
            x = x + self.bias_before[l + (0 if g.parallel else 1)].astype(dtype)
            h = x if (wn := norm_in_front(b, "ffn", cfg)) is None else norm(x, wn, cfg)
            outputs[g.sender(l)] = joined(feed_forward(h, b.ffn, cfg), cfg)[0]
        r = g.n_receivers - 1
        x = self.inputs(slice(r, r + 1), outputs, w, theirs, g.n_senders)
        x = x + self.bias_before[-1].astype(dtype)
        if self.weights.final_norm is not None:
            x = norm(x, self.weights.final_norm, cfg)
        return EdgeRun(outputs, logits_of(unembed_in(x, self.weights), self.weights, cfg)[0])   # (n, V)

    def head_outputs(self, x: np.ndarray, layer: int, kv: tuple[np.ndarray, np.ndarray] | None = None) -> np.ndarray:
        """(H, n, d) each head's output Z_h·W_O,h (× the residual multiplier) when head h reads row h of X (H, n, d):
        the engine's attention over the H rows, head h taken from row h; X (1, n, d): every head reads that row.
        KV (the K inputs' rows, the V inputs' rows), (H, n, d) each: head h's K and V are made from row h of them
        instead (one pass of the engine's attention over those 2·H rows keeps them; hooks on k and v put each into
        its head's row), X then being the Q inputs."""
        cfg, b = self.cfg, self.weights.blocks[layer]
        H, dk, n = cfg.n_heads, cfg.d_head, self.n
        wn = norm_in_front(b, "attn", cfg)
        normed = (lambda a: a) if wn is None else (lambda a: norm(a, wn, cfg))   # noqa: E731
        if kv is not None:
            self.ctx.hooks = self.kv_hooks(np.concatenate(kv), layer, normed)
        self.ctx.tape = Tape()                                                     # to read Concat(Z) from
        attention(normed(x), b.attn, self.ctx, layer)
        z = self.ctx.tape.pop(layer, "attn").z.reshape(len(x), n, H, dk)           # (row, n, head, d_k)
        self.ctx.tape, self.ctx.hooks = None, None
        rows = np.arange(H) if len(x) == H else np.zeros(H, np.int64)              # head h's row
        own = z[rows, :, np.arange(H)]                                             # (H, n, d_k) head h of its row
        W_O = np.asarray(b.attn.W_O).reshape(H, dk, cfg.d_model)                   # (H, d_k, d)
        return joined(np.einsum("hnk,hkd->hnd", own, W_O), cfg)                    # (H, n, d)

    def kv_hooks(self, rows: np.ndarray, layer: int, normed) -> Hooks:
        """Hooks on LAYER's k and v that give row h (head h's) K/V head, the group g(h) head h reads, the one made
        from ROWS[h] (K) and ROWS[H + h] (V), ROWS (2·H, n, d) before the norm NORMED."""
        cfg, H = self.cfg, self.cfg.n_heads
        self.ctx.rec = Recorder(keep=("k", "v"))
        attention(normed(rows), self.weights.blocks[layer].attn, self.ctx, layer)
        made = self.ctx.rec.store[layer]                                           # k, v (2·H, Hkv, n, d_k) after RoPE
        self.ctx.rec = Recorder(keep=())
        head, group = np.arange(H), np.arange(H) // (H // cfg.n_kv_heads)          # head h reads K/V head g(h)

        def put(own: np.ndarray):
            def hook(value: np.ndarray, _layer: int) -> np.ndarray:                # (H, Hkv, n, d_k)
                value = value.copy()
                value[head, group] = own[head, group]
                return value
            return hook
        return Hooks({f"{layer}.k": put(made["k"][:H]), f"{layer}.v": put(made["v"][H:])}, cfg)

    def receiver_gradients(self, ids: np.ndarray, dlogits: np.ndarray, tokens: np.ndarray | None = None
                           ) -> tuple[np.ndarray, np.ndarray]:
        """(∂m/∂in_r (R, n, d_model) of every receiver's own input, the logits (n, V)) of the model's plain pass
        over IDS (token embeddings TOKENS (1, n, d_embed) if given), m having the gradient DLOGITS (n, V) on them:
        the engine's backward (qkv.core.blocks_backward) box by box, each head's part through its own Q, K, V."""
        g, cfg, weights = self.graph, self.cfg, self.weights
        mask = np.ones((1, self.n), np.int64)
        _, logits, tape = taped(weights, cfg, np.asarray(ids)[None], mask, tokens)
        grads = np.zeros((g.n_receivers, self.n, cfg.d_model))                     # (R, n, d)
        dh, _ = back.unembed_in(logit_input_gradient(dlogits, logits[0], weights, cfg)[None], weights, tape)
        if weights.final_norm is not None:
            dh, _ = back.norm(dh, tape.pop(None, "final_norm"), weights.final_norm, cfg)
        grads[-1] = dh[0]
        dx = dh                                                                    # (1, n, d) ∂m/∂ the stream
        m = cfg.residual_multiplier
        for l in reversed(range(cfg.n_layers)):
            b = weights.blocks[l]
            attn_tape = tape.pop(l, "attn")
            x_attn = tape.pop(l, "attn_norm")                                      # (1, n, d) the block's input
            x_ffn = x_attn if g.parallel else tape.pop(l, "ffn_norm")
            d_ffn, _ = back.feed_forward(dx * m, b.ffn, tape.pop(l, "ffn"), cfg)
            wn = norm_in_front(b, "ffn", cfg)
            d_ffn = d_ffn if wn is None else back.norm(d_ffn, x_ffn, wn, cfg)[0]  # (1, n, d)
            grads[g.receiver(l)] = d_ffn[0]
            if not g.parallel:
                dx = dx + d_ffn
            d_heads = head_input_gradients(dx * m, b.attn, attn_tape, cfg)         # (3, H, n, d) q, k, v, post-norm
            d_heads = d_heads.reshape(-1, *d_heads.shape[2:]) if g.qkv else d_heads.sum(axis=0)   # (H · parts, n, d)
            wn = norm_in_front(b, "attn", cfg)
            if wn is not None:
                d_heads = back.norm(d_heads, np.repeat(x_attn, len(d_heads), axis=0), wn, cfg)[0]
            grads[g.receiver(l, 0):g.receiver(l, 0) + len(d_heads)] = d_heads
            dx = dx + d_heads.sum(axis=0, keepdims=True) + (d_ffn if g.parallel else 0)
        return grads, logits[0]


def head_input_gradients(dout: np.ndarray, w: AttentionWeights, t: AttentionTape, cfg: ModelConfig) -> np.ndarray:
    """(3, H, n, d_model): [part, h] the gradient of what head h's Q (part 0), K (1) and V (2) read (their own copies
    of the attention's input X, after the norm; their sum over parts is the head's), given dL/dMultiHead(X) DOUT
    (1, n, d) of a one-row taped pass T. The steps of
    qkv.core.blocks_backward.attention on H rows, row h carrying head h's dZ_h alone: a grouped K/V head's
    gradient is then head h's part of it, not the sum over its group."""
    H, dk = cfg.n_heads, cfg.d_head
    n = dout.shape[1]
    dz = split_heads((dout.reshape(n, -1) @ np.asarray(w.W_O).T)[None], H)       # (1, H, n, d_k)
    rows = np.zeros((H, H, n, dk), dz.dtype)                                      # (row, head, n, d_k)
    rows[np.arange(H), np.arange(H)] = dz[0]
    rep = lambda a: np.repeat(a, H, axis=0)                                       # noqa: E731  (1, …) → (H, …)
    dq, dk_, dv = attention_backward(rows, rep(t.q), rep(t.k), rep(t.v), rep(t.a), cfg.score_scale, cfg.attn_softcap)
    if t.q_scale is not None:                                                     # Llama 4's temperature (NoPE)
        dq = dq * t.q_scale
    l2 = cfg.qk_l2_norm and t.rope is not None                                    # Llama 4: RMS, no γ, after RoPE
    if l2:
        dq = back.rms_norm_backward(dq, rep(t.pre[0]), 1.0, cfg.norm_eps)[0]
        dk_ = back.rms_norm_backward(dk_, rep(t.pre[1]), 1.0, cfg.norm_eps)[0]
    after = cfg.qk_norm_after_rope or l2                                          # Hunyuan: norms after RoPE
    if after and not l2:
        dq, dk_ = back.norm(dq, rep(t.pre[0]), w.q_norm, cfg)[0], back.norm(dk_, rep(t.pre[1]), w.k_norm, cfg)[0]
    if t.rope is not None:
        dq = apply_rope_backward(dq, *t.rope, cfg.rope_interleaved)
        dk_ = apply_rope_backward(dk_, *t.rope, cfg.rope_interleaved)
    if t.pre is not None and t.pre[0].ndim == 4 and not after:                    # each head's q/k norm
        dq, dk_ = back.norm(dq, rep(t.pre[0]), w.q_norm, cfg)[0], back.norm(dk_, rep(t.pre[1]), w.k_norm, cfg)[0]
    dq, dk_, dv = merge_heads(dq), merge_heads(dk_), merge_heads(dv)              # (H, n, H·d_k), (H, n, Hkv·d_k) × 2
    if t.pre is not None and t.pre[0].ndim == 3:                                  # the whole projection's (OLMo 2)
        dq, dk_ = back.norm(dq, rep(t.pre[0]), w.q_norm, cfg)[0], back.norm(dk_, rep(t.pre[1]), w.k_norm, cfg)[0]
    return np.stack([dq @ np.asarray(w.W_Q).T, dk_ @ np.asarray(w.W_K).T, dv @ np.asarray(w.W_V).T])   # (3, H, n, d)


def logit_input_gradient(dlogits: np.ndarray, logits: np.ndarray, weights: Weights, cfg: ModelConfig) -> np.ndarray:
    """(n, d) ∂m/∂Z of logits = (Z·W_vocab + b)·s, soft-capped (blocks_backward.logits_of's dZ), given DLOGITS (n, V)
    and the capped LOGITS (n, V): only the vocabulary columns m reads are multiplied (not the whole W_vocabᵀ, and no
    dW_vocab)."""
    if cfg.final_softcap is not None:
        dlogits = dlogits * (1 - np.square(logits / cfg.final_softcap))
    if cfg.logit_scale != 1:
        dlogits = dlogits * cfg.logit_scale
    cols = np.flatnonzero(np.abs(dlogits).sum(axis=0))                            # the tokens m reads
    return (dlogits[:, cols] @ np.asarray(weights.W_vocab[:, cols]).T).astype(logits.dtype)   # (n, d)
