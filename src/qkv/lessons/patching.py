"""`qkv explain patching`: exact activation patching, attribution patching (AtP) and path patching of one head,
side by side on one IOI prompt pair (Wang et al. 2022), every number recomputed another way before it prints.

    ① the metric       m = logit(answer) − logit(wrong) at the last position, on the clean and corrupted prompts
    ② exact patching   the corrupted run again with head (l, h)'s Z = A·V from the clean run:
                       effect = (m(patched) − m(corrupted)) / (m(clean) − m(corrupted))    (qkv.analysis.patch)
    ③ AtP              the same patch to first order: (Z_clean − Z_corrupted) · ∂m/∂Z at the corrupted run, a sum
                       over positions, ÷ the same denominator (qkv.analysis.atp); m along the straight line from
                       Z_corrupted to Z_clean shows why it differs (the linearisation); the whole head table's
                       agreement with exact patching
    ④ path patching    the same head as a sender into the queries only of the later head it reaches most (a pair
                       table over every later head), the other way round (its corrupted output into the clean run):
                       effect = (m(patched) − m(clean)) / (m(clean) − m(corrupted))   (qkv.analysis.path_patch)
    ⑤ the numbers side by side, and the question each one answers

The checks, each against a computation that shares only the weights with the number it checks:
    ① m from the whole forward pass's logits, against patch's (run from block 0 by patch.tail)
    ② a whole forward pass of the corrupted prompt with a hook on "l.heads.h", against patch's table cell (a batched
      run from block l)
    ③ each position's term Δa_p·∂m/∂a_p as a central difference of hooked passes (no backward), their sum against
      atp's cell (the engine's backward); m at t = 0 and t = 1 of the line against m(corrupted) and ②'s m(patched);
      Pearson's r and the sign agreement redone from their formulas
    ④ the path patched by hand: the sender's Δ from a hooked clean pass, the receiver's queries from a pass on
      x_clean + Δ, a clean pass with those queries hooked in, against path_patch's; the sender's whole effect in
      that direction from the same hooked pass, against patch_one's; the path alone against its cell of the table

It runs on any pre-norm (or parallel) decoder; the default is SmolLM2 and its IOI pair, where ␣Mary and ␣John are
one token each. A GGUF model's weights are dequantised to float32 once (AtP and the pair table multiply by Wᵀ and
by many rows: ~25 s less on SmolLM2). TEXT is another pair, "CLEAN | CORRUPTED", of the same token count; its metric
is then logit(clean's top token) − logit(corrupted's top token).

SmolLM2, the IOI pair (14 tokens), a shared 2-core machine: ~80 s, 60 of them exact patching's 270 heads.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from rich.text import Text

from ..analysis.atp import agreement, atp
from ..analysis.attribution import token_id
from ..analysis.input_attribution import float_model
from ..analysis.patch import metric_of, patch, patch_one, tail
from ..analysis.path_patch import Node, check_path_model, pair_table, path_patch
from ..runtime.errors import QkvError
from ..viz.words import texts
from . import Page, same

TEXTS = texts("patching")          # {language: its words} (viz/words: one module per language)
DEFAULT_MODEL = "smollm2"
CLEAN = "When Mary and John went to the store, John gave a drink to"
CORRUPTED = "When Mary and John went to the store, Mary gave a drink to"
METRIC = (" Mary", " John")        # logit(␣Mary) − logit(␣John): the clean answer against the corrupted one
STEPS = (0.0, 0.25, 0.5, 0.75, 1.0)   # points t of the line Z_corrupted + t·ΔZ
TERMS = 3                          # the positions of AtP's sum printed one by one
KEEP = ("residual", "heads", "attn_out")


@dataclass
class Lesson:
    model: str
    L: int
    H: int
    d_k: int
    tokens: list[str]                 # (n,) clean tokens, "clean/corrupted" where they differ
    texts: tuple[str, str]            # the prompts (given as ids: their tokens, space-separated)
    answer: str
    wrong: str
    logits: dict[str, tuple[float, float]]   # "clean", "corrupted" → (logit(answer), logit(wrong))
    m_clean: float
    m_corrupted: float
    layer: int                        # the followed head
    head: int
    auto: bool                        # chosen by the lesson (the largest |exact effect|), not by the caller
    m_patched: float                  # ② m(corrupted with the head's clean Z)
    exact: float                      # ② its effect (patch's cell)
    delta_norm: float                 # ‖Z_clean − Z_corrupted‖ over all positions
    terms: list[tuple[int, float, float]]    # ③ (position, ‖ΔZ_p‖, Δa_p·∂m/∂a_p), largest |term| first
    estimate: float                   # ③ AtP's cell (normalised)
    line: list[tuple[float, float, float]]   # ③ (t, m(Z_corr + t·ΔZ), AtP's straight line)
    pearson: float                    # ③ the whole head table, AtP against exact
    sign: float
    off: int                          # heads where AtP is wrong by more than half of exact
    cells: int
    receiver: tuple[int, int]         # ④
    m_path: float
    path: float                       # ④ path_patch's effect
    noising: float                    # ④ the sender's whole effect in path patching's direction
    heads_exact: np.ndarray = field(repr=False, default=None)    # (L, H)
    heads_atp: np.ndarray = field(repr=False, default=None)      # (L, H)
    diffs: dict[str, float] = field(default_factory=dict)


def build(model, text: str | None = None, *, pair: tuple | None = None, metric=None, layer: int | None = None,
          head: int | None = None) -> Lesson:
    """The lesson on TEXT ("CLEAN | CORRUPTED"; default the IOI pair) or PAIR (two texts or id lists), with METRIC
    (answer, wrong) tokens (default ␣Mary, ␣John for the IOI pair, else each prompt's top next token), following
    head LAYER.HEAD (default: the one exact patching moves most that has a later layer to send to)."""
    check_path_model(model)
    model = float_model(model)                 # a GGUF's weights dequantised once: every method runs on the same arrays
    clean, corrupted, metric = _inputs(model, text, pair, metric)
    tol = _tolerance(model)
    fn, _ = metric_of(model, metric)
    answer, wrong = (token_id(model, t) for t in metric)
    c, k = model.run(clean, keep=KEEP), model.run(corrupted, keep=KEEP)
    if len(c.ids) != len(k.ids):
        raise QkvError(f"clean has {len(c.ids)} tokens and corrupted {len(k.ids)}; patching position by position "
                       "needs the same count: reword the corrupted prompt so its tokens line up")
    L, H = model.config.n_layers, model.config.n_heads
    if L < 2:
        raise QkvError(f"{model.name} has one layer; path patching needs a later layer to send to")
    diffs: dict[str, float] = {}

    # ① the metric, from the whole pass's logits, against patch's
    exact = patch(model, clean, corrupted, metric, what=("heads",))
    logits = {name: (float(t.logits[-1, answer]), float(t.logits[-1, wrong])) for name, t in
              (("clean", c), ("corrupted", k))}
    mine = [a - w for a, w in logits.values()]
    diffs["metric"] = same("m(clean), m(corrupted) from the whole pass", mine, [exact.clean, exact.corrupted],
                           tol, rel=True)
    m_c, m_k = exact.clean, exact.corrupted
    scale = m_c - m_k

    # ② exact patching of one head: a whole hooked forward of the corrupted prompt
    auto = layer is None and head is None
    layer, head = _followed(model, exact.heads, layer, head)
    z_c, z_k = c.layers[layer].heads[head], k.layers[layer].heads[head]                  # (n, d_k) each
    m_p = _metric(model, fn, k.ids, {f"{layer}.heads.{head}": lambda v, _l: z_c[None]})
    diffs["exact"] = same(f"head {layer}.{head}'s exact effect by a hooked pass", (m_p - m_k) / scale,
                          exact.heads[layer, head], tol, rel=True)

    # ③ AtP: its terms by central differences, its cell by the backward; the line from Z_corrupted to Z_clean
    est = atp(model, clean, corrupted, metric)
    dz = (z_c.astype(np.float64) - z_k.astype(np.float64))                               # (n, d_k)
    terms, line = _terms_and_line(model, fn, k, layer, head, dz)
    diffs["atp"] = same(f"head {layer}.{head}'s AtP: Σ_p Δa_p·∂m/∂a_p by central differences, against atp's cell",
                        sum(t for _, _, t in terms) / scale, est.heads[layer, head], 10 * tol, rel=True)
    diffs["line"] = same("m on the line at t = 0 and t = 1 against m(corrupted) and m(patched)",
                         [line[0][1], line[-1][1]], [m_k, m_p], tol, rel=True)
    line = [(t, m, m_k + t * est.heads[layer, head] * scale) for t, m, _ in line]
    ag = agreement(est.heads, exact.heads, "heads")
    r, sign = _pearson(est.heads, exact.heads), _sign(est.heads, exact.heads)
    diffs["pearson"] = same("Pearson's r of AtP against exact, from its formula", r, ag.pearson, 1e-9)
    diffs["sign"] = same("the sign agreement, counted", sign, ag.sign, 1e-12)

    # ④ path patching: the head into the queries of the later head it reaches most, against the same by hand
    later = [Node(rl, rh) for rl in range(layer + 1, L) for rh in range(H)]           # every head after the sender
    paths = pair_table(model, clean, corrupted, metric, channel="q", senders=[Node(layer, head)], receivers=later)
    best = int(np.argmax(np.abs(paths.values[0])))
    receiver = (later[best].layer, later[best].head)
    pp = path_patch(model, clean, corrupted, metric, senders=f"{layer}.{head}",
                    receivers=f"{receiver[0]}.{receiver[1]}", channel="q")
    diffs["path_table"] = same("the path alone against its cell of the table", pp.effect, paths.values[0, best], tol,
                               rel=True)
    m_path, m_noised = _path_by_hand(model, fn, c, z_k, layer, head, receiver)
    diffs["path"] = same("the path patched by hand against path_patch's effect", (m_path - m_c) / scale, pp.effect,
                         tol, rel=True)
    noising = -patch_one(model, corrupted, clean, metric, "heads", layer, [head])      # path's normalisation
    diffs["noising"] = same("the sender's whole effect on the clean run, by a hooked pass", (m_noised - m_c) / scale,
                            noising, tol, rel=True)

    top = sorted(terms, key=lambda x: -abs(x[2]))
    return Lesson(model=model.name, L=L, H=H, d_k=model.config.d_head, tokens=exact.labels,
                  texts=tuple(x if isinstance(x, str) else " ".join(t.labels) for x, t in ((clean, c), (corrupted, k))),
                  answer=model.tokenizer.label(answer) if model.tokenizer else f"#{answer}",
                  wrong=model.tokenizer.label(wrong) if model.tokenizer else f"#{wrong}", logits=logits,
                  m_clean=m_c, m_corrupted=m_k, layer=layer, head=head, auto=auto, m_patched=m_p,
                  exact=float(exact.heads[layer, head]), delta_norm=float(np.linalg.norm(dz)), terms=top,
                  estimate=float(est.heads[layer, head]), line=line, pearson=r, sign=sign, off=len(ag.wrong),
                  cells=ag.cells, receiver=receiver, m_path=m_path, path=float(pp.effect), noising=float(noising),
                  heads_exact=exact.heads, heads_atp=est.heads, diffs=diffs)


# ── the inputs, the head to follow ───────────────────────────────────────────────

def _inputs(model, text: str | None, pair, metric) -> tuple:
    """(clean, corrupted, (answer, wrong)): the IOI pair by default, TEXT's "CLEAN | CORRUPTED", or PAIR."""
    if text is not None and pair is not None:
        raise QkvError("give the prompts once: TEXT as 'CLEAN | CORRUPTED', or pair=(clean, corrupted)")
    if text is not None:
        parts = [p.strip() for p in text.split("|")]
        if len(parts) != 2 or not all(parts):
            raise QkvError("qkv explain patching reads two prompts: give TEXT as 'CLEAN | CORRUPTED', e.g. "
                           f"'{CLEAN} | {CORRUPTED}'")
        pair = tuple(parts)
    if pair is None:
        return CLEAN, CORRUPTED, METRIC if metric is None else tuple(metric)
    clean, corrupted = pair
    if metric is None:                                          # each prompt's own answer
        a, b = (int(np.argmax(model.run(x, keep=()).logits[-1])) for x in (clean, corrupted))
        if a == b:
            raise QkvError(f"both prompts' top next token is {model.tokenizer.label(a)!r}: give a corrupted prompt "
                           "that changes the answer")
        metric = (a, b)
    return clean, corrupted, tuple(metric)


def _tolerance(model) -> float:
    """How far a number redone another way may be from the engine's, relative to the largest (at least 1)."""
    return 1e-9 if model.dtype == np.float64 else 1e-3


def _followed(model, heads: np.ndarray, layer: int | None, head: int | None) -> tuple[int, int]:
    """The head to follow: LAYER.HEAD, or the one of largest |exact effect| before the last layer."""
    L = model.config.n_layers
    if layer is None and head is None:
        i = int(np.argmax(np.abs(heads[:L - 1])))
        return divmod(i, heads.shape[1])
    if layer is None or head is None:
        raise QkvError("give both --layer and --head to follow a head (or neither: the one patching moves most)")
    layer, head = model.check_layer(layer), model.check_head(head)
    if layer == L - 1:
        raise QkvError(f"head {layer}.{head} is in the last layer, so it sends to no later head: choose a layer "
                       f"below {L - 1}")
    return layer, head


# ── the numbers redone another way ───────────────────────────────────────────────

def _metric(model, fn, ids, hooks) -> float:
    """m of a whole forward pass of IDS with HOOKS."""
    return float(fn(model.run(list(ids), keep=(), hooks=hooks).logits[-1:])[0])


def _terms_and_line(model, fn, k, layer: int, head: int, dz: np.ndarray
                    ) -> tuple[list[tuple[int, float, float]], list[tuple[float, float, float]]]:
    """Each position's AtP term Δa_p·∂m/∂a_p = (m(Z + ε·ΔZ_p) − m(Z − ε·ΔZ_p)) / 2ε (ΔZ_p: ΔZ at p alone), and m at
    Z_corrupted + t·ΔZ for each t of STEPS: one batch run from block LAYER of the corrupted pass, its head's Z
    hooked (2·n' + len(STEPS) rows, n' the positions where Z moves)."""
    eps = 1e-5 if model.dtype == np.float64 else 1e-2
    moved = [p for p in range(len(dz)) if np.any(dz[p])]
    shifts = []
    for p in moved:
        one = np.zeros_like(dz)
        one[p] = dz[p]
        shifts += [eps * one, -eps * one]
    shifts += [t * dz for t in STEPS]
    z = k.layers[layer].heads[head].astype(np.float64)                                # (n, d_k)

    def shifted(v: np.ndarray, _layer: int) -> np.ndarray:                            # (B, H, n, d_k)
        v = v.copy()
        for r, s in enumerate(shifts):
            v[r, head] = (z + s).astype(v.dtype)
        return v

    x = np.repeat(k.layers[layer].residual[None], len(shifts), axis=0)                 # (B, n, d_model)
    m = np.asarray(fn(tail(model, x, layer, {f"{layer}.heads": shifted}, k)), np.float64)   # (B,)
    terms = [(p, float(np.linalg.norm(dz[p])), float((m[2 * i] - m[2 * i + 1]) / (2 * eps)))
             for i, p in enumerate(moved)]
    line = [(t, float(v), 0.0) for t, v in zip(STEPS, m[2 * len(moved):])]
    return terms, line


def _pearson(x: np.ndarray, y: np.ndarray) -> float:
    """r = Σ(x − x̄)(y − ȳ) / √(Σ(x − x̄)²·Σ(y − ȳ)²) over every cell."""
    a, b = np.ravel(x).astype(np.float64), np.ravel(y).astype(np.float64)
    a, b = a - a.mean(), b - b.mean()
    return float((a @ b) / np.sqrt((a @ a) * (b @ b)))


def _sign(estimate: np.ndarray, exact: np.ndarray) -> float:
    """The share of heads with exact ≠ 0 whose estimate has the same sign."""
    pairs = [(e, x) for e, x in zip(np.ravel(estimate), np.ravel(exact)) if x != 0]
    return sum((e > 0) == (x > 0) and e != 0 for e, x in pairs) / len(pairs) if pairs else 1.0


def _path_by_hand(model, fn, c, z_k: np.ndarray, layer: int, head: int, receiver: tuple[int, int]
                  ) -> tuple[float, float]:
    """(m of the clean run with the receiver's queries read from x_clean + Δ, m of the clean run with the sender's
    corrupted Z): Δ = what the sender's corrupted Z changes layer LAYER's attention output by (a hooked clean pass),
    the receiver's q from a pass whose stream entering its layer is x_clean + Δ, put into a clean pass by a hook."""
    rl, rh = receiver
    swap = {f"{layer}.heads.{head}": lambda v, _l: z_k[None]}
    noised = model.run(list(c.ids), keep=("attn_out",), layers=[layer], hooks=swap)
    m_noised = float(fn(noised.logits[-1:])[0])
    delta = noised.layer(layer).attn_out - c.layers[layer].attn_out                      # (n, d_model)
    x = c.layers[rl].residual + delta                                                   # (n, d_model)
    q = model.run(list(c.ids), keep=("q",), layers=[rl],
                  hooks={f"{rl}.residual": lambda v, _l: x[None]}).layer(rl).q[rh]       # (n, d_k)
    m_path = _metric(model, fn, c.ids, {f"{rl}.q.{rh}": lambda v, _l: q[None]})
    return m_path, m_noised


# ── the page ─────────────────────────────────────────────────────────────────────

def render(lesson: Lesson, lang: str = "en") -> list:
    """The lesson's page in LANG: rules, sentences and tables (rich renderables)."""
    p, le = Page(TEXTS, lang), lesson
    l, h = le.layer, le.head
    rl, rh = le.receiver
    (ac, wc), (ak, wk) = le.logits["clean"], le.logits["corrupted"]
    out = [p.rule("title", bold=True, model=le.model), p.say("intro"), Text("")]

    out += [p.rule("s_metric"), p.say("pair", clean=le.texts[0], corrupted=le.texts[1], n=len(le.tokens))]
    tab = p.table("col_prompt", f"logit({le.answer})", f"logit({le.wrong})", "m")
    p.row(tab, p.t["clean"], f"{ac:+.3f}", f"{wc:+.3f}", f"{le.m_clean:+.3f}", bold_first=True)
    p.row(tab, p.t["corrupted"], f"{ak:+.3f}", f"{wk:+.3f}", f"{le.m_corrupted:+.3f}", bold_first=True)
    out += [p.say("metric", answer=le.answer, wrong=le.wrong), tab,
            p.say("metric_check", diff=le.diffs["metric"]), Text("")]

    out += [p.rule("s_exact", layer=l, head=h),
            p.say("exact", layer=l, head=h), *([p.say("exact_auto", L=le.L, H=le.H)] if le.auto else []),
            Text(f"  effect = (m(patched) − m(corrupted)) / (m(clean) − m(corrupted))\n"
                 f"         = ({le.m_patched:+.4f} − ({le.m_corrupted:+.4f})) / ({le.m_clean:+.4f} − "
                 f"({le.m_corrupted:+.4f})) = {le.exact:+.4f}"),
            p.say("exact_means", exact=le.exact),
            p.say("exact_check", diff=le.diffs["exact"]), Text("")]

    shown = le.terms[:TERMS]
    rest = sum(t for _, _, t in le.terms[TERMS:])
    total = sum(t for _, _, t in le.terms)
    out += [p.rule("s_atp", layer=l, head=h), p.say("atp", n=len(le.tokens), d_k=le.d_k, moved=len(le.terms),
                                                   norm=le.delta_norm)]
    tab = p.table("col_position", "col_token", "‖Δa_p‖", "Δa_p·∂m/∂a_p")
    for pos, size, term in shown:
        p.row(tab, pos, le.tokens[pos], f"{size:.4f}", f"{term:+.4f}", bold_first=True)
    if len(le.terms) > TERMS:
        p.row(tab, "", p.t["others"].format(k=len(le.terms) - TERMS), "", f"{rest:+.4f}")
    out += [tab, Text(f"  Σ = {total:+.4f};   {total:+.4f} / ({le.m_clean:+.4f} − ({le.m_corrupted:+.4f})) = "
                      f"{le.estimate:+.4f}"),
            p.say("atp_check", diff=le.diffs["atp"]),
            p.say("line", exact=le.exact, estimate=le.estimate)]
    tab = p.table("t", "col_m_real", "col_m_line")
    for t, m, lin in le.line:
        p.row(tab, f"{t:.2f}", f"{m:+.4f}", f"{lin:+.4f}", bold_first=True)
    out += [tab, p.say("line_check", diff=le.diffs["line"]),
            p.say("table", cells=le.cells, r=le.pearson, sign=le.sign, off=le.off),
            p.say("table_check", diff=max(le.diffs["pearson"], le.diffs["sign"])), Text("")]

    out += [p.rule("s_path", layer=l, head=h, rl=rl, rh=rh),
            p.say("path", layer=l, head=h, rl=rl, rh=rh),
            p.say("path_frozen", layer=l, head=h, rl=rl, rh=rh),
            Text(f"  effect = (m(patched) − m(clean)) / (m(clean) − m(corrupted))\n"
                 f"         = ({le.m_path:+.4f} − ({le.m_clean:+.4f})) / ({le.m_clean:+.4f} − "
                 f"({le.m_corrupted:+.4f})) = {le.path:+.4f}"),
            p.say("path_whole", layer=l, head=h, noising=le.noising, path=le.path),
            p.say("path_check", rl=rl, rh=rh, diff=max(le.diffs["path"], le.diffs["path_table"],
                                                            le.diffs["noising"])), Text("")]

    tab = p.table("col_method", "col_number", "col_answers")
    p.row(tab, p.t["m_exact"], f"{le.exact:+.4f}", p.t["a_exact"].format(layer=l, head=h), bold_first=True)
    p.row(tab, p.t["m_atp"], f"{le.estimate:+.4f}", p.t["a_atp"], bold_first=True)
    p.row(tab, p.t["m_path"], f"{le.path:+.4f}", p.t["a_path"].format(rl=rl, rh=rh), bold_first=True)
    p.row(tab, p.t["m_noise"], f"{le.noising:+.4f}", p.t["a_noise"], bold_first=True)
    tab.columns[-1].justify = "left"
    out += [p.rule("s_side"), tab, p.say("side"), p.say("next")]
    return out


# ── the figure ───────────────────────────────────────────────────────────────────

def figures(lesson: Lesson, out_dir: Path, lang: str = "en") -> list[Path]:
    """patching: AtP against exact for every head (the followed one marked), and m along the line from Z_corrupted
    to Z_clean beside AtP's straight line."""
    from ..viz.drawing import new_figure, save_all, styled

    t, le = Page(TEXTS, lang).t, lesson

    @styled
    def draw():
        fig = new_figure(11, 4.2)
        a, b = fig.subplots(1, 2)
        x, y = np.ravel(le.heads_exact), np.ravel(le.heads_atp)
        a.scatter(x, y, s=14, alpha=0.7)
        a.scatter([le.exact], [le.estimate], s=80, facecolors="none", edgecolors="C3", lw=2,
                  label=f"{le.layer}.{le.head}")
        lo, hi = float(min(x.min(), y.min(), 0)), float(max(x.max(), y.max(), 0))
        a.plot([lo, hi], [lo, hi], color="grey", lw=0.8, ls="--")
        a.set(xlabel=t["fig_exact"], ylabel=t["fig_atp"],
              title=t["fig_scatter"].format(model=le.model, cells=le.cells, r=le.pearson))
        a.legend(fontsize=8)
        ts = [s for s, _, _ in le.line]
        b.plot(ts, [m for _, m, _ in le.line], "o-", label=t["fig_real"])
        b.plot(ts, [m for _, _, m in le.line], "s--", label=t["fig_linear"])
        b.set(xlabel=t["fig_t"], ylabel="m", title=t["fig_line"].format(layer=le.layer, head=le.head))
        b.legend(fontsize=8)
        return fig

    return save_all(out_dir, [("patching", draw)], ["png", "svg"])
