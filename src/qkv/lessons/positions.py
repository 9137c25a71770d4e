"""`qkv explain positions`: how a model knows where each token is (guide: positions, 위치 인코딩).

    sinusoidal  PE(p, 2i) = sin(p / 10000^(2i/d)), PE(p, 2i+1) = cos(p / 10000^(2i/d)), added to X;
                PE(p)·PE(p+k) = Σ_i cos(k·ω_i): a function of the distance k only
    RoPE        q and k turned pair by pair by p·ω_i, ω_i = θ^(−2i/d_k) (SmolLM2); for one real q and k
                placed at positions (p + k, p), q·k is the same for every p: it depends on k only
    learned     a trained table P (MiniLM: 512 × 384) added to X; cos(P[p], P[p+k]) falls with k,
                but only roughly: nothing makes it a function of k alone

Every number comes from the engine (qkv.core.positions: `sinusoidal_table`, `rope_inv_freq`,
`rope_cos_sin`, `apply_rope`; the model's trace and weights) and is checked against an
independent float64 computation before it is shown.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .attention import DEFAULT_TEXT, head_qk, norm_of, rope_rotate
from ..core.capabilities import layers_with, require
from ..core.positions import apply_rope, rope_attention_factor, rope_cos_sin, rope_inv_freq, sinusoidal_table
from rich.text import Text

from . import Page, same, shape
from ..viz.words import texts
from ..viz.drawing import styled

TEXTS = texts("positions")         # {language: its words} (viz/words: one module per language)
DEFAULT_MODEL = "smollm2"
LEARNED_MODEL = "minilm"          # the learned table shown beside RoPE when the model has none
TABLE_POSITIONS = 64              # rows of the sinusoidal heatmap
STARTS = (0, 7, 100, 1000)        # p: where the fixed q·k pair (and PE(p)·PE(p+k)) starts
MAX_DIST = 64                     # k = 0..MAX_DIST
SHOWN_DIST = (0, 1, 2, 4, 8, 16, 32, 64)
ROPE_LAYER, ROPE_HEAD = 3, 0      # a layer whose q·k moves a lot with the distance
ROPE_NEEDS = {"qkv_heads", "plain_block"}   # what _rope rebuilds (core/capabilities.py)
PAIRS = (0, 1, 8, 16)             # frequency pairs whose angles are shown (and the last one)
ANGLE_POSITIONS = (1, 2, 10, 100, 1000)


@dataclass
class Sinusoidal:
    d: int                        # d_model of the table
    table: np.ndarray             # (TABLE_POSITIONS, d) the engine's PE
    dots: np.ndarray              # (len(STARTS), MAX_DIST + 1) PE(p)·PE(p+k) from the engine's table
    closed: np.ndarray            # (MAX_DIST + 1,) Σ_i cos(k·ω_i), float64
    diff_table: float             # engine table − float64 formula
    spread: float                 # largest difference of PE(p)·PE(p+k) over p, at the same k


@dataclass
class Rope:
    layer: int
    head: int
    kv_head: int
    theta: float
    d_k: int
    omega: np.ndarray             # (d_k/2,) the engine's ω_i
    q_token: str
    k_token: str
    q_pos: int                    # where the query really is in the text
    k_pos: int
    q: np.ndarray                 # (d_k,) the query before RoPE (float64)
    k: np.ndarray                 # (d_k,)
    turned: np.ndarray            # (4, d_k) the query turned to positions 0..3 by the engine
    dots: np.ndarray              # (len(STARTS), MAX_DIST + 1) q·k with q at p + k, k at p: the engine's RoPE
    dots64: np.ndarray            # the same with an independent float64 rotation
    diff_omega: float             # ω (engine) − θ^(−2i/d_k)
    diff_trace: float             # RoPE(q, k at their positions) − the model's q, k
    diff_dots: float              # engine − float64
    spread: float                 # largest difference of q·k over p at the same k (engine)
    spread64: float               # the same, float64


@dataclass
class Learned:
    model: str
    table: np.ndarray             # (P, d_model) the model's position embeddings
    cos: np.ndarray               # (P, P) cosine similarity of rows (float64)
    mean: np.ndarray              # (MAX_DIST + 1,) mean over p of cos(P[p], P[p+k])
    low: np.ndarray               # (MAX_DIST + 1,) its smallest over p
    high: np.ndarray              # (MAX_DIST + 1,) its largest
    diff_embed: float             # E[ids] + P[positions] (+ T, Norm) recomputed − the model's X of layer 0


@dataclass
class Lesson:
    model: str
    position: str                 # the model's kind: rope, learned, sinusoidal, relative
    sin: Sinusoidal
    rope: Rope | None             # None when the model has no RoPE
    learned: Learned


def build(model, text: str | None = None, *, learned_model=None) -> Lesson:
    """Every number of the page, each checked; `learned_model` shows its learned table when `model`
    has none (default: MiniLM, loaded here)."""
    text = text or DEFAULT_TEXT
    cfg = model.config
    if cfg.position == "rope":                      # a layer whose q, k are X·W_Q, X·W_K in a plain block
        require(cfg, model.name, "this lesson's RoPE step (q and k rebuilt from Norm(X)·W_Q, Norm(X)·W_K)", ROPE_NEEDS,
                _rope_layer(cfg), instead="use a RoPE model with plain attention (--model smollm2)")
    rope = _rope(model, text) if cfg.position == "rope" else None
    if cfg.position == "learned" and getattr(model.weights, "pos_embed", None) is not None:
        learned_model = model
    elif learned_model is None:
        from ..models.loading import load
        learned_model = load(LEARNED_MODEL)
    return Lesson(model=model.name, position=cfg.position, sin=_sinusoidal(cfg.d_model), rope=rope,
                  learned=_learned(learned_model, text))


def _sinusoidal(d: int) -> Sinusoidal:
    P = STARTS[-1] + MAX_DIST + 1
    table = sinusoidal_table(P, d).astype(np.float64)                       # (P, d) the engine's
    p, i = np.arange(P)[:, None], np.arange(0, d, 2)                        # (P, 1), (d/2,)
    mine = np.zeros((P, d))
    mine[:, 0::2] = np.sin(p / 10000.0 ** (i / d))                          # 2i/d with 2i = i here
    mine[:, 1::2] = np.cos(p / 10000.0 ** (i / d))[:, : d // 2]
    diff = same("the sinusoidal table", table, mine, 1e-6)
    ks = np.arange(MAX_DIST + 1)
    dots = np.array([[table[s] @ table[s + k] for k in ks] for s in STARTS])   # (starts, k)
    closed = np.cos(ks[:, None] * 10000.0 ** (-i / d)).sum(1)              # (k,) Σ_i cos(k·ω_i)
    same("PE(p)·PE(p+k) against Σ cos(k·ω_i)", dots, np.broadcast_to(closed, dots.shape), 1e-3)
    return Sinusoidal(d=d, table=table[:TABLE_POSITIONS], dots=dots, closed=closed, diff_table=diff,
                      spread=float(np.ptp(dots, axis=0).max()))


def _rope_layer(cfg) -> int:
    """ROPE_LAYER (the last layer in a shallower model), or the first layer of plain softmax attention when that one is
    not (Qwen3-Next, Jamba: a linear or Mamba layer there); ROPE_LAYER's own when none is, for `require` to name."""
    layer = min(ROPE_LAYER, cfg.n_layers - 1)
    good = layers_with(cfg, ROPE_NEEDS)
    return layer if layer in good or not good else good[0]


def _rope(model, text: str) -> Rope:
    """One real query and key of layer ROPE_LAYER, head ROPE_HEAD, moved together along the positions."""
    cfg = model.config
    layer, head = _rope_layer(cfg), ROPE_HEAD
    d_k, kv = cfg.d_head, ROPE_HEAD // cfg.group_size
    trace = model.run(text, layers=[layer], keep=("residual", "q", "k"))
    lt, n = trace.layer(layer), len(trace.tokens)
    qi, ki = n - 1, max(n - 3, 0)
    # the query and key before RoPE: Norm(X)·W_Q, Norm(X)·W_K of this head, in float64
    attn, nw = model.weights.blocks[layer].attn, model.weights.blocks[layer].attn_norm
    Xn = lt.residual.astype(np.float64)                                     # (n, d_model); OLMo 2 reads it as is,
    if nw is not None and cfg.norm_place == "pre":                          # and so does post-norm (nomic-bert)
        Xn = norm_of(Xn, nw.weight, nw.bias, cfg.norm, cfg.norm_eps)
    Q, K = head_qk(Xn, attn, cfg, slice(head * d_k, (head + 1) * d_k), slice(kv * d_k, (kv + 1) * d_k))   # (n, d_k)
    d_rot = cfg.rotary_dim or d_k                                           # GPT-NeoX turns only the first d_rot
    omega = rope_inv_freq(d_rot, cfg.rope_theta, cfg.rope_scaling, length=n)   # (d_rot/2,) the engine's, float32
    omega64 = rope_inv_freq(d_rot, cfg.rope_theta, cfg.rope_scaling, np.float64, length=n)
    diff_omega = same("ω_i", omega, cfg.rope_theta ** (-np.arange(0, d_rot, 2) / d_rot), 1e-6, rel=True) \
        if not cfg.rope_scaling else same("ω_i", omega, omega64, 1e-6, rel=True)
    pos, turn = np.arange(n), cfg.rope_interleaved                         # GPT-J, Cohere: pairs (2i, 2i+1)
    a = rope_attention_factor(cfg.rope_scaling)                            # YaRN, LongRoPE: cos and sin × a
    diff_trace = max(same("RoPE(q)", _engine_rope(Q, pos, omega, turn, a), lt.q[head], 1e-4, rel=True),
                     same("RoPE(k)", _engine_rope(K, pos, omega, turn, a), lt.k[kv], 1e-4, rel=True))
    q, k = Q[qi], K[ki]                                                     # (d_k,) each
    turned = _engine_rope(np.tile(q, (4, 1)), np.arange(4), omega, turn)    # (4, d_k) q at positions 0..3
    same("q turned to positions 0..3", turned, rope_rotate(np.tile(q, (4, 1)), np.arange(4), omega64, turn), 1e-4,
         rel=True)
    ks = np.arange(MAX_DIST + 1)
    dots, dots64 = [], []
    for s in STARTS:
        qs = _engine_rope(np.tile(q, (len(ks), 1)), s + ks, omega, turn)
        kk = _engine_rope(np.tile(k, (len(ks), 1)), np.full(len(ks), s), omega, turn)
        dots.append(np.einsum("kd,kd->k", qs.astype(np.float64), kk.astype(np.float64)))
        dots64.append(rope_rotate(np.tile(q, (len(ks), 1)), s + ks, omega64, turn)
                      @ rope_rotate(k[None], np.array([s]), omega64, turn)[0])
    dots, dots64 = np.array(dots), np.array(dots64)                         # (starts, k) each
    diff_dots = same("q·k after RoPE (float32 engine against float64)", dots, dots64, 1e-4, rel=True)
    spread64 = float(np.ptp(dots64, axis=0).max())
    if spread64 > 1e-9 * max(1.0, float(np.abs(dots64).max())):
        raise RuntimeError(f"lesson: q·k after RoPE changed by {spread64:.2e} at the same distance")
    return Rope(layer=layer, head=head, kv_head=kv, theta=cfg.rope_theta, d_k=d_k, omega=omega.astype(np.float64),
                q_token=trace.labels[qi], k_token=trace.labels[ki], q_pos=qi, k_pos=ki, q=q, k=k,
                turned=turned.astype(np.float64), dots=dots,
                dots64=dots64, diff_omega=diff_omega, diff_trace=diff_trace, diff_dots=diff_dots,
                spread=float(np.ptp(dots, axis=0).max()), spread64=spread64)


def _engine_rope(x: np.ndarray, positions: np.ndarray, omega: np.ndarray, interleaved: bool = False,
                 factor: float = 1.0) -> np.ndarray:
    """The engine's RoPE (qkv.core.positions) of rows x (n, d_k) at `positions`, in float32: (n, d_k); cos and
    sin × FACTOR (YaRN's and LongRoPE's attention factor)."""
    cos, sin = rope_cos_sin(np.asarray(positions)[None], omega, factor, interleaved)    # (1, 1, n, d_k) each
    return apply_rope(x.astype(np.float32)[None, None], cos, sin, interleaved)[0, 0]


def _learned(model, text: str) -> Learned:
    cfg, w = model.config, model.weights
    table = w.pos_embed.astype(np.float64)                                  # (P, d_model)
    unit = table / np.linalg.norm(table, axis=1, keepdims=True)
    cos = unit @ unit.T                                                     # (P, P)
    P = len(table)
    ks = np.arange(min(MAX_DIST, P - 1) + 1)                                # a short table (48 rows) has fewer
    per_k = [np.diagonal(cos, k) for k in ks]                               # cos(P[p], P[p+k]) for every p
    # the table is what the model adds: X of layer 0 = [Norm](E[ids] + P[0..n−1] (+ T[0]))
    trace = model.run(text, layers=[0], keep=("residual",))
    ids = np.asarray(trace.ids)
    x = w.tok_embed[ids].astype(np.float64) + table[cfg.position_offset:cfg.position_offset + len(ids)]
    if w.type_embed is not None:
        x = x + w.type_embed[0]
    if w.embed_norm is not None:
        x = norm_of(x, w.embed_norm.weight, w.embed_norm.bias, cfg.norm, cfg.norm_eps)
    if w.W_embed is not None:                                               # ELECTRA: E wide, projected to d_model
        x = x @ w.W_embed.astype(np.float64) + w.b_embed
    diff = same("X of layer 0 = E[ids] + P[positions]", x, trace.layer(0).residual, 1e-4)
    return Learned(model=model.name, table=table, cos=cos[:min(P, 128), :min(P, 128)],
                   mean=np.array([c.mean() for c in per_k]), low=np.array([c.min() for c in per_k]),
                   high=np.array([c.max() for c in per_k]), diff_embed=diff)


# ── the page ─────────────────────────────────────────────────────────────────────

def render(lesson: Lesson, lang: str = "en") -> list:
    p = Page(TEXTS, lang)
    out = [p.rule("title", bold=True, model=lesson.model), p.say("intro", kind=p.t["kind_" + lesson.position])]
    out += [Text("")] + _render_sin(p, lesson.sin)
    out += [Text("")] + (_render_rope(p, lesson.rope) if lesson.rope else
                          [p.rule("s_rope"), p.say("no_rope", model=lesson.model, kind=p.t["kind_" + lesson.position])])
    out += [Text("")] + _render_learned(p, lesson.learned) + [Text(""), p.say("end")]
    return out


def _render_sin(p: Page, s: Sinusoidal) -> list:
    tab = p.table("col_pos", *[f"PE[p, {j}]" for j in (0, 1, 2, 3)], f"PE[p, {s.d - 2}]", f"PE[p, {s.d - 1}]")
    for pos in (0, 1, 2, 10):
        p.row(tab, pos, *[f"{s.table[pos, j]:+.3f}" for j in (0, 1, 2, 3, s.d - 2, s.d - 1)], bold_first=True)
    dots = p.table("k", *[f"p = {st}" for st in STARTS], "col_closed")
    for k in SHOWN_DIST:
        p.row(dots, k, *[f"{s.dots[i, k]:.3f}" for i in range(len(STARTS))], f"{s.closed[k]:.3f}", bold_first=True)
    return [p.rule("s_sin"), p.say("sin_what", d=s.d, shape=shape(TABLE_POSITIONS, s.d),
                                   w_last=10000.0 ** (-(s.d - 2) / s.d)), tab,
            p.say("sin_check", diff=s.diff_table), p.say("sin_dot", half=s.d // 2), dots,
            p.say("sin_dot_end", spread=s.spread, d=s.d, far=s.closed[MAX_DIST])]


def _render_rope(p: Page, r: Rope) -> list:
    half = len(r.omega)                                                     # pairs that turn: d_rot/2
    pairs = [i for i in PAIRS if i < half] + [half - 1]
    ang = p.table("col_pair_i", "ω_i", "col_wave", *[f"p = {q}" for q in ANGLE_POSITIONS])
    for i in pairs:
        p.row(ang, f"{i} ({i}, {i + half})", f"{r.omega[i]:.3g}", f"{2 * math.pi / r.omega[i]:,.0f}",
              *[f"{q * r.omega[i]:.4g}" for q in ANGLE_POSITIONS], bold_first=True)
    slow = min(8, half - 1)                                                 # a slower pair beside pair 0
    turn = p.table("col_pos", p.t["col_pair"].format(i=0, j=half), p.t["col_pair"].format(i=slow, j=slow + half),
                   "|q|")
    for pos, qr in enumerate(r.turned):                                     # (d_k,) the query at position pos
        p.row(turn, pos, f"({qr[0]:+.3f}, {qr[half]:+.3f})", f"({qr[slow]:+.3f}, {qr[slow + half]:+.3f})",
              f"{np.linalg.norm(qr):.3f}", bold_first=True)
    dots = p.table("k", *[f"p = {st}" for st in STARTS], "float64")
    for k in SHOWN_DIST:
        p.row(dots, k, *[f"{r.dots[i, k]:.3f}" for i in range(len(STARTS))], f"{r.dots64[0, k]:.3f}", bold_first=True)
    return [p.rule("s_rope"),
            p.say("rope_what", d_k=r.d_k, half=half, theta=r.theta, last=half - 1),
            ang, p.say("rope_omega_check", diff=r.diff_omega),
            p.say("rope_turn", layer=r.layer, head=r.head, token=r.q_token, kv=r.kv_head), turn,
            p.say("rope_trace_check", diff=r.diff_trace),
            p.say("rope_relative", q=r.q_token, k=r.k_token, qp=r.q_pos, kp=r.k_pos), dots,
            p.say("rope_relative_end", spread=r.spread, spread64=r.spread64, diff=r.diff_dots,
                  lo=float(r.dots64[0].min()), hi=float(r.dots64[0].max()))]


def _render_learned(p: Page, l: Learned) -> list:
    tab = p.table("k", "col_mean_cos", "col_min", "col_max")
    for k in (k for k in SHOWN_DIST if k < len(l.mean)):                   # a short table has fewer distances
        p.row(tab, k, f"{l.mean[k]:.3f}", f"{l.low[k]:.3f}", f"{l.high[k]:.3f}", bold_first=True)
    return [p.rule("s_learned", model=l.model),
            p.say("learned_what", model=l.model, shape=shape(*l.table.shape)),
            p.say("learned_check", diff=l.diff_embed),
            tab, p.say("learned_end", model=l.model)]


# ── the figures ──────────────────────────────────────────────────────────────────

def figures(lesson: Lesson, out_dir: Path, lang: str = "en") -> list[Path]:
    """positions_sinusoidal, positions_rope (with RoPE), positions_learned: .png and .svg, all or none."""
    from ..viz.drawing import save_all

    t = Page(TEXTS, lang).t
    makers = [("positions_sinusoidal", lambda: _fig_sin(lesson.sin, t))]
    if lesson.rope is not None:
        makers.append(("positions_rope", lambda: _fig_rope(lesson.rope, t)))
    makers.append(("positions_learned", lambda: _fig_learned(lesson.learned, t)))
    return save_all(out_dir, makers, ["png", "svg"])


def _fig_sin(s: Sinusoidal, t: dict):
    @styled
    def draw():
        from ..viz.drawing import new_figure
        fig = new_figure(11, 4)
        a, b = fig.subplots(1, 2, gridspec_kw={"width_ratios": [1.4, 1]})
        halves = np.concatenate([s.table[:, 0::2], s.table[:, 1::2]], axis=1)   # sines | cosines, by i
        im = a.imshow(halves, aspect="auto", cmap="RdBu_r", vmin=-1, vmax=1, interpolation="nearest")
        a.axvline(s.d // 2 - 0.5, color="k", lw=0.8)
        a.set(xlabel=t["fig_dim"], ylabel=t["fig_pos"], title=t["fig_sin_table"].format(d=s.d))
        fig.colorbar(im, ax=a, shrink=0.8)
        for i, st in enumerate(STARTS):
            b.plot(s.dots[i], lw=2.5 - 0.5 * i, label=f"p = {st}")
        b.plot(s.closed, "k:", label="Σ cos(k·ω_i)")
        b.set(xlabel=t["fig_dist"], ylabel="PE(p)·PE(p+k)", title=t["fig_sin_dot"])
        b.legend(fontsize=8)
        return fig
    return draw()


def _fig_rope(r: Rope, t: dict):
    @styled
    def draw():
        from ..viz.drawing import new_figure
        fig = new_figure(11, 4)
        a, b = fig.subplots(1, 2)
        half, pos = len(r.omega), np.arange(0, 65)
        for i in [i for i in PAIRS if i < half] + [half - 1]:
            a.plot(pos, np.mod(pos * r.omega[i], 2 * math.pi), ".-", ms=3, lw=0.8, label=f"{t['fig_pair']} {i}")
        a.set(xlabel=t["fig_pos"], ylabel=t["fig_angle"], title=t["fig_rope_angle"].format(theta=r.theta))
        a.legend(fontsize=8)
        for i, st in enumerate(STARTS):
            b.plot(r.dots[i], lw=2.5 - 0.5 * i, label=f"p = {st}")
        b.plot(r.dots64[0], "k:", label="float64")
        b.set(xlabel=t["fig_dist"], ylabel="q·k",
              title=t["fig_rope_dot"].format(layer=r.layer, head=r.head, q=r.q_token, k=r.k_token))
        b.legend(fontsize=8)
        return fig
    return draw()


def _fig_learned(l: Learned, t: dict):
    @styled
    def draw():
        from ..viz.drawing import new_figure
        fig = new_figure(11, 4)
        a, b = fig.subplots(1, 2)
        im = a.imshow(l.cos, cmap="viridis", interpolation="nearest")
        a.set(xlabel=t["fig_pos"], ylabel=t["fig_pos"], title=t["fig_learned_cos"].format(model=l.model))
        fig.colorbar(im, ax=a, shrink=0.8)
        ks = np.arange(len(l.mean))
        b.fill_between(ks, l.low, l.high, alpha=0.25, label=t["fig_range"])
        b.plot(ks, l.mean, lw=2, label=t["fig_mean"])
        b.set(xlabel=t["fig_dist"], ylabel="cos(P[p], P[p+k])", title=t["fig_learned_dist"])
        b.legend(fontsize=8)
        return fig
    return draw()
