"""The pipeline page's boxes of a layer without softmax: a selective scan (Mamba, Mamba-2, and Falcon-H1's Mamba-2
mixer beside its attention) or a linear attention (Qwen3-Next's gated delta rule, MiniMax's lightning attention),
each drawn as its own steps and the token-to-token matrix it implies (Ali et al. 2024, "The Hidden Attention of
Mamba Models"), with the numbers the pass recorded (qkv.core.trace.MIXER), never made again here:

    a scan            x̃ = act(conv(h·W_in)) → Δ, B, C → α[t, s] = Cₜ·(Π_{r=s+1..t} exp(Δᵣ·A))·Bₛ·Δₛ → y = α·x̃ (+ D·x̃)
    the delta rule    q̂, k̂, v → β, g → A[t, s] = βₛ·q̂ₜᵀ·(Π_{r=s+1..t} exp(g_r)(I − β_r k̂_r k̂_rᵀ))·k̂ₛ → o = A·v
    lightning         q, k, v → λ = exp(−r) → A[t, s] = (qₜ·kₛ)·λ^(t−s) → o = A·v

Each layer has M such matrices, each mixing its own values (a Mamba layer: one a channel, of which the trace keeps
MIX_CHANNELS a group; a Mamba-2 mixer: one a head; the delta rule: one a value head; lightning: one a head).
What travels, per such layer (the key: the layer's number as a string):

    {"kind": "mamba" | "mamba2" | "parallel" | "delta" | "lightning", "M": int, "labels": [str] (M),
     "index": [int] (M)   each matrix's channel (Mamba) or head: the page names it in its language,
     "d_s": int, "d_v": int, "skip": [float] (M) | null   a scan's D: y + D·x̃ after the matrix, kept apart
     "q", "k", "v", "out": {"norm" (M, n), "first" (M, n, HEAD_DIMS)}   mix_q, mix_k, mix_v, mix_out summarised
     "gate": f32 (M, n) | null    Δ (a scan), β (the delta rule); lightning none
     "decay": f32 (M, n) | (M, n, N)   the log of each token's decay: Δ·A (Mamba-2; Mamba's per state), g, −r
     "matrix": {"shape": [1, M, n, n], "lo", "step", "data"}   the signed matrix, one byte a number as S travels
               (`encode_scores`: within step/2 of the engine's; code 0 above the diagonal)
     "whole": {"matrix" f32 (M, n, n), "v" f32 (M, n, d_v), "out" f32 (M, n, d_v)} | null}
               whole, for the layers around the start layer that fit in MIXER_MB: the page sums matrix[t, s]·v[s]
               and sets it beside the engine's out[t]

`mixer_arrays` builds it (float64 `layer_arrays` first, which tests/test_pipeline_scan.py checks: matrix·v = out to
1e-9 in float64); `as_attention` gives the stack's attention arrays a layer without q, k, v: zeros, never drawn.

The payload (`pipeline_payload`) of a stack with such layers (core/capabilities.py: Mamba, Mamba-2, Jamba, Granite 4,
Falcon-H1, Qwen3-Next, MiniMax) has, besides, "mixers": {str(layer): the above}, and its "arch" the "layer_kinds"
and "mixer" sizes (`arch_entries`); a layer without softmax has zeros for its q, k, v, Z and S (never drawn), its
"attention" the implied matrix's shares. Such a trace keeps the mixers' steps: `pipeline_trace`, or
model.run(text, keep=PIPELINE_KEEP); `page_reads` and `check_kept` say what the page needs of each layer.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from ..core.capabilities import has_ffn, kind_of, layer_kinds
from ..core.lightning import shares
from ..core.mamba import mix_channels
from ..core.mamba2 import Mamba2
from ..core.trace import MIXER, LayerTrace, Trace
from ..runtime.errors import QkvError
from .pipeline_scores import encode_scores
from .wire import encode

MIXER_MB = 4                     # float32 matrix, v and out kept whole for the page's sums: as many layers as fit
NO_SOFTMAX = ("mamba", "mamba2", "delta", "lightning")   # kinds whose q, k, v, S, Z are not softmax attention's
MIXING = (*NO_SOFTMAX, "parallel")                        # kinds with a mixer's steps (Falcon-H1: beside attention)
STEPS = ("mix_q", "mix_k", "mix_v", "mix_decay", "mix_matrix", "mix_out")   # what the page reads (and mix_gate)


def steps_of(kind: str) -> tuple[str, ...]:
    """The MIXER names a layer of KIND must have kept for the page (lightning has no gate)."""
    return STEPS if kind == "lightning" else (*STEPS, "mix_gate")


def has_mixers(cfg) -> bool:
    """Whether any layer of the stack has a mixer's steps (a scan, a linear attention, Falcon-H1's mixer beside)."""
    return any(kind in MIXING for kind in layer_kinds(cfg))


def page_reads(cfg, layer: int, shown: tuple[str, ...]) -> tuple[str, ...]:
    """What the page reads of LAYER: SHOWN (softmax attention's layer, `pipeline_payload.SHOWN`), without q, k, v and
    S where they are not softmax attention's and without ffn_in where there is no FFN (a Mamba stack), with the
    layer's own steps where it has a mixer (trace.MIXER)."""
    kind = kind_of(cfg, layer)
    if kind in NO_SOFTMAX:
        absent = ("q", "k", "v", "scores") if has_ffn(cfg, layer) else ("q", "k", "v", "scores", "ffn_in")
        return (*(name for name in shown if name not in absent), *steps_of(kind))
    return (*shown, *steps_of("mamba2")) if kind == "parallel" else shown


def check_kept(model, trace: Trace, missing: list[int]) -> None:
    """A trace of a stack with mixers that lacks a layer's steps (MISSING: those layers) or keeps some heads only:
    one error saying how to keep them (they are kept only when asked for)."""
    if (missing or trace.head_ids is not None) and has_mixers(model.config):
        raise QkvError(f"the pipeline page needs every intermediate of every layer and head, and the own steps of "
                       f"{model.name}'s scan or linear-attention layers (kept only when asked for); make the trace "
                       "with qkv.viz.pipeline.pipeline_trace(model, text), or model.run(text, keep=PIPELINE_KEEP) "
                       "(qkv.viz.pipeline)")


def softmax_layer(cfg, trace: Trace) -> LayerTrace | None:
    """The first layer of TRACE with softmax attention's q, k, v (None: a stack of scans alone)."""
    return next((trace.layers[i] for i in range(cfg.n_layers) if kind_of(cfg, i) not in NO_SOFTMAX), None)


def arch_entries(cfg, seq2seq: bool) -> dict:
    """The page's "arch" knobs of layers of other kinds: each layer's kind (core/capabilities.py; None for an
    encoder–decoder), the mixer's sizes and its block's knobs (`sizes`); Qwen3-Next's softmax layers gate each head's
    Z_h ⊙ σ(X·W_G)_h before W_O (gated_heads)."""
    return {"layer_kinds": None if seq2seq else list(layer_kinds(cfg)), "mixer": sizes(cfg),
            "gated_heads": bool(cfg.attn_output_gate)}


def attention_layers(cfg, trace: Trace, L: int, mixers: bool) -> list[LayerTrace]:
    """TRACE's L layers as the stack's attention arrays read them (`as_attention` where MIXERS: the stack has any)."""
    return [trace.layers[i] if not mixers else as_attention(trace.layers[i], cfg, kind_of(cfg, i)) for i in range(L)]


def index(cfg, kind: str, M: int) -> list[int]:
    """(M,) the number of each of a layer's matrices: a Mamba layer's channel, else its (Mamba, value) head."""
    return [int(c) for c in mix_channels(cfg.mamba.d_inner, cfg.n_heads)] if kind == "mamba" else list(range(M))


def labels(cfg, kind: str, M: int) -> list[str]:
    """What each of a layer's M matrices is (English; the page says it in its language from `index`): a Mamba
    layer's channel, a Mamba-2 head, a value head, a head."""
    what = {"mamba": "channel", "mamba2": "Mamba head", "parallel": "Mamba head", "delta": "value head",
            "lightning": "head"}[kind]
    return [f"{what} {i}" for i in index(cfg, kind, M)]


def skip(cfg, block, kind: str) -> np.ndarray | None:
    """(M,) a scan's D of each matrix (y + D ⊙ x̃ after it), None for a linear attention."""
    if kind == "mamba":
        return np.asarray(block.mixer.D, np.float64)[mix_channels(cfg.mamba.d_inner, cfg.n_heads)]
    if kind in ("mamba2", "parallel"):
        return np.asarray(block.mixer.D, np.float64)
    return None


def layer_arrays(t: LayerTrace) -> dict[str, np.ndarray]:
    """A layer's own steps as the pass recorded them, float64, names without "mix_": q, k (M, n, d_s), v, out
    (M, n, d_v), gate (M, n) or None, decay, matrix (M, n, n); out = matrix·v exactly (a pass from the text's start)."""
    return {name[4:]: None if getattr(t, name) is None else np.asarray(getattr(t, name), np.float64) for name in MIXER}


def summary(x: np.ndarray, k: int) -> dict:
    """(..., d) vectors → their lengths and first k values, float32 (pipeline_payload.summary's, for M per layer)."""
    x = np.asarray(x, dtype=np.float64)
    return {"norm": encode(np.linalg.norm(x, axis=-1), "f32"), "first": encode(x[..., :k], "f32")}


def mixer_layers(cfg, L: int) -> list[int]:
    """The layers (of L) with a mixer's steps."""
    return [i for i in range(L) if kind_of(cfg, i) in MIXING]


def whole_layers(layers: list[int], trace: Trace, center: int) -> list[int]:
    """The mixer layers whose float32 matrix, v and out fit in MIXER_MB, nearest CENTER first (at least one)."""
    kept, used = [], 0
    for i in sorted(layers, key=lambda i: (abs(i - center), i < center)):
        t = trace.layers[i]
        size = 4 * (t.mix_matrix.size + t.mix_v.size + t.mix_out.size)
        if kept and used + size > MIXER_MB << 20:
            break
        kept.append(i)
        used += size
    return kept


def mixer_arrays(cfg, blocks, trace: Trace, center: int, head_dims: int) -> dict | None:
    """{str(layer): the layer's payload (module doc)} for every layer with a mixer's steps, None if none; each
    matrix one byte a number as S travels (`pipeline_scores.encode_scores`, −∞ above the diagonal)."""
    layers = mixer_layers(cfg, len(blocks))
    if not layers:
        return None
    whole = set(whole_layers(layers, trace, center))
    out = {}
    for i in layers:
        kind = kind_of(cfg, i)
        a = layer_arrays(trace.layers[i])
        M, n, m = a["matrix"].shape
        above = np.arange(m)[None, :] > np.arange(n)[:, None]                      # (n, m) s > t: no key
        D = skip(cfg, blocks[i], kind)
        out[str(i)] = {
            "kind": kind, "M": M, "labels": labels(cfg, kind, M), "index": index(cfg, kind, M),
            "d_s": a["q"].shape[-1], "d_v": a["v"].shape[-1],
            "skip": None if D is None else [float(x) for x in D],
            **{name: summary(a[name], head_dims) for name in ("q", "k", "v", "out")},
            "gate": None if a["gate"] is None else encode(a["gate"], "f32"),          # (M, n)
            "decay": encode(a["decay"], "f32"),                                      # (M, n) | (M, n, N)
            "matrix": encode_scores(np.where(above, -np.inf, a["matrix"])[None]),    # (1, M, n, n)
            "whole": {name: encode(a[name], "f32") for name in ("matrix", "v", "out")} if i in whole else None}
    return out


def as_attention(t: LayerTrace, cfg, kind: str) -> LayerTrace:
    """T as the stack's attention arrays read it: a layer of a kind without softmax (NO_SOFTMAX) has zeros for q, Z
    (H, n, d_k), k, v (H_kv, n, d_k) and S = M (0, −∞ above the diagonal), which the page never draws there (its
    own steps are `mixer_arrays`'); its attentions (the implied matrix as shares) stay. Other layers: T itself."""
    if kind not in NO_SOFTMAX:
        return t
    n = t.residual.shape[0]
    H, Hkv = cfg.n_heads, cfg.n_kv_heads
    dk = cfg.d_head or cfg.d_model // H
    mask = np.where(np.arange(n)[None, :] > np.arange(n)[:, None], -np.inf, 0.0)   # (n, n)
    zeros = np.zeros((H, n, dk), np.float32)
    return LayerTrace(**{**vars(t), "q": zeros, "heads": zeros, "k": np.zeros((Hkv, n, dk), np.float32),
                         "v": np.zeros((Hkv, n, dk), np.float32),
                         "scores": np.broadcast_to(mask, (H, n, n)).astype(np.float32)})


def sizes(cfg) -> dict | None:
    """The sizes a mixer's boxes name (the module docstrings' letters), None for a model without one; and each
    layer's own knobs: MiniMax's α, β on each step, Falcon-H1's multipliers on its two boxes side by side."""
    m, d, lit = cfg.mamba, cfg.delta, cfg.lightning
    out: dict = {}
    if isinstance(m, Mamba2):
        out.update(scan="mamba2", H=m.n_heads, P=m.head_dim, N=m.d_state, G=m.n_groups, conv=m.conv_kernel)
        if m.beside is not None:
            out["beside"] = {k: float(v) for k, v in vars(m.beside).items()}   # attn_in, attn_out, ssm_out, ffn_out
    elif m is not None:
        out.update(scan="mamba", E=m.d_inner, N=m.d_state, R=m.dt_rank, conv=m.conv_kernel)
    if d is not None:
        out.update(Hk=d.n_k_heads, Hv=d.n_v_heads, d_k=d.d_k, d_v=d.d_v, conv=d.conv_kernel)
    if lit is not None:
        out.update(block=lit.block_size, factors=[list(map(float, lit.attn_factors(i))) for i in range(cfg.n_layers)],
                   ffn_factors=[float(lit.ffn_alpha), float(lit.ffn_beta)])
    return out or None


def beside_trace(trace: Trace) -> Trace | None:
    """The attention that Falcon-H1's Mamba-2 mixers imply, beside its softmax heads, as a trace of its own (the
    viewer's second kind of attention): each layer that kept both its q and its mixer's matrices (trace.MIXER), its
    Mamba heads' |α| with each row divided by its sum, the rule every scan's "attentions" follow (core.lightning.
    shares: on the engine's α); None when no layer kept both (a model without a mixer beside attention)."""
    both = [i for i in trace.layer_ids if trace.layers[i].q is not None and trace.layers[i].mix_matrix is not None]
    if not both:
        return None
    return dataclasses.replace(trace, head_ids=None, layers={
        i: LayerTrace(layer=i, attentions=shares(trace.layers[i].mix_matrix)) for i in both})   # (M, n, n) each
