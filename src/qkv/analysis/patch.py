"""Activation patching: which activations carry the answer (Meng et al. 2022; Wang et al. 2022).

Run a clean input ("… John gave a drink to" → " Mary") and a corrupted one that changes the
answer ("… Mary gave a drink to" → " John"), then run the corrupted one again with ONE activation
copied from the clean run, and measure how much of the clean answer comes back:

    effect = (m(corrupted, patched) − m(corrupted)) / (m(clean) − m(corrupted))

0: the patch changes nothing; 1: it restores the clean metric entirely. The metric m is a
function of the last position's logits, e.g. the logit difference logit(␣Mary) − logit(␣John).
An encoder (MiniLM; a masked-LM one too, whose logits are at a mask) reads the final hidden states,
and the named metric "embedding" (EMBEDDING) is the one sentence-transformers models are made
for: the sentence embedding e = mean-pooled final hidden states, L2-normalised, and
m = cos(e(patched), e(clean)), so the effect measures how much of the clean sentence's
embedding a patch brings back.

    patch           the effect tables: heads (L, H), each head's Z at every position; residual,
                    attn_out, ffn_out (L, n), one position of the residual stream entering block l,
                    or of layer l's attention or FFN output; an encoder–decoder's (qkv.models.seq2seq.
                    DecoderView: CLEAN and CORRUPTED are sources, the decoder writes one target) also
                    cross (L, H), each cross-attention head's Z
    patch_one       the effect of one patch (any positions or heads at once), for checks

The tables as heatmaps, and patch.png, .svg, .json: `viz.interpret_figures` (patch_figure,
save_patching); as the viewer's panel: `sections.patch_payload`.

Speed: a patch at layer l leaves layers 0..l-1 as in the corrupted run, so the patched copies of
layer l start from the corrupted residual stream entering block l and run only blocks l..L-1,
as one batch (B = H + 3·n copies, split when B·n passes MAX_TOKENS): L passes in all, each
over (L − l) blocks, instead of L·(H + 3n) whole forward passes. A patch whose clean value equals
the corrupted one bit for bit (in a decoder: every position before the first token that differs)
is the corrupted run itself: its effect is 0 and it is not run. The patches themselves are hooks
(qkv.core.hooks) on "heads", "attn_out" and "ffn_out", each writing its own batch rows.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Mapping, Sequence

import numpy as np

from ..runtime.errors import QkvError
from .attribution import token_id

if TYPE_CHECKING:
    from ..models.model import Model

WHAT = ("heads", "residual", "attn_out", "ffn_out", "cross")   # the tables `patch` can make (cross: encoder–decoders)
MAX_TOKENS = 2048                                        # B·n of one batched pass (memory ~ B·n·d_ff floats)
Metric = Callable[[np.ndarray], np.ndarray]              # logits (B, V) of the last position → (B,)
EMBEDDING = "embedding"                                  # the named metric of encoders (module doc)


@dataclass
class Patching:
    """Effect tables of patching clean activations into the corrupted run (see the module)."""

    heads: np.ndarray | None         # (L, H) head h's Z at every position
    residual: np.ndarray | None      # (L, n) the residual stream entering block l, at position p
    attn_out: np.ndarray | None      # (L, n) layer l's attention output at position p
    ffn_out: np.ndarray | None       # (L, n) layer l's FFN output at position p
    cross: np.ndarray | None = None  # (L, H) an encoder–decoder's cross-attention head h's Z (None: a decoder)
    clean: float = 0.0               # m(clean)
    corrupted: float = 0.0           # m(corrupted)
    labels: list[str] = field(default_factory=list)   # (n,) the clean tokens, "clean/corrupted" where they differ
    metric: str = ""                 # what m is, e.g. "logit(␣Mary) − logit(␣John)"
    normalised: bool = True          # False: the tables hold m(patched) − m(corrupted) itself
    runs: int = 0                    # patched copies computed
    skipped: int = 0                 # copies whose clean value equals the corrupted one (effect 0, not run)
    passes: int = 0                  # batched forward passes (each over blocks l..L-1)
    seconds: float = 0.0
    model: str = ""
    texts: tuple[str, str] = field(default=("", ""))

    def top_heads(self, k: int = 10) -> list[tuple[int, int, float]]:
        """The k heads of largest |effect|: (layer, head, effect), largest first."""
        order = np.argsort(-np.abs(self.heads), axis=None)[:k]
        return [(int(i // self.heads.shape[1]), int(i % self.heads.shape[1]), float(self.heads.flat[i]))
                for i in order]

    def as_json(self) -> dict:
        tables = {name: None if t is None else np.round(t, 6).tolist()
                  for name, t in (("heads", self.heads), ("residual", self.residual),
                                  ("attn_out", self.attn_out), ("ffn_out", self.ffn_out), ("cross", self.cross))}
        return {"model": self.model, "clean": self.texts[0], "corrupted": self.texts[1], "labels": self.labels,
                "metric": self.metric, "metric_clean": self.clean, "metric_corrupted": self.corrupted,
                "normalised": self.normalised, **tables,
                "top_heads": [{"layer": l, "head": h, "effect": round(e, 6)} for l, h, e in
                              (self.top_heads(10) if self.heads is not None else [])],
                "runs": self.runs, "skipped": self.skipped, "passes": self.passes, "seconds": round(self.seconds, 3)}


# ── inputs and the metric ────────────────────────────────────────────────────────

def metric_of(model: "Model", metric) -> tuple[Metric | None, str]:
    """A metric given as a function of logits (B, V) → (B,), a token (its logit), or a pair of
    tokens (answer, wrong): logit(answer) − logit(wrong). Tokens: ids or one-token texts.
    "embedding" (an encoder's): (None, its name), made from the clean run by `_embedding_metric`."""
    if callable(metric):
        return metric, getattr(metric, "__name__", "metric")
    if isinstance(metric, str) and metric == EMBEDDING:
        if model.weights.W_vocab is not None and getattr(model.config, "causal", True):   # a masked-LM encoder may
            raise QkvError(f'the "{EMBEDDING}" metric compares sentence embeddings of an encoder; {model.name} has '
                           "an LM head: give (answer, wrong) tokens instead")
        return None, "cos(embedding, clean embedding)"             # needs the clean run: `_embedding_metric`
    if model.weights.W_vocab is not None and not getattr(model.config, "causal", True):
        raise QkvError(f"{model.name} is a masked-LM encoder: patching reads its final hidden states, not the last "
                       "position's logits, so tokens name nothing to compare; use a decoder (--model smollm2), or a "
                       "metric on the final hidden states (B, n, d_model) → (B,)")
    if model.weights.W_vocab is None:
        raise QkvError(f"{model.name} has no LM head, so no logits to compare tokens by; use a decoder "
                       "(--model smollm2), or from Python a metric on the final hidden states (B, n, d_model) → (B,)")
    pair = metric if isinstance(metric, (tuple, list)) else (metric,)
    if not 1 <= len(pair) <= 2:
        raise QkvError(f"metric must be a function, a token or (answer, wrong) tokens, got {metric!r}")
    ids = [token_id(model, t) for t in pair]
    name = " − ".join(f"logit({model.tokenizer.label(i) if model.tokenizer else i})" for i in ids)
    if len(ids) == 1:
        return (lambda z: z[:, ids[0]]), name
    return (lambda z: z[:, ids[0]] - z[:, ids[1]]), name


def sentence_embedding(hidden: np.ndarray) -> np.ndarray:
    """Final hidden states (B, n, d_model) of unpadded texts → their sentence embeddings (B, d_model):
    the mean over positions, L2-normalised (sentence-transformers' mean pooling with a full mask)."""
    e = np.asarray(hidden, dtype=np.float64).mean(axis=1)                  # (B, d_model)
    return e / np.linalg.norm(e, axis=-1, keepdims=True)


def _embedding_metric(model: "Model", clean) -> Metric:
    """m(hidden) = cos(sentence_embedding(hidden), the clean run's embedding)."""
    target = sentence_embedding(tail(model, clean.layers[0].residual[None], 0, None, clean))[0]     # (d_model,)

    def embedding(hidden: np.ndarray) -> np.ndarray:                     # (B, n, d_model) → (B,)
        return sentence_embedding(hidden) @ target
    return embedding


def _measure(metric: Metric, out: np.ndarray) -> np.ndarray:
    values = np.asarray(metric(out), dtype=np.float64)
    if values.shape != (len(out),):
        raise QkvError(f"the metric returned shape {values.shape} for {len(out)} rows; it must give one number "
                       f"per row: logits (B, V) → (B,)")
    return values


# ── the patched runs ─────────────────────────────────────────────────────────────

def tail(model: "Model", x: np.ndarray, start: int, hooks: Mapping[str, Callable] | None, trace) -> np.ndarray:
    """x (B, n, d_model), the residual stream entering block START of TRACE's pass, through blocks
    START..L-1 (and the final norm) with HOOKS ({name: fn}) → the last position's logits (B, V), or
    for an encoder (with or without a masked-LM head) the final hidden states (B, n, d_model): the model's own pass from the middle
    (`from_layer`)."""
    hidden, logits = model.from_layer(x, start, hooks, trace)
    encoder = not getattr(model.config, "causal", True)                       # a masked-LM head's too: hidden
    return hidden if logits is None or encoder else logits[:, 0]               # (B, V) or (B, n, d_model)


def copied(trace, layer: int, what: str) -> np.ndarray:
    """What patching copies: layer LAYER's WHAT of TRACE ("cross": its cross-attention heads' Z)."""
    return trace.cross.layers[layer].heads if what == "cross" else getattr(trace.layers[layer], what)


HOOKED = {"heads": "{layer}.heads", "attn_out": "{layer}.attn_out", "ffn_out": "{layer}.ffn_out",
          "cross": "cross.{layer}.heads"}                 # the hook each patch is made with


def _patched(model: "Model", clean, corrupted, layer: int, rows: list[tuple[str, np.ndarray]]) -> np.ndarray:
    """The corrupted run from block LAYER on, one batch row per (what, index): index = the heads
    (for "heads", "cross") or positions whose clean values replace the corrupted ones → outputs (B, ...)."""
    c = clean.layers[layer]
    x = np.repeat(corrupted.layers[layer].residual[None], len(rows), axis=0)      # (B, n, d_model)
    marks: dict[str, list[tuple[int, np.ndarray]]] = {w: [] for w in HOOKED}
    for r, (what, index) in enumerate(rows):
        if what == "residual":
            x[r, index] = c.residual[index]
        else:
            marks[what].append((r, index))

    def copier(what: str, source: np.ndarray):
        def fn(value: np.ndarray, _layer: int) -> np.ndarray:                     # (B, H, n, d_k) or (B, n, d)
            value = value.copy()
            for r, index in marks[what]:
                value[r, index] = source[index]
            return value
        return fn

    spec = {HOOKED[w].format(layer=layer): copier(w, copied(clean, layer, w)) for w in marks if marks[w]}
    return tail(model, x, layer, spec or None, corrupted)


def _traces(model: "Model", clean, corrupted):
    """The clean and corrupted runs, keeping what patching copies, and the positions' labels. An
    encoder–decoder's (a DecoderView) are its decoder's, on one target: the sources may differ in length."""
    keep = ("residual", "heads", "attn_out", "ffn_out")
    a, b = model.run(clean, keep=keep), model.run(corrupted, keep=keep)
    if len(a.ids) != len(b.ids):
        raise QkvError(f"clean has {len(a.ids)} tokens and corrupted {len(b.ids)}; patching position by position "
                       "needs the same count: reword the corrupted input so its tokens line up")
    labels = [x if x == y else f"{x}/{y}" for x, y in zip(a.labels, b.labels)]
    return a, b, labels


def _check_cross(trace, what: Sequence[str]) -> tuple[str, ...]:
    """WHAT without "cross" for a decoder's trace (an explicit request for it alone is refused)."""
    if trace.cross is not None:
        return tuple(what)
    if tuple(what) == ("cross",):
        raise QkvError("cross-attention heads are an encoder–decoder's; this model has none to patch")
    return tuple(w for w in what if w != "cross")


def _baselines(model, metric: Metric, clean, corrupted, normalise: bool) -> tuple[float, float]:
    m_clean, m_corrupt = (float(_measure(metric, tail(model, t.layers[0].residual[None], 0, None, t))[0])
                          for t in (clean, corrupted))
    if normalise and math.isclose(m_clean, m_corrupt, rel_tol=1e-6, abs_tol=1e-9):
        raise QkvError(f"clean and corrupted give the same metric ({m_clean:.4g}), so there is no effect to "
                       "normalise; give a corrupted input that changes the answer (or normalise=False)")
    return m_clean, m_corrupt


def patch_one(model: "Model", clean: str | Sequence[int], corrupted: str | Sequence[int], metric, what: str,
              layer: int, index: Sequence[int] | None = None, *, normalise: bool = True) -> float:
    """The effect of one patch: WHAT ("heads", "residual", "attn_out", "ffn_out") of LAYER at INDEX
    (heads, or positions; None = all of them) copied from clean into corrupted, in one pass."""
    fn, _ = metric_of(model, metric)
    c, k, _ = _traces(model, clean, corrupted)
    fn = fn or _embedding_metric(model, c)
    m_clean, m_corrupt = _baselines(model, fn, c, k, normalise)
    if what not in WHAT:
        raise QkvError(f"unknown patch {what!r}; choose from {list(WHAT)}")
    _check_cross(c, (what,))
    layer = model.check_layer(layer)
    count = model.config.n_heads if what in ("heads", "cross") else len(c.ids)
    index = np.arange(count) if index is None else np.asarray(index, dtype=np.int64)
    m = float(_measure(fn, _patched(model, c, k, layer, [(what, index)]))[0]) - m_corrupt
    return m / (m_clean - m_corrupt) if normalise else m


def patch(model: "Model", clean: str | Sequence[int], corrupted: str | Sequence[int], metric, *,
          what: Sequence[str] = WHAT, normalise: bool = True, batch: int | None = None,
          progress: Callable[[int, int], None] | None = None) -> Patching:
    """Effect tables of patching each head (L, H) and each position of the residual stream,
    attention output and FFN output (L, n) from CLEAN into CORRUPTED (see the module).

    clean, corrupted: texts or ids with the same token count. metric: a function of the last
    position's logits (B, V) → (B,), a token, or (answer, wrong) tokens, e.g. (" Mary", " John");
    without an LM head a function of the final hidden states (B, n, d_model) → (B,), or "embedding":
    the cosine similarity of the sentence embedding to the clean one (module doc).
    normalise=False gives m(patched) − m(corrupted) itself. batch: at most this many patched
    copies per pass (1: each alone; default as many as MAX_TOKENS allows). progress(done, total) is told
    after each layer's check and each pass how many of the total copies are done (a copy equal to the
    corrupted run counts as done without a pass).
    """
    unknown = set(what) - set(WHAT)
    if unknown:
        raise QkvError(f"unknown patch {sorted(unknown)}; choose from {list(WHAT)}")
    fn, name = metric_of(model, metric)
    started = time.perf_counter()
    c, k, labels = _traces(model, clean, corrupted)
    fn = fn or _embedding_metric(model, c)
    m_clean, m_corrupt = _baselines(model, fn, c, k, normalise)
    what = _check_cross(c, what)
    L, H, n = model.config.n_layers, model.config.n_heads, len(c.ids)
    size = {"heads": H, "residual": n, "attn_out": n, "ffn_out": n, "cross": H}
    tables = {w: np.zeros((L, size[w])) for w in what}
    per_pass = max(1, MAX_TOKENS // n) if batch is None else max(1, int(batch))
    runs = passes = skipped = 0
    total = L * sum(size[w] for w in what)                                      # every copy, run or not
    for layer in range(L):
        same = {w: [np.array_equal(x, y) for x, y in zip(copied(c, layer, w), copied(k, layer, w))]
                for w in what}                                                  # per head / position
        rows = [(w, np.array([i])) for w in what for i in range(size[w]) if not same[w][i]]
        skipped += sum(sum(v) for v in same.values())
        if progress is not None:
            progress(runs + skipped, total)
        for s in range(0, len(rows), per_pass):
            chunk = rows[s:s + per_pass]
            values = _measure(fn, _patched(model, c, k, layer, chunk)) - m_corrupt       # (B,)
            for (w, index), v in zip(chunk, values):
                tables[w][layer, index[0]] = v
            runs, passes = runs + len(chunk), passes + 1
            if progress is not None:
                progress(runs + skipped, total)
    scale = (m_clean - m_corrupt) if normalise else 1.0
    return Patching(**{w: tables[w] / scale if w in tables else None for w in WHAT}, clean=m_clean,
                    corrupted=m_corrupt, labels=labels, metric=name, normalised=normalise, runs=runs,
                    skipped=skipped, passes=passes, seconds=time.perf_counter() - started, model=model.name,
                    texts=tuple(x if isinstance(x, str) else "" for x in (clean, corrupted)))
