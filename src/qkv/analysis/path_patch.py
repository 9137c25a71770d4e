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
     (`receivers.altered_inputs`) — through the layer's own norm, projections, QK-norm, RoPE (`receivers.receiver_hooks`);
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
(`receivers.receiver_hooks` computes the altered K/V head in a companion row and copies back head H's Z only).

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
from typing import TYPE_CHECKING, Callable, Sequence

import numpy as np

from ..runtime.errors import QkvError
from .patch import MAX_TOKENS, _measure, metric_of
from .receivers import EMBED, Node, every_sender, parse_nodes, patched_logits, reaches

if TYPE_CHECKING:
    from ..core.trace import Trace
    from ..models.model import Model

CHANNELS = ("q", "k", "v", "all")
KEEP = ("residual", "heads", "attn_out", "ffn_out")          # what the clean and corrupted traces must keep


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
