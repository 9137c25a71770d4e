"""Path patching: the effect of sender heads on receiver heads' Q, K or V inputs only (Wang et al. 2022, IOI;
Goldowsky-Dill et al. 2023).

Activation patching asks what a head does through every path downstream of it; path patching asks what it
does through one path: its direct line, through the residual stream, into the queries (or keys, or values)
of chosen receiver heads. As Wang et al. do, the senders are patched from the corrupted run into the clean
one (noising):

  1. run clean and corrupted, recording each sender s's output out_s (what it adds to the residual stream);
  2. each receiver of layer r reads, for its channel (q, k or v; "all": all three), the altered stream

         x'_r = x_r(clean) + Σ_{s ∈ S, layer(s) < r} (out_s(corrupted) − out_s(clean))

     — the senders' change reaches the receivers directly, every other component frozen at its clean value
     (`altered_inputs`) — through the layer's own norm, projections, QK-norm, RoPE (`receiver_hooks`);
  3. the clean run goes on from the receivers with everything downstream recomputed (the receivers' other
     channels, every later head and FFN), and the metric m of its last position's logits is read:

         effect = (m(patched) − m(clean)) / (m(clean) − m(corrupted))

     0: the path carries nothing; −1: corrupting it moves the metric as far as corrupting the whole input.
     normalise=False gives m(patched) − m(clean) itself. The metric grammar is `qkv.analysis.patch`'s
     (`metric_of`): a function of the logits (B, V) → (B,), a token, or (answer, wrong) tokens.

A sender is a head "L.H" (out_s: what layer L's attention output changes by when head H's Z = A·V takes its
corrupted value, computed by the layer itself, so an output norm (Gemma 2, OLMo 2) and a residual multiplier
(Granite) are included; heads of one layer in one sender set change it together), a layer's FFN "L.ffn"
(ffn_out(corrupted) − ffn_out(clean)) or the embeddings "embed" (the stream entering block 0). A sender
reaches only receivers of later layers: a table's cell with no such receiver is NaN (no path). A receiver is a
head "L.H". With grouped-query attention a K/V head serves a group of query heads; receiver L.H with channel k
or v means head H alone reads the altered keys or values, its group mates keep the clean ones
(`receiver_hooks` computes the altered K/V head in a companion row and copies back head H's Z only).

positions: the receivers' input altered at these positions only (e.g. the last: a name mover's query at END).

Identity (tests/test_path_patch.py): with S every component before layer r (the embeddings, every head and FFN)
the altered stream is the corrupted run's, x'_r = x_r(corrupted), so path patching S into all heads of layer r
with channel all is activation patching of those heads from the corrupted run into the clean one.

Decoders only, pre-norm or parallel: a post-norm stream (BERT, OPT-350m) is renormalised after every box, so
senders' outputs do not add up in it, and an encoder–decoder's decoder mixes cross-attention in; both refused.

    path_patch      one sender set → one receiver set: PathPatching (its effect)
    sender_table    every sender alone (each head, each FFN, the embeddings) → one receiver set: PathTable (S, 1)
    pair_table      every (sender, receiver) pair, each alone: PathTable (S, R) (small models)

Cost: a patched copy is two batch rows (the clean run and its companion) over the receivers' layers, then one
row to the end; copies are batched (2·B·n ≤ patch.MAX_TOKENS per pass), and each sender head's change is one
batched run of its layer alone. SmolLM2, 14 tokens, the 231 senders before layer 23 into four layer-23 heads:
4 passes, ~12 s on a shared 2-core machine.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Iterator, Mapping, Sequence

import numpy as np

from ..core.hooks import Hooks, HookFn
from ..core.stack import transformer
from ..runtime.errors import QkvError
from .patch import MAX_TOKENS, _measure, metric_of, tail

if TYPE_CHECKING:
    from ..core.trace import Trace
    from ..models.model import Model

CHANNELS = ("q", "k", "v", "all")
KEEP = ("residual", "heads", "attn_out", "ffn_out")          # what the clean and corrupted traces must keep
EMBED = -1                                                   # the embeddings' "layer": before block 0


@dataclass(frozen=True)
class Node:
    """A sender or receiver: head HEAD of LAYER, or (head None) LAYER's FFN, or (layer EMBED) the embeddings."""

    layer: int
    head: int | None = None

    def __str__(self) -> str:
        return "embed" if self.layer == EMBED else f"{self.layer}.{'ffn' if self.head is None else self.head}"

    def order(self) -> tuple[int, float]:
        """The pass's order: the embeddings, then each layer's heads, then its FFN."""
        return self.layer, float("inf") if self.head is None else self.head


# ── who sends and who receives ───────────────────────────────────────────────────

def parse_nodes(model: "Model", spec: "str | Sequence | None", what: str = "senders", heads_only: bool = False
                ) -> list[Node]:
    """SPEC — "L.H,L.ffn,embed", a list of such strings, (layer, head) pairs or Nodes; None: none — → Nodes, checked
    against MODEL (negative layers count from the end); HEADS_ONLY: receivers, heads alone."""
    items = ([s.strip() for s in spec.split(",") if s.strip()] if isinstance(spec, str)
             else [] if spec is None else list(spec))
    L, H = model.config.n_layers, model.config.n_heads
    example = "'3.2' (layer 3, head 2)" + ("" if heads_only else ", '3.ffn' or 'embed'")
    nodes = []
    for item in items:
        if item == Node(EMBED) or (isinstance(item, str) and item in ("embed", "emb")):
            if heads_only:
                raise QkvError(f"{what}: the embeddings are no head; name heads as {example}")
            nodes.append(Node(EMBED))
            continue
        if isinstance(item, Node):
            layer, head = item.layer, item.head
        elif isinstance(item, (tuple, list)) and len(item) == 2:
            layer, head = item
        elif isinstance(item, str) and item.count(".") == 1:
            layer, head = item.split(".")
            head = None if head in ("ffn", "mlp") and not heads_only else head
        else:
            raise QkvError(f"{what}: {item!r} is not a component; name them as {example}, comma-separated")
        try:
            layer, head = int(layer), None if head is None else int(head)
        except (TypeError, ValueError):
            raise QkvError(f"{what}: {item!r} is not a component; name them as {example}") from None
        if not -L <= layer < L or (head is not None and not 0 <= head < H):
            raise QkvError(f"{what}: {item!r} is outside {model.name} ({L} layers × {H} heads); name them as {example}")
        nodes.append(Node(layer % L, head))
    return sorted(set(nodes), key=Node.order)


def every_sender(model: "Model") -> list[Node]:
    """The embeddings, then each layer's heads and its FFN."""
    L, H = model.config.n_layers, model.config.n_heads
    return [Node(EMBED)] + [Node(l, h) for l in range(L) for h in [*range(H), None]]


def reaches(sender: Node, receivers: Sequence[Node]) -> bool:
    """Whether SENDER has a direct path to any of RECEIVERS: one of them is in a later layer."""
    return any(r.layer > sender.layer for r in receivers)


# ── the altered receivers (the mechanism) ────────────────────────────────────────

def sender_changes(model: "Model", clean: "Trace", corrupted: "Trace", senders: Sequence[Sequence[Node]],
                   below: int) -> Iterator[tuple[int, int, np.ndarray]]:
    """(layer l, row i, Δ (n, d_model)) for each row i's sender set SENDERS[i] and each layer l < BELOW it has
    senders in: Δ = Σ_{s ∈ S_i, layer(s) = l} out_s(corrupted) − out_s(clean) (l = EMBED: the embeddings). A
    layer's heads: its attention output with those heads' Z from the corrupted run and the rest clean, minus the
    clean one, computed by the layer itself (its W_O, output norm, multiplier); an FFN: ffn_out's change."""
    for i, nodes in enumerate(senders):
        for s in nodes:
            if s.layer == EMBED:
                yield EMBED, i, corrupted.layers[0].residual - clean.layers[0].residual
            elif s.head is None and s.layer < below:
                yield s.layer, i, corrupted.layers[s.layer].ffn_out - clean.layers[s.layer].ffn_out
    for layer in sorted({s.layer for nodes in senders for s in nodes if s.head is not None and s.layer < below}):
        rows = [(i, [s.head for s in nodes if s.layer == layer and s.head is not None])
                for i, nodes in enumerate(senders)]
        rows = [(i, heads) for i, heads in rows if heads]
        outs = _attention_with(model, clean, corrupted, layer, [heads for _, heads in rows])   # (B', n, d_model)
        for (i, _), out in zip(rows, outs):
            yield layer, i, out - clean.layers[layer].attn_out


def _attention_with(model: "Model", clean: "Trace", corrupted: "Trace", layer: int, heads: list[list[int]]
                    ) -> np.ndarray:
    """Layer LAYER's attention output (B, n, d_model) on the clean stream, row i with HEADS[i]'s Z = A·V from
    the corrupted run: block LAYER alone, as a batch, its attn_out read by a hook."""
    source = corrupted.layers[layer].heads                                    # (H, n, d_k)
    seen: list[np.ndarray] = []

    def swap(z: np.ndarray, _layer: int) -> np.ndarray:                       # (B, H, n, d_k)
        z = z.copy()
        for i, hs in enumerate(heads):
            z[i, hs] = source[hs]
        return z

    def read(out: np.ndarray, _layer: int) -> None:                           # (B, n, d_model)
        seen.append(out.copy())

    x = np.repeat(clean.layers[layer].residual[None], len(heads), axis=0)      # (B, n, d_model)
    _blocks(model, x, layer, layer + 1, {f"{layer}.heads": swap, f"{layer}.attn_out": read})
    return seen[0]


def altered_inputs(model: "Model", clean: "Trace", corrupted: "Trace", senders: Sequence[Sequence[Node]],
                   layers: Sequence[int]) -> dict[int, np.ndarray]:
    """The stream each receiver layer r of LAYERS reads, for each row i's sender set SENDERS[i]:

        x'_r[i] = x_r(clean) + Σ_{s ∈ S_i, layer(s) < r} (out_s(corrupted) − out_s(clean))      (B, n, d_model)

    the senders' change reaching layer r directly, every other component at its clean value (`sender_changes`)."""
    out = {r: np.repeat(clean.layers[r].residual[None], len(senders), axis=0) for r in sorted(set(layers))}
    for layer, i, change in sender_changes(model, clean, corrupted, senders, below=max(out)):
        for r, x in out.items():
            if layer < r:
                x[i] += change
    return out


def receiver_hooks(altered: Mapping[int, np.ndarray], receivers: Mapping[int, Sequence[Sequence[int]]],
                   channel: str, positions: Sequence[int] | None = None) -> dict[str, HookFn]:
    """Hooks on a pass over 2B rows — B main rows, then row B + i the companion of row i — under which main row
    i's receiver heads RECEIVERS[r][i] of layer r read their CHANNEL input ("q", "k", "v" or "all") from
    ALTERED[r][i] (n, d_model), an altered residual stream entering block r, and everything else from their own:

        r.residual      the companion's stream entering block r := ALTERED[r][i]
        r.q, r.k, r.v   the companion's := the main row's, for each channel not chosen and at each position not
                        in POSITIONS (None: all positions altered)
        r.heads         main row i's Z_h := the companion's Z_h, for each receiver h

    So the receiver's q (k, v) is what layer r's own norm, projections, biases, QK-norm and RoPE make of the
    altered stream, and its Z = A·V what the layer's attention (mask, ALiBi, soft-cap) makes of them. Only the
    receivers' Z leave the companion: under GQA, the companion alters a whole K/V head, but only the receiver
    reads it (its group mates' Z are not copied). The companions' rows after layer r mean nothing."""
    chosen = ("q", "k", "v") if channel == "all" else (channel,)
    B = len(next(iter(altered.values())))

    def restream(r: int) -> HookFn:
        def fn(x: np.ndarray, _layer: int) -> np.ndarray:                      # (2B, n, d_model)
            x = x.copy()
            x[B:] = altered[r]
            return x
        return fn

    def keep_main(name: str) -> HookFn:
        def fn(y: np.ndarray, _layer: int) -> np.ndarray:                      # (2B, H or Hkv, n, d_k)
            y = y.copy()
            if name not in chosen:
                y[B:] = y[:B]
            elif positions is not None:
                rest = np.setdiff1d(np.arange(y.shape[2]), positions)
                y[B:, :, rest] = y[:B, :, rest]
            return y
        return fn

    def copy_back(r: int) -> HookFn:
        def fn(z: np.ndarray, _layer: int) -> np.ndarray:                      # (2B, H, n, d_k)
            z = z.copy()
            for i, heads in enumerate(receivers[r]):
                z[i, list(heads)] = z[B + i, list(heads)]
            return z
        return fn

    hooks: dict[str, HookFn] = {}
    for r in altered:
        hooks[f"{r}.residual"] = restream(r)
        for name in ("q", "k", "v"):
            if name not in chosen or positions is not None:
                hooks[f"{r}.{name}"] = keep_main(name)
        hooks[f"{r}.heads"] = copy_back(r)
    return hooks


def _blocks(model: "Model", x: np.ndarray, start: int, stop: int, hooks: Mapping[str, HookFn]
            ) -> tuple[np.ndarray, np.ndarray | None]:
    """X (B, n, d_model), the stream entering block START, through blocks START..STOP-1 with HOOKS → (the stream
    entering block STOP (B, n, d_model), None); STOP = L: (the final hidden states, the last position's logits
    (B, 1, V))."""
    end = stop >= model.config.n_layers
    return transformer(model.weights, model.config, None, np.ones(x.shape[:2], np.int64),
                       logits="last" if end else None, hooks=Hooks.of(None, hooks, model.config, model.name),
                       start=start, stream=x, stop=None if end else stop)


def patched_logits(model: "Model", clean: "Trace", corrupted: "Trace",
                   rows: Sequence[tuple[Sequence[Node], Sequence[Node]]], channel: str,
                   positions: Sequence[int] | None = None) -> np.ndarray:
    """The clean run with each row's (senders, receivers) path patched (module doc) → the last position's
    logits (B, V), one batched pass: 2B rows (`receiver_hooks`) over the receivers' layers, then B rows on."""
    B = len(rows)
    layers = sorted({r.layer for _, receivers in rows for r in receivers})
    altered = altered_inputs(model, clean, corrupted, [senders for senders, _ in rows], layers)
    heads = {r: [[h.head for h in receivers if h.layer == r] for _, receivers in rows] for r in layers}
    hooks = receiver_hooks(altered, heads, channel, positions)
    first, last = layers[0], layers[-1]
    x = np.repeat(clean.layers[first].residual[None], 2 * B, axis=0)           # (2B, n, d_model)
    x, logits = _blocks(model, x, first, last + 1, hooks)
    if logits is not None:
        return logits[:B, 0]                                                   # (B, V)
    return tail(model, x[:B], last + 1, None, clean)                           # (B, V) the main rows on


# ── the effects ──────────────────────────────────────────────────────────────────

@dataclass
class PathPatching:
    """One sender set's effect on one receiver set (see the module)."""

    effect: float                    # (m(patched) − m(clean)) / (m(clean) − m(corrupted)); unnormalised: the numerator
    patched: float                   # m(patched)
    clean: float                     # m(clean)
    corrupted: float                 # m(corrupted)
    senders: list[str]
    receivers: list[str]
    channel: str
    positions: list[int] | None      # the receivers' positions altered (None: all)
    metric: str = ""
    normalised: bool = True
    seconds: float = 0.0
    model: str = ""

    def as_json(self) -> dict:
        return {"model": self.model, "metric": self.metric, "channel": self.channel, "senders": self.senders,
                "receivers": self.receivers, "positions": self.positions, "effect": round(self.effect, 6),
                "metric_patched": self.patched, "metric_clean": self.clean, "metric_corrupted": self.corrupted,
                "normalised": self.normalised, "seconds": round(self.seconds, 3)}


@dataclass
class PathTable:
    """Effects of senders (rows) on receivers (columns), each patched alone; NaN: the sender reaches none of the
    column's receivers (no path). `sender_table`'s one column is the whole receiver set."""

    values: np.ndarray               # (S, R)
    senders: list[Node]              # (S,)
    receivers: list[list[Node]]      # (R,) each column's receiver set
    channel: str
    positions: list[int] | None
    clean: float = 0.0
    corrupted: float = 0.0
    metric: str = ""
    normalised: bool = True
    labels: list[str] = field(default_factory=list)    # (n,) the clean tokens, "clean/corrupted" where they differ
    runs: int = 0                    # patched copies computed
    passes: int = 0                  # batched passes
    seconds: float = 0.0
    model: str = ""
    shape: tuple[int, int] = (0, 0)  # the model's (L, H)
    texts: tuple[str, str] = ("", "")

    def column_names(self) -> list[str]:
        return [",".join(map(str, r)) for r in self.receivers]

    def heads(self, column: int = 0) -> np.ndarray:
        """The head senders' effects on COLUMN's receivers as a map (L, H); NaN: not a sender, or no path."""
        out = np.full(self.shape, np.nan)
        for s, v in zip(self.senders, self.values[:, column]):
            if s.layer != EMBED and s.head is not None:
                out[s.layer, s.head] = v
        return out

    def top(self, k: int = 10, column: int = 0) -> list[tuple[str, float]]:
        """The K senders of largest |effect| on COLUMN's receivers: (sender, effect), largest first."""
        v = self.values[:, column]
        order = [i for i in np.argsort(-np.nan_to_num(np.abs(v), nan=-1.0)) if not np.isnan(v[i])][:k]
        return [(str(self.senders[i]), float(v[i])) for i in order]

    def as_json(self) -> dict:
        return {"model": self.model, "clean": self.texts[0], "corrupted": self.texts[1], "labels": self.labels,
                "metric": self.metric, "metric_clean": self.clean, "metric_corrupted": self.corrupted,
                "normalised": self.normalised, "channel": self.channel, "positions": self.positions,
                "senders": [str(s) for s in self.senders], "receivers": self.column_names(),
                "values": [[None if np.isnan(x) else round(float(x), 6) for x in row] for row in self.values],
                "top": [{"sender": s, "effect": round(e, 6)} for s, e in self.top(10)],
                "runs": self.runs, "passes": self.passes, "seconds": round(self.seconds, 3)}


@dataclass
class _Setup:
    """The clean and corrupted runs and the metric's baselines: what every patched copy is measured against."""

    clean: "Trace"
    corrupted: "Trace"
    fn: Callable[[np.ndarray], np.ndarray]
    name: str
    m_clean: float
    m_corrupted: float
    normalise: bool
    labels: list[str]

    def effect(self, m: np.ndarray) -> np.ndarray:
        """(m − m(clean)) / (m(clean) − m(corrupted)), or m − m(clean) unnormalised."""
        change = np.asarray(m, dtype=np.float64) - self.m_clean
        return change / (self.m_clean - self.m_corrupted) if self.normalise else change


def check_path_model(model: "Model") -> None:
    """One QkvError unless MODEL is a pre-norm (or parallel) decoder, whose stream adds its boxes' outputs."""
    from ..models.seq2seq import DecoderView, Seq2SeqModel

    if isinstance(model, (DecoderView, Seq2SeqModel)):
        raise QkvError(f"path patching runs on decoder-only models; {model.name} is an encoder–decoder, whose decoder "
                       "mixes cross-attention into its stream; use activation patching (`qkv patch`) there")
    if not getattr(model.config, "causal", True):
        raise QkvError(f"path patching reads the next token's logits of a decoder; {model.name} is an encoder: "
                       "use a decoder (--model smollm2)")
    if model.config.norm_place == "post":
        raise QkvError(f"{model.name} is post-norm: its stream is renormalised after every box, so senders' outputs "
                       "do not add up in it and path patching is not defined; use a pre-norm decoder")


def check_channel(channel: str) -> str:
    if channel not in CHANNELS:
        raise QkvError(f"channel {channel!r}: choose from {', '.join(CHANNELS)} (all: q, k and v together)")
    return channel


def _setup(model: "Model", clean, corrupted, metric, normalise: bool) -> _Setup:
    """The runs, the metric (patch.metric_of's grammar) and its clean and corrupted values."""
    check_path_model(model)
    fn, name = metric_of(model, metric)
    a, b = model.run(clean, keep=KEEP), model.run(corrupted, keep=KEEP)
    if len(a.ids) != len(b.ids):
        raise QkvError(f"clean has {len(a.ids)} tokens and corrupted {len(b.ids)}; path patching position by position "
                       "needs the same count: reword the corrupted input so its tokens line up")
    m_clean, m_corrupted = (float(_measure(fn, t.logits[-1:])[0]) for t in (a, b))
    if normalise and np.isclose(m_clean, m_corrupted, rtol=1e-6, atol=1e-9):
        raise QkvError(f"clean and corrupted give the same metric ({m_clean:.4g}), so there is no effect to "
                       "normalise; give a corrupted input that changes the answer (or normalise=False)")
    labels = [x if x == y else f"{x}/{y}" for x, y in zip(a.labels, b.labels)]
    return _Setup(a, b, fn, name, m_clean, m_corrupted, normalise, labels)


def _positions(positions, n: int) -> list[int] | None:
    """The receivers' positions to alter, checked against N tokens and counted from 0 (None: all)."""
    if positions is None:
        return None
    if not all(-n <= int(p) < n for p in positions) or not len(positions):
        raise QkvError(f"positions {list(positions)}: the input has {n} tokens (0..{n - 1}, or -1 for the last)")
    return sorted({int(p) % n for p in positions})


def path_patch(model: "Model", clean: str | Sequence[int], corrupted: str | Sequence[int], metric, *,
               senders, receivers, channel: str = "q", positions: Sequence[int] | None = None,
               normalise: bool = True) -> PathPatching:
    """The effect of patching SENDERS' corrupted outputs into RECEIVERS' CHANNEL input only (module doc).

    clean, corrupted: texts or ids with the same token count. metric: a function of the last position's logits
    (B, V) → (B,), a token, or (answer, wrong) tokens, e.g. (" Mary", " John"). senders: "L.H", "L.ffn",
    "embed" (comma-separated or a list; empty: nothing changes, effect 0); receivers: heads "L.H"; channel: q, k,
    v or all; positions: the receivers' positions whose input is altered (None: all; e.g. [-1], the last)."""
    started = time.perf_counter()
    channel = check_channel(channel)
    S, R = parse_nodes(model, senders, "senders"), parse_nodes(model, receivers, "receivers", heads_only=True)
    if not R:
        raise QkvError("give at least one receiver head, e.g. receivers='3.2'")
    run = _setup(model, clean, corrupted, metric, normalise)
    where = _positions(positions, len(run.clean.ids))
    m = float(_measure(run.fn, patched_logits(model, run.clean, run.corrupted, [(S, R)], channel, where))[0])
    return PathPatching(float(run.effect(m)), m, run.m_clean, run.m_corrupted, [str(s) for s in S],
                        [str(r) for r in R], channel, where, run.name, normalise,
                        time.perf_counter() - started, model.name)


def _table(model: "Model", clean, corrupted, metric, senders: list[Node], columns: list[list[Node]], channel: str,
           positions, normalise: bool, batch: int | None, progress) -> PathTable:
    """Each (sender, column) alone, batched: its rows sorted by their receivers' first layer."""
    started = time.perf_counter()
    channel = check_channel(channel)
    run = _setup(model, clean, corrupted, metric, normalise)
    where = _positions(positions, len(run.clean.ids))
    values = np.full((len(senders), len(columns)), np.nan)
    cells = sorted(((min(r.layer for r in col), i, j) for i, s in enumerate(senders) for j, col in enumerate(columns)
                    if reaches(s, col)))
    n = len(run.clean.ids)
    per_pass = max(1, MAX_TOKENS // (2 * n)) if batch is None else max(1, int(batch))
    passes = 0
    for start in range(0, len(cells), per_pass):
        chunk = cells[start:start + per_pass]
        rows = [([senders[i]], columns[j]) for _, i, j in chunk]
        m = _measure(run.fn, patched_logits(model, run.clean, run.corrupted, rows, channel, where))
        for (_, i, j), e in zip(chunk, run.effect(m)):
            values[i, j] = e
        passes += 1
        if progress is not None:
            progress(start + len(chunk), len(cells))
    return PathTable(values, senders, columns, channel, where, run.m_clean, run.m_corrupted, run.name, normalise,
                     run.labels, len(cells), passes, time.perf_counter() - started, model.name,
                     (model.config.n_layers, model.config.n_heads),
                     tuple(x if isinstance(x, str) else "" for x in (clean, corrupted)))


def sender_table(model: "Model", clean: str | Sequence[int], corrupted: str | Sequence[int], metric, *, receivers,
                 channel: str = "q", senders=None, positions: Sequence[int] | None = None, normalise: bool = True,
                 batch: int | None = None, progress: Callable[[int, int], None] | None = None) -> PathTable:
    """Every sender alone (default `every_sender`: the embeddings, each head, each FFN) → the one receiver set
    RECEIVERS: a PathTable of one column (`heads()` its (L, H) map). Senders in or after the receivers' last layer
    reach none of them: NaN, not run. batch: copies per pass (default as many as patch.MAX_TOKENS allows);
    progress(done, total) after each pass. The rest as `path_patch`."""
    R = parse_nodes(model, receivers, "receivers", heads_only=True)
    if not R:
        raise QkvError("give at least one receiver head, e.g. receivers='3.2'")
    S = every_sender(model) if senders is None else parse_nodes(model, senders, "senders")
    return _table(model, clean, corrupted, metric, S, [R], channel, positions, normalise, batch, progress)


def pair_table(model: "Model", clean: str | Sequence[int], corrupted: str | Sequence[int], metric, *,
               channel: str = "q", senders=None, receivers=None, positions: Sequence[int] | None = None,
               normalise: bool = True, batch: int | None = None,
               progress: Callable[[int, int], None] | None = None) -> PathTable:
    """Every (sender, receiver) pair alone (defaults: every sender, every head): a PathTable (S, R), NaN where the
    sender is not before the receiver. S·R patched copies: for small models (or few senders and receivers)."""
    S = every_sender(model) if senders is None else parse_nodes(model, senders, "senders")
    H = model.config.n_heads
    R = ([Node(l, h) for l in range(model.config.n_layers) for h in range(H)] if receivers is None
         else parse_nodes(model, receivers, "receivers", heads_only=True))
    return _table(model, clean, corrupted, metric, S, [[r] for r in R], channel, positions, normalise, batch, progress)
