"""Attribution patching (AtP; Nanda 2023, Syed et al. 2023) and AtP* (Kramár et al. 2024): activation patching's
effects estimated to first order, every component at once, from one forward on each run and one backward.

Patching copies an activation a of the clean run into the corrupted run (`analysis.patch`); to first order

    m(patched) − m(corrupted) ≈ (a_clean − a_corrupted) · ∂m/∂a   (the gradient at the corrupted run)

The differences come from the two forwards, every ∂m/∂a from one backward of the corrupted run: the engine's own
(qkv.core.blocks_backward, run block by block as qkv.core.backward runs it) with `Boxes` that note the gradient
passing each point patching copies (`_backward`). The metric and the normalisation are `patch.patch`'s (a token,
(answer, wrong) tokens, or an encoder's "embedding"; ÷ (m(clean) − m(corrupted))), so each table lines up cell for
cell with a `Patching`'s:

    heads     (L, H)     each head's Z at every position
    residual  (L, n)     the residual stream entering block l, at position p
    attn_out  (L, n)     layer l's attention output at p (what joins the stream)
    ffn_out   (L, n)     layer l's FFN output at p
    neurons   (L, d_ff)  each FFN neuron at every position (None where a layer's FFN is routed: MoE)
    star=True also: queries (L, H), keys, values (L, Hkv): each head's Q, each K/V head's K or V, every position,
                    by AtP, and queries_star, keys_star by AtP*; `patch_qkv` patches them exactly

AtP* (Kramár et al. 2024, §3.1.1, attention saturation): a query or key feeds a softmax, and a softmax near
one-hot has a gradient near 0 however far a patch would move it, so AtP misses such patches. AtP* computes the
patched pattern exactly, A' = softmax(S(q_clean, k_corrupted) + M) (keys: S(q_corrupted, k_clean)), and is
linear only after it: (A' − A) · ∂m/∂A, with ∂m/∂A = ∂m/∂Z · Vᵀ. A head's Z and values feed no softmax in their
own layer (ΔZ is exact), so their AtP* is AtP. GradDrop, AtP*'s second fix (dropping each layer's gradient in
turn against cancelling paths), is left out.

When the estimate is exact: when m is linear in the activation from there on. In a real model nothing is: the
final norm divides by the stream's scale, which every patch moves, and later attention and FFNs bend it. With the
final norm removed and the last FFN silenced, the last layer's heads, attn_out and ffn_out are exact, and AtP* of
its queries and keys (tests/test_atp.py builds that model). `compare` sets AtP beside exact patching: Pearson r,
sign agreement and the components where |estimate − exact| > ½·|exact|.

Encoders (an "embedding" metric) are estimated as patch patches them; an encoder–decoder is refused (its backward
is qkv.core.seq2seq_backward's).

Cost: two forwards and one backward, whatever the number of components. SmolLM2 (30 × 9 heads), a 20-token IOI pair,
2 cores shared with other work, one BLAS thread: 0.9 s (load ≈ 6) to 3.2–4.0 s (load ≈ 12), 0.6 s of CPU, against
exact patching's 270 heads in 16 s to 44 s (10–11 s of CPU); a GGUF model is first dequantised to float32 (the
backward multiplies by Wᵀ: `input_attribution.float_model`), 10–25 s more on that machine.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Sequence

import numpy as np

from ..core import blocks_backward as back
from ..core.attention import attention_backward, attention_scores, softmax_of, split_heads
from ..core.blocks_backward import Boxes, FFNTape, Tape
from ..core.stack import transformer
from ..core.trace import Recorder
from ..runtime.errors import QkvError
from .attribution import token_id
from .input_attribution import Output, float_model
from .patch import EMBEDDING, metric_of, sentence_embedding, tail

if TYPE_CHECKING:
    from ..models.model import Model

TABLES = ("heads", "residual", "attn_out", "ffn_out")            # patch's tables, in its order
QKV = ("queries", "keys", "values")                              # star=True: the heads' inputs
KEEP = ("residual", "heads", "attn_out", "ffn_out", "neurons")   # what both passes record
KEEP_QKV = ("q", "k", "v", "scores", "attentions")               # and for queries, keys, values
NOISE = 1e-9                # agreement: |effect| below this share of the largest is rounding, counted as 0


@dataclass
class AttributionPatching:
    """AtP's estimates of `patch.patch`'s tables (and of more components; see the module). It reads as a
    `Patching` does (`viz.interpret_figures.patch_figure`, `analysis.sections.patch_payload`)."""

    heads: np.ndarray                       # (L, H)
    residual: np.ndarray                    # (L, n)
    attn_out: np.ndarray                    # (L, n)
    ffn_out: np.ndarray                     # (L, n)
    neurons: np.ndarray | None = None       # (L, d_ff) None: some FFN is routed (MoE)
    queries: np.ndarray | None = None       # (L, H) AtP of each head's Q (star=True)
    keys: np.ndarray | None = None          # (L, Hkv)
    values: np.ndarray | None = None        # (L, Hkv) (AtP* = AtP)
    queries_star: np.ndarray | None = None  # (L, H) AtP*: the pattern recomputed exactly
    keys_star: np.ndarray | None = None     # (L, Hkv)
    cross: None = None                      # as Patching's (an encoder–decoder is refused)
    clean: float = 0.0                      # m(clean)
    corrupted: float = 0.0                  # m(corrupted)
    labels: list[str] = field(default_factory=list)
    metric: str = ""
    normalised: bool = True
    seconds: float = 0.0                    # the two forwards, the backward and the products (not dequantising)
    model: str = ""
    texts: tuple[str, str] = field(default=("", ""))
    method: str = "attribution patching (AtP)"

    def top_heads(self, k: int = 10) -> list[tuple[int, int, float]]:
        """The k heads of largest |estimate|: (layer, head, estimate), largest first."""
        order = np.argsort(-np.abs(self.heads), axis=None)[:k]
        return [(int(i // self.heads.shape[1]), int(i % self.heads.shape[1]), float(self.heads.flat[i]))
                for i in order]

    def as_json(self) -> dict:
        names = TABLES + ("neurons", "cross") + QKV + ("queries_star", "keys_star")
        tables = {name: None if getattr(self, name) is None else np.round(getattr(self, name), 6).tolist()
                  for name in names}
        return {"model": self.model, "method": self.method, "clean": self.texts[0], "corrupted": self.texts[1],
                "labels": self.labels, "metric": self.metric, "metric_clean": self.clean,
                "metric_corrupted": self.corrupted, "normalised": self.normalised, **tables,
                "top_heads": [{"layer": l, "head": h, "estimate": round(e, 6)} for l, h, e in self.top_heads(10)],
                "seconds": round(self.seconds, 3)}


# ── the metric, the passes and the backward ──────────────────────────────────────

def _output(model: "Model", metric, clean_hidden: np.ndarray) -> tuple[Output, str]:
    """What m is as input attribution's `Output` (its value and its gradient on logits or hidden states), and
    its name, from patch's metric grammar (`patch.metric_of`); a function of logits has no gradient here."""
    fn, name = metric_of(model, metric)
    if isinstance(metric, str) and metric == EMBEDDING:
        return Output(compare=sentence_embedding(clean_hidden)[0]), name
    if callable(metric):
        raise QkvError("attribution patching differentiates the metric: give a token or (answer, wrong) tokens "
                       "(or \"embedding\" for an encoder), not a function")
    pair = metric if isinstance(metric, (tuple, list)) else (metric,)
    ids = [token_id(model, t) for t in pair]
    return Output(-1, ids[0], ids[1] if len(ids) == 2 else None), name


def _ids(model: "Model", text: str | Sequence[int]) -> np.ndarray:
    return model.encode(text)[0] if isinstance(text, str) else model.check_ids(text)[0][0]   # (n,)


def _pass(model: "Model", ids: np.ndarray, keep: Sequence[str]) -> tuple[np.ndarray, np.ndarray | None, dict, Tape]:
    """One forward of ids (n,) keeping KEEP and a tape: (hidden (1, n, d), logits (1, n, V) or None, {layer:
    {name: (1, …)}}, tape). Both runs take this same path, so a position where they agree agrees bit for bit."""
    rec, tape = Recorder(keep=keep), Tape()
    h, logits = transformer(model.weights, model.config, ids[None], np.ones((1, len(ids)), np.int64), rec=rec,
                            tape=tape)
    return h, logits, rec.store, tape


def _backward(model: "Model", h: np.ndarray, logits: np.ndarray | None, tape: Tape, out: Output,
              star: bool) -> dict[str, list]:
    """∂m/∂(each point patching copies) at the pass TAPE kept: {"residual", "attn_out", "ffn_out": L × (1, n, d),
    "heads": L × (1, H, n, d_k), "neurons": L × (1, n, d_ff) or None; star: "q", "k", "v" (as the tape's q, k, v),
    "A" (1, H, n, n)}. qkv.core.backward.backward's steps, with block-by-block `Boxes` that note the gradients:

        attn_out, ffn_out   what each box's step adds to the stream: its backward's input before the output norm
                            and the multiplier (Boxes.ffn takes that whole step; attention's is noted at the
                            output norm, or as dout / m without one)
        heads               ∂m/∂Z = dout · W_Oᵀ, split into heads; star: ∂m/∂A = ∂m/∂Z · Vᵀ and attention_backward
        residual            the block's dX (the stream entering it)"""
    cfg, w = model.config, model.weights
    L, m = cfg.n_layers, cfg.residual_multiplier
    g: dict[str, list] = {name: [None] * L for name in ("residual", "attn_out", "ffn_out", "heads", "neurons",
                                                        "q", "k", "v", "A")}
    out_norm_of = {id(b.attn_out_norm): i for i, b in enumerate(w.blocks) if b.attn_out_norm is not None}

    def norm(dy, x, nw, cfg_):
        if id(nw) in out_norm_of:                          # attention's output norm: dy = m · ∂m/∂attn_out
            g["attn_out"][out_norm_of[id(nw)]] = dy / m
        return back.norm(dy, x, nw, cfg_)

    def attention(layer, dout, aw, t, cfg_):
        if w.blocks[layer].attn_out_norm is None:
            g["attn_out"][layer] = dout / m                # (1, n, d_model)
        dz = split_heads(dout @ aw.W_O.T, cfg.n_heads)     # (1, H, n, d_k)
        g["heads"][layer] = dz
        if star:
            g["q"][layer], g["k"][layer], g["v"][layer] = attention_backward(dz, t.q, t.k, t.v, t.a, cfg.score_scale,
                                                                             cfg.attn_softcap)
            G = cfg.n_heads // t.v.shape[1]
            dzg = dz.reshape(1, t.v.shape[1], G * dz.shape[2], -1)              # (1, Hkv, G·n, d_k)
            g["A"][layer] = np.matmul(dzg, t.v.swapaxes(-1, -2)).reshape(t.a.shape)   # (1, H, n, m)
        return back.attention(dout, aw, t, cfg_)

    def ffn(layer, d):
        g["ffn_out"][layer] = d                            # (1, n, d_model)
        b = w.blocks[layer]
        d = d * m if m != 1 else d
        if b.ffn_out_norm is not None:
            d, _ = back.norm(d, tape.pop(layer, "ffn_out_norm"), b.ffn_out_norm, cfg)
        t = tape.pop(layer, "ffn")
        if isinstance(t, FFNTape):
            g["neurons"][layer] = d @ b.ffn.W_out.T         # (1, n, d_ff) ∂m/∂h, h·W_out = the FFN's output
        return back.feed_forward(d, b.ffn, t, cfg)

    dlogits, dhidden = out.gradient(h, logits)
    head = tape.pop(None, "head") if w.W_head is not None else None
    if dlogits is None:
        dh = dhidden
    else:
        dh, _, _ = back.logits_of(dlogits, h if head is None else head.out, w, cfg, logits)
        if head is not None:
            dh = back.head(dh, w, cfg, head)[0]
    dh, _ = back.unembed_in(dh, w, tape)
    if w.final_norm is not None:
        dh, _ = back.norm(dh, tape.pop(None, "final_norm"), w.final_norm, cfg)
    dx = dh                                                # (1, n, d_model)
    for i in reversed(range(L)):
        boxes = Boxes(norm=norm, attention=partial(attention, i), ffn=ffn)
        dx, _, _ = back.block(dx, w.blocks[i], tape, i, cfg, boxes=boxes)
        g["residual"][i] = dx
    return g


# ── the estimates ────────────────────────────────────────────────────────────────

def _dot(delta: np.ndarray, grad: np.ndarray, keep: int) -> np.ndarray:
    """Σ over all axes after the first KEEP of delta ⊙ grad, in float64: (…keep axes)."""
    d = np.asarray(delta, np.float64) * np.asarray(grad, np.float64)
    return d.reshape(*d.shape[:keep], -1).sum(axis=-1)


def _pattern(q: np.ndarray, k: np.ndarray, bias: np.ndarray, cfg, sink: np.ndarray | None = None) -> np.ndarray:
    """A = softmax(S(q, k) + bias) (B, H, n, m): the pattern of queries q (B, H, n, d_k) and keys k (B, Hkv, m, d_k),
    with the pass's mask and position bias (bias: its recorded scores minus its own S(q, k)); sink (H,): each head's
    sink logit in the softmax (gpt-oss), or None."""
    return softmax_of(attention_scores(q, k, cfg.score_scale, cfg.attn_softcap) + bias, sink)


def _star(c: dict, k: dict, dA: np.ndarray, cfg, sink: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """AtP* of one layer's queries (H,) and keys (Hkv,): (A' − A) · ∂m/∂A, A' the pattern recomputed with head h's
    clean queries (only head h's pattern moves), or K/V head g's clean keys (its G query heads' patterns move)."""
    A = k["attentions"].astype(np.float64)                                    # (1, H, n, m)
    q, kk = k["q"].astype(np.float64), k["k"].astype(np.float64)              # (1, H, n, d_k), (1, Hkv, m, d_k)
    bias = k["scores"].astype(np.float64) - attention_scores(q, kk, cfg.score_scale, cfg.attn_softcap)   # mask: −∞
    queries = _dot(_pattern(c["q"].astype(np.float64), kk, bias, cfg, sink) - A, dA, 2)[0]      # (H,)
    Hkv, H = kk.shape[1], q.shape[1]
    keys = np.repeat(kk, Hkv, axis=0)                                         # (Hkv, Hkv, m, d_k): row g patched at g
    keys[np.arange(Hkv), np.arange(Hkv)] = c["k"][0].astype(np.float64)
    moved = _dot(_pattern(np.repeat(q, Hkv, axis=0), keys, bias, cfg, sink) - A, dA, 2)   # (Hkv, H)
    group = np.arange(H) // (H // Hkv)                                        # query head → its K/V head
    return queries, np.array([moved[g, group == g].sum() for g in range(Hkv)])    # (H,), (Hkv,)


def _sink(model: "Model", layer: int) -> np.ndarray | None:
    """LAYER's sink logits (H,) in float64 when the model has attention sinks (gpt-oss), else None."""
    s = model.weights.blocks[layer].attn.sinks
    return None if s is None or not model.config.attn_sinks else np.asarray(s, np.float64)


def _refuse_seq2seq(model, what: str) -> None:
    """One line for an encoder–decoder (or its decoder view): its backward is another (qkv.core.seq2seq_backward)."""
    from ..models.seq2seq import DecoderView

    if isinstance(model, DecoderView) or getattr(model.config, "encoder_decoder", False):
        raise QkvError(f"{what} of an encoder–decoder ({model.name}) is not supported; use qkv patch, which patches "
                       "its decoder exactly")


def atp(model: "Model", clean: str | Sequence[int], corrupted: str | Sequence[int], metric, *, star: bool = False,
        normalise: bool = True) -> AttributionPatching:
    """AtP's estimate of patching each head, each position of the residual stream, attention and FFN outputs
    and each FFN neuron from CLEAN into CORRUPTED (texts or ids with the same token count); star: also each head's
    queries, keys and values, by AtP and AtP* (module doc). METRIC and NORMALISE as `patch.patch`'s."""
    _refuse_seq2seq(model, "attribution patching")
    metric_of(model, metric)                                                   # the grammar's errors first
    model = float_model(model)                                                # a GGUF's weights, dequantised
    started = time.perf_counter()
    a, b = _ids(model, clean), _ids(model, corrupted)
    if len(a) != len(b):
        raise QkvError(f"clean has {len(a)} tokens and corrupted {len(b)}; patching position by position needs the "
                       "same count: reword the corrupted input so its tokens line up")
    keep = KEEP + (KEEP_QKV if star else ())
    h_c, z_c, c, _ = _pass(model, a, keep)
    h_k, z_k, k, tape = _pass(model, b, keep)
    out, name = _output(model, metric, h_c)
    m_clean, m_corrupt = float(out.value(h_c, z_c)[0]), float(out.value(h_k, z_k)[0])
    if normalise and math.isclose(m_clean, m_corrupt, rel_tol=1e-6, abs_tol=1e-9):
        raise QkvError(f"clean and corrupted give the same metric ({m_clean:.4g}), so there is no effect to "
                       "normalise; give a corrupted input that changes the answer (or normalise=False)")
    g = _backward(model, h_k, z_k, tape, out, star)
    L = model.config.n_layers
    delta = {w: [c[l][w][0] - k[l][w][0] for l in range(L)] for w in TABLES}   # each (n, d) or (H, n, d_k)
    tables = {w: np.stack([_dot(delta[w][l], g[w][l][0], 1) for l in range(L)]) for w in TABLES}
    if all(g["neurons"][l] is not None and "neurons" in c[l] for l in range(L)) and \
            len({g["neurons"][l].shape for l in range(L)}) == 1:                # every FFN dense, of one width
        tables["neurons"] = np.stack([_dot((c[l]["neurons"] - k[l]["neurons"])[0].T, g["neurons"][l][0].T, 1)
                                      for l in range(L)])                     # (L, d_ff)
    if star:
        for w, short in zip(QKV, "qkv"):
            tables[w] = np.stack([_dot(c[l][short][0] - k[l][short][0], g[short][l][0], 1) for l in range(L)])
        both = [_star(c[l], k[l], g["A"][l], model.config, _sink(model, l)) for l in range(L)]
        tables["queries_star"] = np.stack([q for q, _ in both])
        tables["keys_star"] = np.stack([kk for _, kk in both])
    scale = (m_clean - m_corrupt) if normalise else 1.0
    label = model.tokenizer.label if model.tokenizer else str
    labels = [x if x == y else f"{x}/{y}" for x, y in zip((label(int(i)) for i in a), (label(int(i)) for i in b))]
    return AttributionPatching(**{w: t / scale for w, t in tables.items()}, clean=m_clean, corrupted=m_corrupt,
                               labels=labels, metric=name, normalised=normalise,
                               seconds=time.perf_counter() - started, model=model.name,
                               texts=tuple(x if isinstance(x, str) else "" for x in (clean, corrupted)),
                               method="attribution patching (AtP*)" if star else "attribution patching (AtP)")


# ── exact patching of queries, keys and values (what AtP* is checked against) ───

def patch_qkv(model: "Model", clean: str | Sequence[int], corrupted: str | Sequence[int], metric, *,
              normalise: bool = True) -> dict[str, np.ndarray]:
    """Exact patching of each head's queries and each K/V head's keys and values (every position) from CLEAN
    into CORRUPTED: {"queries": (L, H), "keys", "values": (L, Hkv)}, normalised as `patch.patch`. Each layer's
    H + 2·Hkv copies are one batch run from block l (`patch.tail`) with hooks on "l.q", "l.k", "l.v"."""
    _refuse_seq2seq(model, "patching each head's queries, keys and values")
    fn, _ = metric_of(model, metric)
    keep = ("residual", "q", "k", "v")
    c, k = model.run(clean, keep=keep), model.run(corrupted, keep=keep)
    if len(c.ids) != len(k.ids):
        raise QkvError(f"clean has {len(c.ids)} tokens and corrupted {len(k.ids)}; give inputs of the same count")
    if fn is None:                                                           # "embedding": cos to the clean one
        target = sentence_embedding(c.hidden[None])[0]
        fn = lambda hidden: sentence_embedding(hidden) @ target             # noqa: E731 (B, n, d) → (B,)
    m_clean = float(fn(tail(model, c.layers[0].residual[None], 0, None, c))[0])
    m_corrupt = float(fn(tail(model, k.layers[0].residual[None], 0, None, k))[0])
    cfg = model.config
    H, Hkv = cfg.n_heads, cfg.n_kv_heads
    rows = [("q", h) for h in range(H)] + [("k", j) for j in range(Hkv)] + [("v", j) for j in range(Hkv)]
    out = {w: np.zeros((cfg.n_layers, H if w == "queries" else Hkv)) for w in QKV}
    for layer in range(cfg.n_layers):
        def copier(point: str):
            def fn_(value: np.ndarray, _layer: int) -> np.ndarray:             # (B, H or Hkv, n, d_k)
                value = value.copy()
                for r, (p, h) in enumerate(rows):
                    if p == point:
                        value[r, h] = getattr(c.layers[layer], point)[h]
                return value
            return fn_
        x = np.repeat(k.layers[layer].residual[None], len(rows), axis=0)      # (B, n, d_model)
        hooks = {f"{layer}.{p}": copier(p) for p in "qkv"}
        values = np.asarray(fn(tail(model, x, layer, hooks, k)), np.float64) - m_corrupt    # (B,)
        for (p, h), v in zip(rows, values):
            out[dict(zip("qkv", QKV))[p]][layer, h] = v
    scale = (m_clean - m_corrupt) if normalise else 1.0
    return {w: t / scale for w, t in out.items()}


# ── AtP beside exact patching ────────────────────────────────────────────────────

@dataclass
class Agreement:
    """How one table of estimates matches the exact one (both (L, …), same cells)."""

    table: str
    pearson: float                          # r over every cell (nan where either table is constant)
    sign: float                             # share of cells with exact ≠ 0 whose estimate has its sign
    cells: int
    wrong: list[tuple[int, int, float, float]]   # (layer, index, estimate, exact): |est − exact| > ½·|exact|,
                                                 # largest |exact| first

    def as_json(self) -> dict:
        wrong = [{"layer": l, "index": i, "estimate": round(e, 6), "exact": round(x, 6)} for l, i, e, x in self.wrong]
        return {"table": self.table, "pearson": None if math.isnan(self.pearson) else round(self.pearson, 6),
                "sign_agreement": round(self.sign, 6), "cells": self.cells, "wrong_by_more_than_half": wrong}


def agreement(estimate: np.ndarray, exact: np.ndarray, table: str = "") -> Agreement:
    """ESTIMATE beside EXACT (the same shape, (L, …)): Pearson's r, the sign agreement over cells whose exact
    effect is not 0, and the cells where the estimate is wrong by more than half (|est − exact| > ½·|exact|).
    A cell whose exact effect and estimate are both within NOISE of the table's largest effect counts as 0 on both
    sides: exact patching's batched passes leave ~1e-17 where a patch cannot reach the metric, AtP exactly 0."""
    e, x = np.asarray(estimate, np.float64), np.asarray(exact, np.float64)
    if e.shape != x.shape or e.ndim != 2:
        raise QkvError(f"compare tables of one shape (L, …): estimate {e.shape}, exact {x.shape}")
    r = math.nan
    if e.size > 1 and e.std() > 0 and x.std() > 0:
        r = float(np.corrcoef(e.ravel(), x.ravel())[0, 1])
    eps = NOISE * float(np.abs(x).max(initial=0.0))
    moved = np.abs(x) > eps
    sign = float(np.mean(np.sign(e[moved]) == np.sign(x[moved]))) if moved.any() else 1.0
    still = ~moved & (np.abs(e) <= eps)                                      # 0 on both sides
    off = np.argwhere((np.abs(e - x) > 0.5 * np.abs(x)) & ~still)            # (k, 2)
    off = sorted(off.tolist(), key=lambda li: -abs(x[li[0], li[1]]))
    return Agreement(table, r, sign, int(e.size), [(l, i, float(e[l, i]), float(x[l, i])) for l, i in off])


def compare(estimates: AttributionPatching, exact, qkv: dict[str, np.ndarray] | None = None) -> list[Agreement]:
    """Each table of ESTIMATES beside EXACT's (a `Patching`: heads, residual, attn_out, ffn_out where it has
    them) and, given QKV (`patch_qkv`), the queries and keys by AtP and AtP* and the values beside it."""
    out = [agreement(getattr(estimates, w), getattr(exact, w), w) for w in TABLES
           if getattr(exact, w, None) is not None]
    if qkv is not None and estimates.queries is not None:
        for w in QKV:
            out.append(agreement(getattr(estimates, w), qkv[w], w))
        out += [agreement(estimates.queries_star, qkv["queries"], "queries (AtP*)"),
                agreement(estimates.keys_star, qkv["keys"], "keys (AtP*)")]
    return out
