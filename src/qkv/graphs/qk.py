"""QK attribution: why a head attended from query position i to key position j, as a bilinear table over the
graph's nodes (beyond circuit-tracer, whose edges through attention hold the patterns fixed and say nothing of
why they are what they are).

In the local replacement model (qkv.graphs.replacement: patterns, norm scales and error nodes frozen) the stream
entering layer L is a sum over the upstream nodes, each through a linear map, plus a constant (the biases):

    x_p = Σ_s x_p^(s) + c_p          s: token embeddings (E), active features (F), error nodes (R) of layers < L

and the head's query and key are affine in that stream, through what the real pass froze:

    q_i = RoPE_i( qnorm_s( Norm_s(x_i)·W_Q^h + b_Q^h ) )      the attention norm dividing by the real pass's
    k_j = RoPE_j( knorm_s( Norm_s(x_j)·W_K^g + b_K^g ) )      scale; a q/k norm (Qwen3, OLMo 2) by the scale the
                                                               real q_i, k_j had; g the head's K/V head (GQA)

so each source s has a query part q^(s) and a key part k^(t), the constants ("bias": every bias and norm offset,
the transcoders' b_dec) one more of each, and the head's score splits exactly:

    S_ij = scale·q_i·k_j = Σ_s Σ_t T[s, t],      T[s, t] = scale·q^(s)·k^(t)

A position bias (ALiBi) is added after it, a separate constant; a soft-cap (Gemma 2) is applied to the table's
sum, S = c·tanh(Σ T / c) + bias: the table splits the score before its cap.

The parts come from the frozen system by one of two roads, equal up to rounding (tests/test_graph_qk.py):
  forward   (`stream_parts`, the plain form) a batched frozen pass whose rows each carry one source (its embedding
            entering block 0, or its vector added to its layer's ffn_out); a row with nothing gives the constant
            every row shares, which is subtracted. Cost: a pass of (sources + 3) rows over positions 0..max(i, j)
            and layers 0..L-1: seconds for a pruned graph's few hundred nodes, minutes for every node of SmolLM2.
  backward  (`backward_parts`, the default) one backward sweep of 2·d_k rows (the query's and the key's
            coordinates) through the frozen boxes gives, for every layer and position, the map from what a source
            writes there to q_i and k_j; each source is then one small product.
Nodes not asked for are summed in one "rest" row, so the table still sums to the score.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable

import numpy as np

from ..core import blocks_backward as back
from ..core.blocks import attention_mask_of, norm_by, norm_scale
from ..core.hooks import Hooks
from ..core.layer import norm_in_front
from ..core.positions import apply_rope, rope_attention_factor, rope_cos_sin
from ..core.stack import rope_speeds, transformer
from ..core.trace import Recorder
from ..core.weights import NormWeights
from ..runtime.errors import QkvError, check_index
from .files import token_text
from .replacement import Replacement

BIAS, REST = "bias", "rest"
CHUNK = 256                                   # rows of the batched frozen pass at a time


@dataclass
class QKTable:
    """One head's score at (query i, key j) split over the query side's and the key side's sources."""

    layer: int
    head: int
    query: int                                # i
    key: int                                  # j
    queries: list[str]                        # (S,) the query side's sources: node ids ("E:3", "F:1:3:12", "R:0:2"),
    keys: list[str]                           # (T,) the key side's;  then "rest" (nodes not asked for), "bias"
    table: np.ndarray                         # (S, T) T[s, t] = scale·q^(s)·k^(t)
    score: float                              # the real pass's S_ij (recorded "scores": capped, + position bias)
    position_bias: float = 0.0                # ALiBi's slope × distance, added after the cap (0: none)
    cap: float | None = None                  # Gemma 2's soft-cap c (None: none)
    tokens: list[str] | None = None          # (n,) the prompt's tokens as text

    @property
    def total(self) -> float:
        """Σ T: the score before its cap and position bias."""
        return float(self.table.sum())

    @property
    def rebuilt(self) -> float:
        """The score from the table: c·tanh(Σ T / c) (a cap) + the position bias."""
        t = self.total
        return (t if self.cap is None else self.cap * math.tanh(t / self.cap)) + self.position_bias

    @property
    def error(self) -> float:
        """|rebuilt − score|: 0 up to rounding (the sum check)."""
        return abs(self.rebuilt - self.score)

    def top(self, k: int = 10) -> list[tuple[str, str, float]]:
        """The K entries largest in |T|: (query source, key source, value)."""
        flat = np.argsort(-np.abs(self.table), axis=None, kind="stable")[:k]
        return [(self.queries[a], self.keys[b], float(self.table[a, b]))
                for a, b in zip(*np.unravel_index(flat, self.table.shape))]

    def sides(self, k: int = 5) -> tuple[list[tuple[str, float]], list[tuple[str, float]]]:
        """Each side's K sources largest in |share|: a query source's row sum scale·q^(s)·k_j (its part of the
        score with the whole key), a key source's column sum scale·q_i·k^(t)."""
        rows, cols = self.table.sum(axis=1), self.table.sum(axis=0)
        def pick(v: np.ndarray, names: list[str]) -> list[tuple[str, float]]:
            return [(names[i], float(v[i])) for i in np.argsort(-np.abs(v), kind="stable")[:k]]
        return pick(rows, self.queries), pick(cols, self.keys)

    def label(self, node: str) -> str:
        """A node id with the token at its position: 'F:1:3:12 "cat"'."""
        if self.tokens is None or node in (BIAS, REST):
            return node
        return f"{node} {self.tokens[_position(node)]!r}"

    def text(self, k: int = 10) -> str:
        """What `qkv graph … --qk` prints: the top entries, each side's top sources and the sum check."""
        at = (f" ({self.tokens[self.query]!r} → {self.tokens[self.key]!r})" if self.tokens else "")
        lines = [f"layer {self.layer} head {self.head}: query {self.query} → key {self.key}{at}, score "
                 f"{self.score:.6g} = Σ q^(s)·k^(t)·scale over {len(self.queries)} × {len(self.keys)} sources"]
        lines += [f"  {v:+10.4f}  {self.label(a)}  ·  {self.label(b)}" for a, b, v in self.top(k)]
        q, kk = self.sides(min(k, 5))
        lines.append("  query side: " + ", ".join(f"{self.label(a)} {v:+.4f}" for a, v in q))
        lines.append("  key side:   " + ", ".join(f"{self.label(a)} {v:+.4f}" for a, v in kk))
        extra = (f", cap {self.cap:g}: c·tanh(Σ/c)" if self.cap is not None else "") + (
            f", position bias {self.position_bias:+.6g}" if self.position_bias else "")
        lines.append(f"  sum check: Σ T = {self.total:.10g}{extra} → {self.rebuilt:.10g}; the pass's score "
                     f"{self.score:.10g} (|difference| {self.error:.1e})")
        return "\n".join(lines)


def parse_pair(spec: str) -> tuple[int, int, int, int]:
    """'L:H@i,j' (e.g. '3:5@7,2') → (layer, head, query i, key j), or one QkvError."""
    try:
        lh, ij = spec.split("@")
        layer, head = (int(t) for t in lh.split(":"))
        i, j = (int(t) for t in ij.split(","))
    except ValueError:
        raise QkvError(f"cannot read the head and positions {spec!r}; write LAYER:HEAD@QUERY,KEY, e.g. 3:5@7,2"
                       ) from None
    return layer, head, i, j


# ── the sources: which rows the batched pass carries ─────────────────────────────

def sources(rep: Replacement, layer: int, m: int, nodes: Iterable[str] | None = None) -> list[str]:
    """The node ids upstream of LAYER at positions < M (embeddings, active features, error nodes of layers < LAYER),
    all of them or those among NODES."""
    found = [f"E:{p}" for p in range(m)]
    for l in range(layer):
        for p in range(m):
            found += [f"F:{l}:{p}:{f}" for f in np.flatnonzero(rep.acts[l][p])]
            found.append(f"R:{l}:{p}")
    if nodes is None:
        return found
    wanted = set(nodes)
    return [s for s in found if s in wanted]


def _injections(rep: Replacement, names: list[str], layer: int, m: int, rest: bool
                ) -> tuple[np.ndarray, list[np.ndarray]]:
    """Each row's input: (embedding entering block 0 (R, m, d), per layer < LAYER what joins its ffn_out (R, m, d)),
    for the rows NAMES, then "rest" (everything not named, if REST), then "bias" (b_dec at every layer and
    position; at a held position its real ffn_out) and a row of nothing (the shared constant)."""
    d = rep.embeddings.shape[1]
    R = len(names) + rest + 2
    x0 = np.zeros((R, m, d))                                                # (R, m, d)
    inj = [np.zeros((R, m, d)) for _ in range(layer)]                       # L' × (R, m, d)
    W = [rep.transcoders[l].params["W_dec"] for l in range(layer)]
    for r, name in enumerate(names):
        kind, *at = name.split(":")
        if kind == "E":
            x0[r, int(at[0])] = rep.embeddings[int(at[0])]
        elif kind == "F":
            l, p, f = map(int, at)
            inj[l][r, p] = rep.acts[l][p, f] * W[l][f]
        else:
            l, p = map(int, at)
            inj[l][r, p] = rep.errors[l][p]
    if rest:                                                                # all minus the named
        x0[-3] = rep.embeddings[:m] - x0[:-3].sum(axis=0)
        for l in range(layer):
            inj[l][-3] = rep.acts[l][:m] @ W[l] + rep.errors[l][:m] - inj[l][:-3].sum(axis=0)
    for l in range(layer):
        inj[l][-2] = rep.hold(l, np.broadcast_to(rep.transcoders[l].params["b_dec"], (m, d)))[:m]   # held: the real
    return x0, inj                                                          # ffn_out there, a constant


def stream_parts(rep: Replacement, layer: int, m: int, names: list[str], rest: bool) -> np.ndarray:
    """The stream entering LAYER at positions < M split by source: (R, m, d) for NAMES, then "rest" (if REST),
    then "bias" (the constant: the stream of the replacement model with no node), by batched frozen passes
    (patterns and norm scales held at the real pass's, each row's skip path x·W_skip live on its own ffn_in).
    The rows sum to the real stream (up to rounding)."""
    model = rep.model
    x0, inj = _injections(rep, names, layer, m, rest)
    hooks = {f"{l}.attentions": _const(a[None, :, :m, :m]) for l, a in enumerate(rep.attentions)}
    hooks |= {key: _const(s[None, :m]) for key, s in rep.scales.items()}
    out = []
    for lo in range(0, len(x0), CHUNK):
        rows = slice(lo, lo + CHUNK)
        seen: dict[int, np.ndarray] = {}

        def read(x, l):
            seen[l] = x                                                     # (B, m, d)
            return None

        def write(_, l, rows=rows):
            skip = rep.transcoders[l].params.get("W_skip")
            x = seen.pop(l)
            return inj[l][rows] if skip is None else inj[l][rows] + rep.release(x @ skip)   # (B, m, d)

        spec = hooks | {"ffn_in": read, "ffn_out": write}
        x, _ = transformer(model.weights, model.config, None, np.ones(x0[rows].shape[:2], np.int64),
                           hooks=Hooks(spec, model.config, model.name), stream=x0[rows], stop=layer)
        out.append(x)                                                       # (B, m, d) entering LAYER
    parts = np.concatenate(out)                                             # (R, m, d)
    return np.concatenate([parts[:-2] - parts[-1], parts[-2:-1]])          # sources − the shared constant; bias


def _const(value: np.ndarray):
    return lambda _, layer: value


# ── the head's query and key, affine in the stream ──────────────────────────────

def _head_norm(w: NormWeights, head: int) -> NormWeights:
    """A per-head q/k norm's weights for one head: its row of an (H, d_k) table (StableLM), or the one (d_k,)."""
    if w.weight.ndim == 2:
        return NormWeights(w.weight[head], None if w.bias is None else w.bias[head])
    return w


def projected(rep: Replacement, layer: int, head: int, side: str, x: np.ndarray, position: int,
              real: np.ndarray, biased: bool = True) -> np.ndarray:
    """The frozen affine map from the stream at POSITION (rows x (R, d)) to a head's query (side "q", HEAD a
    query head) or key (side "k", HEAD its K/V head), RoPE included: (R, d_k). real (d,): what attention read
    there in the real pass (attn_in), whose projection gives a q/k norm its frozen scale (so the norm divides
    every row by the number the real q or k was divided by: linear, and the rows still sum to the real one).
    biased: with the constants (the norms' β, b_Q or b_K); False: the map's linear part (a source's share)."""
    cfg, w = rep.model.config, rep.model.weights.blocks[layer]
    a, dk = w.attn, cfg.d_head
    front = norm_in_front(w, "attn", cfg)
    if front is not None:
        s = rep.scales[f"{layer}.attn_norm_scale"][position]
        x = norm_by(x, np.full(len(x), s), _keep(front, biased), cfg)     # (R, d) what attention reads
    W, b, qk_norm = (a.W_Q, a.b_Q, a.q_norm) if side == "q" else (a.W_K, a.b_K, a.k_norm)
    full = cfg.qk_norm == "all"                                          # OLMo 2: one norm over all heads
    cut = slice(None) if full else slice(head * dk, (head + 1) * dk)
    y = x @ W[:, cut]                                                    # (R, d_k), or (R, H·d_k) when full
    if b is not None and biased:
        y = y + b[cut]
    after = cfg.qk_norm_after_rope                                       # Hunyuan: the norm follows RoPE
    if cfg.qk_norm is not None and not after:
        r = real @ W[:, cut] + (0 if b is None else b[cut])              # the real pass's, before its norm
        g = _keep(qk_norm if full else _head_norm(qk_norm, head), biased)
        y = norm_by(y, np.full(len(y), norm_scale(r, cfg)), g, cfg)
    if full:
        y = y[:, head * dk:(head + 1) * dk]                              # (R, d_k)
    rope = _rotation(rep, layer, position)
    y = y if rope is None else apply_rope(y, *rope, cfg.rope_interleaved)   # (R, d_k)
    if after:                                                            # frozen at the real pass's turned q or k
        r = real @ W[:, cut] + (0 if b is None else b[cut])              # (d_k,)
        r = r if rope is None else apply_rope(r[None], *rope, cfg.rope_interleaved)[0]
        y = norm_by(y, np.full(len(y), norm_scale(r, cfg)), _keep(_head_norm(qk_norm, head), biased), cfg)
    return y


def _keep(w: NormWeights, biased: bool) -> NormWeights:
    """A norm's weights, without its β when not BIASED (its linear part)."""
    return w if biased or w.bias is None else NormWeights(w.weight)


def _rotation(rep: Replacement, layer: int, position: int) -> tuple[np.ndarray, np.ndarray] | None:
    """cos, sin (d_rot,) of POSITION for LAYER's kind of rotation, as the pass makes them (core.stack.transformer);
    None without RoPE there."""
    cfg, n = rep.model.config, len(rep.ids)
    kind = cfg.rope_kind(layer)
    if kind is None:
        return None
    speeds = rope_speeds(cfg, rep.model.dtype, n)[kind]
    scaling = cfg.local_rope_scaling if kind == "local" else cfg.rope_scaling
    cos, sin = rope_cos_sin(np.arange(n)[None], speeds, rope_attention_factor(scaling), cfg.rope_interleaved)
    return cos[0, 0, position], sin[0, 0, position]                     # (d_rot,) each


# ── the table ────────────────────────────────────────────────────────────────────

def check_model(rep: Replacement) -> None:
    """One QkvError where the head's score is not q·k through the frozen maps above (T5's relative bias; a MoE
    layer's routing belongs to the graph's own refusals)."""
    cfg = rep.model.config
    if cfg.position == "relative" or cfg.disentangled is not None:        # T5's bias, DeBERTa's c2p + p2c
        raise QkvError(f"{rep.model.name}'s scores add a learned relative position bias per query and key, which "
                       "QK attribution does not split; use a model with RoPE, learned positions or ALiBi")


def real_pass(rep: Replacement, layer: int) -> tuple[np.ndarray, np.ndarray]:
    """The real pass's (attn_in (n, d), scores (H, n, n)) at LAYER."""
    rec = Recorder(layers=[layer], keep=("attn_in", "scores"))
    ids = rep.ids[None]
    transformer(rep.model.weights, rep.model.config, ids, np.ones_like(ids), rec=rec, logits=None)
    return rec.store[layer]["attn_in"][0], rec.store[layer]["scores"][0]


def qk_table(rep: Replacement, layer: int, head: int, query_pos: int, key_pos: int,
             nodes: Iterable[str] | None = None, method: str = "backward") -> QKTable:
    """Head HEAD of LAYER's score from query QUERY_POS to key KEY_POS as a table over the upstream nodes (all, or
    NODES (node ids) with the others summed in "rest"), with the constant "bias" row and column; sums to the real
    pass's score (QKTable.error). A key the query cannot see (after it, or outside its window) is one QkvError.
    method: "backward" (`backward_parts`: the sources' parts from one frozen backward sweep, fast for every node)
    or "forward" (`stream_parts`: a batch row per source, the plain form; the same numbers up to rounding)."""
    check_model(rep)
    if method not in ("backward", "forward"):
        raise QkvError(f"method must be 'backward' or 'forward', got {method!r}")
    cfg, n = rep.model.config, len(rep.ids)
    layer = check_index("layer", layer, cfg.n_layers, rep.model.name)
    head = check_index("head", head, cfg.n_heads, rep.model.name)
    i = check_index("position", query_pos, n, "the prompt")
    j = check_index("position", key_pos, n, "the prompt")
    bias = attention_mask_of(cfg, np.ones((1, n), np.int64), n, layer).bias(rep.model.dtype)   # (1, H|1, n, n) | None
    pb = 0.0 if bias is None else float(bias[0, head if bias.shape[1] > 1 else 0, i, j])
    if not np.isfinite(pb):
        raise QkvError(f"query {i} cannot see key {j} in layer {layer} (the mask hides it: a later position, or "
                       "outside the window); give a key the query attends to")
    m = max(i, j) + 1 if cfg.causal else n                  # a causal stream at positions ≤ max(i, j): no later one
    names = sources(rep, layer, m, nodes)
    rest = nodes is not None
    attn_in, scores = real_pass(rep, layer)
    g = head // (cfg.n_heads // cfg.n_kv_heads)             # the K/V head this query head reads (GQA)
    if method == "forward":                                 # the plain form: one batch row per source
        parts = stream_parts(rep, layer, m, names, rest)    # (R, m, d): sources, (rest), bias
        q = _affine(rep, layer, head, "q", parts[:, i], i, attn_in[i])   # (R, d_k)
        k = _affine(rep, layer, g, "k", parts[:, j], j, attn_in[j])      # (R, d_k)
    else:
        q, k = backward_parts(rep, layer, (head, g), (i, j), names, rest, attn_in)
    scale = cfg.score_scale or 1.0 / math.sqrt(cfg.d_head)
    labels = names + ([REST] if rest else []) + [BIAS]
    at = np.array([_position(s) for s in names] + [-1] * (1 + rest))      # (R,) each source's position
    qs, ks = (at <= i, at <= j) if cfg.causal else (at < n, at < n)     # a causal pass: p ≤ i reaches q_i, else 0
    qs &= np.any(q != 0, axis=1) | (at < 0)                              # no source that adds exactly nothing
    ks &= np.any(k != 0, axis=1) | (at < 0)                              # (layer 0: only E:i reaches position i)
    table = scale * (q[qs] @ k[ks].T)                       # (S, T)
    return QKTable(layer=layer, head=head, query=i, key=j, queries=[s for s, ok in zip(labels, qs) if ok],
                   keys=[s for s, ok in zip(labels, ks) if ok], table=table, score=float(scores[head, i, j]),
                   position_bias=pb, cap=cfg.attn_softcap,
                   tokens=[token_text(rep.model, t) for t in rep.ids])


def _linear_map(rep: Replacement, layer: int, head: int, side: str, position: int, real: np.ndarray) -> np.ndarray:
    """M (d_k, d): the linear part of `projected` at POSITION, read off on the identity."""
    return projected(rep, layer, head, side, np.eye(rep.model.config.d_model), position, real, biased=False).T


def _position(node: str) -> int:
    """The position of a node id: E:p, F:l:p:f, R:l:p."""
    parts = node.split(":")
    return int(parts[1] if parts[0] == "E" else parts[2])


def _affine(rep: Replacement, layer: int, head: int, side: str, x: np.ndarray, position: int,
            real: np.ndarray) -> np.ndarray:
    """Each source's part of the head's q or k (R, d_k): the linear part of the frozen map (`projected`) for the
    sources, the whole affine map for the last row (the constant: every bias lands there)."""
    return np.vstack([projected(rep, layer, head, side, x[:-1], position, real, biased=False),
                      projected(rep, layer, head, side, x[-1:], position, real)])   # (R, d_k)


# ── the fast form: the sources' parts by one frozen backward sweep ──────────────

def backward_parts(rep: Replacement, layer: int, heads: tuple[int, int], positions: tuple[int, int],
                   names: list[str], rest: bool, attn_in: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(q parts, k parts) (R, d_k) each, rows as `stream_parts`' (NAMES, then "rest" if REST, then "bias"), the same
    numbers by another road: q^(s) = M_q·J_s·v_s, with M_q (d_k, d) the frozen map from the stream at (LAYER, i)
    to the query (`projected`'s linear part, read off on the identity) and J_s the frozen system's map from where
    source s writes its vector v_s (a·W_dec[f] or e at its layer's ffn_out, x₀ entering block 0) to that stream.
    The rows M_q·J for every layer and position come from one backward sweep of 2·d_k rows (q's and k's) through
    the frozen boxes (qkv.core.blocks_backward: norms by their real scales, attention through V with its pattern
    held, each FFN cut but for a skip transcoder's W_skip), so each source costs one (d_k, d)·(d,) product instead
    of a row of a forward pass. The constant comes from the forward pass with no node (`stream_parts`)."""
    model, cfg = rep.model, rep.model.config
    (head, g), (i, j) = heads, positions
    n, d, dk = len(rep.ids), cfg.d_model, cfg.d_head
    M_q = _linear_map(rep, layer, head, "q", i, attn_in[i])                 # (d_k, d)
    M_k = _linear_map(rep, layer, g, "k", j, attn_in[j])                    # (d_k, d)
    dx = np.zeros((2 * dk, n, d))                                 # (2·d_k, n, d) at the stream entering LAYER
    dx[:dk, i], dx[dk:, j] = M_q, M_k
    caught: dict[int, np.ndarray] = {}

    def ffn(l: int, dy: np.ndarray) -> tuple[np.ndarray, None]:
        caught[l] = dy                                                       # (2·d_k, n, d) ∂(q, k)/∂ffn_out of l
        skip = rep.transcoders[l].params.get("W_skip")
        return (np.zeros_like(dy) if skip is None else rep.release(dy) @ skip.T), None   # into ffn_in: the skip only

    boxes = back.Boxes(norm=back.frozen_norm, attention=back.value_path, ffn=ffn)
    for l in reversed(range(layer)):
        dx, _, _ = back.block(dx, model.weights.blocks[l], rep.tape, l, cfg, boxes=boxes)

    def part(name: str) -> np.ndarray:                                       # (2·d_k,) q's then k's
        kind, *at = name.split(":")
        if kind == "E":
            return dx[:, int(at[0])] @ rep.embeddings[int(at[0])]
        l, p = int(at[0]), int(at[1])
        if kind == "R":
            return caught[l][:, p] @ rep.errors[l][p]
        f = int(at[2])
        return caught[l][:, p] @ (rep.acts[l][p, f] * rep.transcoders[l].params["W_dec"][f])

    rows = [part(s) for s in names]
    if rest:                                                                 # every source's, minus the named
        every = np.einsum("bpd,pd->b", dx, rep.embeddings) + sum(
            np.einsum("bpd,pd->b", caught[l], rep.acts[l] @ rep.transcoders[l].params["W_dec"] + rep.errors[l])
            for l in range(layer))
        rows.append(every - sum(rows, np.zeros(2 * dk)))
    m = max(i, j) + 1 if cfg.causal else n
    c = stream_parts(rep, layer, m, [], False)[0]                            # (m, d) the stream with no node
    rows = np.array(rows).reshape(-1, 2 * dk)                                # (R, 2·d_k)
    q = np.vstack([rows[:, :dk], projected(rep, layer, head, "q", c[i:i + 1], i, attn_in[i])])   # (R + 1, d_k)
    k = np.vstack([rows[:, dk:], projected(rep, layer, g, "k", c[j:j + 1], j, attn_in[j])])
    return q, k
