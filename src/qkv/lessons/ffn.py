"""`qkv explain ffn`: the FFN box of a block (guide: block), one token's vector through it, on a real model.

    h = Norm(x)                          what the FFN reads (pre-norm; each layout below)
    u = h·W_in + b_in                    (d_ff,) pre-activations; gated: also g = h·W_gate (+ b_gate, Llama's mlp_bias)
    a = act(u)      gated: act(g) ⊙ u    (d_ff,) the hidden vector, the engine's "neurons"
    FFN(h) = a·W_out + b_out = Σ_i a_i·W_out[i] + b_out          (d_model,) added to the stream

Column i of W_in is a key and row i of W_out its value (Geva et al. 2021, "Transformer Feed-Forward
Layers Are Key-Value Memories"): a_i says how much of the value W_out[i] this token writes. The
lesson ranks the neurons by |a_i|·‖W_out[i]‖, measures how close the top k's partial sum comes to the
whole output (cosine, for k = 1, 10, 100, d_ff), and reads the top neurons' values through the final
norm's γ and W_vocab as the logit lens reads the stream.

What the FFN reads, by layout: pre-norm h = Norm₂(x + a) (x the block's input, a attention's output
as it joined the stream); no norm before the FFN (OLMo 2) h = x + a; parallel (GPT-NeoX, Phi) h =
Norm₂(x), or the attention's Norm₁(x) where one norm serves both; post-norm (BERT) h = Norm₁(x + a).
What joins the stream: FFN(h), through Norm_out first where the model has one (Gemma 2's sandwich,
OLMo 2), × Granite's residual multiplier. A routed FFN (MoE: several experts, each token its own k)
has no single d_ff hidden and is refused; so are encoder–decoders (a third residual, cross-attention).

Checked before anything prints: the whole computation, redone here in float64 from the layer's
weights (a GGUF's stored blocks dequantised for this layer), against the engine's "ffn_out" and, where
the engine records it, its "neurons"; Σ_i a_i·W_out[i] against a·W_out.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from rich.text import Text

from ..core.capabilities import choose_layer, require
from ..core.blocks import activation_of, linear, unembed_in
from ..core.layer import joined as into_stream
from ..runtime.errors import QkvError, check_index
from ..runtime.stored import StoredMatrix
from ..core.trace import INTERMEDIATES
from ..core.weights import MoEWeights
from ..writing.nexttoken import token_text
from . import Page, nbytes, same, shape
from .attention import DEFAULT_TEXT, norm_of
from ..viz.words import texts

TEXTS = texts("ffn")               # {language: its words} (viz/words: one module per language)
DEFAULT_MODEL = "smollm2"
TOP = 5                            # neurons followed through ④ and ⑤
TOKENS = 5                         # promoted and suppressed tokens listed per vector
KS = (1, 10, 100)                  # partial sums shown (and k = d_ff)
SHOWN = 4                          # values of a vector shown
CHUNK = 256                        # rows of the running partial sums at a time
TOL = 1e-4                         # the engine's float32 against the lesson's float64, relative to the largest value


@dataclass
class Neuron:
    """One of the top neurons: its coefficient, its value vector and what that writes."""

    index: int
    a: float                       # a_i
    u: float                       # its pre-activation h·W_in[:, i] + b_i
    g: float | None                # gated: h·W_gate[:, i]
    norm: float                    # ‖W_out[i]‖
    cos: float                     # cos(a_i·W_out[i], FFN(h))
    promoted: list[tuple[str, float]]     # the tokens a_i·W_out[i] raises most, with their logits
    suppressed: list[tuple[str, float]]   # and lowers most

    @property
    def size(self) -> float:
        return abs(self.a) * self.norm


@dataclass
class Partial:
    """The top k neurons' a_i·W_out[i] summed (+ b_out) against the whole output."""

    k: int
    cos: float
    rel: float                     # ‖FFN(h) − partial‖ / ‖FFN(h)‖
    share: float                   # their Σ |a_i|·‖W_out[i]‖ over every neuron's


@dataclass
class Lesson:
    model: str
    text: str
    layer: int
    L: int
    labels: list[str]
    pos: int                       # the followed token
    d_model: int
    d_ff: int
    activation: str                # the config's name: gelu, gelu_tanh, silu, relu
    gated: bool
    layout: str                    # pre, pre_bare (no norm before), parallel, parallel_shared, post
    out_norm: bool                 # Norm_out(FFN(h)) joins the stream (Gemma 2, OLMo 2)
    multiplier: float              # Granite's residual multiplier (1 elsewhere)
    bias_in: bool
    bias_out: bool
    params: list[tuple[str, tuple[int, ...]]]   # the FFN's matrices and biases, with their shapes
    attn_params: int               # W_Q, W_K, W_V, W_O and their biases
    stored: list[str]              # the stored kinds of the FFN's matrices (a GGUF); [] for arrays
    dequant_bytes: int             # what the lesson made of them in float32, and how long it took
    dequant_seconds: float
    x: np.ndarray                  # (d_model,) the stream entering the block, at the token
    h: np.ndarray                  # (d_model,) what the FFN reads
    u: np.ndarray                  # (d_ff,) h·W_in + b_in
    g: np.ndarray | None           # (d_ff,) h·W_gate + b_gate (gated)
    a: np.ndarray                  # (d_ff,) the hidden vector
    y: np.ndarray                  # (d_model,) FFN(h) = a·W_out + b_out
    joined: np.ndarray             # (d_model,) what joined the stream: the engine's ffn_out row
    order: np.ndarray              # (d_ff,) neurons by |a_i|·‖W_out[i]‖, largest first
    curve: np.ndarray              # (d_ff,) cos of the top-k partial sum to FFN(h), k = 1 … d_ff
    partials: list[Partial]
    top: list[Neuron]
    out_promoted: list[tuple[str, float]]
    out_suppressed: list[tuple[str, float]]
    no_vocab: str | None           # why ⑤ is skipped (None: it is not)
    diffs: dict[str, float | None]  # ffn_out, neurons (None: not recorded), sum

    @property
    def ffn_params(self) -> int:
        return sum(int(np.prod(s)) for _, s in self.params)


def build(model, text: str | None = None, *, layer: int | None = None, token: int | None = None) -> Lesson:
    """One token of `text` (default the guide's sentence, its last token) through the FFN of `layer` (default
    the middle one) of `model`; every number checked against the engine."""
    text = text or DEFAULT_TEXT
    cfg = model.config
    if getattr(cfg, "encoder_decoder", False) or not hasattr(model.weights, "blocks"):
        raise QkvError(f"{model.name} is an encoder–decoder; qkv explain ffn follows one stack: use --model smollm2 "
                       "(the default), minilm, or a GPT-2 or Llama directory")
    if cfg.d_ff == 0:
        raise QkvError(f"{model.name} has no FFN (d_ff = 0): choose a model with FFNs, e.g. --model smollm2")
    layer = cfg.n_layers // 2 if layer is None else model.check_layer(layer)
    w = model.weights.blocks[layer]
    if isinstance(w.ffn, MoEWeights):
        dense = [i for i in range(cfg.n_layers) if not isinstance(model.weights.blocks[i].ffn, MoEWeights)]
        raise QkvError(f"layer {layer} of {model.name} is a routed FFN (MoE: {cfg.n_experts} experts, each token "
                       f"takes {cfg.experts_per_token}), with no single d_ff hidden to follow; "
                       + (f"choose a dense layer with --layer ({', '.join(map(str, dense))})" if dense
                          else "use a model with dense FFNs, e.g. --model smollm2"))
    require(cfg, model.name, "this lesson (the FFN after x + Attn(Norm(x)), its parameters beside attention's)",
            {"plain_block"}, layer, instead=choose_layer(cfg, {"plain_block", "dense_ffn"},
                                                         "use a transformer, e.g. --model smollm2"))
    keep = ("residual", "attn_out", "ffn_out") + (("neurons",) if "neurons" in INTERMEDIATES else ())
    trace = model.run(text, layers=[layer], keep=keep)
    lt, n = trace.layer(layer), len(trace.tokens)
    pos = _default_token(model, text, n) if token is None else check_index("token", token, n, "the text")

    layout = _layout(cfg, w)
    x = lt.residual[pos].astype(np.float64)                                 # (d_model,)
    h = _ffn_input(layout, x, lt.attn_out[pos].astype(np.float64), w, cfg)  # (d_model,)
    mats = [m for m in (w.ffn.W_in, w.ffn.W_gate, w.ffn.W_out) if m is not None]
    stored = [m.kind for m in mats if isinstance(m, StoredMatrix)]
    t0 = time.perf_counter()
    as32 = [m.dequantized() if isinstance(m, StoredMatrix) else np.asarray(m) for m in mats]   # a GGUF's blocks
    seconds = time.perf_counter() - t0                                      # dequantised exactly, this layer only
    W_in, *W_gate, W_out = [m.astype(np.float64) for m in as32]            # (d_model, d_ff), …, (d_ff, d_model)
    W_gate = W_gate[0] if W_gate else None                                  # (d_model, d_ff)
    d_ff = W_in.shape[1]
    b_in = None if w.ffn.b_in is None else np.asarray(w.ffn.b_in, np.float64)
    b_out = np.zeros(cfg.d_model) if w.ffn.b_out is None else np.asarray(w.ffn.b_out, np.float64)

    act = activation_of(w.ffn, cfg)                                         # xIELU: its own scalars (Apertus)
    u = h @ W_in + (0 if b_in is None else b_in)                            # (d_ff,)
    b_gate = 0 if w.ffn.b_gate is None else np.asarray(w.ffn.b_gate, np.float64)   # (d_ff,) Llama's mlp_bias
    g = None if W_gate is None else h @ W_gate + b_gate                     # (d_ff,)
    a = act(u) if g is None else act(g) * u                                 # (d_ff,)
    y = a @ W_out + b_out                                                   # (d_model,)
    joined = y if w.ffn_out_norm is None else norm_of(y, w.ffn_out_norm.weight, w.ffn_out_norm.bias, cfg.norm,
                                                      cfg.norm_eps)
    joined = into_stream(joined, cfg)                                       # (d_model,) Granite: × m
    engine = lt.ffn_out[pos].astype(np.float64)
    diffs = {"ffn_out": same("FFN(h), what joins the stream, against the engine's ffn_out", joined, engine, TOL,
                             rel=True),
             "neurons": (same("a, the hidden vector, against the engine's neurons", a, lt.neurons[pos], TOL, rel=True)
                         if "neurons" in keep and lt.kept("neurons") else None)}

    norms = np.linalg.norm(W_out, axis=1)                                   # (d_ff,) ‖W_out[i]‖
    order = np.argsort(-np.abs(a) * norms, kind="stable")                   # (d_ff,)
    curve, rel, last = _partial_sums(a, W_out, b_out, y, order)
    diffs["sum"] = same("Σ_i a_i·W_out[i] + b_out against a·W_out + b_out", last, y, 1e-9, rel=True)
    size = np.abs(a[order]) * norms[order]
    share = np.cumsum(size) / max(size.sum(), 1e-300)
    ks = sorted({k for k in KS if k < d_ff} | {d_ff})
    partials = ([Partial(0, _cos(b_out, y), float(np.linalg.norm(y - b_out) / np.linalg.norm(y)), 0.0)]
                if w.ffn.b_out is not None else [])
    partials += [Partial(k, float(curve[k - 1]), float(rel[k - 1]), float(share[k - 1])) for k in ks]

    why = _no_vocab(model)
    tops = order[:min(TOP, d_ff)]
    rows = np.vstack([np.sign(a[tops])[:, None] * W_out[tops], joined[None]]) # (k + 1, d_model) what each writes
    z = None if why else _value_logits(model, rows)                        # (k + 1, V)
    top = [Neuron(int(i), float(a[i]), float(u[i]), None if g is None else float(g[i]), float(norms[i]),
                  _cos(a[i] * W_out[i], y), *(_tokens(model, z[r]) if z is not None else ([], [])))
           for r, i in enumerate(tops)]
    out_up, out_down = _tokens(model, z[-1]) if z is not None else ([], [])
    params = [(name, tuple(int(d) for d in m.shape)) for name, m in
              (("W_in", w.ffn.W_in), ("W_gate", w.ffn.W_gate), ("W_out", w.ffn.W_out), ("b_in", w.ffn.b_in),
               ("b_gate", w.ffn.b_gate), ("b_out", w.ffn.b_out)) if m is not None]
    at = w.attn
    attn_params = sum(int(np.prod(m.shape)) for m in (at.W_Q, at.W_K, at.W_V, at.W_O, at.b_Q, at.b_K, at.b_V, at.b_O)
                      if m is not None)
    return Lesson(model=model.name, text=text, layer=layer, L=cfg.n_layers, labels=list(trace.labels), pos=pos,
                  d_model=cfg.d_model, d_ff=d_ff, activation=cfg.activation, gated=g is not None, layout=layout,
                  out_norm=w.ffn_out_norm is not None, multiplier=cfg.residual_multiplier, bias_in=b_in is not None,
                  bias_out=w.ffn.b_out is not None, params=params, attn_params=attn_params, stored=stored,
                  dequant_bytes=sum(m.size * 4 for m in as32),
                  dequant_seconds=seconds, x=x, h=h, u=u, g=g, a=a, y=y, joined=engine, order=order, curve=curve,
                  partials=partials, top=top, out_promoted=out_up, out_suppressed=out_down, no_vocab=why, diffs=diffs)


def _default_token(model, text: str, n: int) -> int:
    """The text's last token: the last one with characters of the text (an encoder's [SEP] has none)."""
    offsets = getattr(model.tokenizer, "offsets", None)
    spans = offsets(text) if offsets is not None else []
    real = [i for i, (s, e) in enumerate(spans) if e > s]
    return real[-1] if len(spans) == n and real else n - 1


def _layout(cfg, w) -> str:
    """Which stream the FFN reads (see the module's docstring)."""
    if cfg.norm_place == "post":
        return "post"
    if cfg.parallel_residual:
        return "parallel" if w.ffn_norm is not None else "parallel_shared"
    return "pre" if w.ffn_norm is not None else "pre_bare"


def _ffn_input(layout: str, x: np.ndarray, attn: np.ndarray, w, cfg) -> np.ndarray:
    """h (d_model,), what the FFN of a block reads, from its input x and attention's output (as it joined)."""
    def nrm(v, nw):
        b = None if nw.bias is None else np.asarray(nw.bias, np.float64)
        return norm_of(v, np.asarray(nw.weight, np.float64), b, cfg.norm, cfg.norm_eps)
    return {"pre": lambda: nrm(x + attn, w.ffn_norm), "pre_bare": lambda: x + attn,
            "parallel": lambda: nrm(x, w.ffn_norm), "parallel_shared": lambda: nrm(x, w.attn_norm),
            "post": lambda: nrm(x + attn, w.attn_norm)}[layout]()


def _cos(p: np.ndarray, q: np.ndarray) -> float:
    d = float(np.linalg.norm(p) * np.linalg.norm(q))
    return float(p @ q / d) if d > 0 else 0.0


def _partial_sums(a, W_out, b, y, order) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For k = 1 … d_ff: the top k's Σ a_i·W_out[i] + b against y, as (cos (d_ff,), relative error (d_ff,),
    the last partial sum (d_model,)). Plain form: P = b + cumsum(a[order, None]·W_out[order]); run CHUNK
    rows at a time so that no (d_ff, d_model) cumulative array is held."""
    d_ff = len(a)
    cos, rel = np.empty(d_ff), np.empty(d_ff)
    ny, P = np.linalg.norm(y), b.astype(np.float64)
    for s in range(0, d_ff, CHUNK):
        idx = order[s:s + CHUNK]
        S = P + np.cumsum(a[idx, None] * W_out[idx], axis=0)               # (chunk, d_model)
        lengths = np.linalg.norm(S, axis=1)
        cos[s:s + len(idx)] = S @ y / np.maximum(lengths * ny, 1e-300)
        rel[s:s + len(idx)] = np.linalg.norm(S - y, axis=1) / max(ny, 1e-300)
        P = S[-1]
    return cos, rel, P


def _no_vocab(model) -> str | None:
    """Why a vector written into the stream has no logits of its own (None: it has)."""
    w = model.weights
    if w.W_vocab is None:
        return "no_head"
    if getattr(w, "W_head", None) is not None:
        return "mlm_head"
    return None


def _value_logits(model, rows: np.ndarray) -> np.ndarray:
    """Vectors written into the stream (k, d_model) → their logits (k, V) as the logit lens reads the stream,
    the final norm's linear part kept: (v ⊙ γ)·W_vocab (LayerNorm: v centred first; 1/rms, β and the
    vocabulary bias left out) × the logit scale. A stored W_vocab is multiplied in place."""
    w, cfg = model.weights, model.config
    v = np.array(rows, dtype=np.float32)                                    # (k, d_model)
    if w.final_norm is not None:
        if cfg.norm == "layer":
            v -= v.mean(axis=-1, keepdims=True)
        v *= w.final_norm.weight
    z = linear(unembed_in(v, w), w.W_vocab)                                 # (k, V)
    return z * np.float32(cfg.logit_scale) if cfg.logit_scale != 1 else z


def _tokens(model, z: np.ndarray) -> tuple[list[tuple[str, float]], list[tuple[str, float]]]:
    """A vector's logits z (V,) → its TOKENS highest and lowest tokens, as a reader sees them, with their logits."""
    def label(i) -> str:
        return token_text(model.tokenizer, int(i)) if model.tokenizer is not None else f"#{int(i)}"

    up, down = np.argsort(-z, kind="stable")[:TOKENS], np.argsort(z, kind="stable")[:TOKENS]
    return [(label(i), float(z[i])) for i in up], [(label(i), float(z[i])) for i in down]


# ── the page ─────────────────────────────────────────────────────────────────────

def _vec(x: np.ndarray, k: int = SHOWN) -> str:
    return "[" + ", ".join(f"{v:+.3f}" for v in x[:k]) + (", …" if len(x) > k else "") + "]"


def _words(items: list[tuple[str, float]]) -> str:
    return "  ".join(f"{t} {v:+.2f}" for t, v in items)


def render(lesson: Lesson, lang: str = "en") -> list:
    p, le = Page(TEXTS, lang), lesson
    tok = le.labels[le.pos]
    glu = {"silu": "SwiGLU", "gelu": "GeGLU", "gelu_tanh": "GeGLU", "relu": "ReGLU"}[le.activation]
    out = [p.rule("title", bold=True, model=le.model, layer=le.layer, L=le.L, token=tok), p.say("intro"), Text("")]

    out += [p.rule("s_place", layer=le.layer, model=le.model), p.say("place_" + le.layout), Text(p.t["f_" + le.layout])]
    if le.out_norm:
        out.append(p.say("place_out_norm"))
    if le.multiplier != 1:
        out.append(p.say("place_mult", m=le.multiplier))
    out.append(p.say("place_numbers", token=tok, pos=le.pos, n=len(le.labels), nx=np.linalg.norm(le.x),
                     nh=np.linalg.norm(le.h), h=_vec(le.h)))
    tab = p.table("col_matrix", "col_shape", "col_params")
    for name, s in le.params:
        p.row(tab, name, str(s), f"{int(np.prod(s)):,}", bold_first=True)
    p.row(tab, p.t["row_ffn"], "", f"{le.ffn_params:,}", bold_first=True)
    p.row(tab, p.t["row_attn"], "", f"{le.attn_params:,}", bold_first=True)
    total = le.ffn_params + le.attn_params
    out += [p.say("dims", d_model=le.d_model, d_ff=le.d_ff, ratio=le.d_ff / le.d_model), tab,
            p.say("params_end", share=le.ffn_params / total, ratio=le.ffn_params / max(le.attn_params, 1))]
    if le.ffn_params > le.attn_params:
        out.append(p.say("params_most"))
    out.append(Text(""))

    big_u = np.argsort(-le.u, kind="stable")[:SHOWN]
    out += [p.rule("s_in_gated" if le.gated else "s_in"),
            p.say("in", d_model=le.d_model, d_ff=le.d_ff, hs=shape(le.d_model), ws=shape(le.d_model, le.d_ff),
                  us=shape(le.d_ff), b=" + b_in" if le.bias_in else ""),
            Text("  u  = " + _vec(le.u) + "    " + p.t["largest"] + ": " + _largest(le.u, big_u))]
    if le.gated:
        big_g = np.argsort(-le.g, kind="stable")[:SHOWN]
        out += [p.say("in_gated", d_ff=le.d_ff), Text("  g  = " + _vec(le.g) + "    " + p.t["largest"] + ": "
                                                      + _largest(le.g, big_g))]
    out.append(Text(""))

    a, amax = le.a, float(np.abs(le.a).max())
    out += [p.rule("s_act", formula=f"{glu}: act(g) ⊙ u" if le.gated else "act(u)"),
            p.say("act", name=le.activation, formula=p.t["act_" + le.activation])]
    if le.gated:
        out.append(p.say("act_gated", glu=glu))
    zero = int((a == 0).sum())
    out += [Text("  a  = " + _vec(a)),
            p.say("act_counts", d_ff=le.d_ff, pos=int((a > 0).sum()), neg=int((a < 0).sum()),
                  zero=p.t["zeros"].format(zero=zero) if zero else "", amax=amax, imax=int(np.argmax(np.abs(a))),
                  few=int((np.abs(a) > 0.1 * amax).sum()), frac=float((np.abs(a) > 0.1 * amax).mean())), Text("")]

    out += [p.rule("s_out", b=" + b_out" if le.bias_out else ""),
            p.say("out", d_model=le.d_model, d_ff=le.d_ff, ws=shape(le.d_ff, le.d_model), ny=np.linalg.norm(le.y),
                  y=_vec(le.y))]
    tab = p.table("col_rank", "col_neuron", "g" if le.gated else "u", "a_i", "‖W_out[i]‖", "|a_i|·‖W_out[i]‖",
                  "col_cos_one")
    for r, nr in enumerate(le.top):
        p.row(tab, r + 1, nr.index, f"{nr.g if le.gated else nr.u:+.3f}", f"{nr.a:+.3f}", f"{nr.norm:.3f}",
              f"{nr.size:.3f}", f"{nr.cos:+.3f}")
    out += [p.say("rank", top=len(le.top)), tab, p.say("partial", bias=p.t["with_bias"] if le.bias_out else "")]
    tab = p.table("col_k", "col_of", "col_cos", "col_rel", "col_share")
    for pt in le.partials:
        p.row(tab, pt.k, f"{pt.k / le.d_ff:.1%}", f"{pt.cos:.4f}", f"{pt.rel:.4f}", f"{pt.share:.1%}", bold_first=True)
    k90 = int(np.argmax(le.curve >= 0.9)) + 1 if (le.curve >= 0.9).any() else le.d_ff
    out += [tab, p.say("partial_end", k90=k90, d_ff=le.d_ff, frac=k90 / le.d_ff)]
    if le.out_norm:
        out.append(p.say("out_norm_note"))
    out.append(Text(""))

    out.append(p.rule("s_vocab"))
    if le.no_vocab:
        out.append(p.say("skip_" + le.no_vocab, model=le.model))
    else:
        tab = p.table("col_neuron", "a_i", "col_promoted", "col_suppressed")
        for nr in le.top:
            p.row(tab, nr.index, f"{nr.a:+.3f}", _words(nr.promoted), _words(nr.suppressed), bold_first=True)
        out += [p.say("vocab"), tab, p.say("vocab_out", up=_words(le.out_promoted), down=_words(le.out_suppressed))]
    out.append(Text(""))

    out += [p.rule("s_check"), p.say("check", token=tok, diff=le.diffs["ffn_out"],
                                     big=float(np.abs(le.joined).max()))]
    out.append(p.say("check_neurons", diff=le.diffs["neurons"]) if le.diffs["neurons"] is not None
               else p.say("check_no_neurons"))
    out.append(p.say("check_sum", d_ff=le.d_ff, diff=le.diffs["sum"], cos=le.partials[-1].cos))
    if le.stored:
        out.append(p.say("stored", model=le.model, kinds=", ".join(sorted(set(le.stored))), k=len(le.stored),
                         size=nbytes(le.dequant_bytes), ms=le.dequant_seconds * 1000))
    return out


def _largest(v: np.ndarray, idx: np.ndarray) -> str:
    return ", ".join(f"{v[i]:+.3f} (#{int(i)})" for i in idx)


# ── the figures ──────────────────────────────────────────────────────────────────

def figures(lesson: Lesson, out_dir: Path, lang: str = "en") -> list[Path]:
    """ffn_neurons (a over d_ff, the top neurons marked; the top-k partial sums' cosine against k) and, where
    the model has an LM head, ffn_promoted (what each top neuron and the whole output write): PNG + SVG."""
    from ..viz.drawing import save_all
    from .ffn_figures import neurons_figure, promoted_figure

    t = Page(TEXTS, lang).t
    makers = [("ffn_neurons", lambda: neurons_figure(lesson, t))]
    if not lesson.no_vocab:
        makers.append(("ffn_promoted", lambda: promoted_figure(lesson, t)))
    return save_all(out_dir, makers, ["png", "svg"])
