"""A decoder layer's one-token step in one compiled call (numba): what `generate` runs per layer per new token
when nothing is recorded, hooked or ablated.

`layer.step_block` is the readable step (NumPy: a call per product and per small operation between them, ~20 a
layer); this is the same step as one function, compiled once per *plan* — the arithmetic ("exact" or
"llama.cpp") and the kinds of its four products (a GGUF kind kept stored, or "F32" for a float32 matrix) — with
every number of the layer computed in its body. What differs between families (RoPE's pairs, the norms and where
they sit, the FFN's activation, a parallel block) is read from arguments (`switches`), not compiled in: every
float32 checkpoint takes one compiled layer, and a GGUF file one an arithmetic and set of kinds.

    h = Norm(x)                         RMSNorm (llama.cpp: ggml's x·(1/√(…))·γ) or LayerNorm; none (OLMo 2)
    [q | k | v] = h·W_QKV (+ b)         one product, its rows split over numba's threads (Q, K, V stored in
                                        different kinds, as Q4_K_M's layers: three products, side by side)
    q, k normalised, turned by RoPE     norms over each head (before or after RoPE) or all of q, k (OLMo 2)
    K, V → the cache at position t
    z_h = softmax(S)·V_g                S = cap·tanh(q_h·K_gᵀ·scale / cap) + M (cap: Gemma 2; M: a mask, ALiBi's
                                        bias), each query head h on its K/V head g = h // (H / Hkv), in parallel
    o = [Norm](z·W_O + b)·m             the output's norm (OLMo 2, Gemma 2/3, GLM-4), m Granite's multiplier
    f = [Norm](act(h'·W_gate + b) ⊙ (h'·W_in + b)·W_out + b)·m      plain FFN: act(h'·W_in + b)·W_out + b
    x + o, then + f with h' = Norm(x + o); a parallel block: (f + o) + x with h' = Norm₂(x) (Phi: h)

The products are the kernels' own row functions (runtime.stored_kernels.ROWS, runtime.llama_kernels.ROWS): the
same numbers as the readable step's for stored weights (bit for bit, in both arithmetics); a float32 matrix
is multiplied by columns here instead of by BLAS. The norms, RoPE, the activations, the softmax's exp and sum
are the readable step's float32 steps in its order (core/step_math.py: its sums np.add.reduce's pairwise order,
its exp NumPy's, the scores and the weighted sum in attention.one_query_dots' and one_query_sum's order, which
the readable step runs through the same loops): to the bit with stored weights in either arithmetic; with float32
weights on most families, and where BLAS sums the readable step's product in another order (BLOOM, MPT, Falcon-RW's
W_out; Gemma 2's soft-cap, NumPy's tanh) to float32 rounding (tests/test_step_compiled.py: each logits vector
within 1e-6 relative, the same 200 greedy tokens).

What it takes (`refusal` says why not, and the layer then takes the readable step): a pre-norm block with
RMSNorm or LayerNorm (or none), sequential or parallel, attention with RoPE or none (any table: LongRoPE, YaRN,
ggml's angles), GQA/MQA, a mask, a sliding window or ALiBi, biases anywhere, norms on q and k and on the
boxes' outputs, a soft-cap, a residual multiplier; an FFN plain or gated with SiLU, GELU (erf or tanh), ReLU
or ReLU²; float32 activations. Not: post-norm blocks (OPT-350m), routed FFNs (MoE), latent attention (MLA),
sinks (gpt-oss), Llama 4's q/k scaling, xIELU. Compiled entries are kept on disk by runtime.kernel_cache (each
plan its own file, checked when read back).
"""

from __future__ import annotations

import hashlib
import importlib.util
import math
import os
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import numpy as np

from ..runtime.errors import QkvError
from .config import ModelConfig
from .weights import BlockWeights, FFNWeights, NormWeights

ACTS = ("silu", "gelu", "gelu_tanh", "relu", "relu2")     # the FFN activations it computes (step_math.act's codes)
GGML_SILU = len(ACTS)                                       # and llama.cpp arithmetic's SiLU (+ 1: a row's tail)
QK_NORMS = ("", "head", "turned", "all")                    # norms on q and k: none, each head's (before RoPE, after
                                                            # it), all of q and of k (OLMo 2)


@cache
def has_numba() -> bool:
    """Whether numba is installed: imported only when a plan compiles (`import qkv` stays without it)."""
    return importlib.util.find_spec("numba") is not None


@dataclass(frozen=True)
class Plan:
    """What a compiled layer is specialised for: the code of its products and norms (its sizes and switches are
    arguments)."""

    arith: str                          # "exact" or "llama.cpp"
    kinds: tuple[str, ...]              # W_QKV (or W_Q, W_K, W_V), W_O, W_gate_in (plain FFN: W_in), W_out: each
                                        # a stored kind or "F32"

    @property
    def name(self) -> str:
        """The compiled entry's name, its file in the kernel cache: one per plan."""
        return "_layer_" + hashlib.sha256(repr(self).encode()).hexdigest()[:16]


def kind_of(W, arith: str) -> str | None:
    """W's kind for a plan: a StoredMatrix's GGUF kind, "F32" for a float32 array, None where no compiled rows
    multiply it in ARITH (it then keeps the readable step)."""
    from ..runtime.stored import StoredMatrix
    if isinstance(W, StoredMatrix):
        if W.arith != arith or not has_numba():
            return None
        return W.kind if W.kind in _rows_table(arith) else None
    if isinstance(W, np.ndarray) and W.dtype == np.float32 and W.ndim == 2 and W.flags.c_contiguous:
        return "F32"
    return None


def refusal(cfg: ModelConfig, w: BlockWeights) -> str | None:
    """Why LAYER's block W cannot take the compiled step (None: it can) — one short reason."""
    if not has_numba():
        return "numba is not installed"
    a, f = w.attn, w.ffn
    outs = (w.attn_out_norm, w.ffn_out_norm)
    pre = (w.attn_norm, w.ffn_norm if not cfg.parallel_residual or w.ffn_norm is not None else w.attn_norm)
    qk = (a.q_norm, a.k_norm) if cfg.qk_norm is not None else ()
    checks = (
        (cfg.norm in ("rms", "layer") and cfg.norm_place == "pre", "not a pre-norm block with RMSNorm or LayerNorm"),
        (not cfg.latent and not cfg.attn_output_gate and w.cross_attn is None, "its attention box is another"),
        (cfg.qk_norm in (None, "head", "all") and (cfg.qk_norm == "head" or not cfg.qk_norm_after_rope)
         and not cfg.qk_l2_norm and cfg.temperature_floor is None, "norms or scales on q, k"),
        (not cfg.attn_sinks, "sinks on the scores"),
        (outs.count(None) in (0, 2) and not (cfg.parallel_residual and outs[0] is not None),
         "a norm on one box's output"),
        (pre.count(None) in (0, 2) and all(_plain_norm(n, cfg) for n in (*pre, *outs) if n is not None)
         and all(n is not None and _plain_norm(n, cfg, cfg.qk_norm == "head") for n in qk), "its norms"),
        (isinstance(f, FFNWeights) and cfg.activation in ACTS and cfg.ffn_gate_scale == 1
         and cfg.glu_limit is None, "its FFN"),
        (cfg.d_head * cfg.n_heads == a.W_O.shape[0], "heads of another width"),
    )
    for ok, why in checks:
        if not ok:
            return why
    if f.W_gate is not None and f.W_gate_in is None:
        return "its FFN"
    for W in _products(w):
        if kind_of(W, cfg.arith) is None:
            return f"a matrix of a kind without compiled rows in {cfg.arith} arithmetic"
    return None


def _plain_norm(n: NormWeights, cfg: ModelConfig, heads: bool = False) -> bool:
    """A norm the compiled step computes: one γ (d,) shared by the rows, β only in a LayerNorm; HEADS (a norm of
    each head of q or k): also one γ a head, (H, d_k) (StableLM, Cohere)."""
    return (n.weight.ndim == 1 or heads and n.weight.ndim == 2 and n.weight.shape[1] == cfg.d_head) and \
        n.weight.dtype == np.float32 and (n.bias is None or cfg.norm == "layer")


def _qkv(a) -> tuple:
    """The Q/K/V product's matrices: (W_QKV,), or (W_Q, W_K, W_V) where they are kept apart (stored in different
    kinds)."""
    return (a.W_Q, a.W_K, a.W_V) if a.W_QKV is None else (a.W_QKV,)


def _products(w: BlockWeights) -> tuple:
    """The matrices the compiled layer multiplies by, in its plan's order: W_QKV (or W_Q, W_K, W_V), W_O,
    W_gate_in (a plain FFN: W_in), W_out."""
    f = w.ffn
    return (*_qkv(w.attn), w.attn.W_O, f.W_gate_in if f.W_gate is not None else f.W_in, f.W_out)


def plan_of(cfg: ModelConfig, w: BlockWeights) -> Plan:
    """The compiled layer W (which `refusal` let through) runs on."""
    return Plan(cfg.arith, tuple(kind_of(W, cfg.arith) for W in _products(w)))


def switches(cfg: ModelConfig, w: BlockWeights) -> tuple[int, ...]:
    """What the compiled layer does differently for W's family, as its `how` argument (ints): RoPE's pairs
    interleaved (2i, 2i + 1) or halves (i, i + d/2); a gated FFN; its activation (in ACTS; llama.cpp arithmetic's SiLU
    GGML_SILU); LayerNorm or RMSNorm;
    norms before the boxes (OLMo 2: none); the norms on q and k (in QK_NORMS); norms on each box's output (OLMo 2,
    Gemma 2/3, GLM-4); a parallel block x + Attn(Norm₁(x)) + FFN(Norm₂(x)) (GPT-NeoX, Phi, GPT-J, Falcon)."""
    qk = "" if cfg.qk_norm is None else "turned" if cfg.qk_norm_after_rope else cfg.qk_norm
    act = GGML_SILU if cfg.activation == "silu" and cfg.arith == "llama.cpp" else ACTS.index(cfg.activation)
    return (int(bool(cfg.rope_interleaved)), int(w.ffn.W_gate is not None), act,
            int(cfg.norm == "layer"), int(w.attn_norm is not None), QK_NORMS.index(qk),
            int(w.attn_out_norm is not None), int(bool(cfg.parallel_residual)))


def bits_of(W) -> tuple:
    """What a plan's rows read of W: a StoredMatrix's parts, or (W,) of a float32 array."""
    return (W,) if isinstance(W, np.ndarray) else tuple(W.bits)


_NONE = np.zeros(0, np.float32)
_NO_MASK = np.zeros((0, 0), np.float32)
_NO_BIAS = np.zeros((0, 0, 0), np.float32)
_compiled: dict[Plan, object] = {}


def wanted() -> bool:
    """QKV_STEP: "compiled" (the default) or "readable" (every layer's one-token step in NumPy: to compare, or to
    read it run)."""
    how = os.environ.get("QKV_STEP", "compiled")
    if how not in ("compiled", "readable"):
        raise QkvError(f"QKV_STEP={how[:40]!r} is not a way qkv takes a one-token step; use compiled or readable")
    return how == "compiled" and has_numba()


def takes(w: BlockWeights, ctx) -> bool:
    """Whether this one-token step of W runs compiled: the block can (`refusal`), nothing is recorded, and the
    cache is what it reads. What a block's steps share (its plan, the arrays it passes) is kept on W while its
    config, matrices and norms stay the same objects."""
    if not ctx.compiled_step:
        return False
    cfg, a, f = ctx.cfg, w.attn, w.ffn
    parts = (cfg, a.W_QKV, a.W_Q, a.W_K, a.W_V, a.W_O, getattr(f, "W_gate_in", None), getattr(f, "W_in", None),
             getattr(f, "W_out", None), w.attn_norm, w.ffn_norm, a.q_norm, a.k_norm, w.attn_out_norm, w.ffn_out_norm,
             a.b_Q, a.b_K, a.b_V, a.b_O, getattr(f, "b_in", None), getattr(f, "b_gate", None), getattr(f, "b_out", None))
    kept = w.__dict__.get("_step_plan")
    if kept is None or len(kept[0]) != len(parts) or any(p is not q for p, q in zip(kept[0], parts)):
        plan = None if refusal(cfg, w) is not None else plan_of(cfg, w)
        kept = (parts, plan, None if plan is None else _held(w, cfg))
        w.__dict__["_step_plan"] = kept
    cache = ctx.cache
    return (kept[1] is not None and cache.k.dtype == np.float32 and cache.k.shape[-1] == cfg.d_head
            and cache.v.shape[-1] == cfg.d_head)


def _held(w: BlockWeights, cfg: ModelConfig) -> tuple[tuple, int]:
    """What of W's compiled layer does not change from step to step: (its switches, norms, ε, its products'
    parts and biases; the width of its first FFN product)."""
    a, f = w.attn, w.ffn
    *qkv, W_O, W_in, W_out = _products(w)
    return ((switches(cfg, w), _norms(w), np.float32(cfg.norm_eps), tuple(bits_of(W) for W in qkv), _qkv_bias(a),
             bits_of(W_O), _or_none(a.b_O), bits_of(W_in), _or_none(f.b_in), _or_none(f.b_gate), bits_of(W_out),
             _or_none(f.b_out)), W_in.shape[1])


def step(x: np.ndarray, w: BlockWeights, ctx, layer: int) -> np.ndarray:
    """`layer.step_block` of W for x (B, 1, d_model) in one compiled call → (B, 1, d_model); `takes` said yes."""
    cfg, cache = ctx.cfg, ctx.cache
    _, plan, (held, wide) = w.__dict__["_step_plan"]
    fn = _compiled.get(plan) or _compile(plan)
    B, d = x.shape[0], x.shape[-1]
    t, r = cache.length, cache.row(layer)
    rope = ctx.rope_of(layer)
    if rope is None:
        cos = sin = _NO_MASK
    else:
        cos, sin = (np.ascontiguousarray(c.reshape(c.shape[0], c.shape[-1])) for c in rope)   # (B or 1, d_rot)
    bias = ctx.step_bias_of(layer)                                    # (B or 1, H or 1, 1, m): a mask, ALiBi's
    mask = _NO_BIAS if bias is None else np.ascontiguousarray(bias.reshape(bias.shape[0], bias.shape[1], -1))
    scale = 1.0 / math.sqrt(cfg.d_head) if ctx.scale is None else ctx.scale
    y = fn(np.ascontiguousarray(x.reshape(B, d), np.float32), *held, cos, sin, cache.k[r], cache.v[r], t, mask,
           np.float32(scale), np.float32(cfg.attn_softcap or 0), np.float32(cfg.residual_multiplier),
           cfg.n_heads, cfg.n_kv_heads, cfg.d_head, wide)
    return y.reshape(B, 1, d)


def _or_none(b) -> np.ndarray:
    return _NONE if b is None else b


def _norms(w: BlockWeights) -> tuple:
    """γ, β of the norms the compiled layer reads, float32 (d,) each, empty where there is none: before attention
    and the FFN (a parallel block's one shared norm: the FFN's empty), on q and k, after each box's output."""
    a = w.attn
    parts = []
    for n in (w.attn_norm, w.ffn_norm, a.q_norm, a.k_norm, w.attn_out_norm, w.ffn_out_norm):
        parts += [_NONE, _NONE] if n is None else [np.ascontiguousarray(n.weight).reshape(-1),
                                                   _NONE if n.bias is None else np.ascontiguousarray(n.bias).reshape(-1)]
    return tuple(parts)


def _qkv_bias(a) -> np.ndarray:
    """[b_Q | b_K | b_V] (zeros where one is missing), or none at all."""
    if a.b_Q is None and a.b_K is None and a.b_V is None:
        return _NONE
    parts = [np.zeros(W.shape[1], np.float32) if b is None else b for b, W in
             ((a.b_Q, a.W_Q), (a.b_K, a.W_K), (a.b_V, a.W_V))]
    return np.concatenate(parts).astype(np.float32)


def _rows_table(arith: str) -> dict:
    from ..runtime import llama_kernels, stored_kernels
    if arith == "exact":
        return stored_kernels.ROWS
    return {**llama_kernels.ROWS, "F32": stored_kernels.ROWS["F32"]}


def _compile(plan: Plan):
    """The compiled layer of PLAN (made once a process, read from the kernel cache when kept)."""
    from ..runtime import kernel_cache, llama_arith, llama_kernels, llama_simd, simd, stored_kernels
    from . import ops, step_math
    rows = [_rows_table(plan.arith)[k] for k in plan.kinds]
    fn = _layer_of(plan, rows[:-3], *rows[-3:])
    kernel_cache.keep([fn], [Path(__file__), Path(stored_kernels.__file__), Path(llama_kernels.__file__),
                             Path(simd.__file__), Path(llama_simd.__file__), Path(llama_arith.__file__),
                             Path(ops.__file__), Path(step_math.__file__)])
    _compiled[plan] = fn
    return fn


def _layer_of(plan: Plan, qkv_rows: list, o_rows, in_rows, out_rows):
    """The numba entry of PLAN: its products' (prep, rows) pairs (QKV_ROWS: one, or three for W_Q, W_K, W_V) and
    its arithmetic's norms closed over."""
    from numba import njit, prange
    from .step_math import act, dots, exp32, norm_of, pairwise32, weigh
    from ..runtime.stored_kernels import CHUNKS, _chunk
    split = len(qkv_rows) == 3                            # W_Q, W_K, W_V apart: three products
    (q_prep, q_part), (k_prep, k_part), (v_prep, v_part) = qkv_rows * (3 // len(qkv_rows))
    o_prep, o_part = o_rows
    in_prep, in_part = in_rows
    out_prep, out_part = out_rows
    norm = norm_of(plan.arith == "llama.cpp")
    HEAD, TURNED, ALL = (QK_NORMS.index(k) for k in ("head", "turned", "all"))

    @njit(inline="always")
    def turn(qkv, b, at, cos, sin, r, interleaved):
        """RoPE on the head at column AT of row b: its first d_rot numbers, by cos, sin row r."""
        d_rot = cos.shape[1]
        half = d_rot // 2
        if interleaved:                                   # pairs (2i, 2i + 1)
            for i in range(half):
                x0, x1 = qkv[b, at + 2 * i], qkv[b, at + 2 * i + 1]
                qkv[b, at + 2 * i] = x0 * cos[r, 2 * i] + (-x1) * sin[r, 2 * i]
                qkv[b, at + 2 * i + 1] = x1 * cos[r, 2 * i + 1] + x0 * sin[r, 2 * i + 1]
        else:                                             # pairs (i, i + d_rot/2)
            for i in range(half):
                x0, x1 = qkv[b, at + i], qkv[b, at + half + i]
                qkv[b, at + i] = x0 * cos[r, i] + (-x1) * sin[r, i]
                qkv[b, at + half + i] = x1 * cos[r, half + i] + x0 * sin[r, half + i]

    @njit(inline="always")
    def head_norm(qkv, b, head, H, dk, g_q, b_q, g_k, b_k, eps, layer_norm):
        """The norm of query head HEAD (< H) or key head HEAD − H of row b, in place: γ, β (d_k,) shared by the
        heads, or one per head (H·d_k,) / (Hkv·d_k,) (StableLM, Cohere: a LayerNorm each)."""
        g, beta, own = (g_q, b_q, head) if head < H else (g_k, b_k, head - H)
        if g.shape[0] > dk:
            g = g[own * dk:(own + 1) * dk]
            beta = beta[own * dk:(own + 1) * dk] if beta.shape[0] > 0 else beta
        norm(layer_norm, qkv, b, head * dk, dk, g, beta, eps, qkv, head * dk)

    @njit
    def attend(qkv, b, head, g, kc, vc, m, mask, scale, cap, z, dk):
        """z_h = softmax(q_h·K_gᵀ·scale + M)·V_g for query head HEAD of row b; cap > 0: S = cap·tanh(S/cap) before
        M (Gemma 2); M (B or 1, H or 1, m): a mask, ALiBi's bias. The scaling, cap and mask one float32 step each
        as attention_scores takes them (no fused multiply-add anywhere: the scores and the weighted sum in
        attention.one_query_dots' and one_query_sum's orders), the softmax as ops.softmax_ (a row whose every key
        is masked gives zeros)."""
        s = np.empty(m, np.float32)
        at = head * dk
        dots(qkv, b, at, g, kc, m, dk, s)
        top = np.finfo(np.float32).min
        for j in range(m):
            v = s[j] * scale
            if cap > 0:
                v = np.tanh(v / cap) * cap
            if mask.shape[0] > 0:
                v += mask[b if mask.shape[0] > 1 else 0, head if mask.shape[1] > 1 else 0, j]
            s[j] = v
            top = max(top, v)
        for j in range(m):
            s[j] = exp32(s[j] - top)
        total = max(pairwise32(s, m), np.finfo(np.float32).tiny)      # ops.softmax_'s Σ
        for j in range(m):
            s[j] = s[j] / total
        weigh(s, vc, b, g, m, z, at, dk)

    def layer(x, how, norms, eps, qkv_bits, b_qkv, o_bits, b_o, in_bits, b_in, b_gate, out_bits, b_out,
              cos, sin, kc, vc, t, mask, scale, cap, mult, H, Hkv, dk, wide):
        interleaved, gated, act_no, layer_norm, pre, qk, out_norms, parallel = how      # `switches`
        g_attn, b_attn, g_ffn, b_ffn, g_q, b_q, g_k, b_k, g_ao, b_ao, g_fo, b_fo = norms
        B, d = x.shape
        h = np.empty((B, d), np.float32)
        for b in range(B):                                                # Norm(x) (OLMo 2: x)
            if pre:
                norm(layer_norm, x, b, 0, d, g_attn, b_attn, eps, h, 0)
            else:
                h[b] = x[b]                                               # (B, d_model)
        n_qkv = (H + 2 * Hkv) * dk
        qkv = np.empty((B, n_qkv), np.float32)
        if split:                                                         # h·W_Q, h·W_K, h·W_V side by side: a
            n_q, n_kv = H * dk, Hkv * dk                                  # thread takes a chunk of each
            y_q, y_k, y_v = (np.empty((B, n_q), np.float32), np.empty((B, n_kv), np.float32),
                             np.empty((B, n_kv), np.float32))
            p_q, p_k, p_v = q_prep(h), k_prep(h), v_prep(h)
            bits_q, bits_k, bits_v = qkv_bits
            for i in prange(3 * CHUNKS):
                which, c = i % 3, i // 3
                if which == 0:
                    o0, o1 = _chunk(n_q, c)
                    q_part(h, p_q, bits_q, y_q, o0, o1)
                elif which == 1:
                    o0, o1 = _chunk(n_kv, c)
                    k_part(h, p_k, bits_k, y_k, o0, o1)
                else:
                    o0, o1 = _chunk(n_kv, c)
                    v_part(h, p_v, bits_v, y_v, o0, o1)
            qkv[:, :n_q] = y_q
            qkv[:, n_q:n_q + n_kv] = y_k
            qkv[:, n_q + n_kv:] = y_v
        else:
            p = q_prep(h)
            bits_qkv = qkv_bits[0]
            for c in prange(CHUNKS):                                      # h·[W_Q | W_K | W_V]
                o0, o1 = _chunk(n_qkv, c)
                q_part(h, p, bits_qkv, qkv, o0, o1)
        if b_qkv.shape[0] > 0:
            for b in range(B):
                for i in range(n_qkv):
                    qkv[b, i] += b_qkv[i]
        for b in range(B):
            r = b if cos.shape[0] > 1 else 0
            if qk == ALL:                                                 # OLMo 2: over the whole q, and k
                norm(layer_norm, qkv, b, 0, H * dk, g_q, b_q, eps, qkv, 0)
                norm(layer_norm, qkv, b, H * dk, Hkv * dk, g_k, b_k, eps, qkv, H * dk)
            for head in range(H + Hkv):
                if qk == HEAD:                                            # each head's q, k (Qwen3): before RoPE
                    head_norm(qkv, b, head, H, dk, g_q, b_q, g_k, b_k, eps, layer_norm)
                if cos.shape[1] > 0:
                    turn(qkv, b, head * dk, cos, sin, r, interleaved)
                if qk == TURNED:                                          # … after it (Hunyuan)
                    head_norm(qkv, b, head, H, dk, g_q, b_q, g_k, b_k, eps, layer_norm)
            for g in range(Hkv):                                          # K, V of position t into the cache
                for i in range(dk):
                    kc[b, g, t, i] = qkv[b, (H + g) * dk + i]
                    vc[b, g, t, i] = qkv[b, (H + Hkv + g) * dk + i]
        m = t + 1
        z = np.zeros((B, H * dk), np.float32)
        group = H // Hkv
        for bh in prange(B * H):                                          # softmax(q·Kᵀ·scale + M)·V, a head each
            b, head = bh // H, bh % H
            attend(qkv, b, head, head // group, kc, vc, m, mask, scale, cap, z, dk)
        out = np.empty((B, d), np.float32)
        p = o_prep(z)
        for c in prange(CHUNKS):                                          # z·W_O
            o0, o1 = _chunk(d, c)
            o_part(z, p, o_bits, out, o0, o1)
        for b in range(B):                                                # + b_O, its norm, × m (Granite)
            if b_o.shape[0] > 0:
                for i in range(d):
                    out[b, i] += b_o[i]
            if out_norms:
                norm(layer_norm, out, b, 0, d, g_ao, b_ao, eps, out, 0)
            if mult != 1:
                for i in range(d):
                    out[b, i] *= mult
        x1 = np.empty((B, d), np.float32)
        for b in range(B):
            if parallel:                                                  # the FFN reads Norm₂(x) (Phi: Norm₁(x))
                if g_ffn.shape[0] > 0:
                    norm(layer_norm, x, b, 0, d, g_ffn, b_ffn, eps, h, 0)
            else:
                for i in range(d):
                    x1[b, i] = x[b, i] + out[b, i]
                if pre:
                    norm(layer_norm, x1, b, 0, d, g_ffn, b_ffn, eps, h, 0)
                else:
                    h[b] = x1[b]
        u = np.empty((B, wide), np.float32)
        p = in_prep(h)
        for c in prange(CHUNKS):                                          # h·[W_gate | W_in]
            o0, o1 = _chunk(wide, c)
            in_part(h, p, in_bits, u, o0, o1)
        d_ff = wide // 2 if gated else wide
        hid = np.empty((B, d_ff), np.float32)
        vec = d_ff - d_ff % 8                                             # ggml's SiLU: its last n mod 8 apart
        for c in prange(CHUNKS):                                          # act(g + b) ⊙ (u + b), or act(u + b)
            i0, i1 = _chunk(d_ff, c)
            for b in range(B):
                for i in range(i0, i1):
                    no = act_no + 1 if act_no == GGML_SILU and i >= vec else act_no
                    if gated:
                        gv = u[b, i] + b_gate[i] if b_gate.shape[0] > 0 else u[b, i]
                        iv = u[b, d_ff + i] + b_in[i] if b_in.shape[0] > 0 else u[b, d_ff + i]
                        hid[b, i] = act(no, gv) * iv
                    else:
                        hid[b, i] = act(no, u[b, i] + b_in[i] if b_in.shape[0] > 0 else u[b, i])
        p = out_prep(hid)
        y = np.empty((B, d), np.float32)
        for c in prange(CHUNKS):                                          # hidden·W_out
            o0, o1 = _chunk(d, c)
            out_part(hid, p, out_bits, y, o0, o1)
        for b in range(B):                                                # + b_out, its norm, × m, + the stream
            if b_out.shape[0] > 0:
                for i in range(d):
                    y[b, i] += b_out[i]
            if out_norms:
                norm(layer_norm, y, b, 0, d, g_fo, b_fo, eps, y, 0)
            for i in range(d):
                f = y[b, i] * mult if mult != 1 else y[b, i]
                if parallel:
                    x1[b, i] = (f + out[b, i]) + x[b, i]
                else:
                    x1[b, i] += f
        return x1                                                         # (B, d_model)

    layer.__name__ = layer.__qualname__ = plan.name
    return njit(parallel=True)(layer)
