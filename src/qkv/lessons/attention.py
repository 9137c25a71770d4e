"""`qkv explain`: the guide's attention steps for one head of the real model, with shapes and numbers.

    X → Q, K, V → Q·Kᵀ → S = Q·Kᵀ/√d_k → A = softmax(S + M) → Z = A·V → Concat(Z)·W_O

On a decoder such as SmolLM2 it adds the steps BERT lacks: Norm(X) (RMSNorm) before the
projections, RoPE (q and k turned by their position; q·k then depends on the distance
only), GQA (query heads sharing K/V heads) and the causal mask. `walkthrough` recomputes
each step from the model's own weights and the trace of one forward pass, and checks it
equals what the model computed (a wrong explanation raises instead of printing); then it
measures why √d_k matters. This module computes; `explain_render` lays the result out with
rich, in English or Korean (the sentences live in `viz.words`, EXPLAIN).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..core.blocks import attention_mask_of, norm
from ..core.capabilities import choose_layer, require
from ..core.layer import joined as into_stream, norm_in_front
from ..models.model import Model
from ..core.ops import entropy as row_entropy, softmax
from ..core.positions import rope_attention_factor, rope_inv_freq
from ..runtime.errors import QkvError

DEFAULT_TEXT = "The cat sat on the mat"
DK_SIZES = (4, 16, 64, 256)
SOFTMAX_EXAMPLES = ((100.0, 1.0, 1.0), (10.0, 0.1, 0.1), (1.0, 0.01, 0.01))   # the guide's example, /10, /100
N_PAIRS = 10_000
ROPE_SHIFTS = (0, 10, 100, 1000)  # the relative-position demo moves q and k together by these


@dataclass
class Arch:
    """How the model is built, as far as the walkthrough needs it: its knobs and sizes."""

    name: str
    family: str
    post_norm: bool
    norm: str                    # "rms" or "layer"
    norm_eps: float
    token_types: bool            # segment embeddings (BERT)
    embed_norm: bool             # LayerNorm on the embedding (BERT)
    qkv_bias: bool
    out_bias: bool
    H: int                       # query heads
    H_kv: int                    # K/V heads
    group: int                   # query heads per K/V head (1 = plain multi-head)
    d_model: int
    d_k: int
    W_Q: tuple[int, ...]         # shape of the whole W_Q (d_model, H·d_k)
    W_K: tuple[int, ...]         # shape of the whole W_K (d_model, H_kv·d_k)
    W_O: tuple[int, ...]         # (H·d_k, d_model)
    alibi: float | None = None   # ALiBi (BLOOM, Falcon): this head's slope m_h, S += m_h·p_j; None: no ALiBi


@dataclass
class Checks:
    """The largest difference of each recomputed step from what the model computed."""

    norm: float                  # our Norm(X) − the engine's (0 for post-norm)
    qkv: float                   # X·W + b − the model's q, k, v (v only with RoPE)
    scores: float                # S + M, S = Q·Kᵀ/√d_k
    group: float                 # the group's scores recomputed with the one shared K
    heads: float                 # Z = A·V
    out: float                   # Concat(Z)·W_O + b_O


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
class WhyScale:
    """Step ⑧'s measurements: why the scores are divided by √d_k."""

    variance: list[tuple[int, float, float]]                 # (d_k, var(q·k), var(q·k/√d_k))
    saturation: list[tuple[tuple[float, ...], np.ndarray]]   # (scores, softmax(scores))
    entropy: dict[str, float]    # {head,layer}_{entropy,max}_{scaled,unscaled}


@dataclass
class Walkthrough:
    """Every number `qkv explain` prints, computed from the model (arrays in float64), step by step."""

    arch: Arch
    layer: int
    head: int
    kv_head: int
    group_heads: list[int]       # the query heads that read this head's K/V head
    row: int                     # the token whose row is shown
    tokens: list[str]            # as the tokenizer spells them ('Ġmat')
    labels: list[str]            # as a reader sees them ('␣mat'): what every table shows
    ids: np.ndarray              # (n,)
    X: np.ndarray                # (n, d_model) the residual stream entering the layer
    Xn: np.ndarray               # (n, d_model) Norm(X), what attention reads (pre-norm); X itself (post-norm)
    rope: RopeStep | None
    Q: np.ndarray                # (n, d_k) this head's queries (after RoPE where used)
    K: np.ndarray                # (n, d_k)
    V: np.ndarray                # (n, d_k)
    S_raw: np.ndarray            # (n, n) Q·Kᵀ
    S: np.ndarray                # (n, n) S + M, S = Q·Kᵀ/√d_k
    causal: bool                 # S has masked (−∞) cells
    A: np.ndarray                # (n, n) softmax(S + M)
    Z: np.ndarray                # (n, d_k) A·V
    out: np.ndarray              # (n, d_model) Concat(Z)·W_O + b_O
    checks: Checks
    why: WhyScale

    @property
    def n(self) -> int:
        return len(self.tokens)


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


WAY_OUT = ("`qkv show --head H` prints a head's weights (with its sink column), `qkv explain kv-cache` and "
           "`qkv explain gqa` a latent cache, `qkv explain linear` a linear layer's state")   # no layer to choose


def walkthrough(model: Model, text: str = DEFAULT_TEXT, layer: int = 0, head: int | None = None) -> Walkthrough:
    """Recompute one head's attention step by step and check every step against the model."""
    cfg = model.config
    layer = model.check_layer(layer)
    require(cfg, model.name, "this lesson (one head's A = softmax(X·W_Q·(X·W_K)ᵀ/√d_k) rebuilt, x + Attn(Norm(x)))",
            {"qkv_heads", "plain_softmax", "plain_block"}, layer,
            instead=choose_layer(cfg, {"qkv_heads", "plain_softmax", "plain_block"}, WAY_OUT))
    head = model.check_head(2 if cfg.n_heads > 2 else 0) if head is None else model.check_head(head)
    trace = model.run(text, layers=[layer])                          # everything kept
    lt = trace.layer(layer)
    attn = model.weights.blocks[layer].attn
    d_k, n, G = cfg.d_head, len(trace.tokens), cfg.group_size
    kv = head // G
    row = n - 1 if cfg.causal else min(3, n - 1)                    # a decoder's last token sees them all
    X = lt.residual.astype(np.float64)                              # (n, d_model)
    Xn, norm_diff = _norm_input(model, layer, lt.residual)          # (n, d_model)

    q_cols, kv_cols = slice(head * d_k, (head + 1) * d_k), slice(kv * d_k, (kv + 1) * d_k)
    Q_p, K_p = head_qk(Xn, attn, cfg, q_cols, kv_cols)              # (n, d_k) each, before RoPE
    V_p = _proj(Xn, attn.W_V, attn.b_V, kv_cols)                    # (n, d_k)
    Q, K, V = (lt.q[head].astype(np.float64), lt.k[kv].astype(np.float64),
               lt.v[kv].astype(np.float64))                         # as the model used them
    rope = None
    kind = cfg.rope_kind(layer)                                     # this layer's rotation (None: no RoPE here)
    if kind is not None:
        rope = _rope_step(Q_p, K_p, Q, K, row, cfg, kind)
        qkv_diff = _same("V", V_p, V, 1e-4)
    else:
        qkv_diff = max(_same("Q, K, V", mine, theirs, 1e-4) for mine, theirs in [(Q_p, Q), (K_p, K), (V_p, V)])

    masked = _checked_mask(lt.scores[head], cfg, layer)             # (n, n) M = −∞ here
    bias = position_bias(model, n)                                  # (H, 1, n) m_h·p_j, or 0
    S_raw = Q @ K.T                                                 # (n, n)
    S = np.where(masked, -np.inf, _scaled(S_raw, cfg) + bias[head])   # (n, n)
    scores_diff = _same("S = Q·Kᵀ/√d_k", S, lt.scores[head].astype(np.float64), 1e-5)
    if rope is not None:
        _same("q·k at its own positions", np.array(rope.relative[0][2]), S_raw[row, rope.key], 1e-4)
    group = list(range(kv * G, (kv + 1) * G))                       # the query heads reading K/V head kv
    group_diff = max(_same(f"S of head {g}", np.where(masked, -np.inf, _scaled(lt.q[g].astype(np.float64) @ K.T, cfg)
                                                      + bias[g]), lt.scores[g].astype(np.float64), 1e-5)
                     for g in group)
    A = softmax(S)                                                  # (n, n)
    _same("A", A, lt.attentions[head].astype(np.float64), 1e-5)
    Z = A @ V                                                       # (n, d_k)
    heads_diff = _same("Z", Z, lt.heads[head].astype(np.float64), 1e-4)
    out = _concat_out(lt.heads, head, Z, attn)                      # (n, d_model)
    on = model.weights.blocks[layer].attn_out_norm                  # OLMo 2: normalised before the stream
    joined = out if on is None else norm_of(out, on.weight, on.bias, cfg.norm, cfg.norm_eps)
    joined = into_stream(joined, cfg)                               # Granite: × m before the stream
    out_diff = _same("Concat·W_O", joined, lt.attn_out.astype(np.float64), 1e-4)

    return Walkthrough(
        arch=_arch(model, attn, head), layer=layer, head=head, kv_head=kv, group_heads=group, row=row,
        tokens=list(trace.tokens), labels=list(trace.labels), ids=np.asarray(trace.ids), X=X, Xn=Xn, rope=rope, Q=Q, K=K, V=V,
        S_raw=S_raw, S=S, causal=bool(masked.any()), A=A, Z=Z, out=out,
        checks=Checks(norm=norm_diff, qkv=qkv_diff, scores=scores_diff, group=group_diff, heads=heads_diff,
                      out=out_diff),
        why=WhyScale(variance=scaling_variance(), saturation=[(s, softmax(np.array(s))) for s in SOFTMAX_EXAMPLES],
                     entropy=scaling_entropy(lt.q, lt.k, lt.scores, head, G)))


def position_bias(model: Model, n: int) -> np.ndarray:
    """ALiBi's bias on S of each head for n tokens, m_h·p_j (Falcon's scaled as its scores are), as the model
    adds it: (H, 1, n) float64; zeros for a model without ALiBi (the lessons that recompute S add it)."""
    bias = attention_mask_of(model.config, np.ones((1, n), np.int64), n).position_bias
    return np.zeros((model.config.n_heads, 1, 1)) if bias is None else bias[0].astype(np.float64)


def _arch(model: Model, attn, head: int = 0) -> Arch:
    """The knobs and sizes of `model` that the walkthrough shows (`attn`: the followed layer's weights, `head`
    the followed head: its ALiBi slope)."""
    cfg = model.config
    return Arch(name=model.name, family=cfg.family, post_norm=cfg.norm_place == "post", norm=cfg.norm,
                norm_eps=cfg.norm_eps, token_types=cfg.type_vocab_size > 0, embed_norm=cfg.embed_norm,
                qkv_bias=attn.b_Q is not None, out_bias=attn.b_O is not None, H=cfg.n_heads, H_kv=cfg.n_kv_heads,
                group=cfg.group_size, d_model=cfg.d_model, d_k=cfg.d_head, W_Q=tuple(attn.W_Q.shape),
                W_K=tuple(attn.W_K.shape), W_O=tuple(attn.W_O.shape),
                alibi=float(position_bias(model, 2)[head, 0, 1]) if cfg.position == "alibi" else None)


def _norm_input(model: Model, layer: int, residual: np.ndarray) -> tuple[np.ndarray, float]:
    """(what attention reads, |ours − the engine's|): Norm(X) in a pre-norm model, X itself in a post-norm one."""
    cfg = model.config
    X = residual.astype(np.float64)                                 # (n, d_model)
    nw = norm_in_front(model.weights.blocks[layer], "attn", cfg)
    if nw is None:                                                  # post-norm, or no norm before it (OLMo 2)
        return X, 0.0
    Xn = norm_of(X, nw.weight, nw.bias, cfg.norm, cfg.norm_eps)     # (n, d_model)
    return Xn, _same("Norm(X)", Xn, norm(residual, nw, cfg).astype(np.float64), 1e-4)


def _scaled(s_raw: np.ndarray, cfg) -> np.ndarray:
    """Q·Kᵀ as the model scales it: /√d_k, or ·attn_scale (GPT-Neo 1, Gemma query_pre_attn_scalar^-½), then
    Gemma 2's soft-cap c·tanh(S/c)."""
    s = s_raw * (cfg.score_scale if cfg.score_scale is not None else 1 / math.sqrt(cfg.d_head))   # (n, n)
    return s if cfg.attn_softcap is None else cfg.attn_softcap * np.tanh(s / cfg.attn_softcap)


def _checked_mask(scores: np.ndarray, cfg, layer: int = 0) -> np.ndarray:
    """Where the model's scores are −∞ (n, n); a causal model's must be exactly above the diagonal."""
    masked = np.isneginf(scores)                                    # (n, n)
    n = len(masked)
    window = cfg.window(layer)
    if cfg.causal and (window is None or n <= window) and \
            not np.array_equal(masked, np.triu(np.ones((n, n), bool), 1)):
        raise AssertionError("explain: the causal mask is not −∞ exactly above the diagonal")
    return masked


def _concat_out(heads: np.ndarray, head: int, Z: np.ndarray, attn) -> np.ndarray:
    """Concat(Z_0 … Z_{H−1})·W_O + b_O with our Z in place of head `head`'s: (n, d_model)."""
    z_all = heads.astype(np.float64)                                # (H, n, d_k)
    z_all[head] = Z
    H, n, d_k = z_all.shape
    concat = z_all.transpose(1, 0, 2).reshape(n, H * d_k)           # (n, H·d_k)
    out = concat @ attn.W_O.astype(np.float64)                      # (n, d_model)
    return out if attn.b_O is None else out + attn.b_O


def scaling_entropy(q: np.ndarray, k: np.ndarray, scores: np.ndarray, head: int, group: int) -> dict[str, float]:
    """Mean row entropy and mean largest weight of softmax with and without 1/√d_k, for `head` and the layer.

    q (H, n, d_k), k (H_kv, n, d_k) and the model's scores (H, n, n), whose −∞ cells stay masked.
    """
    H, _, d_k = q.shape
    q_all = q.astype(np.float64)                                    # (H, n, d_k)
    k_all = k.astype(np.float64)[np.arange(H) // group]             # (H, n, d_k)
    raw_all = q_all @ k_all.transpose(0, 2, 1)                      # (H, n, n)
    mask_all = np.isneginf(scores)                                  # (H, n, n)
    entropy = {}
    for name, s in (("scaled", raw_all / math.sqrt(d_k)), ("unscaled", raw_all)):
        a = softmax(np.where(mask_all, -np.inf, s))                 # (H, n, n)
        ent, top = row_entropy(a), a.max(-1)                        # (H, n) each
        entropy |= {f"head_entropy_{name}": float(ent[head].mean()), f"head_max_{name}": float(top[head].mean()),
                    f"layer_entropy_{name}": float(ent.mean()), f"layer_max_{name}": float(top.mean())}
    return entropy


def head_qk(Xn: np.ndarray, attn, cfg, q_cols: slice, kv_cols: slice) -> tuple[np.ndarray, np.ndarray]:
    """One head's q and k before RoPE, in float64, as the model makes them: Norm(X)·W + b, then the q/k
    norms — each head's (Qwen3, Phi) or the whole projection's, before it is cut into heads (OLMo 2). A model whose
    q/k norms come after RoPE (Hunyuan) has no such q, k: refused."""
    if cfg.qk_norm_after_rope:
        raise QkvError("this model normalises q and k after RoPE (Hunyuan), so they have no normalised form before "
                       "RoPE for this lesson to rebuild; use a model whose q/k norms come first, or none")
    if cfg.qk_l2_norm or cfg.temperature_floor is not None:
        raise QkvError("this model changes q and k after RoPE (Llama 4: divided by their RMS on its RoPE layers, the "
                       "queries scaled by position on its NoPE layers), so they have no form before RoPE for this "
                       "lesson to rebuild; `qkv show` prints its weights, `qkv explain kv-cache` its cache")
    if cfg.qk_norm == "all":
        q = norm_of(_proj(Xn, attn.W_Q, attn.b_Q, slice(None)), attn.q_norm.weight, None, cfg.norm, cfg.norm_eps)
        k = norm_of(_proj(Xn, attn.W_K, attn.b_K, slice(None)), attn.k_norm.weight, None, cfg.norm, cfg.norm_eps)
        return q[:, q_cols], k[:, kv_cols]                          # (n, d_k) each
    q, k = _proj(Xn, attn.W_Q, attn.b_Q, q_cols), _proj(Xn, attn.W_K, attn.b_K, kv_cols)
    if cfg.qk_norm == "head":
        q = norm_of(q, *_head_norm(attn.q_norm, q_cols, cfg.d_head), cfg.norm, cfg.norm_eps)
        k = norm_of(k, *_head_norm(attn.k_norm, kv_cols, cfg.d_head), cfg.norm, cfg.norm_eps)
    return q, k


def _head_norm(w, cols: slice, d_k: int) -> tuple[np.ndarray, np.ndarray | None]:
    """γ, β of the head whose columns are COLS: the shared (d_k,) ones, or its own row of (H, d_k) (StableLM)."""
    if w.weight.ndim == 1:
        return w.weight, w.bias
    h = cols.start // d_k
    return w.weight[h], None if w.bias is None else w.bias[h]


def norm_of(x: np.ndarray, g: np.ndarray, b: np.ndarray | None, kind: str, eps: float) -> np.ndarray:
    """RMSNorm(x) = x / √(mean(x²) + ε) · g, or LayerNorm(x) = (x − mean(x)) / √(var(x) + ε) · g + b."""
    if kind == "rms":
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * g               # (n, d_model)
    xc = x - x.mean(-1, keepdims=True)                                              # (n, d_model)
    y = xc / np.sqrt((xc * xc).mean(-1, keepdims=True) + eps) * g
    return y if b is None else y + b


def rope_rotate(x: np.ndarray, positions: np.ndarray, omega: np.ndarray, interleaved: bool = False) -> np.ndarray:
    """RoPE: each pair (x_i, x_{i+d/2}) of a row at position p turned by the angle p·ω_i (guide: positions).

    (x_i, x_{i+d/2}) → (x_i·cos − x_{i+d/2}·sin, x_i·sin + x_{i+d/2}·cos), the rotate-half form;
    interleaved (GPT-J, Cohere), the pair is (x_{2i}, x_{2i+1}) instead.
    With fewer speeds ω than half the row (GPT-NeoX's partial rotary: d_rot = 2·len(ω) < d), only the
    first d_rot numbers turn; the rest pass unchanged.
    """
    half = len(omega)                                               # d_rot / 2
    angle = np.asarray(positions, np.float64)[:, None] * omega      # (n, d_rot/2)
    c, s = np.cos(angle), np.sin(angle)                             # (n, d_rot/2) each
    if interleaved:
        x1, x2 = x[..., 0:2 * half:2], x[..., 1:2 * half:2]         # (n, d_rot/2) each
        turned = np.stack([x1 * c - x2 * s, x1 * s + x2 * c], axis=-1).reshape(*x1.shape[:-1], 2 * half)
        return np.concatenate([turned, x[..., 2 * half:]], axis=-1)   # (n, d)
    x1, x2 = x[..., :half], x[..., half:2 * half]                   # (n, d_rot/2) each
    return np.concatenate([x1 * c - x2 * s, x1 * s + x2 * c, x[..., 2 * half:]], axis=-1)   # (n, d)


def scaled_turn(turned: np.ndarray, x: np.ndarray, a: float, cfg) -> np.ndarray:
    """TURNED (n, d) with its turned part times A (YaRN's and LongRoPE's attention factor multiplies cos and sin,
    so the turned numbers; a partial rotary's rest passes as it is)."""
    if a == 1.0:
        return turned
    r = 2 * ((cfg.rotary_dim or x.shape[-1]) // 2)
    return np.concatenate([turned[..., :r] * a, turned[..., r:]], axis=-1)    # (n, d)


def _rope_step(Q_p: np.ndarray, K_p: np.ndarray, Q: np.ndarray, K: np.ndarray, row: int, cfg,
               kind: str = "global") -> RopeStep:
    """Rotate this head's q and k ourselves, check against the model's, and move q and k together. kind: the
    layer's rotation, "local" for Gemma 3's sliding layers (their own base)."""
    theta, scaling = ((cfg.local_rope_theta, cfg.local_rope_scaling) if kind == "local"
                      else (cfg.rope_theta, cfg.rope_scaling))
    omega = rope_inv_freq(cfg.rotary_dim or cfg.d_head, theta, scaling, np.float64,
                          length=len(Q_p))                                              # (d_rot/2,)
    pos = np.arange(len(Q_p))                                                           # (n,) 0..n−1
    turn, a = cfg.rope_interleaved, rope_attention_factor(scaling)   # YaRN, LongRoPE: cos and sin × a
    diff = max(_same("RoPE(Q)", scaled_turn(rope_rotate(Q_p, pos, omega, turn), Q_p, a, cfg), Q, 1e-4),
               _same("RoPE(K)", scaled_turn(rope_rotate(K_p, pos, omega, turn), K_p, a, cfg), K, 1e-4))
    key = max(row - 2, 0)
    dist = row - key
    places = [(row + s, key + s) for s in ROPE_SHIFTS] + [(row, row), (row + 5, key)]
    relative = [(m, p, float(scaled_turn(rope_rotate(Q_p[row:row + 1], np.array([m]), omega, turn), Q_p, a, cfg)[0]
                             @ scaled_turn(rope_rotate(K_p[key:key + 1], np.array([p]), omega, turn), K_p, a, cfg)[0]))
                for m, p in places]
    same = [dot for m, p, dot in relative if m - p == dist]
    spread = max(same) - min(same)
    if spread > 1e-6 * max(1.0, abs(same[0])):
        raise AssertionError(f"explain: q·k after RoPE changed by {spread:.2e} at the same distance")
    return RopeStep(theta=theta, omega=omega, Q_pre=Q_p, K_pre=K_p, diff=diff, key=key,
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
