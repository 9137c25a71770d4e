"""`qkv explain gqa`: query heads sharing K/V heads (guide: gqa, KV head 공유).

    MHA   H query heads, H K/V heads: head h reads K/V head h
    GQA   H query heads, Hkv K/V heads: head h reads K/V head h // (H/Hkv)       (SmolLM2: 9 and 3)
    MQA   H query heads, one K/V head

On the model (SmolLM2 by default): which query heads read which K/V head, checked on the
model's own scores (S_h = Q_h·K_{h // G}ᵀ/√d_k for every head), and the cache each layout
keeps per token. Then the GQA paper's conversion (Ainslie et al. 2023), measured: a multi-head
model's K and V projection heads mean-pooled into G groups (G = every divisor of H), run on the
text, and how far its output moves: the relative error of the last hidden state and the cosine
of the mean-pooled sentence embedding to the original's. Checked: G = H gives the model
unchanged, exactly; each pooled model equals the dense multi-head model whose K/V heads are
the pooled ones repeated. (The paper then uptrains for 5 % of the pre-training steps to win
the quality back; that is not done here.)
Multi-head latent attention (DeepSeek: cfg.latent) shares otherwise: every query head reads a K and V of its own,
expanded from one latent per token, and their RoPE part is one key all heads share (checked on the expanded K);
its cache is that latent, set beside MHA's and MQA's (kvcache.latent_layouts). Its pooling is MiniLM's.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from rich.text import Text

from ..core.capabilities import layers_with, require
from ..runtime.errors import QkvError
from .attention import DEFAULT_TEXT, position_bias
from . import Page, same
from ..viz.words import texts
from .kvcache import Layout, cache_layouts, latent_sizes, layout_name, own_layout, per_token

TEXTS = texts("gqa")               # {language: its words} (viz/words: one module per language)
DEFAULT_MODEL = "smollm2"
POOL_MODEL = "minilm"             # the multi-head model pooled when the model itself shares K/V heads


@dataclass
class Sharing:
    """How the model's query heads read its K/V heads."""

    model: str
    H: int
    H_kv: int
    d_k: int
    L: int                        # the layers that keep K, V (Jamba: its attention layers)
    kv_of: list[int]              # (H,) the K/V head each query head reads: h // (H/Hkv)
    layer: int                    # the layer whose scores were checked
    diff_scores: float            # Q_h·K_{h//G}ᵀ/√d_k − the model's scores, every head
    layouts: list[Layout]         # MHA, this model, MQA: cache bytes per token
    latent: dict | None = None    # MLA's sizes (kvcache.latent_sizes); None: K and V heads as they are cached
    diff_shared: float = 0.0      # MLA: how far the heads' RoPE parts of K differ (0: one key for all)

    @property
    def group(self) -> int:
        return self.H // self.H_kv


@dataclass
class Pooled:
    """The multi-head model with its K/V heads mean-pooled into G groups."""

    G: int                        # K/V heads after pooling
    rel_error: float              # ‖hidden' − hidden‖ / ‖hidden‖, the last hidden state (all tokens)
    cosine: float                 # cos(mean over tokens of hidden', of hidden)
    diff_dense: float             # the pooled model − the dense model with the pooled heads repeated
    cache_bytes: int              # its KV cache per token


@dataclass
class Lesson:
    sharing: Sharing
    pool_model: str               # the multi-head model that was pooled
    pool_H: int
    pool_tokens: int
    rows: list[Pooled]            # G = H first (unchanged), then fewer K/V heads
    text: str


def build(model, text: str | None = None, *, pool_model=None) -> Lesson:
    """The sharing of `model` and the pooling of `pool_model` (default: `model` if it is multi-head,
    else MiniLM, loaded here); every number checked."""
    text = text or DEFAULT_TEXT
    if not hasattr(model.weights, "blocks"):
        raise QkvError(f"{model.name} is an encoder–decoder; qkv explain gqa reads a single stack: use --model "
                       "smollm2 (the default), minilm, or a GPT-2 or Llama directory")
    sharing = _sharing(model, text)
    if pool_model is None:
        if (model.config.n_kv_heads == model.config.n_heads and hasattr(model.weights, "blocks")
                and not model.config.latent):           # MLA's K/V heads come from a latent: pool MiniLM's
            pool_model = model
        else:
            from ..models.loading import load
            pool_model = load(POOL_MODEL)
    rows, n = _pooling(pool_model, text)
    return Lesson(sharing=sharing, pool_model=pool_model.name, pool_H=pool_model.config.n_heads, pool_tokens=n,
                  rows=rows, text=text)


def _sharing(model, text: str) -> Sharing:
    cfg = model.config
    H, H_kv, d_k = cfg.n_heads, cfg.n_kv_heads, cfg.d_head
    kv_of = [h // (H // H_kv) for h in range(H)]
    layers = layers_with(cfg, {"kv_heads"})                     # Jamba, Qwen3-Next: their attention layers
    if not layers:                                              # Mamba, MiniMax (core/capabilities.py: kv_heads)
        require(cfg, model.name, "this lesson (query heads sharing K/V heads)", {"kv_heads"},
                instead="so no K/V heads to share; use a transformer: qkv explain gqa --model smollm2")
    layer = layers[0]
    lt = model.run(text, layers=[layer], keep=("q", "k", "scores")).layer(layer)
    q, k = lt.q.astype(np.float64), lt.k.astype(np.float64)                # (H, n, d_k), (Hkv, n, d_k)
    if q.shape[0] != H or k.shape[0] != H_kv:
        raise RuntimeError(f"lesson: the model kept {q.shape[0]} query and {k.shape[0]} K/V heads, not {H} and {H_kv}")
    scale = 1 / math.sqrt(d_k) if cfg.score_scale is None else cfg.score_scale
    mine = np.stack([q[h] @ k[kv_of[h]].T * scale for h in range(H)])      # (H, n, n)
    mine += position_bias(model, q.shape[1])                                # + m_h·p_j (ALiBi), else 0
    model_s = lt.scores.astype(np.float64)                                  # (H, n, n), −∞ where masked
    kept = np.isfinite(model_s)
    diff = same("S_h = Q_h·K_{h//G}ᵀ/√d_k", mine[kept], model_s[kept], 1e-4, rel=True)
    shared = 0.0
    if cfg.latent:                                                          # one RoPE key for every head
        rot = k[:, :, d_k - cfg.rotary_dim:]                                 # (H, n, d_rot)
        shared = same("the RoPE part of every head's K", rot, np.broadcast_to(rot[:1], rot.shape), 0)
    return Sharing(model=model.name, H=H, H_kv=H_kv, d_k=d_k, L=cfg.attention_layers, kv_of=kv_of, layer=layer,
                   diff_scores=diff, layouts=cache_layouts(cfg, 1, np.float32), latent=latent_sizes(cfg),
                   diff_shared=shared)


def pool_heads(W: np.ndarray, H: int, G: int, d_k: int) -> np.ndarray:
    """Mean-pool H heads of a K or V projection into G groups of H/G neighbours (Ainslie et al. 2023):
    W (d_model, H·d_k) → (d_model, G·d_k), group g = mean of heads g·H/G … (g+1)·H/G − 1. A bias
    (H·d_k,) is pooled the same way."""
    lead = W.shape[:-1]
    return W.reshape(*lead, G, H // G, d_k).mean(-2).reshape(*lead, G * d_k)


def repeat_heads(W: np.ndarray, H: int, G: int, d_k: int) -> np.ndarray:
    """G K/V heads repeated for their H/G query heads each: (…, G·d_k) → (…, H·d_k), the dense form."""
    lead = W.shape[:-1]
    return np.repeat(W.reshape(*lead, G, d_k), H // G, axis=-2).reshape(*lead, H * d_k)


def _with_kv(model, G: int, dense: bool):
    """`model` with its K/V heads mean-pooled into G: as GQA (Hkv = G) or, dense=True, as the multi-head
    model whose K/V heads are the pooled ones repeated."""
    from ..models.model import Model

    cfg = model.config
    H, d_k = cfg.n_heads, cfg.d_head

    def convert(a):
        def f(x):
            if x is None:
                return None
            pooled = pool_heads(np.asarray(x, np.float32), H, G, d_k)
            return repeat_heads(pooled, H, G, d_k) if dense else pooled
        return dataclasses.replace(a, W_K=f(a.W_K), W_V=f(a.W_V), b_K=f(a.b_K), b_V=f(a.b_V), W_QKV=None)

    blocks = [dataclasses.replace(b, attn=convert(b.attn)) for b in model.weights.blocks]
    weights = dataclasses.replace(model.weights, blocks=blocks)
    return Model(cfg if dense else cfg.with_(n_kv_heads=G), weights, model.tokenizer, model.name)


def _pooling(model, text: str) -> tuple[list[Pooled], int]:
    cfg = model.config
    if cfg.n_kv_heads != cfg.n_heads:
        raise RuntimeError(f"lesson: {model.name} already shares K/V heads; pool a multi-head model")
    H = cfg.n_heads
    base = model.run(text, keep=()).hidden.astype(np.float64)               # (n, d_model)
    rows = []
    for G in [g for g in range(H, 0, -1) if H % g == 0]:
        pooled = _with_kv(model, G, dense=False).run(text, keep=()).hidden.astype(np.float64)
        dense = _with_kv(model, G, dense=True).run(text, keep=()).hidden.astype(np.float64)
        diff = same(f"the model with {G} pooled K/V heads against its dense form", pooled, dense, 1e-4, rel=True)
        if G == H and not np.array_equal(pooled, base):
            raise RuntimeError("lesson: pooling H heads into H groups changed the model")
        e0, e1 = base.mean(0), pooled.mean(0)                               # (d_model,) sentence embeddings
        rows.append(Pooled(G=G, rel_error=float(np.linalg.norm(pooled - base) / np.linalg.norm(base)),
                           cosine=float(e0 @ e1 / (np.linalg.norm(e0) * np.linalg.norm(e1))), diff_dense=diff,
                           cache_bytes=2 * cfg.n_layers * G * cfg.d_head * 4))
    return rows, len(base)


# ── the page ─────────────────────────────────────────────────────────────────────

def render(lesson: Lesson, lang: str = "en") -> list:
    p, s = Page(TEXTS, lang), lesson.sharing
    out = [p.rule("title", bold=True, model=s.model), p.say("intro"), Text(""),
           p.rule("s_share", H=s.H, H_kv=s.H_kv)]
    if s.latent is not None:
        out.append(p.say("mla", model=s.model, H=s.H, d_k=s.d_k, **s.latent))
    elif s.H_kv == s.H:
        out.append(p.say("mha", model=s.model, H=s.H))
    else:
        tab = p.table("col_kv", "col_queries")
        for kv in range(s.H_kv):
            p.row(tab, kv, ", ".join(str(h) for h in range(s.H) if s.kv_of[h] == kv), bold_first=True)
        out += [p.say("share", H=s.H, H_kv=s.H_kv, G=s.group, kq=f"({s.H}, n, {s.d_k})",
                      kk=f"({s.H_kv}, n, {s.d_k})"), tab]
    out.append(p.say("share_check", layer=s.layer, H=s.H, diff=s.diff_scores))
    lay = p.table("col_attention", "col_kv_heads", "col_per_token", "col_ratio")
    for l in s.layouts:
        ratio = l.bytes_per_token / s.layouts[0].bytes_per_token
        p.row(lay, layout_name(l, s.H_kv), l.H_kv, per_token(l), f"{ratio:.2f}", bold_first=True)
    own = own_layout(s.layouts, s.H_kv)
    cache = p.say("cache", L=s.L, d_k=s.d_k) if s.latent is None else p.say("cache_latent", L=s.L, d_k=s.d_k,
                                                                             **s.latent)
    out += [Text(""), p.rule("s_cache"), cache, lay,
            p.say("cache_end", model=s.model, saved=s.layouts[0].bytes_per_token - own.bytes_per_token,
                  ratio=s.layouts[0].bytes_per_token / own.bytes_per_token)]
    r0 = lesson.rows[0]
    tab = p.table("col_groups", "col_queries_per", "col_rel", "col_cos", "col_per_token")
    for r in lesson.rows:
        p.row(tab, r.G, lesson.pool_H // r.G, f"{r.rel_error:.4f}", f"{r.cosine:.4f}",
              f"{r.cache_bytes:,}", bold_first=True)
    worst = lesson.rows[-1]
    out += [Text(""), p.rule("s_pool", model=lesson.pool_model),
            p.say("pool", model=lesson.pool_model, H=lesson.pool_H, n=lesson.pool_tokens, text=lesson.text), tab,
            p.say("pool_check", H=lesson.pool_H, rel=r0.rel_error, diff=max(r.diff_dense for r in lesson.rows)),
            p.say("pool_end", G=worst.G, rel=worst.rel_error, cos=worst.cosine)]
    return out


# ── the figure ───────────────────────────────────────────────────────────────────

def figures(lesson: Lesson, out_dir: Path, lang: str = "en") -> list[Path]:
    """gqa: the query heads → K/V heads map, and the pooled model's error against its K/V heads."""
    from ..viz.drawing import new_figure, styled, save_all

    t, s = Page(TEXTS, lang).t, lesson.sharing

    @styled
    def draw():
        fig = new_figure(11, 4)
        a, b = fig.subplots(1, 2)
        xq = np.arange(s.H)
        xk = (np.arange(s.H_kv) + 0.5) * s.H / s.H_kv - 0.5
        for h in range(s.H):
            a.plot([xq[h], xk[s.kv_of[h]]], [1, 0], color=f"C{s.kv_of[h] % 10}", lw=1.5)
        a.scatter(xq, np.ones(s.H), s=180, c=[f"C{s.kv_of[h] % 10}" for h in range(s.H)], zorder=3)
        a.scatter(xk, np.zeros(s.H_kv), s=320, marker="s", c=[f"C{g % 10}" for g in range(s.H_kv)], zorder=3)
        for h in range(s.H):
            a.text(xq[h], 1.12, str(h), ha="center", fontsize=9)
        for g in range(s.H_kv):
            a.text(xk[g], -0.2, str(g), ha="center", fontsize=9)
        a.set(yticks=[0, 1], yticklabels=[t["fig_kv"], t["fig_q"]], xticks=[], ylim=(-0.4, 1.35),
              title=t["fig_map"].format(model=s.model, H=s.H, H_kv=s.H_kv))
        for side in ("top", "right", "bottom"):
            a.spines[side].set_visible(False)
        x = np.arange(len(lesson.rows))                                     # G = H, …, 1 left to right
        b.plot(x, [r.rel_error for r in lesson.rows], "o-", label=t["fig_rel"])
        b.plot(x, [1 - r.cosine for r in lesson.rows], "s-", label=t["fig_cos"])
        b.set(xlabel=t["fig_groups"], xticks=x, xticklabels=[str(r.G) for r in lesson.rows], ylim=(0, None),
              title=t["fig_pool"].format(model=lesson.pool_model, H=lesson.pool_H))
        b.legend(fontsize=8)
        return fig

    return save_all(out_dir, [("gqa", draw)], ["png", "svg"])
