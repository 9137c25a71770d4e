"""`qkv explain`: the seeds' attention steps for one head of the real model, with shapes and numbers.

    X → Q, K, V → S = Q·Kᵀ → S/√d_k → A = softmax(·) → Z = A·V → Concat(Z)·W_O

`walkthrough` recomputes each step from the model's own weights and the trace of one
forward pass, and checks it equals what the model computed (a wrong explanation raises
instead of printing); then it measures why √d_k matters. `render` lays it out with
rich, in English or Korean (the sentences live in `explain_text`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .errors import QkvError
from .explain_text import TEXTS
from .model import Model, norm
from .ops import softmax

DEFAULT_TEXT = "The cat sat on the mat"
DK_SIZES = (4, 16, 64, 256)
SOFTMAX_EXAMPLES = ((100.0, 1.0, 1.0), (10.0, 0.1, 0.1), (1.0, 0.01, 0.01))   # the seeds' example, /10, /100
N_PAIRS = 10_000
CORNER = 4                       # rows and columns of S shown


@dataclass
class Walkthrough:
    """Every number `qkv explain` prints, computed from the model (arrays in float64)."""

    model: str
    family: str
    post_norm: bool
    rope: bool
    causal: bool
    token_types: bool
    qkv_bias: bool
    embed_norm: bool
    layer: int
    head: int
    kv_head: int
    group: int                   # query heads per K/V head (1 = plain multi-head)
    H: int
    d_model: int
    d_k: int
    tokens: list[str]
    ids: np.ndarray              # (n,)
    X: np.ndarray                # (n, d_model) the residual stream entering the layer
    W_Q: tuple[int, ...]         # shape of the whole W_Q (d_model, H·d_k)
    Q: np.ndarray                # (n, d_k) this head's queries (after RoPE where used)
    K: np.ndarray                # (n, d_k)
    V: np.ndarray                # (n, d_k)
    qkv_diff: float              # |X·W + b − the model's q, k, v| (v only with RoPE)
    S_raw: np.ndarray            # (n, n) Q·Kᵀ
    S: np.ndarray                # (n, n) Q·Kᵀ/√d_k + M
    scores_diff: float
    A: np.ndarray                # (n, n) softmax(S)
    Z: np.ndarray                # (n, d_k) A·V
    heads_diff: float
    concat: tuple[int, ...]      # (n, H·d_k)
    W_O: tuple[int, ...]         # (H·d_k, d_model)
    out: np.ndarray              # (n, d_model) Concat(Z)·W_O + b_O
    out_diff: float
    row: int                     # the token whose row is shown
    variance: list[tuple[int, float, float]]                 # (d_k, var(q·k), var(q·k/√d_k))
    saturation: list[tuple[tuple[float, ...], np.ndarray]]   # (scores, softmax(scores))
    entropy: dict[str, float]    # {head,layer}_{entropy,max}_{scaled,unscaled}

    @property
    def n(self) -> int:
        return len(self.tokens)


def check_lang(lang: str) -> None:
    if lang not in TEXTS:
        raise QkvError(f"unknown language {lang!r}; use --lang en (English) or --lang ko (Korean)")


def _same(what: str, mine: np.ndarray, model: np.ndarray, tol: float) -> float:
    """The largest difference between our recomputation and the model's; a bug if above tol."""
    finite = np.isfinite(model)
    if not np.array_equal(finite, np.isfinite(mine)):
        raise AssertionError(f"explain: {what} masks differ from the model's")
    diff = float(np.max(np.abs(mine[finite] - model[finite]), initial=0.0))
    if not np.allclose(mine[finite], model[finite], rtol=tol, atol=tol):
        raise AssertionError(f"explain: {what} differs from the model's by {diff:.2e} (tolerance {tol:g})")
    return diff


def _proj(x: np.ndarray, W: np.ndarray, b: np.ndarray | None, cols: slice) -> np.ndarray:
    """x·W[:, cols] + b[cols]: one head's slice of a projection."""
    y = x @ W[:, cols].astype(np.float64)                         # (n, d_k)
    return y if b is None else y + b[cols]


def _entropy(a: np.ndarray) -> np.ndarray:
    """−Σ_j a·log a over the last axis (nats)."""
    return -(a * np.log(np.where(a > 0, a, 1.0))).sum(-1)


def walkthrough(model: Model, text: str = DEFAULT_TEXT, layer: int = 0, head: int | None = None) -> Walkthrough:
    """Recompute one head's attention step by step and check every step against the model."""
    cfg = model.config
    layer = model.check_layer(layer)
    head = model.check_head(2 if cfg.n_heads > 2 else 0) if head is None else model.check_head(head)
    trace = model.run(text, layers=[layer])                          # everything kept
    lt = trace.layer(layer)
    w = model.weights.blocks[layer].attn
    d_k, H = cfg.d_head, cfg.n_heads
    G = H // cfg.n_kv_heads
    kv = head // G
    X = lt.residual.astype(np.float64)                              # (n, d_model)
    x_in = X if cfg.norm_place == "post" else norm(lt.residual, model.weights.blocks[layer].attn_norm,
                                                   cfg).astype(np.float64)
    q_cols, kv_cols = slice(head * d_k, (head + 1) * d_k), slice(kv * d_k, (kv + 1) * d_k)
    Q_p, K_p, V_p = (_proj(x_in, w.W_Q, w.b_Q, q_cols), _proj(x_in, w.W_K, w.b_K, kv_cols),
                     _proj(x_in, w.W_V, w.b_V, kv_cols))            # 3 × (n, d_k)
    Q, K, V = (lt.q[head].astype(np.float64), lt.k[kv].astype(np.float64),
               lt.v[kv].astype(np.float64))                         # as the model used them
    pairs = [(V_p, V)] if cfg.position == "rope" else [(Q_p, Q), (K_p, K), (V_p, V)]
    qkv_diff = max(_same("Q, K, V", mine, theirs, 1e-4) for mine, theirs in pairs)

    masked = np.isneginf(lt.scores[head])                           # (n, n) M = −∞ here
    S_raw = Q @ K.T                                                 # (n, n)
    S = np.where(masked, -np.inf, S_raw / math.sqrt(d_k))           # (n, n)
    scores_diff = _same("S/√d_k", S, lt.scores[head].astype(np.float64), 1e-5)
    A = softmax(S)                                                  # (n, n)
    _same("A", A, lt.attentions[head].astype(np.float64), 1e-5)
    Z = A @ V                                                       # (n, d_k)
    heads_diff = _same("Z", Z, lt.heads[head].astype(np.float64), 1e-4)
    z_all = lt.heads.astype(np.float64)                             # (H, n, d_k)
    z_all[head] = Z
    concat = z_all.transpose(1, 0, 2).reshape(len(Z), H * d_k)      # (n, H·d_k)
    out = concat @ w.W_O.astype(np.float64)                         # (n, d_model)
    if w.b_O is not None:
        out += w.b_O
    out_diff = _same("Concat·W_O", out, lt.attn_out.astype(np.float64), 1e-4)

    q_all = lt.q.astype(np.float64)                                 # (H, n, d_k)
    k_all = lt.k.astype(np.float64)[np.arange(H) // G]              # (H, n, d_k)
    raw_all = q_all @ k_all.transpose(0, 2, 1)                      # (H, n, n)
    mask_all = np.isneginf(lt.scores)
    entropy = {}
    for name, s in (("scaled", raw_all / math.sqrt(d_k)), ("unscaled", raw_all)):
        a = softmax(np.where(mask_all, -np.inf, s))                 # (H, n, n)
        ent, top = _entropy(a), a.max(-1)                           # (H, n) each
        entropy |= {f"head_entropy_{name}": float(ent[head].mean()), f"head_max_{name}": float(top[head].mean()),
                    f"layer_entropy_{name}": float(ent.mean()), f"layer_max_{name}": float(top.mean())}

    return Walkthrough(
        model=model.name, family=cfg.family, post_norm=cfg.norm_place == "post", rope=cfg.position == "rope",
        causal=bool(masked.any()), token_types=cfg.type_vocab_size > 0,
        qkv_bias=w.b_Q is not None, embed_norm=cfg.embed_norm, layer=layer,
        head=head, kv_head=kv, group=G, H=H, d_model=cfg.d_model, d_k=d_k, tokens=list(trace.tokens),
        ids=np.asarray(trace.ids), X=X, W_Q=tuple(w.W_Q.shape), Q=Q, K=K, V=V, qkv_diff=qkv_diff,
        S_raw=S_raw, S=S, scores_diff=scores_diff, A=A, Z=Z, heads_diff=heads_diff, concat=concat.shape,
        W_O=tuple(w.W_O.shape), out=out, out_diff=out_diff, row=min(3, len(Z) - 1),
        variance=scaling_variance(), saturation=[(s, softmax(np.array(s))) for s in SOFTMAX_EXAMPLES],
        entropy=entropy)


def scaling_variance(sizes=DK_SIZES, pairs: int = N_PAIRS, seed: int = 0) -> list[tuple[int, float, float]]:
    """(d_k, var(q·k), var(q·k/√d_k)) for random q, k with unit-variance entries: ≈ (d_k, d_k, 1)."""
    rng = np.random.default_rng(seed)
    rows = []
    for d_k in sizes:
        q, k = rng.standard_normal((2, pairs, d_k))                 # 2 × (pairs, d_k)
        dots = np.einsum("pd,pd->p", q, k)                          # (pairs,)
        rows.append((d_k, float(dots.var()), float((dots / math.sqrt(d_k)).var())))
    return rows


# ── layout ───────────────────────────────────────────────────────────────────────

def _shape(*dims) -> str:
    return str(tuple(int(d) for d in dims))


def _num(x: float, digits: int = 3) -> str:
    if np.isneginf(x):
        return "−∞"
    return f"{x:.{digits}f}" if abs(x) >= 10 ** -digits or x == 0 else f"{x:.1e}"


def _vec(x: np.ndarray, k: int = 4) -> str:
    more = ", …" if len(x) > k else ""
    return "[" + ", ".join(f"{v:+.3f}" for v in x[:k]) + more + "]"


def render(w: Walkthrough, lang: str = "en") -> list:
    """The walkthrough as rich renderables, in `lang` ("en" or "ko")."""
    from rich.rule import Rule
    from rich.table import Table
    from rich.text import Text

    check_lang(lang)
    t = TEXTS[lang]

    def say(key: str, **values) -> Text:
        return Text(t[key].format(**values))

    def table(*columns: str) -> Table:
        tab = Table(show_edge=False, pad_edge=False, box=None, padding=(0, 2))
        for c, column in enumerate(columns):
            tab.add_column(Text(column), justify="left" if c == 0 else "right")
        return tab

    def matrix(m: np.ndarray, k: int, digits: int = 2) -> Table:
        tab = table("", *[w.tokens[j] for j in range(k)])
        for i in range(k):
            tab.add_row(Text(w.tokens[i], style="bold"), *[Text(_num(m[i, j], digits)) for j in range(k)])
        return tab

    n, i, tok = w.n, w.row, w.tokens[w.row]
    out: list = [Rule(Text(t["title"].format(model=w.model, layer=w.layer, head=w.head, H=w.H), style="bold")),
                 say("formula", d_model=w.d_model, H=w.H, d_k=w.d_k)]

    out += [Rule(say("s_tokens"), align="left"), say("tokens", n=n)]
    tab = table("#", t["col_token"], t["col_id"])
    for j, (token, id_) in enumerate(zip(w.tokens, w.ids)):
        tab.add_row(Text(str(j)), Text(token), Text(str(int(id_))))
    out.append(tab)

    out += [Rule(say("s_x", layer=w.layer), align="left"), say("x", layer=w.layer, shape=_shape(n, w.d_model))]
    if w.layer == 0:
        out.append(say("x_embed", types=t["x_types"] if w.token_types else "",
                       embed_norm=t["x_embed_norm"] if w.embed_norm else ""))
    out.append(say("x_post" if w.post_norm else "x_pre", model=w.model))
    tab = table(t["col_token"], t["first_values"].format(k=4))
    for j in range(min(n, CORNER)):
        tab.add_row(Text(w.tokens[j]), Text(_vec(w.X[j])))
    out.append(tab)

    lo, hi = w.head * w.d_k, (w.head + 1) * w.d_k - 1
    x_name = "X" if w.post_norm else "Norm(X)"
    out += [Rule(say("s_qkv"), align="left"), say("library"),
            say("w_q", W=_shape(*w.W_Q), head=w.head, lo=lo, hi=hi, Wh=_shape(w.W_Q[0], w.d_k)),
            say("qkv", x_name=x_name, b=" + b" if w.qkv_bias else "", head=w.head, xs=_shape(n, w.d_model),
                ws=_shape(w.W_Q[0], w.d_k), qs=_shape(n, w.d_k), ks=_shape(n, w.d_k), vs=_shape(n, w.d_k))]
    if w.rope:
        out.append(say("rope"))
    if w.group > 1:
        out.append(say("gqa", G=w.group, head=w.head, kv=w.kv_head))
    tab = table("", t["row_of"].format(token=tok) + " · " + t["first_values"].format(k=4))
    for name, m in (("Q", w.Q), ("K", w.K), ("V", w.V)):
        tab.add_row(Text(name, style="bold"), Text(_vec(m[i])))
    out += [tab, say("qkv_check", diff=w.qkv_diff)]

    k = min(n, CORNER)
    out += [Rule(say("s_s"), align="left"),
            say("s", qs=_shape(n, w.d_k), kts=_shape(w.d_k, n), ss=_shape(n, n)), matrix(w.S_raw, k)]
    out += [Rule(say("s_scale"), align="left"), say("scale", d_k=w.d_k, sqrt=math.sqrt(w.d_k), ss=_shape(n, n))]
    if w.causal:
        out.append(say("mask"))
    out += [matrix(w.S, k), say("scale_check", diff=w.scores_diff)]

    dev = float(np.max(np.abs(w.A.sum(-1) - 1)))
    shown = range(n) if n <= 12 else sorted(np.argsort(w.A[i])[-10:])
    tab = table(t["col_key"], *[w.tokens[j] for j in shown])
    tab.add_row(Text(f"A[{tok}]", style="bold"), *[Text(_num(w.A[i, j])) for j in shown])
    j = int(np.argmax(w.A[i]))
    out += [Rule(say("s_softmax"), align="left"), say("softmax", dev=dev, ss=_shape(n, n), token=tok), tab,
            say("looks_most", token=tok, target=w.tokens[j], j=j, w=w.A[i, j])]

    top = np.argsort(w.A[i])[::-1][:3]
    terms = " + ".join(f"{w.A[i, j]:.3f}·v[{w.tokens[j]}]" for j in top) + (" + …" if n > 3 else "")
    out += [Rule(say("s_z"), align="left"), say("z", as_=_shape(n, n), vs=_shape(n, w.d_k), zs=_shape(n, w.d_k),
                                                token=tok),
            Text(f"Z[{tok}] = {terms}"), say("z_seed"), Text(f"Z[{tok}] = {_vec(w.Z[i])}"),
            say("z_check", diff=w.heads_diff)]

    out += [Rule(say("s_out", last=w.H - 1), align="left"),
            say("out", H=w.H, cs=_shape(*w.concat), ws=_shape(*w.W_O), os=_shape(n, w.d_model)),
            Text(f"(Concat·W_O)[{tok}] = {_vec(w.out[i])}"), say("out_check", diff=w.out_diff),
            say("out_post" if w.post_norm else "out_pre")]

    out += [Rule(say("s_why"), align="left"), say("why_var", N=f"{N_PAIRS:,}")]
    tab = table(t["col_dk"], t["col_var"], t["col_std"], t["col_var_scaled"])
    for d_k, var, scaled in w.variance:
        tab.add_row(Text(str(d_k)), Text(f"{var:.1f}"), Text(f"{math.sqrt(var):.2f}"), Text(f"{scaled:.3f}"))
    out += [tab, say("why_var_end"), say("why_softmax")]
    tab = table(t["col_scores"], t["col_softmax"], t["col_grad"])
    for scores, p in w.saturation:
        tab.add_row(Text("[" + ", ".join(f"{s:g}" for s in scores) + "]"),
                    Text("[" + ", ".join(_num(float(v)) for v in p) + "]"), Text(_num(float(np.max(p * (1 - p))))))
    out += [tab, say("why_softmax_end"), say("why_model", logn=math.log(n))]
    e = w.entropy
    tab = table(t["col_what"], t["col_scaled"], t["col_unscaled"])
    for key, prefix, values in (("this_head", "head_entropy", {"head": w.head}),
                                ("this_head_max", "head_max", {"head": w.head}),
                                ("all_heads", "layer_entropy", {"H": w.H, "layer": w.layer}),
                                ("all_heads_max", "layer_max", {"H": w.H, "layer": w.layer})):
        tab.add_row(say(key, **values), Text(f"{e[prefix + '_scaled']:.2f}"), Text(f"{e[prefix + '_unscaled']:.2f}"))
    out += [tab, say("why_end")]
    spaced = []
    for part in out:
        if isinstance(part, Rule) and spaced:
            spaced.append(Text(""))                               # a blank line before each step
        spaced.append(part)
    return spaced
