"""`qkv explain linear`: linear attention on a real model (guide: linear, 선형 어텐션).

    softmax attention   Z = softmax(Q·Kᵀ/√d_k + M)·V        the n × n matrix A built, then A·V
    linear attention    Z = φ(Q)·(φ(K)ᵀ·V)                  (φ(Q)·φ(K)ᵀ)·V regrouped: a d_k × d_v state S = Σₛ φ(kₛ)·vₛᵀ
                                                            carried along the text, each token's row read as φ(qₜ)·S

Three ways in, by the model given:
  a softmax decoder (SmolLM2, the default)   its own q, k, v of one head through φ(x) = elu(x) + 1 (Katharopoulos et
      al. 2020; qkv.core.kernels.linear_attention): the linear matrix, normalised by rows, beside the model's softmax;
      the state after the last token and φ(q)·S / φ(q)·z equal to the last row of A·V; then, as `qkv bench
      --linear` measures, how far each layer's linear output is from its softmax one (relative error, cosine).
  MiniMax (lightning attention)   a lightning layer's head, as the model runs it: A[t, s] = (qₜ·kₛ)·λ^(t−s) (the
      trace's attentions), A·V its output, the state S = Σₛ λ^(n−1−s)·kₛᵀ·vₛ the model's own cache holds, and
      q·S the last row of A·V; the decay λ of every head.
  Qwen3-Next (gated delta layers)   a value head of its first delta layer: A[t, s] = q̂ₜᵀ·Uₜ[:, s] recomputed from
      the keys Uₜ = [exp(gₜ)(I − βₜk̂ₜk̂ₜᵀ)Uₜ₋₁ | βₜk̂ₜ] against core/delta.py's, A·V the delta rule's output, Sᵀ·q̂ its
      last row.
  Mamba   a channel of a selective-scan layer (core/mamba.py): α[t, s] its hidden attention, the state h (N numbers
      per channel) and h·Cₜ the last row of α·x̃.

Every number is checked against the engine (`same`) before it prints.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..core.capabilities import layer_kinds, require
from ..runtime.errors import QkvError
from . import Page, same
from ..viz.words import texts

TEXTS = texts("linear")            # {language: its words} (viz/words: one module per language)
DEFAULT_MODEL = "smollm2"
DEFAULT_TEXT = "The cat sat on the mat because it was warm"
SHOWN = 6                          # the rows and columns of a matrix printed


@dataclass
class Lesson:
    """One head (or channel) of one layer, as a linear attention: its matrix, its state, the checks."""

    model: str
    kind: str                      # "kernel" (a softmax model's q, k, v through φ), "lightning", "delta", "mamba"
    text: str
    tokens: list[str]
    layer: int
    head: int                      # the head (a Mamba channel)
    A: np.ndarray                  # (n, n) the linear (implied) matrix
    state: np.ndarray              # (d_k, d_v) the state after the last token (Mamba: (N, 1))
    d_k: int
    d_v: int
    diff_matrix: float             # the matrix recomputed here − the engine's
    diff_output: float             # A·V − the engine's output of the head
    diff_row: float                # state·q (normalised) − the last row of A·V
    softmax: np.ndarray | None = None          # (n, n) the model's own softmax weights (kernel)
    decay: list[float] = field(default_factory=list)   # λ of every head (lightning)
    diff_state: float = 0.0        # the state recomputed here − the engine's cache (lightning)
    layers: list[tuple[int, float, float]] = field(default_factory=list)   # (layer, rel. error, cosine) (kernel)

    @property
    def n(self) -> int:
        return len(self.tokens)


def build(model, text: str | None = None) -> Lesson:
    """The lesson on MODEL reading TEXT: a MiniMax model's lightning layer, a Qwen3-Next model's delta layer, a Mamba
    model's scan, a softmax decoder's head through the linear kernel; every number checked."""
    text = text or DEFAULT_TEXT
    cfg = model.config
    if not hasattr(model.weights, "blocks") or not cfg.causal:
        raise QkvError(f"{model.name} is not a decoder; qkv explain linear reads one: use --model smollm2 (the "
                       "default), a MiniMax or Mamba checkpoint, or a GPT-2 or Llama directory")
    kinds = set(layer_kinds(cfg))                           # core/capabilities.py
    if cfg.lightning is not None:                           # MiniMax (refused there if no layer is lightning)
        return _lightning(model, text)
    if "delta" in kinds:
        return _delta(model, text)
    if kinds == {"mamba"}:                                  # a pure Mamba stack (not Mamba-2, not Jamba)
        return _mamba(model, text)
    require(cfg, model.name, "qkv explain linear (MiniMax's lightning layers, Qwen3-Next's delta layers, Mamba's "
            "scans or a softmax decoder's heads)", {"plain_block"},
            instead=f"look at its implied attention with qkv show TEXT --model {model.name} --out DIR")
    return _kernel(model, text)


# ── a softmax decoder's head through φ ───────────────────────────────────────────

def phi(x: np.ndarray) -> np.ndarray:
    """φ(x) = elu(x) + 1 (kernels.elu_feature_map), in float64."""
    x = np.asarray(x, np.float64)
    return np.where(x > 0, x + 1, np.exp(np.minimum(x, 0)))


def _kernel(model, text: str) -> Lesson:
    from ..core.kernels import compare_to_softmax, linear_attention

    cfg = model.config
    trace = model.run(text, keep=("q", "k", "v", "attentions", "heads"))
    layer, head = 0, 0
    t = trace.layer(layer)
    kv = head // (cfg.n_heads // cfg.n_kv_heads)
    q, k, v = (np.asarray(a, np.float64) for a in (t.q[head], t.k[kv], t.v[kv]))   # (n, d_k) each
    n = len(q)
    causal = np.tril(np.ones((n, n)))
    scores = phi(q) @ phi(k).T * causal                                   # (n, n) φ(qₜ)·φ(kₛ), s ≤ t
    A = scores / scores.sum(axis=1, keepdims=True)                        # each row divided by its sum
    kernel = linear_attention(t.q[None, head:head + 1], t.k[None, kv:kv + 1], t.v[None, kv:kv + 1], causal=True)[0, 0]
    diff_matrix = same("the linear matrix's output against kernels.linear_attention", A @ v, kernel, 1e-4, rel=True)
    diff_output = same("the model's softmax weights times V against its head's output", t.attentions[head] @ v,
                       t.heads[head], 1e-4, rel=True)
    S, z = phi(k).T @ v, phi(k).sum(axis=0)                               # (d_k, d_v), (d_k,) Σ φ(kₛ)vₛᵀ, Σ φ(kₛ)
    last = phi(q[-1])
    diff_row = same("φ(q)·S / φ(q)·z against the last row of A·V", last @ S / (last @ z), (A @ v)[-1], 1e-9, rel=True)
    layers = []
    for i in trace.layer_ids:
        lt = trace.layer(i)
        c = compare_to_softmax(lt.q[None], lt.k[None], lt.v[None], causal=True)
        layers.append((i, float(c["relative_error"].mean()), float(c["cosine"].mean())))
    return Lesson(model=model.name, kind="kernel", text=text, tokens=list(trace.labels), layer=layer, head=head, A=A,
                  state=S, d_k=q.shape[1], d_v=v.shape[1], diff_matrix=diff_matrix, diff_output=diff_output,
                  diff_row=diff_row, softmax=np.asarray(t.attentions[head], np.float64), layers=layers)


# ── MiniMax: a lightning layer as the model runs it ──────────────────────────────

def _lightning(model, text: str) -> Lesson:
    from ..core.cache import KVCache

    cfg, lightning = model.config, model.config.lightning
    if not lightning.linear_layers:
        raise QkvError(f"{model.name} has no lightning layer (every layer_types entry is full_attention); give a "
                       "MiniMax checkpoint with linear_attention layers")
    layer, head = lightning.linear_layers[0], 0
    trace = model.run(text, keep=("q", "k", "v", "scores", "heads"))
    t = trace.layer(layer)
    q, k, v = (np.asarray(a, np.float64)[head] for a in (t.q, t.k, t.v))   # (n, d_k) each
    rates = np.asarray(model.weights.blocks[layer].lightning.slopes, np.float64)   # (H,)
    n = len(q)
    gap = np.arange(n)[:, None] - np.arange(n)[None, :]                   # (n, n) t − s
    A = (q @ k.T) * np.where(gap >= 0, np.exp(-rates[head] * np.maximum(gap, 0)), 0)   # (qₜ·kₛ)·λ^(t−s)
    diff_matrix = same("(qₜ·kₛ)·λ^(t−s) against the layer's recorded scores", A, t.scores[head], 1e-4, rel=True)
    diff_output = same("A·V against the layer's output of the head", A @ v, t.heads[head], 1e-4, rel=True)
    S = (k * np.exp(-rates[head] * (n - 1 - np.arange(n)))[:, None]).T @ v   # (d_k, d_v) Σ λ^(n−1−s)·kₛᵀ·vₛ
    diff_row = same("q·S against the last row of A·V", q[-1] @ S, (A @ v)[-1], 1e-9, rel=True)
    ids = np.asarray(trace.ids)[None]
    cache = KVCache(cfg, 1, n, dtype=model.dtype)
    model.last_logits(ids, np.ones_like(ids), cache=cache)               # the model's own cache of the text
    diff_state = same("the state against the one the model's cache holds", S, cache.state.S[layer][0, head], 1e-4,
                      rel=True)
    return Lesson(model=model.name, kind="lightning", text=text, tokens=list(trace.labels), layer=layer, head=head,
                  A=A, state=S, d_k=q.shape[1], d_v=v.shape[1], diff_matrix=diff_matrix, diff_output=diff_output,
                  diff_row=diff_row, decay=[float(x) for x in np.exp(-rates)], diff_state=diff_state)


# ── Qwen3-Next: a gated delta layer ──────────────────────────────────────────────

def _delta(model, text: str) -> Lesson:
    from ..core.delta import delta_parts, implied_attention

    cfg = model.config
    layer, head = cfg.delta.layers[0], 0
    trace = model.run(text, keep=("attn_in",))
    f = delta_parts(np.asarray(trace.layer(layer).attn_in, np.float64)[None], model.weights.blocks[layer].delta, cfg)
    A, _ = implied_attention(f.q, f.k, f.beta, f.g)                       # (1, Hv, n, n)
    A, q, v = A[0, head], f.q[0, head], f.v[0, head]                      # (n, n), (n, d_k), (n, d_v)
    U, mine = np.zeros((q.shape[1], 0)), np.zeros_like(A)                # the keys, one column a token; A here
    for t in range(len(q)):                                               # Uₜ = [exp(gₜ)(I − βₜk̂ₜk̂ₜᵀ)Uₜ₋₁ | βₜk̂ₜ]
        kt, bt = f.k[0, head, t], f.beta[0, head, t]
        U = np.concatenate([np.exp(f.g[0, head, t]) * (U - bt * np.outer(kt, kt @ U)), (bt * kt)[:, None]], axis=1)
        mine[t, :t + 1] = q[t] @ U                                        # A[t, s] = q̂ₜᵀ·Uₜ[:, s]
    diff_matrix = same("q̂ₜᵀ·Uₜ[:, s] against the engine's implied attention", mine, A, 1e-9, rel=True)
    diff_output = same("A·V against the delta rule's output", A @ v, f.o[0, head], 1e-9, rel=True)
    S = f.S[0, head]                                                      # (d_k, d_v) the state after the last token
    diff_row = same("Sᵀ·q̂ against the last row of A·V", q[-1] @ S, (A @ v)[-1], 1e-9, rel=True)
    return Lesson(model=model.name, kind="delta", text=text, tokens=list(trace.labels), layer=layer, head=head,
                  A=A, state=S, d_k=q.shape[1], d_v=v.shape[1], diff_matrix=diff_matrix, diff_output=diff_output,
                  diff_row=diff_row)


# ── Mamba: one channel of a scan ─────────────────────────────────────────────────

def _mamba(model, text: str) -> Lesson:
    from ..core.mamba import blocked_attention, hidden_attention, mixer_parts

    layer = 0
    trace = model.run(text, keep=("attn_in",))
    w = model.weights.blocks[layer].mixer
    f = mixer_parts(np.asarray(trace.layer(layer).attn_in, np.float64)[None], w, model.config)
    every = hidden_attention(f.dt, f.A, f.Bm, f.Cm)[0]                   # (E, n, n) α of every channel
    channel = int(np.abs(every).max(axis=(1, 2)).argmax())                # the channel that mixes most
    c = slice(channel, channel + 1)
    alpha = every[channel]                                                # (n, n) α[t, s] of the channel
    x = f.x[0, :, channel]                                                # (n,) x̃, what α mixes
    blocked = blocked_attention(f.dt, f.A, f.Bm, f.Cm, channels=c)[0, 0]   # (n, n) the engine's, as products
    diff_matrix = same("α against the engine's blocked form", alpha, blocked, 1e-9, rel=True)
    diff_output = same("α·x̃ against the scan's output", alpha @ x, f.y[0, :, channel], 1e-9, rel=True)
    h = f.last[0, channel]                                                # (N,) the state after the last token
    diff_row = same("h·C against the last row of α·x̃", h @ f.Cm[0, -1], (alpha @ x)[-1], 1e-9, rel=True)
    return Lesson(model=model.name, kind="mamba", text=text, tokens=list(trace.labels), layer=layer, head=channel,
                  A=alpha, state=h[:, None], d_k=h.shape[0], d_v=1, diff_matrix=diff_matrix,
                  diff_output=diff_output, diff_row=diff_row)


# ── the page ─────────────────────────────────────────────────────────────────────

def _matrix(p: Page, lesson: Lesson, M: np.ndarray):
    """The first SHOWN rows and columns of M, tokens as labels."""
    k = min(SHOWN, lesson.n)
    tab = p.table("", *[_short(t) for t in lesson.tokens[:k]])
    for i in range(k):
        Page.row(tab, _short(lesson.tokens[i]), *[f"{M[i, j]:.3f}" if j <= i else "·" for j in range(k)],
                 bold_first=True)
    return tab


def _short(token: str) -> str:
    return repr(token)[1:-1][:8] or "∅"


def render(lesson: Lesson, lang: str = "en") -> list:
    from rich.text import Text

    p, L = Page(TEXTS, lang), lesson
    n, d = L.n, L.d_k
    out = [p.rule("title", bold=True, model=L.model), p.say("intro"), Text(""),
           p.rule("s_matrix", layer=L.layer, head=L.head), p.say(f"matrix_{L.kind}", model=L.model, layer=L.layer,
                                                                  head=L.head, n=n, text=L.text)]
    out.append(_matrix(p, L, L.A))
    if L.softmax is not None:
        out += [p.say("softmax_beside"), _matrix(p, L, L.softmax)]
    out += [p.say(f"check_{L.kind}", diff_matrix=L.diff_matrix, diff_output=L.diff_output), Text(""),
            p.rule("s_state"),
            p.say(f"state_{L.kind}", n=n, d_k=d, d_v=L.d_v, nn=n * n, dd=L.state.size,
                  cross=math.isqrt(L.state.size - 1) + 1, diff_row=L.diff_row)]   # n² ≥ the state's size
    if L.kind == "lightning":
        out.append(p.say("state_cache", diff=L.diff_state))
        tab = p.table("col_head", "col_decay", "col_half")
        for h, lam in enumerate(L.decay):
            Page.row(tab, h, f"{lam:.4f}", f"{math.log(0.5) / math.log(lam):.1f}" if lam < 1 else "∞", bold_first=True)
        out += [Text(""), p.rule("s_decay"), p.say("decay"), tab]
    if L.layers:
        tab = p.table("col_layer", "col_rel", "col_cos")
        for i, rel, cos in L.layers:
            Page.row(tab, i, f"{rel:.3f}", f"{cos:.3f}", bold_first=True)
        worst = max(L.layers, key=lambda r: r[1])
        out += [Text(""), p.rule("s_compare"), p.say("compare", model=L.model), tab,
                p.say("compare_end", layer=worst[0], rel=worst[1])]
    out += [Text(""), p.say(f"end_{L.kind}")]
    return out


# ── the figures ──────────────────────────────────────────────────────────────────

def figures(lesson: Lesson, out_dir: Path, lang: str = "en") -> list[Path]:
    """linear: the head's linear (implied) matrix, beside the model's softmax one where there is one, and the state."""
    from ..viz.drawing import new_figure, save_all, styled

    t, L = Page(TEXTS, lang).t, lesson
    labels = [_short(x) for x in L.tokens]

    @styled
    def draw():
        panels = [(L.A, t["fig_linear"].format(layer=L.layer, head=L.head))]
        if L.softmax is not None:
            panels.append((L.softmax, t["fig_softmax"].format(layer=L.layer, head=L.head)))
        fig = new_figure(4.2 * (len(panels) + 1), 4.2)
        axes = fig.subplots(1, len(panels) + 1)
        for ax, (M, title) in zip(axes, panels):
            masked = np.where(np.tril(np.ones_like(M)) > 0, M, np.nan)
            im = ax.imshow(masked, cmap="viridis")
            ax.set(title=title, xticks=range(L.n), yticks=range(L.n))
            ax.set_xticklabels(labels, rotation=90, fontsize=7)
            ax.set_yticklabels(labels, fontsize=7)
            fig.colorbar(im, ax=ax, shrink=0.8)
        ax = axes[-1]
        lim = float(np.abs(L.state).max()) or 1.0
        im = ax.imshow(L.state, cmap="RdBu_r", vmin=-lim, vmax=lim, aspect="auto")
        ax.set(title=t["fig_state"].format(d_k=L.d_k, d_v=L.d_v), xlabel="d_v", ylabel="d_k")
        fig.colorbar(im, ax=ax, shrink=0.8)
        fig.suptitle(t["fig_title"].format(model=L.model, n=L.n))
        return fig

    return save_all(out_dir, [("linear", draw)], ["png", "svg"])
