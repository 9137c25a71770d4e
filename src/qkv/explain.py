"""`qkv explain`: the seeds' attention steps for one head of the real model, with shapes and numbers.

    X → Q, K, V → S = Q·Kᵀ → S/√d_k → A = softmax(·) → Z = A·V → Concat(Z)·W_O

On a decoder such as SmolLM2 it adds the steps BERT lacks: Norm(X) (RMSNorm) before the
projections, RoPE (q and k turned by their position; q·k then depends on the distance
only), GQA (query heads sharing K/V heads) and the causal mask. `walkthrough` recomputes each step from the model's own weights and the trace of one
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
from .positions import rope_inv_freq

DEFAULT_TEXT = "The cat sat on the mat"
DK_SIZES = (4, 16, 64, 256)
SOFTMAX_EXAMPLES = ((100.0, 1.0, 1.0), (10.0, 0.1, 0.1), (1.0, 0.01, 0.01))   # the seeds' example, /10, /100
N_PAIRS = 10_000
CORNER = 4                       # rows and columns of S shown (a causal S up to 8 tokens: all of it)
ROPE_SHIFTS = (0, 10, 100, 1000)  # the relative-position demo moves q and k together by these


@dataclass
class RopeStep:
    """RoPE on this head: the unrotated q and k, the rotation recomputed, and q·k at shifted positions."""

    theta: float
    omega: np.ndarray            # (d_k/2,) radians per position of each pair (i, i + d_k/2)
    Q_pre: np.ndarray            # (n, d_k) this head's queries before the rotation
    K_pre: np.ndarray            # (n, d_k)
    diff: float                  # |RoPE(Q_pre), RoPE(K_pre) − the model's q, k|
    key: int                     # the key token of the relative-position demo
    relative: list[tuple[int, int, float]]   # (position of q, position of k, q·k after RoPE)
    spread: float                # largest difference of q·k between rows with the same m − n


@dataclass
class Walkthrough:
    """Every number `qkv explain` prints, computed from the model (arrays in float64)."""

    model: str
    family: str
    post_norm: bool
    norm: str                    # "rms" or "layer"
    norm_eps: float
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
    Xn: np.ndarray               # (n, d_model) Norm(X), what attention reads (pre-norm); X itself (post-norm)
    norm_diff: float             # |our Norm(X) − the engine's|
    rope: RopeStep | None
    H_kv: int
    W_K: tuple[int, ...]         # shape of the whole W_K (d_model, H_kv·d_k)
    group_heads: list[int]       # the query heads that read this head's K/V head
    group_diff: float            # their scores recomputed with the one shared K − the model's
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
    out_bias: bool
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
    d_k, H, n = cfg.d_head, cfg.n_heads, len(trace.tokens)
    G = cfg.group_size
    kv = head // G
    row = n - 1 if cfg.causal else min(3, n - 1)                    # a decoder's last token sees them all
    X = lt.residual.astype(np.float64)                              # (n, d_model)
    x_in, norm_diff = X, 0.0
    if cfg.norm_place == "pre":
        nw = model.weights.blocks[layer].attn_norm
        x_in = norm_of(X, nw.weight, nw.bias, cfg.norm, cfg.norm_eps)              # (n, d_model)
        norm_diff = _same("Norm(X)", x_in, norm(lt.residual, nw, cfg).astype(np.float64), 1e-4)
    q_cols, kv_cols = slice(head * d_k, (head + 1) * d_k), slice(kv * d_k, (kv + 1) * d_k)
    Q_p, K_p, V_p = (_proj(x_in, w.W_Q, w.b_Q, q_cols), _proj(x_in, w.W_K, w.b_K, kv_cols),
                     _proj(x_in, w.W_V, w.b_V, kv_cols))            # 3 × (n, d_k)
    Q, K, V = (lt.q[head].astype(np.float64), lt.k[kv].astype(np.float64),
               lt.v[kv].astype(np.float64))                         # as the model used them
    rope = None
    if cfg.position == "rope":
        rope = _rope_step(Q_p, K_p, Q, K, row, cfg)
        qkv_diff = _same("V", V_p, V, 1e-4)
    else:
        qkv_diff = max(_same("Q, K, V", mine, theirs, 1e-4) for mine, theirs in [(Q_p, Q), (K_p, K), (V_p, V)])

    masked = np.isneginf(lt.scores[head])                           # (n, n) M = −∞ here
    if cfg.causal and (cfg.sliding_window is None or n <= cfg.sliding_window) and \
            not np.array_equal(masked, np.triu(np.ones((n, n), bool), 1)):
        raise AssertionError("explain: the causal mask is not −∞ exactly above the diagonal")
    S_raw = Q @ K.T                                                 # (n, n)
    S = np.where(masked, -np.inf, S_raw / math.sqrt(d_k))           # (n, n)
    scores_diff = _same("S/√d_k", S, lt.scores[head].astype(np.float64), 1e-5)
    if rope is not None:
        _same("q·k at its own positions", np.array(rope.relative[0][2]), S_raw[row, rope.key], 1e-4)
    group = list(range(kv * G, (kv + 1) * G))                       # the query heads reading K/V head kv
    group_diff = max(_same(f"S of head {g}", np.where(masked, -np.inf, lt.q[g].astype(np.float64) @ K.T
                                                      / math.sqrt(d_k)), lt.scores[g].astype(np.float64), 1e-5)
                     for g in group)
    A = softmax(S)                                                  # (n, n)
    _same("A", A, lt.attentions[head].astype(np.float64), 1e-5)
    Z = A @ V                                                       # (n, d_k)
    heads_diff = _same("Z", Z, lt.heads[head].astype(np.float64), 1e-4)
    z_all = lt.heads.astype(np.float64)                             # (H, n, d_k)
    z_all[head] = Z
    concat = z_all.transpose(1, 0, 2).reshape(n, H * d_k)           # (n, H·d_k)
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
        model=model.name, family=cfg.family, post_norm=cfg.norm_place == "post", norm=cfg.norm,
        norm_eps=cfg.norm_eps, causal=bool(masked.any()), token_types=cfg.type_vocab_size > 0,
        qkv_bias=w.b_Q is not None, embed_norm=cfg.embed_norm, layer=layer,
        head=head, kv_head=kv, group=G, H=H, d_model=cfg.d_model, d_k=d_k, tokens=list(trace.tokens),
        ids=np.asarray(trace.ids), X=X, Xn=x_in, norm_diff=norm_diff, rope=rope, H_kv=cfg.n_kv_heads,
        W_K=tuple(w.W_K.shape), group_heads=group, group_diff=group_diff, W_Q=tuple(w.W_Q.shape),
        Q=Q, K=K, V=V, qkv_diff=qkv_diff, S_raw=S_raw, S=S, scores_diff=scores_diff, A=A, Z=Z,
        heads_diff=heads_diff, concat=concat.shape, W_O=tuple(w.W_O.shape), out=out, out_diff=out_diff, row=row,
        out_bias=w.b_O is not None, variance=scaling_variance(),
        saturation=[(s, softmax(np.array(s))) for s in SOFTMAX_EXAMPLES], entropy=entropy)


def norm_of(x: np.ndarray, g: np.ndarray, b: np.ndarray | None, kind: str, eps: float) -> np.ndarray:
    """RMSNorm(x) = x / √(mean(x²) + ε) · g, or LayerNorm(x) = (x − mean(x)) / √(var(x) + ε) · g + b."""
    if kind == "rms":
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * g               # (n, d_model)
    xc = x - x.mean(-1, keepdims=True)                                              # (n, d_model)
    y = xc / np.sqrt((xc * xc).mean(-1, keepdims=True) + eps) * g
    return y if b is None else y + b


def rope_rotate(x: np.ndarray, positions: np.ndarray, omega: np.ndarray) -> np.ndarray:
    """RoPE: each pair (x_i, x_{i+d/2}) of a row at position p turned by the angle p·ω_i (seeds §1).

    (x_i, x_{i+d/2}) → (x_i·cos − x_{i+d/2}·sin, x_i·sin + x_{i+d/2}·cos), the rotate-half form.
    """
    half = x.shape[-1] // 2
    angle = np.asarray(positions, np.float64)[:, None] * omega      # (n, d/2)
    c, s = np.cos(angle), np.sin(angle)                             # (n, d/2) each
    x1, x2 = x[..., :half], x[..., half:]                           # (n, d/2) each
    return np.concatenate([x1 * c - x2 * s, x1 * s + x2 * c], axis=-1)   # (n, d)


def _rope_step(Q_p: np.ndarray, K_p: np.ndarray, Q: np.ndarray, K: np.ndarray, row: int, cfg) -> RopeStep:
    """Rotate this head's q and k ourselves, check against the model's, and move q and k together."""
    omega = rope_inv_freq(cfg.d_head, cfg.rope_theta, cfg.rope_scaling, np.float64)     # (d_k/2,)
    pos = np.arange(len(Q_p))                                                           # (n,) 0..n−1
    diff = max(_same("RoPE(Q)", rope_rotate(Q_p, pos, omega), Q, 1e-4),
               _same("RoPE(K)", rope_rotate(K_p, pos, omega), K, 1e-4))
    key = max(row - 2, 0)
    dist = row - key
    places = [(row + s, key + s) for s in ROPE_SHIFTS] + [(row, row), (row + 5, key)]
    relative = [(m, p, float(rope_rotate(Q_p[row:row + 1], np.array([m]), omega)[0]
                             @ rope_rotate(K_p[key:key + 1], np.array([p]), omega)[0])) for m, p in places]
    same = [dot for m, p, dot in relative if m - p == dist]
    spread = max(same) - min(same)
    if spread > 1e-6 * max(1.0, abs(same[0])):
        raise AssertionError(f"explain: q·k after RoPE changed by {spread:.2e} at the same distance")
    return RopeStep(theta=cfg.rope_theta, omega=omega, Q_pre=Q_p, K_pre=K_p, diff=diff, key=key,
                    relative=relative, spread=spread)


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
    if any(token.startswith("Ġ") for token in w.tokens):
        out.append(say("tokens_bpe"))

    out += [Rule(say("s_x", layer=w.layer), align="left"), say("x", layer=w.layer, shape=_shape(n, w.d_model))]
    if w.layer == 0:
        out.append(say("x_embed_rope") if w.rope else say("x_embed", types=t["x_types"] if w.token_types else "",
                       embed_norm=t["x_embed_norm"] if w.embed_norm else ""))
    out.append(say("x_post" if w.post_norm else "x_pre", model=w.model))
    tab = table(t["col_token"], t["first_values"].format(k=4))
    for j in range(min(n, CORNER)):
        tab.add_row(Text(w.tokens[j]), Text(_vec(w.X[j])))
    out.append(tab)
    if not w.post_norm:
        out += _norm_part(w, t, say, table)

    lo, hi = w.head * w.d_k, (w.head + 1) * w.d_k - 1
    x_name = "X" if w.post_norm else "Norm(X)"
    out += [Rule(say("s_qkv"), align="left"), say("library"),
            say("w_q", W=_shape(*w.W_Q), head=w.head, lo=lo, hi=hi, Wh=_shape(w.W_Q[0], w.d_k)),
            say("qkv", x_name=x_name, b=" + b" if w.qkv_bias else "", head=w.head, xs=_shape(n, w.d_model),
                ws=_shape(w.W_Q[0], w.d_k), qs=_shape(n, w.d_k), ks=_shape(n, w.d_k), vs=_shape(n, w.d_k))]
    tab = table("", t["row_of"].format(token=tok) + " · " + t["first_values"].format(k=4))
    Q, K = (w.rope.Q_pre, w.rope.K_pre) if w.rope else (w.Q, w.K)
    for name, m in (("Q", Q), ("K", K), ("V", w.V)):
        tab.add_row(Text(name, style="bold"), Text(_vec(m[i])))
    out += [tab, say("qkv_check_rope" if w.rope else "qkv_check", diff=w.qkv_diff)]
    if w.rope:
        out += _rope_part(w, t, say, table)
    if w.group > 1:
        out += _gqa_part(w, t, say, table)

    k = min(n, 8 if w.causal else CORNER)
    corner = t["whole"] if k == n else t["corner"]
    out += [Rule(say("s_s"), align="left"),
            say("s", qs=_shape(n, w.d_k), kts=_shape(w.d_k, n), ss=_shape(n, n), corner=corner), matrix(w.S_raw, k)]
    out += [Rule(say("s_scale"), align="left"),
            say("scale", d_k=w.d_k, sqrt=math.sqrt(w.d_k), ss=_shape(n, n), corner=corner)]
    if w.causal:
        out.append(say("mask", masked=int(np.isneginf(w.S).sum()), total=n * n))
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
            say("out", H=w.H, cs=_shape(*w.concat), ws=_shape(*w.W_O), os=_shape(n, w.d_model),
                b=" + b_O" if w.out_bias else ""),
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


def _norm_part(w: Walkthrough, t: dict, say, table) -> list:
    """①a: Norm(X), the input of the projections in a pre-norm model."""
    from rich.rule import Rule
    from rich.text import Text

    i, x = w.row, w.X[w.row]
    name = "RMSNorm" if w.norm == "rms" else "LayerNorm"
    scale = math.sqrt(float(np.mean(x * x)) + w.norm_eps) if w.norm == "rms" else \
        math.sqrt(float(np.var(x)) + w.norm_eps)
    out = [Rule(say("s_norm", name=name), align="left"),
           say("norm_rms" if w.norm == "rms" else "norm_layer", eps=w.norm_eps, gs=_shape(w.d_model),
               token=w.tokens[i], mean=float(np.mean(x)), scale=scale)]
    tab = table("", t["row_of"].format(token=w.tokens[i]) + " · " + t["first_values"].format(k=4))
    tab.add_row(Text("X", style="bold"), Text(_vec(x)))
    tab.add_row(Text(f"{name}(X)", style="bold"), Text(_vec(w.Xn[i])))
    return out + [tab, say("norm_check", name=name, diff=w.norm_diff)]


def _rope_part(w: Walkthrough, t: dict, say, table) -> list:
    """②a: RoPE turns q and k by their position; q·k then depends on the distance only."""
    from rich.rule import Rule
    from rich.text import Text

    r, i, half = w.rope, w.row, w.d_k // 2
    q0, q1 = r.Q_pre[i], w.Q[i]                                      # (d_k,) before and after
    out = [Rule(say("s_rope"), align="left"),
           say("rope_what", d_k=w.d_k, pairs=half, theta=r.theta, w0=float(r.omega[0]), last=half - 1,
               wl=float(r.omega[-1]))]
    tab = table("", t["row_of"].format(token=w.tokens[i]) + " · " + t["first_values"].format(k=4),
                t["col_pair"].format(a=0, b=half), t["col_pair"].format(a=half - 1, b=w.d_k - 1), "|q|")
    for name, q in ((t["before"], q0), (t["after"], q1)):
        tab.add_row(Text(name, style="bold"), Text(_vec(q)), Text(f"({q[0]:+.3f}, {q[half]:+.3f})"),
                    Text(f"({q[half - 1]:+.3f}, {q[-1]:+.3f})"), Text(f"{np.linalg.norm(q):.3f}"))
    out += [say("rope_pair", token=w.tokens[i], p=i, a0=i * float(r.omega[0]), al=i * float(r.omega[-1])), tab,
            say("rope_check", diff=r.diff),
            say("rope_relative", q=w.tokens[i], k=w.tokens[r.key])]
    tab = table(t["col_qpos"], t["col_kpos"], "m − n", "q·k")
    for m, p, dot in r.relative:
        tab.add_row(Text(str(m)), Text(str(p)), Text(str(m - p)), Text(f"{dot:.4f}"))
    return out + [tab, say("rope_relative_end", spread=r.spread, q=w.tokens[i], k=w.tokens[r.key])]


def _gqa_part(w: Walkthrough, t: dict, say, table) -> list:
    """②b: GQA, H query heads reading H_kv shared K/V heads."""
    from rich.rule import Rule
    from rich.text import Text

    G = w.group
    out = [Rule(say("s_gqa", H=w.H, H_kv=w.H_kv), align="left"),
           say("gqa_what", wq=_shape(*w.W_Q), wk=_shape(*w.W_K), H=w.H, H_kv=w.H_kv, n=w.n, G=G,
               qs=_shape(w.H, w.n, w.d_k), ks=_shape(w.H_kv, w.n, w.d_k))]
    tab = table(t["col_kv_head"], t["col_query_heads"])
    for kv in range(w.H_kv):
        heads = ", ".join(f"[{h}]" if h == w.head else str(h) for h in range(kv * G, (kv + 1) * G))
        tab.add_row(Text(str(kv), style="bold" if kv == w.kv_head else ""), Text(heads))
    others = ", ".join(str(h) for h in w.group_heads if h != w.head)
    return out + [tab, say("gqa_follow", head=w.head, kv=w.kv_head, others=others, H=w.H, H_kv=w.H_kv, G=G),
                  say("gqa_check", heads=", ".join(map(str, w.group_heads)), diff=w.group_diff)]
