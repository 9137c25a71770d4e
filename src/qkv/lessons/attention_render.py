"""`qkv explain`'s layout: a `Walkthrough` (explain.py) as rich renderables, one function per step.

    render = title, ⓪ tokens, ① X, [①a Norm(X)], ② Q K V, [②a RoPE], [②b GQA],
             ③ Q·Kᵀ, ④ S = Q·Kᵀ/√d_k, ⑤ softmax, ⑥ Z = A·V, ⑦ Concat·W_O, ⑧ why √d_k

Each step function takes a `Page` (the walkthrough, the sentences of one language from
`viz.words`, and the table helpers) and returns its renderables, a rule first; `render`
leaves a blank line before each step. Nothing here computes a number the model computed:
every value comes from the walkthrough.
"""

from __future__ import annotations

import math

import numpy as np
from rich.rule import Rule
from rich.table import Table
from rich.text import Text

from .attention import N_PAIRS, Walkthrough
from . import check_lang
from ..viz.words import texts

TEXTS = texts("explain")           # {language: its words} (viz/words: one module per language)
CORNER = 4                       # rows and columns of S shown (a causal S up to 8 tokens: all of it)
SHOWN = 4                        # values shown of a vector


def _shape(*dims) -> str:
    return str(tuple(int(d) for d in dims))


def _num(x: float, digits: int = 3) -> str:
    if np.isneginf(x):
        return "−∞"
    return f"{x:.{digits}f}" if abs(x) >= 10 ** -digits or x == 0 else f"{x:.1e}"


def _vec(x: np.ndarray, k: int = SHOWN) -> str:
    more = ", …" if len(x) > k else ""
    return "[" + ", ".join(f"{v:+.3f}" for v in x[:k]) + more + "]"


class Page:
    """One walkthrough in one language, and the small pieces every step is made of."""

    def __init__(self, w: Walkthrough, lang: str):
        check_lang(lang)
        self.w, self.a, self.t = w, w.arch, TEXTS[lang]
        self.token = w.labels[w.row]                              # the token whose row is shown

    def say(self, key: str, **values) -> Text:
        return Text(self.t[key].format(**values))

    def rule(self, key: str, **values) -> Rule:
        return Rule(self.say(key, **values), align="left")

    def table(self, *columns: str) -> Table:
        tab = Table(show_edge=False, pad_edge=False, box=None, padding=(0, 2))
        for c, column in enumerate(columns):
            tab.add_column(Text(column), justify="left" if c == 0 else "right")
        return tab

    def matrix(self, m: np.ndarray, k: int, digits: int = 2) -> Table:
        """The top-left k × k of m, labelled by tokens."""
        tab = self.table("", *self.w.labels[:k])
        for i in range(k):
            tab.add_row(Text(self.w.labels[i], style="bold"), *[Text(_num(m[i, j], digits)) for j in range(k)])
        return tab

    def row_heading(self, token: str) -> str:
        """'row of “token” · first 4 values'."""
        return self.t["row_of"].format(token=token) + " · " + self.t["first_values"].format(k=SHOWN)

    def corner(self) -> tuple[int, str]:
        """(k, "All of it" or "Top-left corner"): how much of an n × n matrix is shown."""
        k = min(self.w.n, 8 if self.w.causal else CORNER)
        return k, self.t["whole"] if k == self.w.n else self.t["corner"]


def render(w: Walkthrough, lang: str = "en") -> list:
    """The walkthrough as rich renderables, in `lang` ("en" or "ko")."""
    p = Page(w, lang)
    steps = [_tokens, _x, None if w.arch.post_norm else _norm, _qkv, _rope if w.rope else None,
             _gqa if w.arch.group > 1 else None, _scores, _scale, _softmax, _z, _out, _why]
    out = _title(p)
    for step in filter(None, steps):
        out += [Text("")] + step(p)                               # a blank line before each step
    return out


def _title(p: Page) -> list:
    a, w = p.a, p.w
    title = p.t["title"].format(model=a.name, layer=w.layer, head=w.head, H=a.H)
    return [Rule(Text(title, style="bold")), p.say("formula", d_model=a.d_model, H=a.H, d_k=a.d_k)]


def _tokens(p: Page) -> list:
    """⓪ the tokens and their ids."""
    w = p.w
    spelled = w.labels != w.tokens                               # byte-level BPE: show both
    tab = p.table("#", p.t["col_token"], *([p.t["col_spelled"]] if spelled else []), p.t["col_id"])
    for j, (label, token, id_) in enumerate(zip(w.labels, w.tokens, w.ids)):
        tab.add_row(Text(str(j)), Text(label), *([Text(token)] if spelled else []), Text(str(int(id_))))
    out = [p.rule("s_tokens"), p.say("tokens", n=w.n), tab]
    if spelled:
        out.append(p.say("tokens_bpe"))
    return out


def _x(p: Page) -> list:
    """① X, the residual stream entering the layer: where it comes from, its first values."""
    w, a = p.w, p.a
    out = [p.rule("s_x", layer=w.layer), p.say("x", layer=w.layer, shape=_shape(w.n, a.d_model))]
    if w.layer == 0:
        out.append(p.say("x_embed_rope") if w.rope else
                   p.say("x_embed", types=p.t["x_types"] if a.token_types else "",
                         embed_norm=p.t["x_embed_norm"] if a.embed_norm else ""))
    out.append(p.say("x_post" if a.post_norm else "x_pre", model=a.name))
    tab = p.table(p.t["col_token"], p.t["first_values"].format(k=SHOWN))
    for j in range(min(w.n, CORNER)):
        tab.add_row(Text(w.labels[j]), Text(_vec(w.X[j])))
    return out + [tab]


def _norm(p: Page) -> list:
    """①a Norm(X), the input of the projections in a pre-norm model."""
    w, a = p.w, p.a
    x = w.X[w.row]                                                  # (d_model,)
    name = "RMSNorm" if a.norm == "rms" else "LayerNorm"
    spread = float(np.mean(x * x)) if a.norm == "rms" else float(np.var(x))
    tab = p.table("", p.row_heading(p.token))
    tab.add_row(Text("X", style="bold"), Text(_vec(x)))
    tab.add_row(Text(f"{name}(X)", style="bold"), Text(_vec(w.Xn[w.row])))
    return [p.rule("s_norm", name=name),
            p.say("norm_rms" if a.norm == "rms" else "norm_layer", eps=a.norm_eps, gs=_shape(a.d_model),
                  token=p.token, mean=float(np.mean(x)), scale=math.sqrt(spread + a.norm_eps)),
            tab, p.say("norm_check", name=name, diff=w.checks.norm)]


def _qkv(p: Page) -> list:
    """② Q, K, V: this head's slice of the three projections."""
    w, a = p.w, p.a
    lo, hi = w.head * a.d_k, (w.head + 1) * a.d_k - 1
    head_shape = _shape(w.n, a.d_k)
    tab = p.table("", p.row_heading(p.token))
    Q, K = (w.rope.Q_pre, w.rope.K_pre) if w.rope else (w.Q, w.K)   # shown before RoPE turns them
    for name, m in (("Q", Q), ("K", K), ("V", w.V)):
        tab.add_row(Text(name, style="bold"), Text(_vec(m[w.row])))
    return [p.rule("s_qkv"), p.say("library"),
            p.say("w_q", W=_shape(*a.W_Q), head=w.head, lo=lo, hi=hi, Wh=_shape(a.W_Q[0], a.d_k)),
            p.say("qkv", x_name="X" if a.post_norm else "Norm(X)", b=" + b" if a.qkv_bias else "", head=w.head,
                  xs=_shape(w.n, a.d_model), ws=_shape(a.W_Q[0], a.d_k), qs=head_shape, ks=head_shape,
                  vs=head_shape),
            tab, p.say("qkv_check_rope" if w.rope else "qkv_check", diff=w.checks.qkv)]


def _rope(p: Page) -> list:
    """②a RoPE turns q and k by their position; q·k then depends on the distance only."""
    w, r, t = p.w, p.w.rope, p.t
    i, half, d_k = w.row, p.a.d_k // 2, p.a.d_k
    turn = p.table("", p.row_heading(p.token), t["col_pair"].format(a=0, b=half),
                   t["col_pair"].format(a=half - 1, b=d_k - 1), "|q|")
    for name, q in ((t["before"], r.Q_pre[i]), (t["after"], w.Q[i])):   # (d_k,) each
        turn.add_row(Text(name, style="bold"), Text(_vec(q)), Text(f"({q[0]:+.3f}, {q[half]:+.3f})"),
                     Text(f"({q[half - 1]:+.3f}, {q[-1]:+.3f})"), Text(f"{np.linalg.norm(q):.3f}"))
    moved = p.table(t["col_qpos"], t["col_kpos"], "m − n", "q·k")
    for m, n, dot in r.relative:
        moved.add_row(Text(str(m)), Text(str(n)), Text(str(m - n)), Text(f"{dot:.4f}"))
    key = w.labels[r.key]
    return [p.rule("s_rope"),
            p.say("rope_what", d_k=d_k, pairs=half, theta=r.theta, w0=float(r.omega[0]), last=half - 1,
                  wl=float(r.omega[-1])),
            p.say("rope_pair", token=p.token, p=i, a0=i * float(r.omega[0]), al=i * float(r.omega[-1])), turn,
            p.say("rope_check", diff=r.diff), p.say("rope_relative", q=p.token, k=key), moved,
            p.say("rope_relative_end", spread=r.spread, q=p.token, k=key)]


def _gqa(p: Page) -> list:
    """②b GQA: H query heads reading H_kv shared K/V heads."""
    w, a = p.w, p.a
    G = a.group
    tab = p.table(p.t["col_kv_head"], p.t["col_query_heads"])
    for kv in range(a.H_kv):
        heads = ", ".join(f"[{h}]" if h == w.head else str(h) for h in range(kv * G, (kv + 1) * G))
        tab.add_row(Text(str(kv), style="bold" if kv == w.kv_head else ""), Text(heads))
    others = ", ".join(str(h) for h in w.group_heads if h != w.head)
    return [p.rule("s_gqa", H=a.H, H_kv=a.H_kv),
            p.say("gqa_what", wq=_shape(*a.W_Q), wk=_shape(*a.W_K), H=a.H, H_kv=a.H_kv, n=w.n, G=G,
                  qs=_shape(a.H, w.n, a.d_k), ks=_shape(a.H_kv, w.n, a.d_k)),
            tab, p.say("gqa_follow", head=w.head, kv=w.kv_head, others=others, H=a.H, H_kv=a.H_kv, G=G),
            p.say("gqa_check", heads=", ".join(map(str, w.group_heads)), diff=w.checks.group)]


def _scores(p: Page) -> list:
    """③ Q·Kᵀ, the raw dot products."""
    w, d_k = p.w, p.a.d_k
    k, corner = p.corner()
    return [p.rule("s_s"),
            p.say("s", qs=_shape(w.n, d_k), kts=_shape(d_k, w.n), ss=_shape(w.n, w.n), corner=corner),
            p.matrix(w.S_raw, k)]


def _scale(p: Page) -> list:
    """④ The scores S = Q·Kᵀ/√d_k, and the causal mask M where there is one."""
    w, d_k = p.w, p.a.d_k
    k, corner = p.corner()
    out = [p.rule("s_scale"), p.say("scale", d_k=d_k, sqrt=math.sqrt(d_k), ss=_shape(w.n, w.n), corner=corner)]
    if p.a.alibi is not None:                                       # BLOOM, Falcon: + m_h·p_j
        out.append(p.say("alibi", slope=p.a.alibi))
    if w.causal:
        out.append(p.say("mask", masked=int(np.isneginf(w.S).sum()), total=w.n * w.n))
    return out + [p.matrix(w.S, k), p.say("scale_check", diff=w.checks.scores)]


def _softmax(p: Page) -> list:
    """⑤ A = softmax(S + M): the shown token's row (its 10 largest weights past 12 tokens)."""
    w, i = p.w, p.w.row
    shown = range(w.n) if w.n <= 12 else sorted(np.argsort(w.A[i])[-10:])
    tab = p.table(p.t["col_key"], *[w.labels[j] for j in shown])
    tab.add_row(Text(f"A[{p.token}]", style="bold"), *[Text(_num(w.A[i, j])) for j in shown])
    j = int(np.argmax(w.A[i]))
    return [p.rule("s_softmax"),
            p.say("softmax", dev=float(np.max(np.abs(w.A.sum(-1) - 1))), ss=_shape(w.n, w.n), token=p.token),
            tab, p.say("looks_most", token=p.token, target=w.labels[j], j=j, w=w.A[i, j])]


def _z(p: Page) -> list:
    """⑥ Z = A·V: the shown token's output as its three largest terms."""
    w, i, tok, d_k = p.w, p.w.row, p.token, p.a.d_k
    top = np.argsort(w.A[i])[::-1][:3]
    terms = " + ".join(f"{w.A[i, j]:.3f}·v[{w.labels[j]}]" for j in top) + (" + …" if w.n > 3 else "")
    return [p.rule("s_z"),
            p.say("z", as_=_shape(w.n, w.n), vs=_shape(w.n, d_k), zs=_shape(w.n, d_k), token=tok),
            Text(f"Z[{tok}] = {terms}"), p.say("z_seed"), Text(f"Z[{tok}] = {_vec(w.Z[i])}"),
            p.say("z_check", diff=w.checks.heads)]


def _out(p: Page) -> list:
    """⑦ Concat(Z_0 … Z_{H−1})·W_O: the heads together."""
    w, a = p.w, p.a
    return [p.rule("s_out", last=a.H - 1),
            p.say("out", H=a.H, cs=_shape(w.n, a.H * a.d_k), ws=_shape(*a.W_O), os=_shape(w.n, a.d_model),
                  b=" + b_O" if a.out_bias else ""),
            Text(f"(Concat·W_O)[{p.token}] = {_vec(w.out[w.row])}"), p.say("out_check", diff=w.checks.out),
            p.say("out_post" if a.post_norm else "out_pre")]


def _why(p: Page) -> list:
    """⑧ why divide by √d_k: the variance of q·k, softmax's saturation, the real model without the scaling."""
    return [p.rule("s_why")] + _why_variance(p) + _why_saturation(p) + _why_model(p)


def _why_variance(p: Page) -> list:
    tab = p.table(p.t["col_dk"], p.t["col_var"], p.t["col_std"], p.t["col_var_scaled"])
    for d_k, var, scaled in p.w.why.variance:
        tab.add_row(Text(str(d_k)), Text(f"{var:.1f}"), Text(f"{math.sqrt(var):.2f}"), Text(f"{scaled:.3f}"))
    return [p.say("why_var", N=f"{N_PAIRS:,}"), tab, p.say("why_var_end")]


def _why_saturation(p: Page) -> list:
    tab = p.table(p.t["col_scores"], p.t["col_softmax"], p.t["col_grad"])
    for scores, a in p.w.why.saturation:
        tab.add_row(Text("[" + ", ".join(f"{s:g}" for s in scores) + "]"),
                    Text("[" + ", ".join(_num(float(v)) for v in a) + "]"), Text(_num(float(np.max(a * (1 - a))))))
    return [p.say("why_softmax"), tab, p.say("why_softmax_end")]


def _why_model(p: Page) -> list:
    w, e = p.w, p.w.why.entropy
    tab = p.table(p.t["col_what"], p.t["col_scaled"], p.t["col_unscaled"])
    for key, prefix, values in (("this_head", "head_entropy", {"head": w.head}),
                                ("this_head_max", "head_max", {"head": w.head}),
                                ("all_heads", "layer_entropy", {"H": p.a.H, "layer": w.layer}),
                                ("all_heads_max", "layer_max", {"H": p.a.H, "layer": w.layer})):
        tab.add_row(p.say(key, **values), Text(f"{e[prefix + '_scaled']:.2f}"), Text(f"{e[prefix + '_unscaled']:.2f}"))
    return [p.say("why_model", logn=math.log(w.n)), tab, p.say("why_end")]
