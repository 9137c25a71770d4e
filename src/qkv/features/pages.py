"""Feature pages: what each latent of an SAE responds to over a corpus, and what its direction writes.

For latent j of an SAE reading a site of one layer (`features.sae`: z = TopK((x − b_dec)·W_enc + b_enc)),

    contexts     the corpus positions where z_j is largest, each with the tokens around it and z_j on them
    frequency    the fraction of the corpus's tokens where z_j > 0 (it fires)
    histogram    how its non-zero activations are spread: counts in HIST_BINS bins of equal width on a log
                 scale, from HIST_LO to HIST_HI (below and above: the first and last bin)
    promotes     W_dec[j] read through the unembedding as the logit lens reads the stream,
                 logits_j = (W_dec[j] ⊙ γ)·W_vocab (`analysis.neurons.value_logits`: the same reading as an FFN
                 neuron's value); its largest entries are the tokens the direction promotes, its smallest the
                 ones it suppresses

    feature_report(model, sae, texts, top=K, contexts=C, features=[...])   → FeatureReport

The corpus streams as `qkv neurons` streams it (`analysis.neurons`: windows sorted by length, BATCH_TOKENS
padded tokens a pass through blocks 0..the SAE's layer only, per latent its C best contexts merged batch by
batch with np.argpartition): memory is bounded by the batch and d_sae, never the corpus. The windows are
CONTEXT tokens, as the activations an SAE is trained on (`features.activations`), and a decoder's first
position of each window is left out, as there (its stream is the attention sink's, tens of times the others'
norm: the SAE was not trained on it).

Which latents: FEATURES (indices) if given, else the TOP that fire most often over the corpus (ties: the
larger max). The figure and the page: `viz.feature_figures`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Sequence

import numpy as np

from ..analysis.neurons import (Example, TopContexts, contexts_of, corpus_triples, no_vocab, padded_batches,
                                value_logits, window_pieces)
from ..runtime.errors import QkvError, check_index
from .activations import CONTEXT, site_rows
from .steer import check_model

if TYPE_CHECKING:
    from ..models.model import Model
    from .sae import SAE

TOP = 24                 # latents reported when none are given
CONTEXTS = 8             # top-activating contexts kept per latent
WINDOW = 8               # tokens of context kept on each side of the activating token
TOKENS = 10              # promoted and suppressed tokens listed per latent
HIST_BINS = 40           # the activation histogram's bins, equal width in log10(z)
HIST_LO, HIST_HI = 1e-2, 1e3


def hist_edges() -> np.ndarray:
    """The histogram's HIST_BINS + 1 edges, log-spaced from HIST_LO to HIST_HI."""
    return np.logspace(np.log10(HIST_LO), np.log10(HIST_HI), HIST_BINS + 1)


@dataclass
class Feature:
    """One latent: its statistics over the corpus, its best contexts, what its decoder direction writes.
    (The fields a neuron of `analysis.neurons` has too, so the neuron page's pieces draw it.)"""

    index: int                     # 0..d_sae-1
    max: float                     # its largest activation over the corpus (0: it never fired)
    mean: float                    # the mean of its non-zero activations (0: it never fired)
    fired: int                     # tokens where it fired
    frequency: float               # fired / tokens
    histogram: list[int]           # HIST_BINS counts of its non-zero activations (`hist_edges`)
    examples: list[Example]        # the largest activations first (only where it fired)
    promotes: list[tuple[int, str, float]] = field(default_factory=list)     # (id, token, logit), largest first
    suppresses: list[tuple[int, str, float]] = field(default_factory=list)   # smallest first
    on_text: float | None = None   # (the neuron page's field; not used here)

    @property
    def positive(self) -> float:
        return self.frequency

    @property
    def min(self) -> float:
        return 0.0


@dataclass
class FeatureReport:
    """What `feature_report` found for one SAE (see the module)."""

    model: str
    layer: int
    site: str
    d_sae: int
    k: int
    chosen: str                    # how the latents were chosen
    corpus: str
    texts: int                     # texts read
    windows: int
    tokens: int                    # tokens the statistics are over
    features: list[Feature]
    dead: int                      # latents (of all d_sae) that never fired on these tokens
    vocab: str | None = None       # None: promotes / suppresses computed; else why they are not
    skipped: list[tuple[int, str]] = field(default_factory=list)
    sep: str = ""                  # what views put between tokens (" " for WordPiece)
    edges: list[float] = field(default_factory=lambda: hist_edges().tolist())

    def feature(self, index: int) -> Feature:
        for f in self.features:
            if f.index == index:
                return f
        raise QkvError(f"feature {index} is not in this report; it has {[f.index for f in self.features]}")

    def as_json(self) -> dict:
        """Plain JSON: the report's fields, each latent's contexts, histogram and tokens."""
        def tokens(items):
            return [{"id": i, "token": t, "logit": round(v, 5)} for i, t, v in items]

        return {
            "model": self.model, "layer": self.layer, "site": self.site, "d_sae": self.d_sae, "k": self.k,
            "chosen": self.chosen, "corpus": self.corpus, "texts": self.texts, "windows": self.windows,
            "tokens": self.tokens, "dead": self.dead, "vocab": self.vocab, "sep": self.sep,
            "histogram_edges": [float(f"{e:.6g}") for e in self.edges],
            "skipped": [{"text": i, "error": e} for i, e in self.skipped],
            "features": [{
                "index": f.index, "max": round(f.max, 5), "mean": round(f.mean, 5), "fired": f.fired,
                "frequency": round(f.frequency, 7), "histogram": f.histogram,
                "contexts": [{"text": e.text, "line": e.line, "window": e.window, "position": e.position,
                              "token": e.token, "activation": round(e.activation, 5), "tokens": e.tokens, "at": e.at,
                              "activations": [round(a, 5) for a in e.activations]} for e in f.examples],
                "promotes": tokens(f.promotes), "suppresses": tokens(f.suppresses)} for f in self.features],
        }


class Tally:
    """Per latent over the tokens seen: how often it fired, its sum and max there, and its histogram."""

    def __init__(self, d_sae: int):
        self.fired = np.zeros(d_sae, np.int64)
        self.sum = np.zeros(d_sae)
        self.max = np.zeros(d_sae, np.float32)
        self.hist = np.zeros((d_sae, HIST_BINS), np.int64)
        self.edges = hist_edges()
        self.tokens = 0

    def add(self, z: np.ndarray) -> None:
        """z (T, d_sae) the latents on T real tokens."""
        rows, cols = np.nonzero(z)                                             # the firing entries
        values = z[rows, cols]                                                 # (F,)
        self.tokens += z.shape[0]
        self.fired += np.bincount(cols, minlength=len(self.fired))
        self.sum += np.bincount(cols, weights=values, minlength=len(self.sum))
        np.maximum.at(self.max, cols, values)
        b = np.clip(np.searchsorted(self.edges, values, side="right") - 1, 0, HIST_BINS - 1)   # (F,)
        self.hist += np.bincount(cols * HIST_BINS + b, minlength=self.hist.size).reshape(self.hist.shape)


def feature_report(model: "Model", sae: "SAE", texts, *, top: int = TOP, contexts: int = CONTEXTS,
                   features: Sequence[int] | None = None, window: int = WINDOW, tokens: int = TOKENS,
                   max_tokens: int = CONTEXT, limit: int | None = None, layer: int | None = None,
                   site: str | None = None, progress: Callable[[int, int | None], None] | None = None) -> FeatureReport:
    """The feature pages' numbers (see the module) for SAE on MODEL over TEXTS (a list of texts,
    `analysis.corpus.open_corpus(path)`, or `features.corpora.open_texts(...)`): per chosen latent its
    `contexts` top contexts (`window` tokens either side), frequency, histogram and `tokens` promoted /
    suppressed tokens. Chosen: FEATURES, else the TOP that fire most often. limit: stop after the batch that
    reaches this many tokens (None: the whole corpus). LAYER, SITE: where the SAE reads, if its cfg.json
    does not say. progress(texts done, texts in all or None): called as the corpus streams."""
    layer, site, _ = check_model(model, sae, layer, site)
    cfg, d_sae = model.config, sae.config.d_sae
    for name, value, least in (("top", top, 1), ("contexts", contexts, 1), ("window", window, 0),
                               ("tokens", tokens, 1), ("max_tokens", max_tokens, 2), ("limit", limit or 1, 1)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < least:
            raise QkvError(f"{name}={value!r} must be an integer ≥ {least}")
    if model.tokenizer is None:
        raise QkvError(f"{model.name} has no tokenizer.json, so text cannot be encoded; add the checkpoint's "
                       "tokenizer.json")
    given = None if features is None else _chosen(features, d_sae)
    source = _source(texts)
    length = min(int(max_tokens), cfg.max_positions)
    skip = 1 if cfg.causal else 0                      # a decoder's first position: the attention sink
    pad = cfg.pad_token_id if cfg.pad_token_id is not None and 0 <= cfg.pad_token_id < cfg.vocab_size else 0
    tally = Tally(d_sae)
    cols = None if given is None else np.array(given)
    best = TopContexts(d_sae if cols is None else len(cols), int(contexts), int(window))
    skipped: list[tuple[int, str]] = []
    count, seen = 0, set()
    for ids, lengths, where in padded_batches(window_pieces(model, source, length, skipped, progress), pad):
        x = site_rows(model, layer, site, ids, lengths)                        # (B, n, d_in)
        B, n, d = x.shape
        real = (np.arange(n)[None, :] < lengths[:, None]) & (np.arange(n)[None, :] >= skip)   # (B, n)
        z = np.zeros((B, n, d_sae), np.float32)                                # (B, n, d_sae)
        z[real] = sae.encode(x[real].astype(np.float32, copy=False))
        tally.add(z[real])
        best.add(z if cols is None else z[..., cols], ids, lengths, where)
        seen.update(where[:, 0].tolist())
        count += len(ids)
        if limit is not None and tally.tokens >= limit:
            break
    if tally.tokens == 0:
        why = f": {skipped[0][1]}" if skipped else ""
        raise QkvError(f"the corpus {source[2]} gave no tokens to measure{why}; give texts with words in them")
    if cols is not None:
        index, chosen = cols, "the features asked for"
    else:
        index = np.lexsort((-tally.max, -tally.fired))[:top]                   # most often, then the larger max
        chosen = f"the {len(index)} that fire most often"
    why = no_vocab(model)
    logits = None if why is not None else value_logits(model, sae.W_dec[index])   # (k, V)
    label = model.tokenizer.label
    out = []
    for k, i in enumerate(index):
        j = k if cols is not None else int(i)                                  # its column in `best`
        f = int(tally.fired[i])
        feat = Feature(index=int(i), max=float(tally.max[i]), mean=float(tally.sum[i] / f) if f else 0.0, fired=f,
                       frequency=f / tally.tokens, histogram=[int(c) for c in tally.hist[i]],
                       examples=[e for e in contexts_of(best, j, label) if e.activation > 0])
        if logits is not None:
            v = logits[k]
            up, down = np.argsort(-v, kind="stable")[:tokens], np.argsort(v, kind="stable")[:tokens]
            feat.promotes = [(int(t), label(int(t)), float(v[t])) for t in up]
            feat.suppresses = [(int(t), label(int(t)), float(v[t])) for t in down]
        out.append(feat)
    return FeatureReport(model=model.name, layer=layer, site=site, d_sae=d_sae, k=sae.config.k, chosen=chosen,
                         corpus=source[2], texts=len(seen), windows=count, tokens=tally.tokens, features=out,
                         dead=int((tally.fired == 0).sum()), vocab=why, skipped=skipped,
                         sep=" " if model.tokenizer.spelling == "plain" else "")


def _chosen(features: Sequence[int], d_sae: int) -> list[int]:
    given = [features] if isinstance(features, (int, np.integer)) else list(features)
    if not given:
        raise QkvError("no feature given; give one or more indices, e.g. --feature 12,40")
    out = []
    for i in given:
        if isinstance(i, bool) or not isinstance(i, (int, np.integer)):
            raise QkvError(f"feature {i!r} is not an index; give integers, e.g. --feature 12,40")
        out.append(check_index("feature", int(i), d_sae, "this SAE"))
    return list(dict.fromkeys(out))


def _source(texts):
    """(index, line, text) triples, their count and the corpus's name, from a list, a Corpus or a Texts."""
    if texts is not None and hasattr(texts, "texts") and hasattr(texts, "sha256") and hasattr(texts, "name"):
        return texts.texts(0), texts.count, str(texts.name)                  # features.corpora.Texts
    if texts is None:
        raise QkvError("no corpus given; give texts, e.g. open_texts(file=...) or a list of strings")
    return corpus_triples(texts)


# ── one text: which latents fire on each token (`qkv sae show`) ─────────────────

def text_features(model: "Model", sae: "SAE", text: str, *, top: int = 5, layer: int | None = None,
                  site: str | None = None, name: str = "") -> dict:
    """TEXT through MODEL, each token's stream at the SAE's site encoded: per token its non-zero latents
    (the largest activation first) and their activations — the viewer's "features" section as plain JSON
    (`viz.interpret_payload.features_section`). A decoder's first position is "skipped" (the attention sink,
    outside what the SAE was trained on: its lists stay empty). top: latents listed per token by views."""
    layer, site, _ = check_model(model, sae, layer, site)
    if isinstance(top, bool) or not isinstance(top, (int, np.integer)) or top < 1:
        raise QkvError(f"top={top!r} must be an integer ≥ 1")
    ids, _ = model.encode(text)                                                 # (n,)
    ids = np.asarray(ids, dtype=np.int64)
    x = site_rows(model, layer, site, ids[None, :], np.array([len(ids)]))[0]    # (n, d_in)
    skip = 1 if model.config.causal and len(ids) > 1 else 0
    z = sae.encode(x.astype(np.float32, copy=False))                            # (n, d_sae)
    z[:skip] = 0
    feats, acts = [], []
    for row in z:
        nz = np.nonzero(row)[0]
        order = nz[np.argsort(-row[nz], kind="stable")]
        feats.append([int(j) for j in order])
        acts.append([float(row[j]) for j in order])
    label = model.tokenizer.label
    return {"sae": name, "model": model.name, "text": text, "layer": layer, "site": site,
            "d_sae": sae.config.d_sae, "k": sae.config.k, "top": int(top), "tokens": [label(int(i)) for i in ids],
            "ids": [int(i) for i in ids], "features": feats, "acts": acts, "skipped": list(range(skip))}
