"""`qkv explain flash`: FlashAttention's online softmax (guide: flash), tile by tile, on a real head.

Softmax needs the whole row (its max and its sum) before any weight is known; FlashAttention
never holds the row. It walks the keys in tiles and keeps, per query, three running values:

    m   the largest score so far                  m_new = max(m_old, max_j s_j)
    ℓ   the sum of exp(s − m) so far              ℓ_new = ℓ_old·exp(m_old − m_new) + Σ_j exp(s_j − m_new)
    acc the sum of exp(s − m)·v so far            acc_new = acc_old·exp(m_old − m_new) + Σ_j exp(s_j − m_new)·v_j

and ends with Z = acc / ℓ. When a tile raises the max, exp(m_old − m_new) < 1 rescales what was
summed against the old max, so nothing is ever recomputed. After every tile acc / ℓ is already the
attention over the keys seen so far.

Default input: the guide's sentence on SmolLM2 (a causal LLM, the models FlashAttention is for:
the tiles above the diagonal are skipped, the diagonal ones masked), one head's real q, k, v from
the trace. The head is the one (of every layer) whose running max, for the followed row, grows at
the most tiles: the rescaling is what there is to see. Checked before anything prints: the scores
against the model's, each step's acc / ℓ against softmax over the keys so far · V (float64), the
end against plain softmax(S)·V, against `kernels.tiled_attention` with the same tiles (float32,
the engine's kernel) and against the model's own Z; the block of queries the same way.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from rich.text import Text

from ..core import sparse as sp
from ..core.capabilities import choose_layer, layers_with, require
from ..runtime.errors import QkvError
from .attention import DEFAULT_TEXT, position_bias
from ..core.kernels import K_BLOCK, Q_BLOCK, tiled_attention
from ..core.masks import visible
from ..core.ops import softmax
from . import Page, nbytes, same
from ..viz.words import texts
from ..viz import hangul
from ..viz.drawing import styled

TEXTS = texts("flash")             # {language: its words} (viz/words: one module per language)
DEFAULT_MODEL = "smollm2"
TILES = 3                          # the followed row's keys are cut into this many tiles (block = ⌈n / 3⌉)
SHOWN = 3                          # values of a vector shown
LONG_N = 8192                      # the memory comparison's n


@dataclass
class Step:
    """One key tile of the followed row: the running values before and after it."""

    tile: int
    k0: int
    k1: int
    s: np.ndarray                  # (k1 − k0,) scores q·k_j/√d_k (−∞ where the mask hides key j)
    m_old: float
    m_new: float
    rescale: float                 # exp(m_old − m_new): 0 at the first tile (m_old = −∞), 1 when the max holds
    p: np.ndarray                  # (k1 − k0,) exp(s − m_new)
    l_old: float
    l_new: float
    acc_old: np.ndarray            # (d_k,)
    acc_new: np.ndarray            # (d_k,)
    so_far: np.ndarray             # (d_k,) acc_new / l_new: attention over keys 0 … k1 − 1


@dataclass
class BlockTile:
    """One key tile of the block of queries: what the pattern makes of it, and m, ℓ of each row after it."""

    k0: int
    k1: int
    kind: str                      # "full", "partial" (masked in part) or "hidden" (skipped)
    m: np.ndarray                  # (rows,)
    l: np.ndarray                  # (rows,)


@dataclass
class Lesson:
    model: str
    layer: int
    head: int
    causal: bool
    labels: list[str]
    n: int
    d_k: int
    H: int
    block: int
    row: int
    S: np.ndarray                  # (n, n) this head's q·kᵀ/√d_k, −∞ where masked
    steps: list[Step]
    out: np.ndarray                # (d_k,) acc / ℓ at the end
    plain: np.ndarray              # (d_k,) softmax(S[row])·V, float64, the whole row at once
    diffs: dict[str, float]        # scores, prefix, plain, kernel, model, block_kernel, block_model
    q0: int                        # the block of queries: rows q0 … q1 − 1
    q1: int
    block_tiles: list[BlockTile]
    block_out: np.ndarray          # (q1 − q0, d_k)
    grid: np.ndarray               # (⌈n/block⌉, ⌈n/block⌉) HIDDEN / PARTIAL / FULL of every tile


def online_softmax(s: np.ndarray, V: np.ndarray, block: int) -> list[Step]:
    """The followed row, tile by tile: s (m,) its scores (−∞ masked), V (m, d_k); float64 throughout."""
    m, l, acc = -np.inf, 0.0, np.zeros(V.shape[1])
    steps = []
    for t, k0 in enumerate(range(0, len(s), block)):
        k1 = min(len(s), k0 + block)
        m_new = max(m, float(s[k0:k1].max()))
        base = m_new if np.isfinite(m_new) else 0.0                  # a tile of only −∞ so far: nothing to add
        rescale = math.exp(m - base) if np.isfinite(m) else 0.0     # exp(m_old − m_new)
        p = np.exp(s[k0:k1] - base)                                 # (k1 − k0,) masked keys: exp(−∞) = 0
        l_new = l * rescale + float(p.sum())
        acc_new = acc * rescale + p @ V[k0:k1]                      # (d_k,)
        so_far = acc_new / l_new if l_new > 0 else np.zeros_like(acc_new)
        steps.append(Step(t, k0, k1, s[k0:k1].copy(), m, m_new, rescale, p, l, l_new, acc, acc_new, so_far))
        m, l, acc = m_new, l_new, acc_new
    return steps


def _growth(s: np.ndarray, block: int) -> tuple[int, float]:
    """(tiles after the first at which the running max grows, −the smallest rescale): a head's score."""
    tops = [s[k0:k0 + block].max() for k0 in range(0, len(s), block)]
    run = np.maximum.accumulate(tops)
    grew = [run[t] > run[t - 1] for t in range(1, len(run))]
    smallest = min([math.exp(run[t - 1] - run[t]) for t in range(1, len(run))], default=1.0)
    return sum(grew), -smallest


NEEDS = {"plain_softmax", "plain_heads"}    # what the lesson's scores and online softmax read of a layer


def build(model, text: str | None = None, *, layer: int | None = None, head: int | None = None,
          block: int | None = None) -> Lesson:
    """The online softmax of one head's row on `model` reading `text` (default the guide's sentence)."""
    cfg = model.config
    if getattr(cfg, "encoder_decoder", False):
        raise QkvError(f"{model.name} is an encoder–decoder; the flash lesson needs one self-attention stack: "
                       "use --model smollm2 or --model minilm")
    # softmax(q·kᵀ) over the keys alone: no sink (gpt-oss), no linear or Mamba layer (core/capabilities.py)
    good = layers_with(cfg, NEEDS)
    if not good or layer is not None:
        require(cfg, model.name, "this lesson (the online softmax of a head's q·kᵀ)", NEEDS,
                None if layer is None else model.check_layer(layer),
                instead=choose_layer(cfg, NEEDS, "use a softmax model, e.g. --model smollm2"))
    trace = model.run(text or DEFAULT_TEXT, keep=("q", "k", "v", "scores", "heads"))
    n, d_k, G = len(trace.tokens), cfg.d_head, cfg.n_heads // cfg.n_kv_heads
    if n < 2:
        raise QkvError("the flash lesson needs a text of at least 2 tokens")
    block = max(1, math.ceil(n / TILES)) if block is None else block
    if block < 1:
        raise QkvError(f"--block must be ≥ 1, got {block}")
    row = n - 1 if cfg.causal else min(3, n - 1)
    scale = cfg.score_scale or 1 / math.sqrt(d_k)                    # 1/√d_k, or the model's own (Granite)
    cap = cfg.attn_softcap                                            # Gemma 2: S = c·tanh(S/c)
    bias = position_bias(model, n)                                    # (H, 1, n) ALiBi's m_h·p_j, else 0
    pos = np.arange(n)

    def allowed(li: int) -> np.ndarray:
        """The keys each query of layer LI sees (n, n): the causal mask and the layer's sliding window."""
        seen = visible(pos, pos, cfg.causal, cfg.window(li))
        return np.ones((n, n), bool) if seen is None else seen

    def scores(li: int, h: int) -> np.ndarray:
        lt = trace.layer(li)
        q, k = lt.q[h].astype(np.float64), lt.k[h // G].astype(np.float64)
        s = q @ k.T * scale                                           # (n, n)
        s = s if cap is None else cap * np.tanh(s / cap)
        return np.where(allowed(li), s + bias[h], -np.inf)             # (n, n)

    if layer is None or head is None:                                 # the head whose max grows most often
        layers = [li for li in trace.layer_ids if (cfg.causal or not cfg.window(li)) and li in good] if layer is None \
            else [model.check_layer(layer)]
        heads = range(cfg.n_heads) if head is None else [model.check_head(head)]
        layer, head = max(((li, h) for li in layers for h in heads),
                          key=lambda lh: _growth(scores(*lh)[row], block))
    layer, head = model.check_layer(layer), model.check_head(head)
    if not cfg.causal and cfg.window(layer):
        raise QkvError(f"layer {layer} of {model.name} is a local layer of an encoder (its window reaches both ways; "
                       "the tiled kernel's reaches back only): pick a global layer with --layer")
    lt = trace.layer(layer)
    S = scores(layer, head)                                              # (n, n)
    V = lt.v[head // G].astype(np.float64)                            # (n, d_k)
    seen = allowed(layer)                                             # (n, n)
    diffs = {"scores": same("S = Q·Kᵀ/√d_k", np.where(seen, S, 0), np.where(seen, lt.scores[head], 0), 1e-4,
                            rel=True)}
    steps = online_softmax(S[row], V, block)
    diffs["prefix"] = max(same(f"acc/ℓ after tile {st.tile}", st.so_far, softmax(S[row, :st.k1]) @ V[:st.k1], 1e-12)
                          for st in steps)
    out, plain = steps[-1].so_far, softmax(S[row]) @ V                 # (d_k,) each
    same("m at the end", steps[-1].m_new, S[row].max(), 0)
    same("ℓ at the end", steps[-1].l_new, np.exp(S[row] - S[row].max()).sum(), 1e-12, rel=True)
    diffs["plain"] = same("Z = acc/ℓ against softmax(S)·V", out, plain, 1e-12)
    q4, k4, v4 = lt.q[None, head:head + 1], lt.k[None, head // G:head // G + 1], lt.v[None, head // G:head // G + 1]
    key_bias = None if cfg.position != "alibi" else bias[None, head:head + 1, 0].astype(np.float32)   # (1, 1, n)
    kernel = tiled_attention(q4, k4, v4, causal=cfg.causal, block_size=block, scale=cfg.score_scale,
                             key_bias=key_bias, window=cfg.window(layer), softcap=cap)[0, 0]        # (n, d_k)
    diffs["kernel"] = same("Z against kernels.tiled_attention", out, kernel[row], 1e-5, rel=True)
    diffs["model"] = same("Z against the model's", out, lt.heads[head, row], 1e-4, rel=True)

    a = (n - 1) // block // 2 if cfg.causal else 0                   # a middle block: full, partial and hidden tiles
    q0, q1 = a * block, min(n, (a + 1) * block)
    w = cfg.window(layer)
    grid = (sp.sliding_window(w, cfg.causal) if w else sp.dense(cfg.causal)).tiles(n, n, block)
    block_tiles, rows = [], [online_softmax(S[i], V, block) for i in range(q0, q1)]
    for t, k0 in enumerate(range(0, n, block)):
        kind = sp.KINDS[grid[a, t]]
        block_tiles.append(BlockTile(k0, min(n, k0 + block), kind, np.array([r[t].m_new for r in rows]),
                                     np.array([r[t].l_new for r in rows])))
    block_out = np.array([r[-1].so_far for r in rows])               # (q1 − q0, d_k)
    diffs["block_kernel"] = same("the block's Z against kernels.tiled_attention", block_out, kernel[q0:q1], 1e-5,
                                 rel=True)
    diffs["block_model"] = same("the block's Z against the model's", block_out, lt.heads[head, q0:q1], 1e-4, rel=True)
    return Lesson(model.name, layer, head, cfg.causal, list(trace.labels), n, d_k, cfg.n_heads, block, row, S, steps,
                  out, plain, diffs, q0, q1, block_tiles, block_out, grid)


# ── the page ─────────────────────────────────────────────────────────────────────

def _elided(items: list[str], shown: int = 8) -> list[str]:
    """A long tile's keys or scores as its first and last few, "…" between (the page stays a page)."""
    return list(items) if len(items) <= shown else [*items[:shown - 2], "…", *items[-2:]]


def _f(x: float, digits: int = 3) -> str:
    return "−∞" if x == -np.inf else f"{x:.{digits}f}"


def _vec(x: np.ndarray, k: int = SHOWN) -> str:
    return "[" + ", ".join(f"{v:+.3f}" for v in x[:k]) + (", …" if len(x) > k else "") + "]"


def render(lesson: Lesson, lang: str = "en") -> list:
    p, le = Page(TEXTS, lang), lesson
    tok = le.labels[le.row]
    out = [p.rule("title", bold=True, model=le.model, layer=le.layer, head=le.head, n=le.n), p.say("intro"),
           Text("  m_new = max(m_old, max_j s_j)"), Text("  ℓ_new = ℓ_old·exp(m_old − m_new) + Σ_j exp(s_j − m_new)"),
           Text("  acc_new = acc_old·exp(m_old − m_new) + Σ_j exp(s_j − m_new)·v_j        Z = acc / ℓ"), Text("")]
    tab = p.table("col_tile", "col_keys", "col_scores", "m_old → m_new", "exp(m_old − m_new)", "ℓ_old → ℓ_new",
                  p.t["col_acc"].format(k=SHOWN))
    for st in le.steps:
        keys = " ".join(_elided(le.labels[st.k0:st.k1]))
        p.row(tab, st.tile, f"{st.k0}–{st.k1 - 1} {keys}", " ".join(_elided([_f(x, 2) for x in st.s])),
              f"{_f(st.m_old)} → {_f(st.m_new)}", _f(st.rescale, 4), f"{_f(st.l_old)} → {_f(st.l_new)}",
              _vec(st.acc_new))
    grew = [st.tile for st in le.steps[1:] if st.m_new > st.m_old]
    out += [p.rule("s_row", token=tok), p.say("row", token=tok, row=le.row, n=le.n, block=le.block, T=len(le.steps),
                                              d_k=le.d_k), tab,
            p.say("grew", tiles=", ".join(map(str, grew))) if grew else p.say("held"),
            p.say("prefix", diff=le.diffs["prefix"]), Text("")]
    out += [p.rule("s_end"), Text(f"Z = acc / ℓ        = {_vec(le.out, 6)}"),
            Text(f"softmax(S)·V       = {_vec(le.plain, 6)}"),
            p.say("end_check", plain=le.diffs["plain"], kernel=le.diffs["kernel"], block=le.block,
                  model=le.diffs["model"], scores=le.diffs["scores"]), Text("")]
    blk = p.table("col_query", *[f"{p.t['col_tile']} {t} ({bt.k0}–{bt.k1 - 1})" for t, bt in enumerate(le.block_tiles)])
    for r, i in enumerate(range(le.q0, le.q1)):
        cells = []
        for bt in le.block_tiles:
            cells.append(p.t["skipped"] if bt.kind == "hidden" else f"m {_f(bt.m[r], 2)} · ℓ {_f(bt.l[r], 2)}")
        p.row(blk, f"{i} {le.labels[i]}", *cells)
    kinds = ", ".join(f"{t}: {p.t['k_' + bt.kind]}" for t, bt in enumerate(le.block_tiles))
    out += [p.rule("s_block", q0=le.q0, q1=le.q1 - 1), p.say("block", kinds=kinds), blk,
            p.say("block_check", kernel=le.diffs["block_kernel"], model=le.diffs["block_model"])]
    hidden = int((le.grid == sp.HIDDEN).sum())
    dense_b = le.H * LONG_N * LONG_N * 4
    tile_b = le.H * Q_BLOCK * K_BLOCK * 4
    out += [Text(""), p.rule("s_memory"),
            p.say("grid", T=le.grid.size, hidden=hidden, visited=le.grid.size - hidden),
            p.say("memory", n=LONG_N, H=le.H, dense=nbytes(dense_b), bq=Q_BLOCK, bk=K_BLOCK, tile=nbytes(tile_b),
                  ratio=dense_b / tile_b)]
    return out


# ── the figures ──────────────────────────────────────────────────────────────────

def figures(lesson: Lesson, out_dir: Path, lang: str = "en") -> list[Path]:
    """flash_tiles (the grid, the visiting order, m and ℓ), flash_steps (one panel a step): .png and .svg;
    flash_steps.html: the same steps as an animation (one SVG frame a step, play / step buttons, offline)."""
    from ..runtime.io import FileBatch
    from ..viz.drawing import save_all

    t = Page(TEXTS, lang).t
    makers = [("flash_tiles", lambda: _fig_tiles(lesson, t)), ("flash_steps", lambda: _fig_steps(lesson, t))]
    try:
        with FileBatch(out_dir) as files:
            save_all(files, makers, ["png", "svg"])
            files.write_text("flash_steps.html", _animation(lesson, t))
    except OSError as e:
        raise QkvError(f"cannot write figures to {out_dir}: {e.strerror or e}; choose a writable directory") from None
    return files.paths


def _grid(ax, le: Lesson, t: dict, upto: int | None = None):
    """The score matrix in tiles: visited ones numbered in order, hidden ones greyed, the followed row
    outlined; with `upto`, the followed row's tile `upto` outlined too (a frame of the animation)."""
    from matplotlib import colormaps
    from matplotlib.patches import Rectangle

    from ..viz.drawing import tick_label
    from ..viz.palette import CMAP, MASKED

    shown = np.ma.masked_invalid(np.where(np.isfinite(le.S), le.S, np.nan))          # (n, n) masked cells grey
    im = ax.imshow(shown, cmap=colormaps[CMAP].with_extremes(bad=MASKED), interpolation="nearest")
    order = 0
    for (qa, kb), kind in np.ndenumerate(le.grid):
        x, y = kb * le.block - 0.5, qa * le.block - 0.5
        w, h = min(le.block, le.n - kb * le.block), min(le.block, le.n - qa * le.block)
        hidden = kind == sp.HIDDEN
        ax.add_patch(Rectangle((x, y), w, h, fill=hidden, color="#bbbbbb" if hidden else "white",
                               alpha=0.85 if hidden else 1, lw=2))
        order += not hidden
        ax.text(x + w / 2, y + h / 2, t["skip"] if hidden else f"#{order}", ha="center", va="center", fontsize=11,
                color="black" if hidden else "white")
    ax.add_patch(Rectangle((-0.5, le.row - 0.5), le.n, 1, fill=False, color="#d62728", lw=2.5))
    if upto is not None:
        st = le.steps[upto]
        ax.add_patch(Rectangle((st.k0 - 0.5, le.row - 0.5), st.k1 - st.k0, 1, fill=False, color="C1", lw=5))
    labels = [tick_label(x, 8) for x in le.labels]
    ax.set_xticks(range(le.n), labels, rotation=60, ha="right", rotation_mode="anchor", fontsize=8)
    ax.set_yticks(range(le.n), labels, fontsize=8)
    ax.set_title(t["fig_grid"].format(model=le.model, layer=le.layer, head=le.head, block=le.block), fontsize=10)
    return im


def _row(ax, le: Lesson, t: dict, st: Step) -> None:
    """The followed row's scores as bars: this tile orange, seen blue, not yet grey; m dashed; m, ℓ written."""
    from ..viz.drawing import tick_label

    s = le.S[le.row]
    low = float(s[np.isfinite(s)].min()) - 1
    colour = ["C1" if st.k0 <= j < st.k1 else "C0" if j < st.k0 else "#dddddd" for j in range(le.n)]
    ax.bar(range(le.n), np.where(np.isfinite(s), s, low) - low, bottom=low, color=colour)
    ax.axhline(st.m_new, color="#d62728", lw=1.5, ls="--")
    ax.set_title(t["fig_step"].format(tile=st.tile, k0=st.k0, k1=st.k1 - 1), fontsize=9)
    ax.text(0.02, 0.98, f"m: {_f(st.m_old, 2)} → {_f(st.m_new, 2)}\nexp(m_old − m_new) = {_f(st.rescale, 3)}\n"
                        f"ℓ: {_f(st.l_old, 2)} → {_f(st.l_new, 2)}", transform=ax.transAxes, va="top", fontsize=8,
            bbox={"facecolor": "white", "alpha": 0.85, "lw": 0})
    ax.set_xticks(range(le.n), [tick_label(x, 6) for x in le.labels], rotation=60, fontsize=7)
    ax.margins(y=0.45)


def _end(ax, le: Lesson, t: dict) -> None:
    """Z's first values: acc / ℓ beside softmax(S)·V."""
    k = min(le.d_k, 12)
    ax.bar(np.arange(k) - 0.2, le.out[:k], width=0.4, label="acc / ℓ")
    ax.bar(np.arange(k) + 0.2, le.plain[:k], width=0.4, label="softmax(S)·V")
    ax.set_title(t["fig_end"].format(k=k, diff=le.diffs["plain"]), fontsize=9)
    ax.legend(fontsize=7)


def _fig_tiles(le: Lesson, t: dict):
    @styled
    def draw():
        from ..viz.drawing import new_figure

        fig = new_figure(12, 5.2)
        a, b = fig.subplots(1, 2, gridspec_kw={"width_ratios": [1.15, 1]})
        fig.colorbar(_grid(a, le, t), ax=a, shrink=0.8).set_label("s = q·k/√d_k")
        x = np.arange(len(le.steps))
        (m_line,) = b.step(x, [st.m_new for st in le.steps], where="mid", color="C0", lw=2, label="m (left axis)")
        b.set_ylabel("m", color="C0")
        b2 = b.twinx()                                                   # ℓ on the right axis, named in the legend
        (l_line,) = b2.plot(x, [st.l_new for st in le.steps], "s-", color="C1", lw=2, label="ℓ (right axis)")
        b.legend(handles=[m_line, l_line], loc="lower right", fontsize=8)
        for st in le.steps:
            b.annotate(f"m {_f(st.m_new, 2)}\nℓ {_f(st.l_new, 2)}\n×{_f(st.rescale, 3)}", (st.tile, st.m_new),
                       textcoords="offset points", xytext=(0, 10), ha="center", fontsize=8)
        b.set_xticks(x, [f"{t['fig_tile']} {st.tile}\n{st.k0}–{st.k1 - 1}" for st in le.steps], fontsize=8)
        b.set_title(t["fig_running"].format(token=le.labels[le.row]), fontsize=10)
        b.margins(y=0.35)
        b.set_xlim(-0.6, len(le.steps) - 0.4)
        return fig
    return draw()


def _fig_steps(le: Lesson, t: dict):
    @styled
    def draw():
        from ..viz.drawing import new_figure

        fig = new_figure(3.6 * (len(le.steps) + 1), 3.8)
        axes = fig.subplots(1, len(le.steps) + 1)
        for ax, st in zip(axes, le.steps):
            _row(ax, le, t, st)
        _end(axes[-1], le, t)
        fig.suptitle(t["fig_steps"].format(token=le.labels[le.row], model=le.model, layer=le.layer, head=le.head),
                     fontsize=11)
        return fig
    return draw()


def _animation(le: Lesson, t: dict) -> str:
    """flash_steps.html: one SVG frame a step (the grid with the tile, the row's bars), and the end; buttons
    and a timer show one frame at a time. Text in the frames is drawn as paths by matplotlib; the page's own
    words are escaped; no script or style is loaded from anywhere."""
    import html
    import io

    @styled
    def frame(i: int) -> str:
        from ..viz.drawing import new_figure

        fig = new_figure(10, 4.2)
        a, b = fig.subplots(1, 2, gridspec_kw={"width_ratios": [1, 1.1]})
        _grid(a, le, t, upto=min(i, len(le.steps) - 1))
        a.set_title(f"{t['fig_tile']} {le.block} × {le.block}", fontsize=10)
        if i < len(le.steps):
            _row(b, le, t, le.steps[i])
        else:
            _end(b, le, t)
        buf = io.StringIO()
        fig.savefig(buf, format="svg", metadata={"Date": None})        # the same lesson, the same page
        svg = buf.getvalue()
        return svg[svg.index("<svg"):]                                  # without the XML prolog and doctype

    frames = "\n".join(f'<div class="frame"{"" if i == 0 else " hidden"}>{frame(i)}</div>'
                        for i in range(len(le.steps) + 1))
    title = html.escape(t["fig_steps"].format(token=le.labels[le.row], model=le.model, layer=le.layer, head=le.head))
    return (f'<!doctype html>\n<html><head><meta charset="utf-8"><title>{title}</title>\n'
            f"<style>{hangul.face_css(title)}body{{font-family:system-ui,'{hangul.FAMILY}',sans-serif;margin:1em}} "
            ".frame svg{max-width:100%;height:auto}</style>"
            f"</head><body>\n<p>{title}</p>\n{frames}\n"
            '<p><button id="back">◀</button> <button id="play">▶ ▶</button> <button id="next">▶</button> '
            '<span id="at"></span></p>\n<script>\n'
            "const frames = [...document.querySelectorAll('.frame')]; let at = 0, timer = null;\n"
            "function show(i) { at = (i + frames.length) % frames.length;\n"
            "  frames.forEach((f, j) => { f.hidden = j !== at; });\n"
            "  document.getElementById('at').textContent = (at + 1) + ' / ' + frames.length; }\n"
            "document.getElementById('back').onclick = () => show(at - 1);\n"
            "document.getElementById('next').onclick = () => show(at + 1);\n"
            "document.getElementById('play').onclick = () => { if (timer) { clearInterval(timer); timer = null; }\n"
            "  else timer = setInterval(() => show(at + 1), 1500); };\n"
            "show(0);\n</script></body></html>\n")
