"""`qkv explain sparse`: sparse attention (guide: sparse, 희소 어텐션) on a real model's q, k, v, measured.

    gallery   causal, sliding window, dilated window, global + window (Longformer), + random
              blocks (BigBird), block-sparse: each a mask `qkv.core.sparse.sparse_attention` runs,
              skipping the tiles it hides (the tile map and the count of tiles it computed)
    own       a model whose own layers attend sparsely (Longformer's window and global tokens, BigBird's
              blocks, an encoder's local layers): the mask each layer used (core/sparse_layers.py: real_mask, with
              BigBird's copies of block 0), drawn, and Z recomputed from its q, k, v (and Longformer's global
              rows from their own projections) against the model's Z: error 0
    error     on every layer and head of the model reading a long text (a paragraph repeated to
              ≥ 256 tokens): ‖Z_sparse − Z‖ / ‖Z‖ against the model's own output Z, and the mass
              of the model's weights A the pattern keeps (as `kernels.compare_to_softmax` does
              for linear attention)
    cost      time and peak memory (tracemalloc) of one call on random q, k, v of the model's
              shape at a few n: the dense matrix with the mask added, the tiled kernel, each pattern

Checked before anything prints: the dense pattern's output equals the model's Z on every layer (a model that
attends sparsely itself: the dense attention of its q, k, v, which the gallery is then measured against);
every pattern's output equals the model's A cut to the pattern, renormalised row by row, times V
(softmax over the kept keys is exactly that); each timed call's output equals the dense masked
one. `qkv bench sparse` (bench/sparse.py) runs the cost part at larger n with `measure_cost`.
"""

from __future__ import annotations

import math
import time
import tracemalloc
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from rich.text import Text

from ..core import sparse as sp
from ..core import sparse_layers as real
from ..core.attention import AttentionMask, mask_bias, scaled_dot_product_attention
from ..runtime.errors import QkvError
from ..core.kernels import tiled_attention
from . import Page, same
from ..viz.words import texts
from ..viz.drawing import styled

TEXTS = texts("sparse")            # {language: its words} (viz/words: one module per language)
DEFAULT_MODEL = "smollm2"
PARAGRAPH = ("The old lighthouse keeper climbed the stairs every evening to light the lamp. Ships passing "
             "in the night trusted its beam to guide them past the rocks, and for forty years it never "
             "failed. When the keeper retired, the town replaced him with an automatic light, but people "
             "still said the beam looked warmer in the years he tended it.")
MIN_TOKENS, MAX_TOKENS = 256, 512     # the text is repeated up to MIN_TOKENS; longer than MAX_TOKENS is refused
WINDOW, BLOCK = 64, 32                # the gallery's window and block; tiles of BLOCK × BLOCK
COST_SIZES = (256, 512, 1024)
REPEATS = 3
DENSE_MAX_BYTES = 4 * 10 ** 9         # the dense masked method's scores beyond this: not run


@dataclass
class PatternResult:
    """One pattern on the model: what it keeps, the work it skips, how far it moves each layer's output."""

    name: str
    label: str
    density: float                # share of the n × n pairs kept
    tiles: sp.TileCount           # the kernel's count for one call (every layer has the same map)
    kinds: np.ndarray             # (⌈n/BLOCK⌉, ⌈n/BLOCK⌉) HIDDEN / PARTIAL / FULL
    error: np.ndarray             # (L,) mean over heads of ‖Z_sparse − Z‖ / ‖Z‖
    mass: np.ndarray              # (L,) mean over heads and rows of Σ A[i, j] over the kept keys j
    check: float                  # largest |Z_sparse − (A cut to the pattern, renormalised)·V|


@dataclass
class OwnMask:
    """The mask one layer of the model used (its copies: 0 hidden, 1 seen, more: BigBird's block 0) and how well
    softmax(S + log c)·V on its q, k, v gives the model's own Z."""

    layer: int
    label: str
    window: int | None            # Longformer's attention_window W of the layer (|i − j| ≤ W/2); None: no window
    copies: int                   # the most times a key is counted (BigBird: 1 + r)
    density: float                # share of the n × n pairs seen
    error: float                  # ‖Z_mask − Z‖ / ‖Z‖ against the model's own Z, all heads
    mask: np.ndarray              # (n, n) int the copies of each key in each query's softmax


@dataclass
class Lesson:
    model: str
    causal: bool
    n: int                        # tokens read
    copies: int                   # times the text was repeated to reach MIN_TOKENS
    copy_tokens: int              # tokens of one copy
    L: int
    H: int
    H_kv: int
    d_k: int
    window: int
    block: int
    patterns: list[PatternResult]
    dense_check: float            # the dense pattern's Z − the model's Z, every layer
    first_mass: float             # mean weight of the first token (rows past the window): the attention sink
    cost: dict                    # measure_cost's result
    own: list[OwnMask] = field(default_factory=list)   # the model's own sparse masks per layer; []: it attends densely


def build(model, text: str | None = None, *, cost_sizes=COST_SIZES, repeats: int = REPEATS) -> Lesson:
    """The gallery on `model` reading `text` (default: a paragraph), every number checked."""
    cfg = model.config
    if getattr(cfg, "encoder_decoder", False):
        raise QkvError(f"{model.name} is an encoder–decoder; the sparse lesson needs one self-attention stack: "
                       "use --model smollm2 or --model minilm")
    if cfg.position == "alibi":
        raise QkvError(f"{model.name} adds ALiBi's bias to its scores, which the sparse kernels do not take: "
                       "use --model smollm2 or --model minilm")
    text, copies, one = _long_enough(model, text or PARAGRAPH, default=text is None)
    keep = ("q", "k", "v", "heads", "attentions") + (("attn_in",) if cfg.global_tokens else ())
    trace = model.run(" ".join([text] * copies), keep=keep)
    n = len(trace.tokens)
    if cfg.causal and cfg.sliding_window is not None and cfg.sliding_window < n:
        raise QkvError(f"{model.name} attends within its own sliding window of {cfg.sliding_window} tokens; the sparse "
                       "lesson compares every pattern with full causal attention: use a model without a window")
    gallery = sp.gallery(cfg.causal, WINDOW, BLOCK)
    layers = [trace.layer(i) for i in trace.layer_ids]
    q, k, v, Z, A = (np.stack([getattr(lt, name) for lt in layers])       # every layer as the batch axis:
                     for name in ("q", "k", "v", "heads", "attentions"))   # (L, H or Hkv, n, d_k), A (L, H, n, n)
    if cfg.score_scale is not None:                                    # the kernel divides by √d_k: a model's own
        q = q * (cfg.score_scale * math.sqrt(cfg.d_head))              # scale s (Granite) enters as q·s·√d_k
    L, G = len(layers), cfg.n_heads // cfg.n_kv_heads
    own = own_masks(model, layers, q, k, v, Z) if _attends_sparsely(cfg, n) else []
    if own:                                                            # the gallery against dense attention
        Z, A, _ = scaled_dot_product_attention(q, k, v, AttentionMask(n, n, cfg.causal).bias(q.dtype))   # causal: Llama
                                                                       # 4's chunks; (L, H, n, d_k), (L, H, n, n)
    results, dense_check = [], 0.0
    kept = np.empty_like(A)                                            # (L, H, n, n) reused by every pattern
    for p in gallery:
        allowed = p.mask(n)                                            # (n, n)
        z, tiles = sp.sparse_attention(q, k, v, p, block=BLOCK)        # (L, H, n, d_k), one call for all layers
        np.multiply(A, allowed, out=kept)                              # A cut to the pattern
        total = kept.sum(-1, keepdims=True)                            # (L, H, n, 1)
        want = (kept.reshape(L, cfg.n_kv_heads, G * n, n) @ v).reshape(z.shape)   # (L, H, n, d_k) ·V, GQA groups
        np.divide(want, total, out=want, where=total > 0)              # renormalised row by row
        check = same(f"{p.name}: Z (every layer)", z, want, 2e-4, rel=True)
        if p.name in ("causal", "full"):
            dense_check = same("dense Z (every layer)", z, Z, 1e-4, rel=True)
        diff = np.linalg.norm((z - Z).astype(np.float64), axis=(2, 3))             # (L, H)
        error = (diff / np.linalg.norm(Z.astype(np.float64), axis=(2, 3))).mean(axis=1)   # (L,)
        mass = total.astype(np.float64).mean(axis=(1, 2, 3))           # (L,)
        kinds = p.tiles(n, n, BLOCK)                                   # (⌈n/BLOCK⌉, ⌈n/BLOCK⌉)
        if (tiles.total, tiles.skipped) != (kinds.size, int((kinds == sp.HIDDEN).sum())):
            raise RuntimeError(f"lesson: {p.name}'s kernel skipped {tiles.skipped} tiles, its map hides "
                               f"{int((kinds == sp.HIDDEN).sum())}")
        results.append(PatternResult(p.name, p.label, p.density(n), tiles, kinds, error, mass, check))
    del kept, want
    far = slice(WINDOW, None)                                          # rows the window no longer reaches back to 0
    first = float(A[:, :, far, 0].astype(np.float64).mean()) if n > WINDOW else 0.0   # (no such rows: 0)
    cost = measure_cost(gallery, cost_sizes, cfg.n_heads, cfg.n_kv_heads, cfg.d_head, repeats=repeats)
    return Lesson(model.name, cfg.causal, n, copies, one, cfg.n_layers, cfg.n_heads, cfg.n_kv_heads, cfg.d_head,
                  WINDOW, BLOCK, results, dense_check, first, cost, own)


def _attends_sparsely(cfg, n: int) -> bool:
    """Whether some layer of the model hides keys a dense (or causal) pattern shows, on n tokens."""
    dense = np.tril(np.ones((n, n), np.int64)) if cfg.causal else np.ones((n, n), np.int64)
    return any((real.real_mask(cfg, n, i) != dense).any() for i in range(cfg.n_layers))


def own_masks(model, layers, q: np.ndarray, k: np.ndarray, v: np.ndarray, Z: np.ndarray) -> list[OwnMask]:
    """Each layer's own mask c (sparse_layers.real_mask) and softmax(Q·Kᵀ/√d_k + log c)·V against the model's Z
    (L, H, n, d_k); Longformer's global rows recomputed from their own projections (sparse_layers.global_rows).
    q (L, H, n, d_k) as the kernels take it (a model's own score scale folded in)."""
    cfg, n = model.config, q.shape[2]
    out = []
    for i, lt in enumerate(layers):
        c = real.real_mask(cfg, n, lt.layer)                           # (n, n)
        z, _, _ = scaled_dot_product_attention(q[i:i + 1], k[i:i + 1], v[i:i + 1], real.copies_bias(c, q.dtype))
        if cfg.global_tokens:                                          # (1, H, n, d_k) the global rows replaced
            w = model.weights.blocks[lt.layer].attn
            z, _, _ = real.global_rows(lt.attn_in[None], w, cfg, AttentionMask(n, n, False), z, None, None, None)
        error = float(np.linalg.norm((z[0] - Z[i]).astype(np.float64)) / np.linalg.norm(Z[i].astype(np.float64)))
        out.append(OwnMask(lt.layer, _own_label(cfg, n, lt.layer), _longformer_window(cfg, lt.layer), int(c.max()),
                           float((c > 0).mean()), error, c))
    return out


def _longformer_window(cfg, layer: int) -> int | None:
    w = cfg.window(layer)
    return None if w is None or cfg.causal else 2 * (w - 1)


def _own_label(cfg, n: int, layer: int) -> str:
    """What LAYER's mask is, in a few words."""
    if cfg.block_sparse is not None and real.bigbird_sparse(n, *cfg.block_sparse):
        b, r = cfg.block_sparse
        return f"BigBird: blocks of {b}, window 3 blocks, first/last global, {r} random (block 0: ×{1 + r})"
    if cfg.chunk(layer) is not None:                                   # Llama 4's chunked layers
        return f"causal, chunks of {cfg.chunk(layer)}"
    w = _longformer_window(cfg, layer)
    if w is None:
        return "full" if not cfg.causal else "causal"
    return f"window |i − j| ≤ {w // 2}" + (f" + global {list(cfg.global_tokens)}" if cfg.global_tokens else "")


def _long_enough(model, text: str, default: bool = False) -> tuple[str, int, int]:
    """(text, copies, tokens a copy adds): the fewest copies that reach MIN_TOKENS, or as many as the
    model's context holds when it is shorter; QkvError past MAX_TOKENS or the context."""
    def count(copies: int) -> int:
        model.encode("x")                                              # one clear error if it cannot encode
        return len(model.tokenizer.encode(" ".join([text] * copies))[0])   # (unchecked: may pass the context)

    limit = min(MAX_TOKENS, model.config.max_positions)
    n1 = count(1)
    if n1 > limit and default:                                         # the lesson's own paragraph: cut to fit
        words = text.split()
        while len(words) > 8 and count(1) > limit // 2:
            words = words[:len(words) * 3 // 4]
            text = " ".join(words)
            n1 = count(1)
    if n1 > limit:
        why = ("the sparse lesson keeps n × n weights of every head" if limit == MAX_TOKENS
               else f"{model.name} reads at most {limit} tokens")
        raise QkvError(f"the text has {n1} tokens; {why}, so give at most {limit}")
    one = max(1, count(2) - n1)                                        # special tokens ([CLS], [SEP]) come once
    target = min(MIN_TOKENS, limit)
    copies = max(1, math.ceil((target - (n1 - one)) / one))
    while count(copies) < target:                                      # a merge across copies may cost a token
        copies += 1
    while copies > 1 and count(copies) > limit:                        # a short context: as many as fit
        copies -= 1
    return text, copies, one


# ── cost: time and peak memory of one call ───────────────────────────────────────

def _inputs(n: int, H: int, H_kv: int, d: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((1, H, n, d), dtype=np.float32), rng.standard_normal((1, H_kv, n, d), dtype=np.float32),
            rng.standard_normal((1, H_kv, n, d), dtype=np.float32))


def _peak(fn) -> tuple[int, object]:
    """(bytes the call allocated at its peak, its result): tracemalloc, which sees NumPy's arrays.
    A trace already running (the caller's) is left running."""
    mine = not tracemalloc.is_tracing()
    if mine:
        tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        out = fn()
        return tracemalloc.get_traced_memory()[1] - before, out
    finally:
        if mine:
            tracemalloc.stop()


def measure_cost(patterns: list[sp.Pattern], sizes, H: int, H_kv: int, d: int, *, repeats: int = REPEATS,
                 block: int = BLOCK, dense_max_bytes: int = DENSE_MAX_BYTES, check_max: int = 2048,
                 log=None) -> dict:
    """Seconds (median of `repeats` rounds taking turns) and peak bytes (tracemalloc, one call) of one
    attention call on random q, k, v (1, H, n, d) at each n of `sizes`:

        dense   softmax(Q·Kᵀ/√d + M)·V on the whole n × n matrix, M = the first pattern's mask
        tiled   kernels.tiled_attention (the engine's tiled kernel, every key the first pattern sees)
        <name>  sparse.sparse_attention with each pattern, tiles of `block`

    Each call's output is checked against the dense masked one up to n = `check_max` (where dense runs): a bug
    otherwise. A size whose dense scores would pass `dense_max_bytes` runs without the dense method.
    A plain dict, ready for JSON (bench/sparse.py writes it into docs/benchmarks.md).
    """
    log = log or (lambda msg: None)
    causal = patterns[0].causal
    rows = []
    for n in sizes:
        q, k, v = _inputs(n, H, H_kv, d)
        calls = {"tiled": lambda: tiled_attention(q, k, v, causal=causal)}
        dense_ok = 4 * H * n * n <= dense_max_bytes
        if dense_ok:
            bias = mask_bias(patterns[0].mask(n))[None, None]                # (1, 1, n, n)
            calls = {"dense": lambda: scaled_dot_product_attention(q, k, v, bias)[0], **calls}
        for p in patterns:
            calls[p.name] = (lambda p=p: sp.sparse_attention(q, k, v, p, block=block))
        row = {"n": n, "methods": {}, "density": {p.name: p.density(n) for p in patterns}}
        for name, fn in calls.items():
            peak, out = _peak(fn)
            z, tiles = out if isinstance(out, tuple) else (out, None)
            row["methods"][name] = {"peak_bytes": int(peak)} | (
                {"tiles": tiles.total, "visited": tiles.visited} if tiles else {})
            if dense_ok and n <= check_max:
                p = next((p for p in patterns if p.name == name), patterns[0])
                want = scaled_dot_product_attention(q, k, v, mask_bias(p.mask(n))[None, None])[0]
                same(f"{name} at n = {n}", z, want, 1e-4, rel=True)
        seconds = {name: [] for name in calls}
        names = list(calls)
        for r in range(repeats):                                            # take turns: noise hits all alike
            for name in names[r % len(names):] + names[:r % len(names)]:
                start = time.perf_counter()
                calls[name]()
                seconds[name].append(time.perf_counter() - start)
        for name in names:
            row["methods"][name]["seconds"] = float(np.median(seconds[name]))
        log(f"n={n}: " + ", ".join(f"{m} {r['seconds'] * 1e3:.1f} ms" for m, r in row["methods"].items()))
        rows.append(row)
    return {"shape": {"H": H, "H_kv": H_kv, "d": d, "dtype": "float32"}, "causal": causal, "block": block,
            "patterns": [{"name": p.name, "label": p.label} for p in patterns], "repeats": repeats, "rows": rows}


# ── the page ─────────────────────────────────────────────────────────────────────

def _ms(s: float) -> str:
    return f"{s * 1e3:.1f}"


def _mb(b: float) -> str:
    return f"{b / 1e6:.1f}"


def render(lesson: Lesson, lang: str = "en") -> list:
    p, le = Page(TEXTS, lang), lesson
    out = [p.rule("title", bold=True, model=le.model, n=le.n), p.say("intro"), Text("")]
    if le.own:                                                         # the model attends sparsely itself
        own = p.table("col_layer", "col_mask", "col_density", "col_copies", "col_own_error")
        for o in le.own:
            p.row(own, o.layer, o.label, f"{o.density:.1%}", o.copies, f"{o.error:.1e}")
        out += [p.rule("s_own"), p.say("own", model=le.model, n=le.n), own, p.say("own_end"), Text("")]
    gal = p.table("col_pattern", "col_defined", "col_density", "col_tiles", "col_skipped")
    for r in le.patterns:
        p.row(gal, p.t[f"m_{r.name}"], r.label, f"{r.density:.1%}", f"{r.tiles.visited} / {r.tiles.total}",
              r.tiles.skipped)
    mode = p.t["mode_causal" if le.causal else "mode_not_causal"]
    out += [p.rule("s_gallery"), p.say("gallery", block=le.block, n=le.n, causal=mode), gal, p.say("gallery_end"),
            Text("")]
    err = p.table("col_pattern", "col_density", "col_error", "col_worst", "col_mass")
    for r in le.patterns:
        worst = int(np.argmax(r.error))
        p.row(err, p.t[f"m_{r.name}"], f"{r.density:.1%}", f"{r.error.mean():.3f}", f"{r.error[worst]:.3f} (L{worst})",
              f"{r.mass.mean():.1%}")
    by = {r.name: r for r in le.patterns}
    out += [p.rule("s_error"),
            p.say("error", model=le.model, n=le.n, copies=le.copies, one=le.copy_tokens, L=le.L, H=le.H), err,
            p.say("error_check", dense=le.dense_check, worst=max(r.check for r in le.patterns))]
    if "window" in by and "longformer" in by and le.n > le.window:
        out.append(p.say("sink", w=le.window, first=le.first_mass, win=by["window"].mass.mean(),
                         lf=by["longformer"].mass.mean(), e_win=by["window"].error.mean(),
                         e_lf=by["longformer"].error.mean()))
    c = le.cost
    if not c["rows"]:                                                  # built with cost_sizes=(): no cost part
        return out
    out += [Text(""), p.rule("s_cost")]
    names = list(c["rows"][0]["methods"])
    tab = p.table("col_method", *[f"ms · n={r['n']}" for r in c["rows"]], *[f"MB · n={r['n']}" for r in c["rows"]])
    for m in names:
        runs = [r["methods"].get(m) for r in c["rows"]]
        p.row(tab, p.t.get(f"m_{m}", m), *[_ms(x["seconds"]) if x else "—" for x in runs],
              *[_mb(x["peak_bytes"]) if x else "—" for x in runs])
    out += [p.say("cost", H=c["shape"]["H"], H_kv=c["shape"]["H_kv"], d=c["shape"]["d"], repeats=c["repeats"],
                  block=c["block"]), tab, p.say("cost_end")]
    return out


# ── the figures ──────────────────────────────────────────────────────────────────

def figures(lesson: Lesson, out_dir: Path, lang: str = "en") -> list[Path]:
    """sparse_gallery (the masks and their tiles), sparse_error (per layer), sparse_cost (when measured): .png, .svg."""
    from ..viz.drawing import save_all

    t = Page(TEXTS, lang).t
    makers = [("sparse_gallery", lambda: _fig_gallery(lesson, t)), ("sparse_error", lambda: _fig_error(lesson, t))]
    if lesson.own:
        makers.insert(0, ("sparse_own", lambda: _fig_own(lesson, t)))
    if lesson.cost["rows"]:
        makers.append(("sparse_cost", lambda: _fig_cost(lesson, t)))
    return save_all(out_dir, makers, ["png", "svg"])


def _fig_gallery(le: Lesson, t: dict):
    @styled
    def draw():
        from matplotlib.colors import ListedColormap
        from matplotlib.patches import Rectangle

        from ..viz.drawing import new_figure
        from ..viz.palette import MASKED

        cols = 3
        rows = math.ceil(len(le.patterns) / cols)
        fig = new_figure(4.0 * cols, 4.1 * rows)
        axes = fig.subplots(rows, cols, squeeze=False)
        gallery = {p.name: p for p in sp.gallery(le.causal, le.window, le.block)}
        for ax, r in zip(axes.flat, le.patterns):
            allowed = gallery[r.name].mask(le.n)                             # (n, n)
            ax.imshow(allowed, cmap=ListedColormap(["white", "#1f4e99"]), interpolation="nearest", vmin=0, vmax=1)
            for (a, b), kind in np.ndenumerate(r.kinds):                    # the tiles the kernel skips: grey
                if kind == sp.HIDDEN:
                    ax.add_patch(Rectangle((b * le.block - 0.5, a * le.block - 0.5), le.block, le.block,
                                           color=MASKED, alpha=0.6, lw=0))
            for x in range(0, le.n, le.block):
                ax.axhline(x - 0.5, color="#999999", lw=0.3)
                ax.axvline(x - 0.5, color="#999999", lw=0.3)
            kept = t["fig_kept"].format(d=r.density, v=r.tiles.visited, T=r.tiles.total)
            name = t["m_" + r.name]                                        # the label often starts with it
            named = r.label if r.label.lower().startswith(name.lower()) else f"{name}\n{r.label}"
            ax.set_title(f"{named}\n{kept}", fontsize=8)
            ax.set(xticks=[], yticks=[])
            ax.set_xlabel(t["fig_key"], fontsize=8)
            ax.set_ylabel(t["fig_query"], fontsize=8)
        for ax in list(axes.flat)[len(le.patterns):]:
            ax.set_visible(False)
        fig.suptitle(t["fig_gallery"].format(n=le.n, block=le.block), fontsize=11)
        return fig
    return draw()


def _fig_own(le: Lesson, t: dict):
    """Each layer's own mask: white hidden, blue seen, darker blue a key counted more than once (BigBird)."""
    @styled
    def draw():
        from matplotlib.colors import ListedColormap

        from ..viz.drawing import new_figure

        cols = min(4, len(le.own))
        rows = math.ceil(len(le.own) / cols)
        fig = new_figure(max(4.2 * cols, 9.0), 4.0 * rows)
        axes = fig.subplots(rows, cols, squeeze=False)
        top = max(o.copies for o in le.own)
        colours = ListedColormap(["white", "#1f4e99", "#0b2350"][:min(top, 2) + 1])
        for ax, o in zip(axes.flat, le.own):
            ax.imshow(np.minimum(o.mask, 2), cmap=colours, interpolation="nearest", vmin=0, vmax=min(top, 2))
            ax.set_title(f"L{o.layer}: {o.label}\n{t['fig_own_kept'].format(d=o.density, e=o.error)}", fontsize=7)
            ax.set(xticks=[], yticks=[])
            ax.set_xlabel(t["fig_key"], fontsize=8)
            ax.set_ylabel(t["fig_query"], fontsize=8)
        for ax in list(axes.flat)[len(le.own):]:
            ax.set_visible(False)
        fig.suptitle(t["fig_own"].format(model=Path(le.model).name or le.model, n=le.n), fontsize=10)
        return fig
    return draw()


def _fig_error(le: Lesson, t: dict):
    @styled
    def draw():
        from ..viz.drawing import new_figure

        fig = new_figure(11, 4)
        a, b = fig.subplots(1, 2)
        layers = np.arange(le.L)
        for i, r in enumerate(le.patterns):
            a.plot(layers, r.error, "o-", ms=3, color=f"C{i}", label=t[f"m_{r.name}"])
            b.plot(layers, r.mass, "o-", ms=3, color=f"C{i}", label=t[f"m_{r.name}"])
        a.set(xlabel=t["fig_layer"], ylabel="‖Z_sparse − Z‖ / ‖Z‖", title=t["fig_error"].format(model=le.model, n=le.n))
        b.set(xlabel=t["fig_layer"], ylabel=t["fig_mass_axis"], ylim=(0, 1.02), title=t["fig_mass"])
        a.legend(fontsize=7)
        return fig
    return draw()


def _fig_cost(le: Lesson, t: dict):
    @styled
    def draw():
        from ..viz.drawing import new_figure

        fig = new_figure(11, 4)
        a, b = fig.subplots(1, 2)
        rows = le.cost["rows"]
        for i, name in enumerate(rows[0]["methods"]):
            ns = [r["n"] for r in rows if name in r["methods"]]
            a.plot(ns, [r["methods"][name]["seconds"] * 1e3 for r in rows if name in r["methods"]], "o-", ms=3,
                   color=f"C{i}", label=t.get(f"m_{name}", name))
            b.plot(ns, [max(r["methods"][name]["peak_bytes"], 1) / 1e6 for r in rows if name in r["methods"]], "o-",
                   ms=3, color=f"C{i}", label=t.get(f"m_{name}", name))
        for ax, title, unit in ((a, t["fig_time"], "ms"), (b, t["fig_memory"], "MB")):
            ax.set(xscale="log", yscale="log", xlabel="n", ylabel=unit, title=title)
            ax.set_xscale("log", base=2)
            ax.grid(True, which="both", alpha=0.3)
        a.legend(fontsize=7)
        return fig
    return draw()
